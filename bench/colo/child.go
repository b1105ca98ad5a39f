package colo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/understory/understory/cgroups"
)

// The scenarios' pods are this binary re-executed with one of these subcommands: the
// LS server, a batch worker, the memory scenario's LS service and batch job. Their
// arguments are written by this package (scenario.go, memory.go) and read back by Child:
// a protocol of the package with itself, not a user's command line, which is why it is
// parsed here and not in cmd/colo/main.go.
const (
	lsServerCmd = "ls-server"
	burnerCmd   = "burner"
)

// IsChild reports whether args (without the program name) start one of the
// scenarios' pods, which Child runs.
func IsChild(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case lsServerCmd, burnerCmd, memLSCmd, memBatchCmd:
		return true
	}
	return false
}

// Child runs the pod that args (without the program name) start, until ctx ends.
// cmd/colo calls it for IsChild arguments, and so does this package's TestMain: the
// test binary plays the pods in the tests.
func Child(ctx context.Context, args []string) error {
	if !IsChild(args) {
		return fmt.Errorf("%q: not a pod of the scenarios", args)
	}
	switch args[0] {
	case lsServerCmd:
		return runLSServer(ctx, args[1:])
	case burnerCmd:
		return runBurner(ctx, args[1:])
	case memLSCmd:
		return runMemLS(ctx, args[1:])
	default:
		return runMemBatch(ctx, args[1:])
	}
}

func runLSServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(lsServerCmd, flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	rounds := fs.Int("rounds", 300, "SHA-256 rounds per request")
	root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup mount")
	cg := fs.String("cgroup", "", "cgroup to join first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := join(*root, *cg); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("ls-server: %w", err)
	}
	return newLSServer(*rounds).serve(ctx, ln)
}

func runBurner(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(burnerCmd, flag.ContinueOnError)
	threads := fs.Int("threads", 1, "busy threads")
	kind := fs.String("kind", burnCPU, "workload: cpu (arithmetic) or membw (memcpy over -buffer-mib)")
	bufMiB := fs.Int("buffer-mib", 256, "membw: buffer, shared out among the threads")
	root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup mount")
	cg := fs.String("cgroup", "", "cgroup to join first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *threads < 1 {
		return errors.New("burner: -threads must be ≥ 1")
	}
	if *kind != burnCPU && *kind != burnMemBW {
		return fmt.Errorf("burner: -kind %q: %s or %s", *kind, burnCPU, burnMemBW)
	}
	if err := join(*root, *cg); err != nil {
		return err
	}
	// Tell the parent the worker sits in its cgroup: a move made before this
	// line would be undone by the join above.
	ready := func() { fmt.Println(burnerReady) }
	if *kind == burnMemBW {
		return burnMemory(ctx, *threads, *bufMiB<<20, ready)
	}
	ready()
	burn(ctx, *threads)
	return nil
}

// join moves this process into a cgroup before it starts its work.
func join(root, rel string) error {
	if rel == "" {
		return nil
	}
	h, err := cgroups.Open(root)
	if err != nil {
		return err
	}
	g, err := h.Load(rel)
	if err != nil {
		return err
	}
	if err := g.AddProc(os.Getpid()); err != nil {
		return fmt.Errorf("joining %s: %w", rel, err)
	}
	return nil
}
