package colo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// variantConfig sizes the variant section of `colo bench`.
type variantConfig struct {
	variants []variant
	paths    []string      // signal paths (signals.mode) of the agent phases
	rounds   int           // paired rounds per variant
	phase    time.Duration // length of each measured phase
	steps    int           // LS load steps per signal path for the reaction time (base scenario)
	stepRate float64       // LS requests/s of each such step (0: the scenario's rate)
	overhead time.Duration // agent overhead with 110 pods per signal path
}

func (vc variantConfig) enabled() bool {
	return len(vc.paths) > 0 && ((len(vc.variants) > 0 && vc.rounds > 0) || vc.steps > 0 || vc.overhead > 0)
}

// runVariants runs every variant's rounds, then per signal path the reaction steps and
// the overhead run, and checks the targets (report.go).
func runVariants(ctx context.Context, sc scenarioConfig, dc demoConfig, vc variantConfig,
	printf, logf func(string, ...any)) (variantsResult, error) {
	res := variantsResult{Rounds: vc.rounds, PhaseS: vc.phase.Seconds(), Paths: vc.paths,
		Variants: []variantResult{}, SignalPaths: []signalPathInfo{}}
	// A path the agent refuses is refused for the whole run (same binary, same config).
	rejected := map[string]string{}
	vdc := dc
	vdc.phase = vc.phase
	if vc.rounds > 0 {
		for _, v := range vc.variants {
			printf("variant %s: %s\n", v.Name, v.Description)
			vr, err := runVariant(ctx, v.apply(sc), v, vdc, vc, rejected, printf, logf)
			if err != nil {
				return res, fmt.Errorf("variant %s: %w", v.Name, err)
			}
			res.Variants = append(res.Variants, vr)
		}
	}
	if vc.steps > 0 || vc.overhead > 0 {
		for _, p := range vc.paths {
			sp, err := runSignalPath(ctx, sc, dc, vc, p, rejected, printf, logf)
			if err != nil {
				return res, fmt.Errorf("signal path %s: %w", p, err)
			}
			res.SignalPaths = append(res.SignalPaths, sp)
		}
	}
	res.Targets = targetChecks(res.Variants, res.SignalPaths)
	res.AllMet = allMet(res.Targets)
	return res, nil
}

// runVariant runs the paired rounds of one variant on its own fake node.
func runVariant(ctx context.Context, sc scenarioConfig, v variant, dc demoConfig, vc variantConfig,
	rejected map[string]string, printf, logf func(string, ...any)) (variantResult, error) {
	s, err := newScenario(sc)
	if err != nil {
		return variantResult{}, err
	}
	defer s.close()
	var (
		rounds         []variantRound
		solo, vanilla  []phaseResult
		pooledByPath   = map[string][]phaseResult{}
		agentPhaseName = func(p string) string { return "agent tier, " + p }
	)
	for i := range vc.rounds {
		printf("  round %d/%d\n", i+1, vc.rounds)
		// Rotate the order of the paths from round to round, so that no path always
		// runs first after plain BestEffort (or last, on a warmer machine).
		order := make([]string, 0, len(vc.paths))
		for j := range vc.paths {
			order = append(order, vc.paths[(i+j)%len(vc.paths)])
		}
		r, so, va, err := s.variantRound(ctx, dc, order, rejected, agentPhaseName, logf)
		if err != nil {
			return variantResult{}, err
		}
		r.Round = i + 1
		// Keep the table's order of paths in the JSON, whatever order they ran in.
		sort.SliceStable(r.Agent, func(a, b int) bool {
			return indexOf(vc.paths, r.Agent[a].Path) < indexOf(vc.paths, r.Agent[b].Path)
		})
		for _, a := range r.Agent {
			pooledByPath[a.Path] = append(pooledByPath[a.Path], a.phase)
		}
		rounds, solo, vanilla = append(rounds, r), append(solo, so), append(vanilla, va)
	}
	vr := summarise(v, rounds, solo, vanilla, vc.paths, rejected)
	rows := []phaseResult{pool("LS alone", solo), pool("LS + batch, no agent", vanilla)}
	for _, p := range vc.paths {
		if ps := pooledByPath[p]; len(ps) > 0 {
			rows = append(rows, pool(agentPhaseName(p), ps))
		}
	}
	printTable(printf, fmt.Sprintf("Variant %s, pooled over %d rounds (noise %.3f)", v.Name, vc.rounds, vr.Noise.Value),
		rows, rows[0].P99ms)
	return vr, nil
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return len(xs)
}

// variantRound measures LS alone, LS with batch under plain BestEffort, then under the
// agent (tier mode) once per signal path in the given order. A path the agent refuses
// is recorded in rejected and skipped from then on. It leaves the batch running.
func (s *scenario) variantRound(ctx context.Context, dc demoConfig, order []string, rejected map[string]string,
	name func(string) string, logf func(string, ...any)) (variantRound, phaseResult, phaseResult, error) {
	var r variantRound
	s.thawBatch() // a frozen worker would not die
	for _, p := range s.batch {
		_ = stopBurner(p)
	}
	logf("LS alone (%v)", dc.phase)
	solo, err := s.measure(ctx, "LS alone", dc.phase)
	if err != nil {
		return r, solo, phaseResult{}, err
	}
	if err := s.resetBatch(); err != nil {
		return r, solo, phaseResult{}, err
	}
	if err := s.startBatch(); err != nil {
		return r, solo, phaseResult{}, err
	}
	logf("LS + %d batch pods, plain BestEffort (%v)", len(s.batch), dc.phase)
	vanilla, err := s.measure(ctx, "LS + batch, no agent", dc.phase)
	if err != nil {
		return r, solo, vanilla, err
	}
	r.SoloP99Ms, r.VanillaP99Ms = solo.P99ms, vanilla.P99ms
	r.RatioVanilla, r.VanillaIdleShare = round3(pratio(vanilla.P99ms, solo.P99ms)), round3(vanilla.IdleShare)
	defer func() { s.signalsMode = "" }()
	for _, path := range order {
		if _, ok := rejected[path]; ok {
			continue
		}
		if err := s.placeBatch(true); err != nil {
			return r, solo, vanilla, err
		}
		s.signalsMode = modeFor(path)
		logf("LS + batch, agent tier, signals.mode %s (%v)", path, dc.phase)
		a, err := s.startAgent(dc.threshold, dc.period)
		if errors.Is(err, errSignalsRejected) {
			rejected[path] = err.Error()
			logf("signals.mode %s: refused by the agent; this path is skipped: %v", path, err)
			if err := s.placeBatch(false); err != nil {
				return r, solo, vanilla, err
			}
			continue
		}
		if err != nil {
			return r, solo, vanilla, err
		}
		if err := sleep(ctx, dc.warmup); err != nil {
			return r, solo, vanilla, err
		}
		ph, err := s.measure(ctx, name(path), dc.phase)
		if err != nil {
			return r, solo, vanilla, err
		}
		sig, serr := readAgentSignals(a)
		if serr != nil {
			logf("warning: reading the agent's signal metrics: %v", serr)
		}
		if st, err := a.status(); err == nil {
			ph.PublishedBatchCPU = st.BatchResources.CPU.Published
			ph.PublishedBatchMemory = st.BatchResources.Memory.Published
		}
		if err := s.stopAgent(); err != nil {
			logf("warning: agent exit: %v", err)
		}
		ar := newAgentRound(path, sig, ph, solo.P99ms, vanilla.P99ms)
		if !ar.SourceMatches {
			_, note := sourceVerdict(path, sig.Source)
			logf("%s", note)
		}
		r.Agent = append(r.Agent, ar)
		if err := s.placeBatch(false); err != nil {
			return r, solo, vanilla, err
		}
		if err := s.resetBatch(); err != nil {
			return r, solo, vanilla, err
		}
	}
	return r, solo, vanilla, nil
}

// runSignalPath measures one signal path on the base scenario: the reaction to LS load
// steps, then the agent's overhead with 110 pods.
func runSignalPath(ctx context.Context, sc scenarioConfig, dc demoConfig, vc variantConfig, path string,
	rejected map[string]string, printf, logf func(string, ...any)) (signalPathInfo, error) {
	sp := signalPathInfo{Path: path}
	if why, ok := rejected[path]; ok {
		sp.Rejected = why
		printf("signal path %s: skipped, the agent refused it\n", path)
		return sp, nil
	}
	sc.signalsMode = modeFor(path)
	matches := true
	verdict := func(sig agentSignals) {
		if ok, note := sourceVerdict(path, sig.Source); !ok {
			matches = false
			if sp.Note == "" {
				sp.Note = note
			}
		}
	}
	if vc.steps > 0 {
		printf("signal path %s: reaction to %d LS load steps (idle → busy)\n", path, vc.steps)
		s, err := newScenario(sc)
		if err != nil {
			return sp, err
		}
		err = s.startBatch()
		var steps []reactionStep
		var sig agentSignals
		if err == nil {
			rate := vc.stepRate
			if rate <= 0 {
				rate = sc.rate
			}
			steps, sig, err = s.reaction(ctx, dc, vc.steps, rate, logf)
		}
		s.close()
		if errors.Is(err, errSignalsRejected) {
			rejected[path], sp.Rejected = err.Error(), err.Error()
			printf("  refused by the agent: %v\n", err)
			return sp, nil
		}
		if err != nil {
			return sp, err
		}
		verdict(sig)
		sum := summarizeReaction(steps, reactionBusy)
		sp.Reaction, sp.ReactionsMs, sp.StepsWithoutCut = &sig, sum.StepMs, sum.NoCut
		sp.ReactionP50Ms, sp.ReactionP99Ms, sp.ReactionMaxMs = sum.StepP50, sum.StepP99, sum.StepMax
		sp.SettleP50Ms = sum.SettleP50
		printf("  source %q: from the step, reaction p50 %.0f ms, p99 %.0f ms, max %.0f ms (%d of %d steps without a cut); settle p50 %.0f ms\n",
			sig.Source, sp.ReactionP50Ms, sp.ReactionP99Ms, sp.ReactionMaxMs, sp.StepsWithoutCut, len(steps), sp.SettleP50Ms)
		if sp.OnsetProbe = sum.Probed; sum.Probed {
			sp.OnsetBatchOnly = sum.ProbedBatch
			sp.HarmedSteps, sp.CutsWithoutHarm, sp.FromHarmMs = sum.Harmed, sum.CutsWithoutHarm, sum.FromHarmMs
			sp.FromHarmP50Ms, sp.FromHarmP99Ms = sum.FromHarmP50, sum.FromHarmP99
			cause := "any cause"
			if sp.OnsetBatchOnly {
				cause = "batch's"
			}
			printf("  from LS harm (the bench's probe, %s): %d of %d steps harmed LS, reaction p50 %.0f ms, p99 %.0f ms; %d cuts without harm\n",
				cause, sp.HarmedSteps, len(steps), sp.FromHarmP50Ms, sp.FromHarmP99Ms, sp.CutsWithoutHarm)
		}
	}
	if vc.overhead > 0 {
		printf("signal path %s: agent overhead with 110 static pods (%v)\n", path, vc.overhead)
		ov, err := measureOverhead(ctx, sc, dc, vc.overhead)
		if errors.Is(err, errSignalsRejected) {
			rejected[path], sp.Rejected = err.Error(), err.Error()
			printf("  refused by the agent: %v\n", err)
			return sp, nil
		}
		if err != nil {
			return sp, err
		}
		verdict(ov.sig)
		sp.Overhead = &ov.sig
		sp.AgentCPUPct, sp.AgentRSSMiB, sp.AgentPeakMiB, sp.AgentPods = ov.cpuPct, ov.rssMiB, ov.peakMiB, ov.pods
		printf("  source %q: agent %.2f%% of a core, RSS %.1f MiB (peak %.1f MiB), %d pods\n",
			ov.sig.Source, ov.cpuPct, ov.rssMiB, ov.peakMiB, ov.pods)
	}
	sp.SourceMatches = matches
	return sp, nil
}

// Rough costs, for the duration printed at the start (measured on the 2-vCPU VM).
const (
	estAgentCycle    = 1500 * time.Millisecond // agent start, health, stop
	estScenarioSetUp = 2 * time.Second         // cgroups, manifests, LS server
	estReactionStep  = 14 * time.Second        // ≥ 2 s idle until the limit restores, 1.5 s busy
	estMemoryFixed   = 20 * time.Second        // the memory phases beside their measured time (43 s with 8 s phases)
	estStability     = 5 * time.Second         // the batch-cpu replay
)

// estMemory is how long the memory-pressure phases take with phases of length phase
// (0: the memory scenario's own).
func estMemory(phase time.Duration) time.Duration {
	if phase <= 0 {
		phase = defaultMemoryConfig().Phase
	}
	return estMemoryFixed + 3*phase
}

// estimateDuration is how long `colo bench` will take with these settings, roughly.
func estimateDuration(dc demoConfig, bc benchConfig, vc variantConfig) time.Duration {
	var d time.Duration
	if bc.rounds > 0 || bc.steps > 0 || len(bc.sweep) > 0 {
		d += estScenarioSetUp
	}
	d += time.Duration(bc.rounds) * estRound(dc)
	if bc.steps > 0 {
		d += estAgentCycle + time.Duration(bc.steps)*estReactionStep
	}
	d += time.Duration(len(bc.sweep)) * (2*bc.sweepPhase + dc.warmup + estAgentCycle)
	if bc.overhead > 0 {
		d += estScenarioSetUp + estAgentCycle + dc.warmup + bc.overhead
	}
	if dc.memory {
		d += estMemory(dc.memPhase)
	}
	if bc.trace != "" {
		d += estStability
	}
	if len(vc.paths) == 0 {
		return d
	}
	paths := time.Duration(len(vc.paths))
	if vc.rounds > 0 {
		perRound := (2+paths)*vc.phase + paths*(dc.warmup+estAgentCycle)
		d += time.Duration(len(vc.variants)) * (estScenarioSetUp + time.Duration(vc.rounds)*perRound)
	}
	if vc.steps > 0 {
		d += paths * (estScenarioSetUp + estAgentCycle + time.Duration(vc.steps)*estReactionStep)
	}
	if vc.overhead > 0 {
		d += paths * (estScenarioSetUp + estAgentCycle + dc.warmup + vc.overhead)
	}
	return d
}
