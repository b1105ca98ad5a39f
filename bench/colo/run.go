package colo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
)

// Printf prints a line of a run's report (cmd/colo passes fmt.Printf).
type Printf func(format string, args ...any)

// Options are the settings of `colo demo` and `colo bench`: cmd/colo's flags set them,
// DefaultOptions gives their defaults. Demo reads the scenario and demo fields; Bench
// reads all of them.
type Options struct {
	// The scenario.
	CgroupRoot string        // cgroupfs mount
	Koordlet   string        // the koordlet binary
	Self       string        // this binary, re-executed as the LS server and the batch pods (Child)
	BatchPods  int           // batch pods, 1..100
	Threads    int           // busy threads per batch pod
	Work       int           // SHA-256 rounds per LS request (≈1.5 µs each)
	Rate       float64       // LS requests per second
	Conns      int           // load generator connections
	LSCPU      string        // LS pod CPU request
	AgentPprof bool          // start the agent with -pprof
	TierParent string        // where the agent creates its batch tier: kubepods or besteffort
	CFSPeriod  time.Duration // the agent's CFS bandwidth period (0: its default)

	// The measured phases (demo and bench).
	Phase       time.Duration // length of each measured CPU phase
	Rounds      int           // paired rounds of the four CPU phases
	Memory      bool          // also run the memory-pressure phases
	MemoryPhase time.Duration // length of each memory phase (0: the memory scenario's own, 15 s)
	Warmup      time.Duration // agent warm-up (and batch's, without the agent) before measuring
	Threshold   float64       // policy threshold of the agent phases
	Period      time.Duration // agent control period

	// Bench only.
	Steps      int           // LS load steps for the reaction time
	Sweep      string        // thresholds for the trade-off curve, comma-separated (empty: none)
	SweepPhase time.Duration // length of each sweep point
	Overhead   time.Duration // agent overhead measurement
	Out        string        // the JSON result
	Trace      string        // LS usage trace of the batch-cpu stability replay (empty: none)

	// Bench only: the scenario variants, each under every signal path.
	Variants      string        // variant names, comma-separated (empty: none)
	SignalPaths   string        // the agent's signals.mode per run, comma-separated (empty: none)
	VariantRounds int           // paired rounds per variant
	VariantPhase  time.Duration // length of each variant phase
	PathSteps     int           // LS load steps per signal path for its reaction time
	PathStepRate  float64       // LS requests/s of each such step (0: Rate)
	PathOverhead  time.Duration // agent overhead run (110 pods) per signal path
}

// DefaultOptions are `make demo`'s and `make bench-colo`'s settings; self is this
// binary, and the koordlet binary is looked for beside it.
func DefaultOptions(self string) Options {
	return Options{
		CgroupRoot: "/sys/fs/cgroup", Koordlet: filepath.Join(filepath.Dir(self), "koordlet"), Self: self,
		BatchPods: 4, Threads: 2, Work: 300, Rate: 500, Conns: 64, LSCPU: "1",
		TierParent: config.TierParentKubepods,
		Phase:      8 * time.Second, Memory: true, Warmup: time.Second, Threshold: qos.DefaultThreshold,
		Period: 100 * time.Millisecond,
		Rounds: 5, Steps: 30, Sweep: "0.6,0.7,0.8,0.9,0.95,1.0", SweepPhase: 8 * time.Second,
		Overhead: 30 * time.Second, Out: "bench/out/colo.json", Trace: defaultStabilityTrace,
		Variants: "base,ls-heavy,small-batch,membw,bursty", SignalPaths: "ebpf,psi,sampling",
		VariantRounds: 3, VariantPhase: 10 * time.Second, PathSteps: 20, PathStepRate: 3000,
		PathOverhead: 20 * time.Second,
	}
}

// DemoOptions are `make demo`'s settings: DefaultOptions with shorter CPU phases in
// rotated rounds, and shorter memory phases, so that the demo takes under 4 minutes.
func DemoOptions(self string) Options {
	o := DefaultOptions(self)
	o.Phase, o.Rounds, o.MemoryPhase = 6*time.Second, 4, 8*time.Second
	return o
}

// MemoryNodeMiB is the memory scenario's fake node size (its kubepods limit), MiB.
func MemoryNodeMiB() int64 { return defaultMemoryConfig().Node / mib }

// Demo runs `make demo`: the memory-pressure phases, then LS alone, with batch and no
// agent, and with batch under the agent in each mode, in o.Rounds rotated rounds,
// printed with their round-to-round band.
func Demo(ctx context.Context, o Options, printf Printf) error {
	sc, dc, _, _, err := o.configs()
	if err != nil {
		return err
	}
	return runDemo(ctx, sc, dc, printf)
}

// Bench runs `make bench-colo` and writes o.Out.
func Bench(ctx context.Context, o Options, printf Printf) error {
	sc, dc, bc, vc, err := o.configs()
	if err != nil {
		return err
	}
	return runBench(ctx, sc, dc, bc, vc, printf)
}

// configs checks o and splits it into the scenario's, the demo's, the bench's and the
// variants' settings.
func (o Options) configs() (scenarioConfig, demoConfig, benchConfig, variantConfig, error) {
	sc := scenarioConfig{cgroupRoot: o.CgroupRoot, koordlet: o.Koordlet, self: o.Self, batchPods: o.BatchPods,
		threads: o.Threads, rounds: o.Work, rate: o.Rate, workers: o.Conns, lsCPU: o.LSCPU,
		agentPprof: o.AgentPprof, tierParent: o.TierParent, cfsPeriod: o.CFSPeriod}
	dc := demoConfig{phase: o.Phase, warmup: o.Warmup, threshold: o.Threshold, period: o.Period, memory: o.Memory,
		rounds: o.Rounds, memPhase: o.MemoryPhase}
	bc := benchConfig{rounds: o.Rounds, steps: o.Steps, sweepPhase: o.SweepPhase, overhead: o.Overhead,
		out: o.Out, trace: o.Trace}
	vc := variantConfig{rounds: o.VariantRounds, phase: o.VariantPhase, steps: o.PathSteps,
		stepRate: o.PathStepRate, overhead: o.PathOverhead}
	fail := func(err error) (scenarioConfig, demoConfig, benchConfig, variantConfig, error) {
		return scenarioConfig{}, demoConfig{}, benchConfig{}, variantConfig{}, err
	}
	var err error
	if vc.paths, err = selectPaths(o.SignalPaths); err != nil {
		return fail(err)
	}
	if vc.variants, err = selectVariants(defaultVariants(sc), o.Variants); err != nil {
		return fail(err)
	}
	if vc.rounds < 0 || vc.steps < 0 || vc.stepRate < 0 || vc.overhead < 0 || (vc.rounds > 0 && len(vc.variants) > 0 && vc.phase <= 0) {
		return fail(errors.New("-variant-rounds, -path-steps, -path-step-rate and -path-overhead must be ≥ 0, -variant-phase > 0"))
	}
	for _, f := range strings.Split(o.Sweep, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 || v > 1 {
			return fail(fmt.Errorf("-sweep: %q is not a threshold in (0, 1]", f))
		}
		bc.sweep = append(bc.sweep, v)
	}
	if o.Rounds < 0 || o.MemoryPhase < 0 || (o.Rounds > 0 && o.Phase <= 0) {
		return fail(errors.New("-rounds and -memory-phase must be ≥ 0, -phase > 0"))
	}
	if sc.batchPods < 1 || sc.batchPods > 100 || sc.threads < 1 || sc.rate <= 0 || sc.workers < 1 || sc.rounds < 1 {
		return fail(errors.New("-batch-pods (1..100), -threads, -rate, -conns and -work must be positive"))
	}
	if _, err := os.Stat(sc.koordlet); err != nil {
		return fail(fmt.Errorf("koordlet binary: %w (run `make build` first, or pass -koordlet)", err))
	}
	return sc, dc, bc, vc, nil
}

// Stability replays the LS usage trace at path through the batch-cpu reclaim policy
// with the given control period, and prints the result.
func Stability(path string, period time.Duration, printf Printf) error {
	st, err := runStability(path, qos.DefaultReclaimConfig(), period)
	if err != nil {
		return err
	}
	printStability(printf, st)
	return nil
}

// GenerateTrace writes the LS usage trace anew to path, from the committed trace's seed.
func GenerateTrace(path string) error {
	return generateLSTrace(path, defaultTraceSeed)
}
