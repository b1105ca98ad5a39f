// Command colo is Understory's co-location scenario: one latency-sensitive web service
// and several CPU-hungry batch pods on this machine, measured alone, under kubelet's
// plain BestEffort settings, and under the agent. `colo demo` is `make demo`; `colo
// bench` is `make bench-colo` and writes bench/out/colo.json; `colo stability` replays
// an LS usage trace through the batch-cpu policy. The scenarios are bench/colo; this is
// their command line.
//
// The LS server and the batch workers are this same binary re-executed
// (`colo ls-server`, `colo burner`, `colo mem-ls`, `colo mem-batch`): their arguments
// are bench/colo's own (colo.Child), each joins its pod's cgroup before it starts work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/understory/understory/bench/colo"
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
	if colo.IsChild(args) {
		return colo.Child(ctx, args)
	}
	printf := func(f string, a ...any) { fmt.Printf(f, a...) }
	self, _ := os.Executable()
	o := colo.DefaultOptions(self)
	switch args[0] {
	case "demo", "bench":
		if args[0] == "demo" {
			o = colo.DemoOptions(self)
		}
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		fs.StringVar(&o.CgroupRoot, "cgroup-root", o.CgroupRoot, "cgroup filesystem mount")
		fs.StringVar(&o.Koordlet, "koordlet", o.Koordlet, "koordlet binary")
		fs.IntVar(&o.BatchPods, "batch-pods", o.BatchPods, "batch pods")
		fs.IntVar(&o.Threads, "threads", o.Threads, "busy threads per batch pod")
		fs.IntVar(&o.Work, "work", o.Work, "SHA-256 rounds per LS request (≈1.5 µs each)")
		fs.Float64Var(&o.Rate, "rate", o.Rate, "LS requests per second")
		fs.IntVar(&o.Conns, "conns", o.Conns, "load generator connections")
		fs.StringVar(&o.LSCPU, "ls-cpu", o.LSCPU, "LS pod CPU request")
		fs.BoolVar(&o.AgentPprof, "agent-pprof", o.AgentPprof, "start the agent with -pprof (profiling)")
		fs.StringVar(&o.TierParent, "tier-parent", o.TierParent, "where the agent creates its batch tier: kubepods or besteffort")
		fs.DurationVar(&o.Phase, "phase", o.Phase, "length of each measured CPU phase")
		fs.IntVar(&o.Rounds, "rounds", o.Rounds, "paired rounds of the four CPU phases (demo: their order rotated every round)")
		fs.DurationVar(&o.MemoryPhase, "memory-phase", o.MemoryPhase, "length of each memory phase (0: 15s)")
		fs.BoolVar(&o.Memory, "memory", o.Memory, fmt.Sprintf(
			"also run the memory-pressure phases (a %d MiB node: LS alone, batch without and with the agent)",
			colo.MemoryNodeMiB()))
		fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "agent warm-up (and batch's, without the agent) before measuring")
		fs.Float64Var(&o.Threshold, "threshold", o.Threshold, "policy threshold for the agent phases")
		fs.DurationVar(&o.Period, "period", o.Period, "agent control period")
		fs.DurationVar(&o.CFSPeriod, "cfs-period", o.CFSPeriod, "agent CFS bandwidth period (0: the agent's default)")
		fs.IntVar(&o.Steps, "steps", o.Steps, "bench: LS load steps for the reaction time")
		fs.StringVar(&o.Sweep, "sweep", o.Sweep, "bench: thresholds for the trade-off curve (empty: none)")
		fs.DurationVar(&o.SweepPhase, "sweep-phase", o.SweepPhase, "bench: length of each sweep point")
		fs.DurationVar(&o.Overhead, "overhead", o.Overhead, "bench: agent overhead measurement")
		fs.StringVar(&o.Out, "out", o.Out, "bench: output file")
		fs.StringVar(&o.Trace, "trace", o.Trace, "bench: LS usage trace for the batch-cpu stability replay (empty: none)")
		fs.StringVar(&o.Variants, "variants", o.Variants,
			"bench: scenario variants, each run under every signal path (empty: none)")
		fs.StringVar(&o.SignalPaths, "signal-paths", o.SignalPaths,
			"bench: the agent's signals.mode for the variants' agent phases and the per-path runs (empty: none)")
		fs.IntVar(&o.VariantRounds, "variant-rounds", o.VariantRounds, "bench: paired rounds per variant")
		fs.DurationVar(&o.VariantPhase, "variant-phase", o.VariantPhase, "bench: length of each variant phase")
		fs.IntVar(&o.PathSteps, "path-steps", o.PathSteps, "bench: LS load steps per signal path for its reaction time")
		fs.Float64Var(&o.PathStepRate, "path-step-rate", o.PathStepRate, "bench: LS requests/s of each signal-path step, "+
			"enough that LS waits for a CPU at once on 2 CPUs (0: -rate)")
		fs.DurationVar(&o.PathOverhead, "path-overhead", o.PathOverhead, "bench: agent overhead run (110 pods) per signal path")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if args[0] == "demo" {
			return colo.Demo(ctx, o, printf)
		}
		return colo.Bench(ctx, o, printf)
	case "stability":
		fs := flag.NewFlagSet("stability", flag.ContinueOnError)
		trace := fs.String("trace", o.Trace, "LS usage trace (CSV)")
		generate := fs.Bool("generate", false, "write the trace anew (fixed seed) instead of replaying it")
		period := fs.Duration("period", 100*time.Millisecond, "agent control period")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *generate {
			if err := colo.GenerateTrace(*trace); err != nil {
				return err
			}
			printf("wrote %s\n", *trace)
			return nil
		}
		return colo.Stability(*trace, *period, printf)
	}
	return usage()
}
