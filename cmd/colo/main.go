// Command colo is Understory's co-location scenario: one latency-sensitive web service
// and several CPU-hungry batch pods on this machine, measured alone, under kubelet's
// plain BestEffort settings, and under the agent. `colo demo` is `make demo`; `colo
// bench` is `make bench-colo` and writes bench/out/colo.json, including the scenario
// variants (variants.go) run under each of the agent's signal paths (runvariants.go,
// signals.go) and the target checks (report.go).
//
// The LS server and the batch workers are this same binary re-executed
// (`colo ls-server`, `colo burner`), each joining its pod's cgroup before it starts work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/qos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "colo: interrupted; everything it created was removed")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "colo:", err)
		os.Exit(1)
	}
}

func usage() error {
	return errors.New("usage: colo demo|bench|stability [flags]  (internal: ls-server, burner, mem-ls, mem-batch)")
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usage()
	}
	printf := func(f string, a ...any) { fmt.Printf(f, a...) }
	if ok, err := memoryChild(ctx, args); ok {
		return err
	}
	switch args[0] {
	case "demo", "bench":
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		self, _ := os.Executable()
		sc := scenarioConfig{self: self}
		dc := demoConfig{}
		bc := benchConfig{}
		fs.StringVar(&sc.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup filesystem mount")
		fs.StringVar(&sc.koordlet, "koordlet", filepath.Join(filepath.Dir(self), "koordlet"), "koordlet binary")
		fs.IntVar(&sc.batchPods, "batch-pods", 4, "batch pods")
		fs.IntVar(&sc.threads, "threads", 2, "busy threads per batch pod")
		fs.IntVar(&sc.rounds, "work", 300, "SHA-256 rounds per LS request (≈1.5 µs each)")
		fs.Float64Var(&sc.rate, "rate", 500, "LS requests per second")
		fs.IntVar(&sc.workers, "conns", 64, "load generator connections")
		fs.StringVar(&sc.lsCPU, "ls-cpu", "1", "LS pod CPU request")
		fs.BoolVar(&sc.agentPprof, "agent-pprof", false, "start the agent with -pprof (profiling)")
		fs.StringVar(&sc.tierParent, "tier-parent", koordlet.TierParentKubepods, "where the agent creates its batch tier: kubepods or besteffort")
		fs.DurationVar(&dc.phase, "phase", 8*time.Second, "length of each measured phase")
		fs.BoolVar(&dc.memory, "memory", true, fmt.Sprintf(
			"also run the memory-pressure phases (a %d MiB node: LS alone, batch without and with the agent)",
			defaultMemoryConfig().Node/mib))
		fs.DurationVar(&dc.warmup, "warmup", time.Second, "agent warm-up before measuring")
		fs.Float64Var(&dc.threshold, "threshold", qos.DefaultThreshold, "policy threshold for the agent phases")
		fs.DurationVar(&dc.period, "period", 100*time.Millisecond, "agent control period")
		fs.DurationVar(&sc.cfsPeriod, "cfs-period", 0, "agent CFS bandwidth period (0: the agent's default)")
		fs.IntVar(&bc.rounds, "rounds", 5, "bench: paired rounds of the four phases")
		fs.IntVar(&bc.steps, "steps", 30, "bench: LS load steps for the reaction time")
		sweep := fs.String("sweep", "0.6,0.7,0.8,0.9,0.95,1.0", "bench: thresholds for the trade-off curve (empty: none)")
		fs.DurationVar(&bc.sweepPhase, "sweep-phase", 8*time.Second, "bench: length of each sweep point")
		fs.DurationVar(&bc.overhead, "overhead", 30*time.Second, "bench: agent overhead measurement")
		fs.StringVar(&bc.out, "out", "bench/out/colo.json", "bench: output file")
		fs.StringVar(&bc.trace, "trace", defaultStabilityTrace, "bench: LS usage trace for the batch-cpu stability replay (empty: none)")
		variants := fs.String("variants", "base,ls-heavy,small-batch,membw,bursty",
			"bench: scenario variants, each run under every signal path (empty: none)")
		paths := fs.String("signal-paths", "ebpf,psi,sampling",
			"bench: the agent's signals.mode for the variants' agent phases and the per-path runs (empty: none)")
		vc := variantConfig{}
		fs.IntVar(&vc.rounds, "variant-rounds", 3, "bench: paired rounds per variant")
		fs.DurationVar(&vc.phase, "variant-phase", 10*time.Second, "bench: length of each variant phase")
		fs.IntVar(&vc.steps, "path-steps", 20, "bench: LS load steps per signal path for its reaction time")
		fs.Float64Var(&vc.stepRate, "path-step-rate", 3000, "bench: LS requests/s of each signal-path step, "+
			"enough that LS waits for a CPU at once on 2 CPUs (0: -rate)")
		fs.DurationVar(&vc.overhead, "path-overhead", 20*time.Second, "bench: agent overhead run (110 pods) per signal path")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var err error
		if vc.paths, err = selectPaths(*paths); err != nil {
			return err
		}
		if vc.variants, err = selectVariants(defaultVariants(sc), *variants); err != nil {
			return err
		}
		if vc.rounds < 0 || vc.steps < 0 || vc.stepRate < 0 || vc.overhead < 0 || (vc.rounds > 0 && len(vc.variants) > 0 && vc.phase <= 0) {
			return errors.New("-variant-rounds, -path-steps, -path-step-rate and -path-overhead must be ≥ 0, -variant-phase > 0")
		}
		for _, f := range strings.Split(*sweep, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			v, err := strconv.ParseFloat(f, 64)
			if err != nil || v <= 0 || v > 1 {
				return fmt.Errorf("-sweep: %q is not a threshold in (0, 1]", f)
			}
			bc.sweep = append(bc.sweep, v)
		}
		if sc.batchPods < 1 || sc.batchPods > 100 || sc.threads < 1 || sc.rate <= 0 || sc.workers < 1 || sc.rounds < 1 {
			return errors.New("-batch-pods (1..100), -threads, -rate, -conns and -work must be positive")
		}
		if _, err := os.Stat(sc.koordlet); err != nil {
			return fmt.Errorf("koordlet binary: %w (run `make build` first, or pass -koordlet)", err)
		}
		if args[0] == "demo" {
			return runDemo(ctx, sc, dc, printf)
		}
		return runBench(ctx, sc, dc, bc, vc, printf)
	case "stability":
		fs := flag.NewFlagSet("stability", flag.ContinueOnError)
		trace := fs.String("trace", defaultStabilityTrace, "LS usage trace (CSV)")
		generate := fs.Bool("generate", false, "write the trace anew (fixed seed) instead of replaying it")
		period := fs.Duration("period", 100*time.Millisecond, "agent control period")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *generate {
			if err := generateLSTrace(*trace, defaultTraceSeed); err != nil {
				return err
			}
			printf("wrote %s\n", *trace)
			return nil
		}
		st, err := runStability(*trace, qos.DefaultReclaimConfig(), *period)
		if err != nil {
			return err
		}
		printStability(printf, st)
		return nil
	case "ls-server":
		fs := flag.NewFlagSet("ls-server", flag.ContinueOnError)
		listen := fs.String("listen", "127.0.0.1:0", "listen address")
		rounds := fs.Int("rounds", 300, "SHA-256 rounds per request")
		root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup mount")
		cg := fs.String("cgroup", "", "cgroup to join first")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if err := join(*root, *cg); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		return newLSServer(*rounds).serve(ctx, ln)
	case "burner":
		fs := flag.NewFlagSet("burner", flag.ContinueOnError)
		threads := fs.Int("threads", 1, "busy threads")
		kind := fs.String("kind", burnCPU, "workload: cpu (arithmetic) or membw (memcpy over -buffer-mib)")
		bufMiB := fs.Int("buffer-mib", 256, "membw: buffer, shared out among the threads")
		root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup mount")
		cg := fs.String("cgroup", "", "cgroup to join first")
		if err := fs.Parse(args[1:]); err != nil {
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
	return usage()
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
	return g.AddProc(os.Getpid())
}
