package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/understory/understory/cgroups"
)

// Sub-commands this binary runs itself as.
const (
	launcherCmd  = "launch"
	fakeLSCmd    = "fake-ls"
	fakeBatchCmd = "fake-batch"
)

// runLauncher joins its container cgroup (every hierarchy the agent reads, v1 memory
// too), then executes argv: the stand-in is in its pod from its first instruction, as a
// runtime's container process is.
func runLauncher(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(launcherCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup filesystem mount")
	rel := fs.String("cgroup", "", "container cgroup, relative to -cgroup-root")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if *rel == "" || len(argv) == 0 {
		return errors.New("usage: launch -cgroup-root ROOT -cgroup REL -- ARGV")
	}
	h, err := cgroups.Open(*root)
	if err != nil {
		return err
	}
	g, err := h.Load(*rel)
	if err != nil {
		return err
	}
	if err := g.AddProcMemory(os.Getpid()); err != nil {
		return fmt.Errorf("joining cgroup %s: %w", *rel, err)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, argv, os.Environ())
}
