// Command gpu-bench measures the node's GPU throttling path and writes
// bench/out/gpu.json (`make bench-gpu`).
//
// Its parts (-parts, all by default):
//
//   - duty (duty.go): a CPU burner in a real cgroup, duty-cycled by koordlet/gpu/duty at
//     the agent's period, gets a share of the CPU it gets unfrozen; duty_error_pct is how
//     far the frozen share is from the target, in percentage points, at 25, 50 and 75 %.
//   - reaction (reaction.go): reaction_ms, the time from an LS load step on an NVML mock
//     GPU until the batch pod's real cgroup is frozen, through the agent's whole GPU
//     pipeline (collector, attribution, throttle, duty cycler, freezer); p50/p99/max
//     over -trials steps.
//   - collect (collect.go): collect_us_per_device, the collector's own cost per GPU per
//     full scrape on an 8-GPU mock with -collect-procs processes per GPU, and the cost of
//     a probe (process list only) of every GPU.
//   - agent_cpu (agentcpu.go): agent_cpu_pct_of_core, the CPU of the whole koordlet agent
//     (its own process: this binary re-executed as "agent-node") with 8 mock GPUs and
//     110 pods on real cgroups, over -agent-duration after -agent-warmup; then the same
//     with GPU features off (-agent-gpu-off), for the GPU loop's share.
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/understory/understory/koordlet/gpu"
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

// agentNodeCmd is the hidden subcommand the agent_cpu part re-executes this binary with:
// the agent under test, in its own process, over the node the part set up.
const agentNodeCmd = "agent-node"

// run parses the flags and runs the bench; progress goes to stdout, flag errors and usage
// to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == agentNodeCmd {
		return runChild(ctx, args[1:], stderr)
	}
	fs := flag.NewFlagSet("gpu-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := defaultConfig()
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
	parts := fs.String("parts", strings.Join(allParts, ","), "parts to run: "+strings.Join(allParts, ", "))
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
	roles := fs.String("agent-gpus", strings.Join(defaultGPURoles, ","), "agent_cpu: what runs on each of the 8 "+
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
	if cfg.Duty.Duties, err = parseDuties(*duties); err != nil {
		return err
	}
	cfg.Duty.Freezers = nil
	for _, f := range strings.Split(*freezers, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Duty.Freezers = append(cfg.Duty.Freezers, f)
		}
	}
	if err := cfg.Duty.validate(); err != nil {
		return err
	}
	if cfg.Parts, err = parseParts(*parts); err != nil {
		return err
	}
	cfg.Reaction.CgroupRoot, cfg.Reaction.Period = cfg.Duty.CgroupRoot, cfg.Duty.Period
	cfg.Reaction.Policy = benchGPUPolicy(cfg.Duty.Period)
	if err := cfg.Reaction.validate(); err != nil {
		return err
	}
	if err := cfg.Collect.validate(); err != nil {
		return err
	}
	cfg.AgentCPU.CgroupRoot, cfg.AgentCPU.LoopPeriod = cfg.Duty.CgroupRoot, cfg.Reaction.LoopPeriod
	cfg.AgentCPU.Roles = nil
	for _, r := range strings.Split(*roles, ",") {
		cfg.AgentCPU.Roles = append(cfg.AgentCPU.Roles, strings.TrimSpace(r))
	}
	if err := cfg.AgentCPU.validate(); err != nil {
		return err
	}
	printf := func(f string, a ...any) { fmt.Fprintf(stdout, f, a...) }
	return runBench(ctx, cfg, printf)
}

func parseDuties(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0 && v < 1) {
			return nil, fmt.Errorf("-duties: %q is not a fraction in (0, 1)", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("-duties: no duty given")
	}
	return out, nil
}

// parseParts reads -parts; the parts run in allParts' order whatever the order given.
func parseParts(s string) ([]string, error) {
	var want []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(allParts, p) {
			return nil, fmt.Errorf("-parts: %q is not one of %s", p, strings.Join(allParts, ", "))
		}
		want = append(want, p)
	}
	if len(want) == 0 {
		return nil, errors.New("-parts: no part given")
	}
	var out []string
	for _, p := range allParts {
		if slices.Contains(want, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// runChild is the agent_cpu part's agent process: agent-node -spec FILE.
func runChild(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpu-bench "+agentNodeCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	spec := fs.String("spec", "", "the node, as the agent_cpu part wrote it (JSON)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *spec == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: gpu-bench %s -spec FILE", agentNodeCmd)
	}
	return runAgentNode(ctx, *spec, stderr)
}

// defaultConfig is `make bench-gpu`: 10 s duty-cycled and 10 s unfrozen per duty point,
// 30 reaction trials at the agent's loop period, 5000 timed scrapes, and the agent's CPU
// over 60 s with GPU features on and 60 s off, at the agent's GPU defaults.
func defaultConfig() config {
	return config{
		Out:   "bench/out/gpu.json",
		Parts: allParts,
		Duty: dutyConfig{
			CgroupRoot: "/sys/fs/cgroup",
			Period:     100 * time.Millisecond,
			Point:      10 * time.Second,
			Window:     500 * time.Millisecond,
			Duties:     []float64{0.25, 0.5, 0.75},
			Freezers:   []string{freezerV1, freezerV2},
		},
		Reaction: reactionConfig{LoopPeriod: gpu.DefaultLoopPeriod, Trials: 30},
		Collect:  collectConfig{Iterations: 5000, ProcsPerGPU: 4},
		AgentCPU: agentCPUConfig{Duration: time.Minute, Warmup: 5 * time.Second, ProcsPerPod: 2,
			FullScrapePeriod: gpu.DefaultFullScrapePeriod, Roles: defaultGPURoles, GPUOff: true},
	}
}
