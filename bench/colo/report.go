package colo

import (
	"math"
	"slices"
	"sort"
	"strings"
)

// Targets of the variant section (docs/bench-colo.md lists them).
const (
	targetReactionP99Ms = 50.0 // reaction_p99_ms with eBPF or PSI
	targetRatioSolo     = 1.05 // LS p99 with the agent / solo, every variant
	targetIdleShare     = 0.80 // batch share of the CPU LS leaves idle
	targetAgentCPUPct   = 1.0  // agent CPU, 110 pods, % of one core
	targetAgentRSSMiB   = 30.0 // agent RSS, 110 pods
)

// noiseMethod says how variantNoise.Value is computed; it is written into the JSON.
const noiseMethod = "coefficient of variation (sample stdev / mean, n−1) over the rounds of the " +
	"per-round ratio LS p99 plain-BestEffort / LS p99 solo: how much a same-round ratio of two p99s " +
	"moves from round to round when nothing changes; 0 with fewer than 2 rounds"

// variantsResult is the variant section of the JSON: colo.json's "variants".
type variantsResult struct {
	Rounds      int              `json:"rounds"`
	PhaseS      float64          `json:"phase_s"`
	Paths       []string         `json:"paths"`
	Variants    []variantResult  `json:"scenarios"`
	SignalPaths []signalPathInfo `json:"signal_paths"`
	Targets     []targetCheck    `json:"targets"`
	// AllMet: every target check was measured and met.
	AllMet bool `json:"all_targets_met"`
}

// variantResult is one variant over its rounds.
type variantResult struct {
	Name   string         `json:"name"`
	Config variant        `json:"config"`
	Rounds []variantRound `json:"rounds"`

	// Pooled over the rounds (quantiles over every latency of the phase).
	SoloP99Ms        float64 `json:"ls_p99_solo_ms"`
	VanillaP99Ms     float64 `json:"ls_p99_vanilla_ms"`
	RatioVanilla     float64 `json:"ls_p99_ratio_vanilla"`
	VanillaIdleShare float64 `json:"batch_idle_share_vanilla"`

	Noise variantNoise         `json:"noise"`
	Paths []variantPathSummary `json:"paths"`
}

// variantRound is one round of a variant: solo, plain BestEffort and the agent under
// each signal path, measured back to back.
type variantRound struct {
	Round            int                `json:"round"`
	SoloP99Ms        float64            `json:"ls_p99_solo_ms"`
	VanillaP99Ms     float64            `json:"ls_p99_vanilla_ms"`
	RatioVanilla     float64            `json:"ls_p99_ratio_vanilla"`
	VanillaIdleShare float64            `json:"batch_idle_share_vanilla"`
	Agent            []agentRoundResult `json:"agent"`
}

// agentRoundResult is the agent phase of one round under one signal path.
type agentRoundResult struct {
	Path          string  `json:"path"`
	ActiveSource  string  `json:"active_source"`
	SourceMatches bool    `json:"source_matches"`
	P99Ms         float64 `json:"ls_p99_ms"`
	// RatioSolo and RatioVanilla are against the solo and plain-BestEffort phases of
	// the same round.
	RatioSolo    float64            `json:"ls_p99_ratio_solo"`
	RatioVanilla float64            `json:"ls_p99_ratio_vanilla"`
	IdleShare    float64            `json:"batch_idle_share"`
	BatchCPUs    float64            `json:"batch_cpus"`
	CutsBySignal map[string]float64 `json:"cuts_by_signal,omitempty"`

	phase phaseResult // with its latencies, for pooling
}

// variantNoise is the round-to-round noise of a variant.
type variantNoise struct {
	Method string `json:"method"`
	// Value is the noise as a fraction: the agent's p99 may exceed plain BestEffort's
	// of the same round by at most this (× vanilla).
	Value             float64   `json:"value"`
	VanillaSoloRatios []float64 `json:"vanilla_solo_ratios"`
	// For context: the same statistic over the solo and the vanilla p99 themselves
	// (these include drift of the machine, which the pairing in rounds cancels).
	SoloP99CV    float64 `json:"solo_p99_cv"`
	VanillaP99CV float64 `json:"vanilla_p99_cv"`
}

// unknownSource stands for an agent that did not report its source (one from before the
// signals section).
const unknownSource = "unknown"

// variantPathSummary is the agent under one signal path over every round of a variant.
type variantPathSummary struct {
	Path string `json:"path"`
	// ActiveSources are the sources the agent reported over the rounds (distinct,
	// sorted); SourceMatches is true when every round ran the requested one.
	ActiveSources []string `json:"active_sources"`
	SourceMatches bool     `json:"source_matches"`
	Note          string   `json:"note,omitempty"`
	// Rejected is set when the agent refused the mode; nothing else is then measured.
	Rejected string `json:"rejected,omitempty"`

	P99Ms     float64 `json:"ls_p99_ms"`
	RatioSolo float64 `json:"ls_p99_ratio_solo"`
	// RatiosVanilla is per round; WorstRatioVanilla their maximum, which the target
	// compares with 1 + noise.
	RatiosVanilla     []float64 `json:"ls_p99_ratios_vanilla"`
	WorstRatioVanilla float64   `json:"ls_p99_ratio_vanilla_worst"`
	IdleShare         float64   `json:"batch_idle_share"`
	BatchCPUs         float64   `json:"batch_cpus"`
}

// signalPathInfo is one signal path's reaction to LS load steps and its overhead with
// 110 pods (base scenario).
type signalPathInfo struct {
	Path          string `json:"path"`
	SourceMatches bool   `json:"source_matches"`
	Note          string `json:"note,omitempty"`
	Rejected      string `json:"rejected,omitempty"`

	// From the load steps (the agent's /metrics read at their end).
	Reaction      *agentSignals `json:"reaction_agent_metrics,omitempty"`
	ReactionP50Ms float64       `json:"reaction_p50_ms"`
	ReactionP99Ms float64       `json:"reaction_p99_ms"`
	ReactionMaxMs float64       `json:"reaction_max_ms"`
	SettleP50Ms   float64       `json:"settle_p50_ms"`
	ReactionsMs   []float64     `json:"reactions_ms,omitempty"`
	// StepsWithoutCut counts the steps in which the tier's limit was not cut by ≥ 0.1
	// CPU: each counts as the step's length (1 500 ms) in the quantiles above. With a
	// harm signal only harm cuts batch, so a step that did not harm LS may rightly not
	// cut; the agent's own histogram (reaction_agent_metrics) times harm → cut.
	StepsWithoutCut int `json:"steps_without_cut"`
	// From LS harm: the bench's own run-queue delay probe on the LS pod (onsetWatch),
	// judged by the agent's default rule over a whole 50 ms window slid every 5 ms,
	// times when each step began to harm LS. FromHarmMs is, per harmed step, harm →
	// cut (0 when the cut came first; the rest of the step when none came). A step that
	// did not harm LS needs no cut; CutsWithoutHarm counts those that got one. With
	// OnsetBatchOnly the probe counted only harm batch caused (the agent's default rule
	// where the kernel tells: signals.RunqueueHarm's batchOnly).
	OnsetProbe      bool      `json:"onset_probe"`
	OnsetBatchOnly  bool      `json:"onset_batch_only"`
	HarmedSteps     int       `json:"harmed_steps"`
	CutsWithoutHarm int       `json:"cuts_without_harm"`
	FromHarmP50Ms   float64   `json:"reaction_from_harm_p50_ms"`
	FromHarmP99Ms   float64   `json:"reaction_from_harm_p99_ms"`
	FromHarmMs      []float64 `json:"reactions_from_harm_ms,omitempty"`

	// From the overhead run: 110 static pods, LS under load, batch running.
	Overhead     *agentSignals `json:"overhead_agent_metrics,omitempty"`
	AgentCPUPct  float64       `json:"agent_cpu_pct"`
	AgentRSSMiB  float64       `json:"agent_rss_mib"`
	AgentPeakMiB float64       `json:"agent_rss_peak_mib"`
	AgentPods    int           `json:"agent_pods"`
}

// targetCheck is one target against one measurement.
type targetCheck struct {
	Target  string `json:"target"`
	Variant string `json:"variant,omitempty"`
	Path    string `json:"path,omitempty"`
	// Value is the measurement, Limit the target, Op how they compare ("<=", ">=").
	Value float64 `json:"value"`
	Op    string  `json:"op"`
	Limit float64 `json:"limit"`
	// Measured is false when the figure could not be had under this path (the agent
	// refused the mode, ran another source, or the part was not run); Met is then false.
	Measured bool   `json:"measured"`
	Met      bool   `json:"met"`
	Note     string `json:"note,omitempty"`
}

// check builds a targetCheck; measured false forces met false.
func check(target, variantName, path string, value float64, op string, limit float64, measured bool, note string) targetCheck {
	c := targetCheck{Target: target, Variant: variantName, Path: path, Value: round3(value), Op: op, Limit: limit,
		Measured: measured, Note: note}
	if measured && !math.IsNaN(value) {
		switch op {
		case "<=":
			c.Met = value <= limit
		case ">=":
			c.Met = value >= limit
		}
	}
	return c
}

func round3(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return math.Round(v*1000) / 1000
}

// pratio is a/b, NaN when b is not positive (a phase that measured nothing).
func pratio(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// cv is the coefficient of variation (sample standard deviation over the mean) of xs;
// 0 for fewer than two values or a mean that is not positive.
func cv(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	if mean <= 0 || math.IsNaN(mean) {
		return 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(len(xs)-1)) / mean
}

// noiseOf computes a variant's round-to-round noise from its rounds.
func noiseOf(rounds []variantRound) variantNoise {
	n := variantNoise{Method: noiseMethod, VanillaSoloRatios: []float64{}}
	var solo, vanilla, exact []float64
	for _, r := range rounds {
		solo, vanilla = append(solo, r.SoloP99Ms), append(vanilla, r.VanillaP99Ms)
		if q := pratio(r.VanillaP99Ms, r.SoloP99Ms); !math.IsNaN(q) {
			exact = append(exact, q)
			n.VanillaSoloRatios = append(n.VanillaSoloRatios, round3(q))
		}
	}
	n.Value = round3(cv(exact))
	n.SoloP99CV, n.VanillaP99CV = round3(cv(solo)), round3(cv(vanilla))
	return n
}

// summarise pools a variant's rounds: the solo and vanilla phases, the noise, and per
// signal path (in the order of paths) the agent's figures. rejected maps a path to why
// the agent refused it.
func summarise(v variant, rounds []variantRound, solo, vanilla []phaseResult, paths []string,
	rejected map[string]string) variantResult {
	ps, pv := pool("LS alone", solo), pool("LS + batch, no agent", vanilla)
	res := variantResult{Name: v.Name, Config: v, Rounds: rounds,
		SoloP99Ms: ps.P99ms, VanillaP99Ms: pv.P99ms, RatioVanilla: round3(pratio(pv.P99ms, ps.P99ms)),
		VanillaIdleShare: round3(pv.IdleShare), Noise: noiseOf(rounds)}
	for _, p := range paths {
		sum := variantPathSummary{Path: p, ActiveSources: []string{}, RatiosVanilla: []float64{}, Rejected: rejected[p]}
		var phases []phaseResult
		matches, ran := true, false
		for _, r := range rounds {
			for _, a := range r.Agent {
				if a.Path != p {
					continue
				}
				ran = true
				phases = append(phases, a.phase)
				sum.RatiosVanilla = append(sum.RatiosVanilla, a.RatioVanilla)
				sum.WorstRatioVanilla = max(sum.WorstRatioVanilla, a.RatioVanilla)
				src := a.ActiveSource
				if src == "" {
					src = unknownSource
				}
				if !slices.Contains(sum.ActiveSources, src) {
					sum.ActiveSources = append(sum.ActiveSources, src)
				}
				if !a.SourceMatches {
					matches = false
					if sum.Note == "" {
						_, sum.Note = sourceVerdict(p, a.ActiveSource)
					}
				}
			}
		}
		sort.Strings(sum.ActiveSources)
		sum.SourceMatches = ran && matches
		if ran {
			pa := pool(p, phases)
			sum.P99Ms, sum.RatioSolo, sum.IdleShare = pa.P99ms, round3(pratio(pa.P99ms, ps.P99ms)), round3(pa.IdleShare)
			if pa.Seconds > 0 {
				sum.BatchCPUs = round3(pa.BatchCPU / pa.Seconds)
			}
		} else if sum.Note == "" && sum.Rejected == "" {
			sum.Note = "not run"
		}
		res.Paths = append(res.Paths, sum)
	}
	return res
}

// newAgentRound fills the per-round figures of one agent phase.
func newAgentRound(path string, sig agentSignals, r phaseResult, solo, vanilla float64) agentRoundResult {
	ok, _ := sourceVerdict(path, sig.Source)
	a := agentRoundResult{Path: path, ActiveSource: sig.Source, SourceMatches: ok, P99Ms: r.P99ms,
		RatioSolo: round3(pratio(r.P99ms, solo)), RatioVanilla: round3(pratio(r.P99ms, vanilla)),
		IdleShare: round3(r.IdleShare), CutsBySignal: sig.CutsBySignal, phase: r}
	if r.Seconds > 0 {
		a.BatchCPUs = round3(r.BatchCPU / r.Seconds)
	}
	return a
}

// targetChecks lists every target against the variant and path results.
func targetChecks(vs []variantResult, sps []signalPathInfo) []targetCheck {
	var out []targetCheck
	for _, sp := range sps {
		measured, note := sp.SourceMatches && sp.Rejected == "", sp.Note
		if sp.Rejected != "" {
			note = "rejected: " + sp.Rejected
		}
		if sp.Path == pathEBPF || sp.Path == pathPSI {
			// Timed from the harm where the bench could see it: with a harm signal the
			// agent cuts on harm only, and a step's time before harm is not its delay.
			if sp.OnsetProbe {
				name := "reaction_p99_ms (from LS harm)"
				if sp.OnsetBatchOnly {
					name = "reaction_p99_ms (from batch's LS harm)"
				}
				out = append(out, check(name, "", sp.Path, sp.FromHarmP99Ms, "<=",
					targetReactionP99Ms, measured && len(sp.FromHarmMs) > 0, note))
			} else {
				out = append(out, check("reaction_p99_ms", "", sp.Path, sp.ReactionP99Ms, "<=", targetReactionP99Ms,
					measured && len(sp.ReactionsMs) > 0, note))
			}
		}
		ran := sp.AgentPods > 0
		out = append(out,
			check("agent_cpu_pct (110 pods)", "", sp.Path, sp.AgentCPUPct, "<=", targetAgentCPUPct, measured && ran, note),
			check("agent_rss_mib (110 pods)", "", sp.Path, sp.AgentRSSMiB, "<=", targetAgentRSSMiB, measured && ran, note))
	}
	for _, v := range vs {
		for _, p := range v.Paths {
			measured := p.SourceMatches && p.Rejected == "" && len(p.RatiosVanilla) > 0
			note := p.Note
			if p.Rejected != "" {
				note = "rejected: " + p.Rejected
			}
			out = append(out,
				check("ls_p99_ratio_solo", v.Name, p.Path, p.RatioSolo, "<=", targetRatioSolo, measured, note),
				check("ls_p99_ratio_vanilla_worst_round (limit 1 + noise)", v.Name, p.Path, p.WorstRatioVanilla, "<=",
					round3(1+v.Noise.Value), measured, note),
				check("batch_idle_share", v.Name, p.Path, p.IdleShare, ">=", targetIdleShare, measured, note))
		}
	}
	return out
}

// allMet is true when there is at least one check and every check was measured and met.
func allMet(cs []targetCheck) bool {
	for _, c := range cs {
		if !c.Met {
			return false
		}
	}
	return len(cs) > 0
}

// printVariants prints the summary tables of the variant section.
func printVariants(w func(string, ...any), r variantsResult) {
	w("\nVariants (%d rounds × %.0f s phases, pooled; ratio vs vanilla: worst round)\n", r.Rounds, r.PhaseS)
	w("%-12s %-9s %-9s %8s %8s %9s %9s %7s\n", "variant", "path", "active", "p99 ms", "/solo", "/vanilla", "1+noise",
		"idle")
	for _, v := range r.Variants {
		w("%-12s %-9s %-9s %8.2f %8.2f %9s %9s %7.2f\n", v.Name, "vanilla", "-", v.VanillaP99Ms,
			v.RatioVanilla, "-", "-", v.VanillaIdleShare)
		for _, p := range v.Paths {
			active := strings.Join(p.ActiveSources, "+")
			if p.Rejected != "" {
				active = "rejected"
			}
			w("%-12s %-9s %-9s %8.2f %8.2f %9.2f %9.3f %7.2f\n", v.Name, p.Path, active, p.P99Ms, p.RatioSolo,
				p.WorstRatioVanilla, 1+v.Noise.Value, p.IdleShare)
		}
	}
	if len(r.SignalPaths) > 0 {
		w("\nSignal paths (base scenario): reaction to LS load steps; agent with 110 pods\n")
		w("%-9s %-7s %9s %9s %9s %8s %9s %9s\n", "path", "source", "p50 ms", "p99 ms", "max ms", "no cut", "agent %", "RSS MiB")
		for _, sp := range r.SignalPaths {
			src := "ok"
			switch {
			case sp.Rejected != "":
				src = "rejected"
			case !sp.SourceMatches:
				src = "OTHER"
			}
			w("%-9s %-7s %9.0f %9.0f %9.0f %8d %9.2f %9.1f\n", sp.Path, src, sp.ReactionP50Ms, sp.ReactionP99Ms,
				sp.ReactionMaxMs, sp.StepsWithoutCut, sp.AgentCPUPct, sp.AgentRSSMiB)
			if sp.Note != "" || sp.Rejected != "" {
				w("  %s: %s%s\n", sp.Path, sp.Note, sp.Rejected)
			}
		}
	}
	w("\nTargets\n")
	for _, c := range r.Targets {
		verdict := "met"
		switch {
		case !c.Measured:
			verdict = "NOT MEASURED"
		case !c.Met:
			verdict = "NOT MET"
		}
		where := strings.TrimSpace(c.Variant + " " + c.Path)
		w("  %-52s %-22s %8.3f %s %-6.3g %s\n", c.Target, where, c.Value, c.Op, c.Limit, verdict)
	}
}
