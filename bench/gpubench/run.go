package gpubench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/koordlet/gpu"
)

// DefaultConfig is `make bench-gpu`: 10 s duty-cycled and 10 s unfrozen per duty point,
// 30 reaction trials at the agent's loop period, 5000 timed scrapes, and the agent's CPU
// over 60 s with GPU features on and 60 s off, at the agent's GPU defaults.
func DefaultConfig() Config {
	return Config{
		Out:   "bench/out/gpu.json",
		Parts: Parts(),
		Duty: DutyConfig{
			CgroupRoot: "/sys/fs/cgroup",
			Period:     100 * time.Millisecond,
			Point:      10 * time.Second,
			Window:     500 * time.Millisecond,
			Duties:     []float64{0.25, 0.5, 0.75},
			Freezers:   []string{freezerV1, freezerV2},
		},
		Reaction: ReactionConfig{LoopPeriod: gpu.DefaultLoopPeriod, Trials: 30},
		Collect:  CollectConfig{Iterations: 5000, ProcsPerGPU: 4},
		AgentCPU: AgentCPUConfig{Duration: time.Minute, Warmup: 5 * time.Second, ProcsPerPod: 2,
			FullScrapePeriod: gpu.DefaultFullScrapePeriod, Roles: defaultGPURoles(), GPUOff: true},
	}
}

// Run checks cfg, fills in what the parts share (the reaction and agent_cpu parts take
// the duty part's cgroup root and period, agent_cpu the reaction part's loop period),
// runs cfg.Parts and writes cfg.Out. Progress goes to printf.
func Run(ctx context.Context, cfg Config, printf func(string, ...any)) error {
	if err := cfg.Duty.validate(); err != nil {
		return err
	}
	if len(cfg.Parts) == 0 {
		return errors.New("-parts: no part given")
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
	if err := cfg.AgentCPU.validate(); err != nil {
		return err
	}
	return runBench(ctx, cfg, printf)
}

// ParseDuties reads a comma-separated list of duty cycles, fractions in (0, 1).
func ParseDuties(s string) ([]float64, error) {
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

// ParseParts reads a comma-separated list of parts; they run in Parts' order whatever
// the order given.
func ParseParts(s string) ([]string, error) {
	all := Parts()
	var want []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(all, p) {
			return nil, fmt.Errorf("-parts: %q is not one of %s", p, strings.Join(all, ", "))
		}
		want = append(want, p)
	}
	if len(want) == 0 {
		return nil, errors.New("-parts: no part given")
	}
	var out []string
	for _, p := range all {
		if slices.Contains(want, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// agentNodeCmd is the subcommand the agent_cpu part re-executes its binary with: the
// agent under test, in its own process, over the node the part set up. Its arguments
// are this package's own (written by agentcpu.go, read by Child), not a user's command
// line, which is why they are parsed here and not in cmd/gpu-bench/main.go.
const agentNodeCmd = "agent-node"

// IsChild reports whether args (without the program name) start the agent_cpu part's
// agent process, which Child runs.
func IsChild(args []string) bool { return len(args) > 0 && args[0] == agentNodeCmd }

// Child runs the agent_cpu part's agent process (agent-node -spec FILE) until ctx ends;
// its usage errors go to stderr. cmd/gpu-bench calls it for IsChild arguments, and so
// does this package's TestMain.
func Child(ctx context.Context, args []string, stderr io.Writer) error {
	if !IsChild(args) {
		return fmt.Errorf("%q: not the agent process", args)
	}
	fs := flag.NewFlagSet("gpu-bench "+agentNodeCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	spec := fs.String("spec", "", "the node, as the agent_cpu part wrote it (JSON)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *spec == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: gpu-bench %s -spec FILE", agentNodeCmd)
	}
	return runAgentNode(ctx, *spec, stderr)
}
