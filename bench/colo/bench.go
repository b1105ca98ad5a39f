package colo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/qos"
)

// benchConfig sizes `colo bench`.
type benchConfig struct {
	rounds     int
	steps      int           // LS load steps for the reaction measurement
	sweep      []float64     // thresholds for the trade-off curve
	sweepPhase time.Duration // length of each sweep point
	overhead   time.Duration // agent overhead measurement
	trace      string        // LS usage trace for the batch-cpu stability replay
	out        string
}

// benchResult is bench/out/colo.json.
type benchResult struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Config  any    `json:"config"`

	LSP99SoloMs    float64 `json:"ls_p99_solo_ms"`
	LSP99VanillaMs float64 `json:"ls_p99_vanilla_ms"`
	LSP99AgentMs   float64 `json:"ls_p99_agent_ms"`
	// The agent figures above are for the default mode (tier); in-place mode is below.
	LSP99AgentInPlaceMs float64 `json:"ls_p99_agent_inplace_ms"`

	BatchIdleShareVanilla      float64 `json:"batch_idle_share_vanilla"`
	BatchIdleShareAgent        float64 `json:"batch_idle_share_agent"`
	BatchIdleShareAgentInPlace float64 `json:"batch_idle_share_agent_inplace"`

	RatioAgent        float64 `json:"ls_p99_ratio_agent"`
	RatioAgentInPlace float64 `json:"ls_p99_ratio_agent_inplace"`
	RatioVanilla      float64 `json:"ls_p99_ratio_vanilla"`

	ReactionP50Ms float64   `json:"reaction_p50_ms"`
	ReactionP99Ms float64   `json:"reaction_p99_ms"`
	ReactionMaxMs float64   `json:"reaction_max_ms"`
	SettleP50Ms   float64   `json:"settle_p50_ms"`
	ReactionsMs   []float64 `json:"reactions_ms"`

	AgentCPUPct  float64 `json:"agent_cpu_pct"`
	AgentRSSMiB  float64 `json:"agent_rss_mib"`
	AgentPeakMiB float64 `json:"agent_rss_peak_mib"`
	AgentPods    int     `json:"agent_pods"`

	Phases []phaseResult `json:"phases"`
	Sweep  []sweepPoint  `json:"sweep"`

	// The published batch-cpu replayed over a recorded day of noisy LS usage
	// (stability.go); the three headline figures, then the whole result.
	BatchCPUChangesPerHour float64          `json:"batch_cpu_changes_per_hour"`
	BatchCPUMinOverMean    float64          `json:"batch_cpu_min_over_mean"`
	BatchCPUOvercommitMax  float64          `json:"batch_cpu_overcommit_max"`
	Stability              *stabilityResult `json:"stability,omitempty"`

	// The memory-pressure phases (memory.go): mem_* fields.
	*memoryResult

	// The scenario variants under each signal path, the per-path reaction and
	// overhead, and the target checks (runvariants.go, report.go).
	Variants *variantsResult `json:"variants,omitempty"`
}

type sweepPoint struct {
	Threshold float64 `json:"threshold"`
	P99Ratio  float64 `json:"p99_ratio"`
	P99Ms     float64 `json:"p99_ms"`
	IdleShare float64 `json:"batch_idle_share"`
	BatchCPUs float64 `json:"batch_cpus"`
}

func runBench(ctx context.Context, sc scenarioConfig, dc demoConfig, bc benchConfig, vc variantConfig,
	printf func(string, ...any)) error {
	logf := func(f string, a ...any) { printf("  "+f+"\n", a...) }
	sc.logf = logf
	started := time.Now()
	printf("colo bench: expected duration about %v on an idle machine\n", estimateDuration(dc, bc, vc).Round(time.Second))
	res := benchResult{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(),
		Config: map[string]any{"rate": sc.rate, "rounds_per_request": sc.rounds, "batch_pods": sc.batchPods,
			"threads_per_batch_pod": sc.threads, "phase_s": dc.phase.Seconds(), "rounds": bc.rounds,
			"threshold": dc.threshold, "period_ms": dc.period.Milliseconds(), "tier_parent": sc.tierParent,
			"variant_rounds": vc.rounds, "variant_phase_s": vc.phase.Seconds(), "signal_paths": vc.paths,
			"path_steps": vc.steps, "path_step_rate": vc.stepRate, "path_overhead_s": vc.overhead.Seconds()}}
	if bc.rounds > 0 || bc.steps > 0 || len(bc.sweep) > 0 {
		s, err := newScenario(sc)
		if err != nil {
			return err
		}
		err = s.benchScenario(ctx, dc, bc, &res, printf, logf)
		s.close()
		if err != nil {
			return err
		}
	}
	if dc.memory {
		mc := defaultMemoryConfig()
		if dc.memPhase > 0 {
			mc.Phase = dc.memPhase
		}
		printf("memory pressure: LS alone, batch without and with the agent on a %d MiB node\n", mc.Node/mib)
		mr, err := runMemory(ctx, sc, mc, printf)
		if err != nil {
			return err
		}
		res.memoryResult = &mr
	}
	if bc.trace != "" {
		st, err := runStability(bc.trace, qos.DefaultReclaimConfig(), dc.period)
		if err != nil {
			return err
		}
		res.BatchCPUChangesPerHour, res.BatchCPUMinOverMean, res.BatchCPUOvercommitMax =
			st.BatchCPUChangesPerHour, st.BatchCPUMinOverMean, st.BatchCPUOvercommitMax
		res.Stability = &st
		printStability(printf, st)
	}
	if bc.overhead > 0 {
		printf("agent overhead with 110 static pods (%v)\n", bc.overhead)
		ov, err := measureOverhead(ctx, sc, dc, bc.overhead)
		if err != nil {
			return err
		}
		res.AgentCPUPct, res.AgentRSSMiB, res.AgentPeakMiB, res.AgentPods = ov.cpuPct, ov.rssMiB, ov.peakMiB, ov.pods
		printf("  agent: %.2f%% of a core, RSS %.1f MiB (peak %.1f MiB), %d pods\n", ov.cpuPct, ov.rssMiB, ov.peakMiB, ov.pods)
	}
	if vc.enabled() {
		vr, err := runVariants(ctx, sc, dc, vc, printf, logf)
		if err != nil {
			return err
		}
		res.Variants = &vr
		printVariants(printf, vr)
	}
	printf("colo bench took %v\n", time.Since(started).Round(time.Second))
	if err := os.MkdirAll(filepath.Dir(bc.out), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(bc.out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	printf("wrote %s\n", bc.out)
	return nil
}

// benchScenario runs the parts of the benchmark that share one fake node: the paired
// rounds of the four phases, the reaction steps and the threshold sweep.
func (s *scenario) benchScenario(ctx context.Context, dc demoConfig, bc benchConfig, res *benchResult, printf, logf func(string, ...any)) error {
	if bc.rounds > 0 {
		// Paired rounds, so that drift on the machine hits every phase alike; in the fixed
		// order the recorded runs used, so that their numbers stay comparable.
		rounds, err := s.runRounds(ctx, dc, bc.rounds, false, printf, logf)
		if err != nil {
			return err
		}
		bands := summariseRounds(rounds)
		for _, b := range bands {
			res.Phases = append(res.Phases, b.Pooled)
		}
		solo, vanilla, tier, inplace := res.Phases[0], res.Phases[1], res.Phases[2], res.Phases[3]
		res.LSP99SoloMs, res.LSP99VanillaMs, res.LSP99AgentMs, res.LSP99AgentInPlaceMs = solo.P99ms, vanilla.P99ms, tier.P99ms, inplace.P99ms
		res.BatchIdleShareVanilla, res.BatchIdleShareAgent, res.BatchIdleShareAgentInPlace = vanilla.IdleShare, tier.IdleShare, inplace.IdleShare
		res.RatioVanilla, res.RatioAgent, res.RatioAgentInPlace = vanilla.P99ms/solo.P99ms, tier.P99ms/solo.P99ms, inplace.P99ms/solo.P99ms
		printTable(printf, "Pooled over rounds", res.Phases, solo.P99ms)
		printBands(printf, bands, bc.rounds, dc.phase)
	} else if err := s.startBatch(); err != nil {
		return err
	}
	if bc.steps > 0 {
		printf("reaction: %d LS load steps (idle → busy)\n", bc.steps)
		steps, _, err := s.reaction(ctx, dc, bc.steps, s.cfg.rate, logf)
		if err != nil {
			return err
		}
		sum := summarizeReaction(steps, reactionBusy)
		res.ReactionsMs = sum.StepMs
		res.ReactionP50Ms, res.ReactionP99Ms, res.ReactionMaxMs = sum.StepP50, sum.StepP99, sum.StepMax
		res.SettleP50Ms = sum.SettleP50
		printf("  reaction p50 %.0f ms, p99 %.0f ms, max %.0f ms; settle p50 %.0f ms\n", res.ReactionP50Ms, res.ReactionP99Ms, res.ReactionMaxMs, res.SettleP50Ms)
	}
	if len(bc.sweep) == 0 {
		return nil
	}
	printf("sweep of the policy threshold (%v each)\n", bc.sweepPhase)
	if err := s.placeBatch(true); err != nil {
		return err
	}
	for _, th := range bc.sweep {
		if _, err := s.startAgent(th, dc.period); err != nil {
			return err
		}
		if err := sleep(ctx, dc.warmup); err != nil {
			return err
		}
		r, err := s.measure(ctx, fmt.Sprintf("threshold %.2f", th), bc.sweepPhase)
		if err != nil {
			return err
		}
		_ = s.stopAgent()
		soloNow, err := s.soloP99(ctx, bc.sweepPhase)
		if err != nil {
			return err
		}
		p := sweepPoint{Threshold: th, P99Ms: r.P99ms, P99Ratio: r.P99ms / soloNow, IdleShare: r.IdleShare, BatchCPUs: r.BatchCPU / r.Seconds}
		res.Sweep = append(res.Sweep, p)
		printf("  threshold %.2f: p99 %.2f ms (%.2f× solo), batch %.2f CPUs, idle share %.2f\n", th, p.P99Ms, p.P99Ratio, p.BatchCPUs, p.IdleShare)
	}
	return nil
}

// soloP99 measures the LS service alone for d (batch paused by freezing is not used:
// the workers are stopped and restarted in place).
func (s *scenario) soloP99(ctx context.Context, d time.Duration) (float64, error) {
	pids := s.batchPIDs()
	s.thawBatch() // a frozen worker would not die
	for _, p := range s.batch {
		_ = stopBurner(p)
	}
	r, err := s.measure(ctx, "solo", d)
	if err != nil {
		return 0, err
	}
	if len(pids) > 0 {
		if err := s.startBatch(); err != nil {
			return 0, err
		}
		if err := s.placeBatch(true); err != nil {
			return 0, err
		}
	}
	return r.P99ms, nil
}

// reaction steps the LS load from idle to busy and times how long the agent takes to cut
// the tier's limit. A cut counts once the limit is at least cutMargin cores below where
// it stood at the step, so that noise-level adjustments are not mistaken for a reaction.
// Settle time is until the limit is within settleBand of where it ends up.
//
// It also returns what the agent's /metrics said at the end of the steps: the signal
// source it ran and its own cut-reaction histogram (a zero value if unreadable).
//
// rate is the LS load of each step (requests/s). Before each step LS idles at least
// idleFor and until the limit has stopped rising for restoredFor (at most restoreMax):
// the agent restores batch slowly after a cut, and a step that starts from a limit still
// held low by the previous one has little left to cut.
//
// Each step also records when LS harm began (OnsetMs), by a probe of the bench's own
// (onsetWatch) where the machine can load one: a reaction is then timed from the harm,
// which is what the agent reacts to, and a step that never harmed LS needs no cut.
func (s *scenario) reaction(ctx context.Context, dc demoConfig, steps int, rate float64, logf func(string, ...any)) ([]reactionStep, agentSignals, error) {
	const busyFor = reactionBusy
	var sig agentSignals
	const (
		cutMargin   = 0.1
		settleBand  = 0.05
		idleFor     = 2 * time.Second
		restoredFor = 3 * time.Second // past the agent's hold after a cut (1 s)
		restoreMax  = 20 * time.Second
		poll        = time.Millisecond
	)
	if err := s.placeBatch(true); err != nil {
		return nil, sig, err
	}
	ow, err := newOnsetWatch(s.hier, s.lsCg)
	if err != nil {
		logf("warning: reactions timed from the step only: %v", err)
	} else {
		defer ow.close()
	}
	a, err := s.startAgent(dc.threshold, dc.period)
	if err != nil {
		return nil, sig, err
	}
	defer func() { _ = s.stopAgent() }()
	tier, err := s.hier.Load(s.tier())
	if err != nil {
		return nil, sig, err
	}
	readLimit := func() (float64, error) {
		q, p, err := tier.CPULimit()
		if err != nil {
			return 0, err
		}
		if q < 0 {
			return float64(numCPU()), nil
		}
		return q.Seconds() / p.Seconds(), nil
	}
	var out []reactionStep
	for i := range steps {
		if err := waitRestored(ctx, readLimit, idleFor, restoredFor, restoreMax); err != nil {
			return nil, sig, err
		}
		before, err := readLimit()
		if err != nil {
			return nil, sig, err
		}
		type sample struct {
			at    time.Duration
			limit float64
		}
		var (
			trace []sample
			mu    sync.Mutex
		)
		pollCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		t0 := time.Now()
		wg.Go(func() {
			tk := time.NewTicker(poll)
			defer tk.Stop()
			for {
				select {
				case <-pollCtx.Done():
					return
				case <-tk.C:
					if l, err := readLimit(); err == nil {
						mu.Lock()
						trace = append(trace, sample{time.Since(t0), l})
						mu.Unlock()
					}
				}
			}
		})
		onset := -1.0
		if ow != nil {
			wg.Go(func() {
				if d, ok := ow.first(pollCtx, t0); ok {
					onset = float64(d.Microseconds()) / 1000
				}
			})
		}
		gen := newOpenLoop("http://"+s.lsAddr+"/work", rate, s.cfg.workers)
		_, err = gen.run(ctx, busyFor)
		stop()
		wg.Wait()
		if err != nil {
			return nil, sig, err
		}
		final := trace[len(trace)-1].limit
		react, settle := -1.0, -1.0
		for _, smp := range trace {
			if react < 0 && smp.limit <= before-cutMargin {
				react = float64(smp.at.Microseconds()) / 1000
			}
		}
		for j := len(trace) - 1; j >= 0; j-- {
			if d := trace[j].limit - final; d > settleBand || d < -settleBand {
				if j+1 < len(trace) {
					settle = float64(trace[j+1].at.Microseconds()) / 1000
				}
				break
			}
			settle = float64(trace[j].at.Microseconds()) / 1000
		}
		if react < 0 {
			logf("step %d: no cut of ≥ %.1f CPU (limit %.2f → %.2f, LS harm at %.0f ms)", i+1, cutMargin, before, final, onset)
		}
		if react > 2*float64(dc.period.Milliseconds()) {
			// A slow step: show how the limit moved, to tell a late cut from a small one.
			var b strings.Builder
			next := 0.0
			for _, smp := range trace {
				if at := float64(smp.at.Microseconds()) / 1000; at >= next {
					fmt.Fprintf(&b, " %.0fms:%.2f", at, smp.limit)
					next = at + 50
				}
			}
			logf("step %d: cut after %.0f ms, LS harm at %.0f ms (limit %.2f before); limit over the step:%s", i+1, react, onset, before, b.String())
		}
		out = append(out, reactionStep{CutMs: react, SettleMs: settle, OnsetMs: onset, HaveOnset: ow != nil,
			OnsetBatch: ow != nil && ow.batch})
	}
	if sig, err = readAgentSignals(a); err != nil {
		logf("warning: reading the agent's signal metrics: %v", err)
	}
	return out, sig, nil
}

// reactionStep is one LS load step of reaction.
type reactionStep struct {
	CutMs     float64 // step → the tier's limit cut; -1: no cut
	SettleMs  float64 // step → the limit within the settle band of its end
	OnsetMs   float64 // step → LS harm (onsetWatch); -1: none, or no probe
	HaveOnset bool    // the bench's probe watched the step
	// OnsetBatch: the probe counted only harm batch caused (onsetWatch.batch).
	OnsetBatch bool
}

// reactionSummary sums up the steps. StepMs times each step to its cut, a step without
// one counting as the step's length. FromHarmMs times each harmed step (a probe saw
// harm) from the harm to the cut: 0 when the cut came first (the agent saw the harm
// sooner, or cut on utilisation), the rest of the step when no cut followed. Both in
// step order; the quantiles are over them (0 when empty).
type reactionSummary struct {
	StepMs, FromHarmMs             []float64
	StepP50, StepP99, StepMax      float64
	SettleP50                      float64
	FromHarmP50, FromHarmP99       float64
	NoCut, Harmed, CutsWithoutHarm int
	Probed                         bool
	// ProbedBatch: the probe counted only harm batch caused.
	ProbedBatch bool
}

func summarizeReaction(steps []reactionStep, busy time.Duration) reactionSummary {
	var r reactionSummary
	var settles []float64
	busyMs := float64(busy.Milliseconds())
	for _, st := range steps {
		r.Probed = r.Probed || st.HaveOnset
		r.ProbedBatch = r.ProbedBatch || st.OnsetBatch
		cut := st.CutMs
		if cut < 0 {
			r.NoCut++
			cut = busyMs
		}
		r.StepMs, settles = append(r.StepMs, cut), append(settles, st.SettleMs)
		switch {
		case st.OnsetMs >= 0:
			r.Harmed++
			r.FromHarmMs = append(r.FromHarmMs, max(0, cut-st.OnsetMs))
		case st.HaveOnset && st.CutMs >= 0:
			r.CutsWithoutHarm++
		}
	}
	sorted := slices.Sorted(slices.Values(r.StepMs))
	r.StepP50, r.StepP99 = fquantile(sorted, .5), fquantile(sorted, .99)
	if len(sorted) > 0 {
		r.StepMax = sorted[len(sorted)-1]
	}
	slices.Sort(settles)
	r.SettleP50 = fquantile(settles, .5)
	harm := slices.Sorted(slices.Values(r.FromHarmMs))
	r.FromHarmP50, r.FromHarmP99 = fquantile(harm, .5), fquantile(harm, .99)
	return r
}

// waitRestored sleeps at least minIdle, then until read's value has not risen for
// stableFor, or until maxIdle in all.
func waitRestored(ctx context.Context, read func() (float64, error), minIdle, stableFor, maxIdle time.Duration) error {
	const poll = 100 * time.Millisecond
	start := time.Now()
	if err := sleep(ctx, minIdle); err != nil {
		return err
	}
	last, err := read()
	if err != nil {
		return err
	}
	stableSince := time.Now()
	for time.Since(stableSince) < stableFor && time.Since(start) < maxIdle {
		if err := sleep(ctx, poll); err != nil {
			return err
		}
		v, err := read()
		if err != nil {
			return err
		}
		if v > last+1e-3 {
			stableSince = time.Now()
		}
		last = v
	}
	return nil
}

// reactionBusy is how long each reaction step loads LS; a step without a cut counts as
// this long.
const reactionBusy = 1500 * time.Millisecond

type overhead struct {
	cpuPct, rssMiB, peakMiB float64
	pods                    int
	sig                     agentSignals // what the agent's /metrics said at the end
}

// measureOverhead runs the agent over 110 static pods (1 LS, the batch pods, the rest
// idle pods of every class) with the LS service under load and batch running, and
// measures the agent process's CPU and memory.
func measureOverhead(ctx context.Context, sc scenarioConfig, dc demoConfig, d time.Duration) (overhead, error) {
	const pods = 110
	sc.extraPods = pods - 1 - sc.batchPods
	s, err := newScenario(sc)
	if err != nil {
		return overhead{}, err
	}
	defer s.close()
	if err := s.startBatch(); err != nil {
		return overhead{}, err
	}
	a, err := s.startAgent(dc.threshold, dc.period)
	if err != nil {
		return overhead{}, err
	}
	if err := sleep(ctx, dc.warmup); err != nil {
		return overhead{}, err
	}
	pid := a.cmd.Process.Pid
	c0, err := proc.ReadCPU("/proc", pid)
	if err != nil {
		return overhead{}, err
	}
	t0 := time.Now()
	if _, err := s.measure(ctx, "overhead", d); err != nil {
		return overhead{}, err
	}
	c1, err := proc.ReadCPU("/proc", pid)
	if err != nil {
		return overhead{}, err
	}
	wall := time.Since(t0)
	rss, peak, err := proc.ReadRSS("/proc", pid)
	if err != nil {
		return overhead{}, err
	}
	st, err := a.status()
	if err != nil {
		return overhead{}, err
	}
	n := 0
	for _, ps := range st.Pods {
		n += len(ps)
	}
	if n != pods {
		return overhead{}, fmt.Errorf("agent tracks %d pods, want %d", n, pods)
	}
	sig, err := readAgentSignals(a)
	if err != nil {
		return overhead{}, err
	}
	return overhead{cpuPct: 100 * (c1 - c0).Seconds() / wall.Seconds(), rssMiB: float64(rss) / (1 << 20),
		peakMiB: float64(peak) / (1 << 20), pods: n, sig: sig}, nil
}

func fquantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	model := "unknown CPU"
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs, %s, %s/%s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH)
}
