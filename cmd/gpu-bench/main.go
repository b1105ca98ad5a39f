// Command gpu-bench measures the node's GPU throttling path and writes
// bench/out/gpu.json (`make bench-gpu`). The parts (-parts: duty, reaction, collect,
// agent_cpu) are bench/gpubench; this is their command line.
//
// duty, reaction and agent_cpu need root and a cgroup filesystem with a freezer (v1
// freezer or cgroup2 cgroup.freeze); reaction, collect and agent_cpu need a cgo build
// (NVML).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/understory/understory/bench/gpubench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "gpu-bench: interrupted; the cgroups it created were removed")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "gpu-bench:", err)
		os.Exit(1)
	}
}

// run parses the flags and runs the bench; progress goes to stdout, flag errors and usage
// to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if gpubench.IsChild(args) {
		return gpubench.Child(ctx, args, stderr)
	}
	fs := flag.NewFlagSet("gpu-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := gpubench.DefaultConfig()
	fs.StringVar(&cfg.Out, "out", cfg.Out, "output file")
	fs.StringVar(&cfg.Duty.CgroupRoot, "cgroup-root", cfg.Duty.CgroupRoot, "cgroup filesystem mount")
	duties := fs.String("duties", "0.25,0.5,0.75", "duty cycles to measure, fractions in (0, 1)")
	fs.DurationVar(&cfg.Duty.Period, "period", cfg.Duty.Period, "duty-cycle period")
	fs.DurationVar(&cfg.Duty.Point, "point", cfg.Duty.Point,
		"duty-cycled time per duty point (as long again is spent unfrozen for the baseline)")
	fs.DurationVar(&cfg.Duty.Window, "window", cfg.Duty.Window,
		"length of one measured window, a multiple of -period; baseline and cycled windows alternate")
	freezers := fs.String("freezers", "v1,v2", "freezers to measure: v1 (freezer.state), v2 (cgroup.freeze); "+
		"the first one available gives duty_error_pct")
	parts := fs.String("parts", strings.Join(gpubench.Parts(), ","), "parts to run: "+strings.Join(gpubench.Parts(), ", "))
	fs.IntVar(&cfg.Reaction.Trials, "trials", cfg.Reaction.Trials, "reaction: LS load steps measured")
	fs.DurationVar(&cfg.Reaction.LoopPeriod, "loop-period", cfg.Reaction.LoopPeriod, "reaction: GPU loop period")
	fs.IntVar(&cfg.Collect.Iterations, "collect-scrapes", cfg.Collect.Iterations, "collect: timed scrapes")
	fs.IntVar(&cfg.Collect.ProcsPerGPU, "collect-procs", cfg.Collect.ProcsPerGPU, "collect: processes per GPU")
	fs.DurationVar(&cfg.AgentCPU.Duration, "agent-duration", cfg.AgentCPU.Duration,
		"agent_cpu: measured window of each run")
	fs.DurationVar(&cfg.AgentCPU.Warmup, "agent-warmup", cfg.AgentCPU.Warmup,
		"agent_cpu: time between the agent tracking the node and the window")
	fs.IntVar(&cfg.AgentCPU.ProcsPerPod, "agent-procs", cfg.AgentCPU.ProcsPerPod, "agent_cpu: processes per GPU pod")
	fs.DurationVar(&cfg.AgentCPU.FullScrapePeriod, "agent-full-scrape-period", cfg.AgentCPU.FullScrapePeriod,
		"agent_cpu: the agent's gpu.fullScrapePeriod (-loop-period reads every GPU in full every period)")
	roles := fs.String("agent-gpus", strings.Join(cfg.AgentCPU.Roles, ","), "agent_cpu: what runs on each of the 8 "+
		"mock GPUs: shared (an LS and a batch pod), ls, batch or idle")
	fs.BoolVar(&cfg.AgentCPU.GPUOff, "agent-gpu-off", cfg.AgentCPU.GPUOff,
		"agent_cpu: also measure the agent with GPU features off")
	fs.StringVar(&cfg.AgentCPU.Signals, "agent-signals", "",
		"agent_cpu: the agent's signals.mode (auto, ebpf, psi, sampling; empty: its default)")
	fs.StringVar(&cfg.AgentCPU.CPUProfile, "agent-cpuprofile", "",
		"agent_cpu: write the agent's CPU profile (GPU features on, start to stop) to this file; "+
			"profiling adds CPU of its own")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Duty.Duties, err = gpubench.ParseDuties(*duties); err != nil {
		return err
	}
	cfg.Duty.Freezers = nil
	for _, f := range strings.Split(*freezers, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Duty.Freezers = append(cfg.Duty.Freezers, f)
		}
	}
	if cfg.Parts, err = gpubench.ParseParts(*parts); err != nil {
		return err
	}
	cfg.AgentCPU.Roles = nil
	for _, r := range strings.Split(*roles, ",") {
		cfg.AgentCPU.Roles = append(cfg.AgentCPU.Roles, strings.TrimSpace(r))
	}
	printf := func(f string, a ...any) { fmt.Fprintf(stdout, f, a...) }
	return gpubench.Run(ctx, cfg, printf)
}
