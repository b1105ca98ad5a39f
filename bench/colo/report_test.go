package colo

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestCV(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"one round", []float64{1.1}, 0},
		{"equal", []float64{1.2, 1.2, 1.2}, 0},
		// mean 1.0, sample stdev sqrt(((-.1)²+0+.1²)/2) = 0.1.
		{"spread", []float64{0.9, 1.0, 1.1}, 0.1},
		{"zero mean", []float64{0, 0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := cv(tt.xs); math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("cv(%v) = %v, want %v", tt.xs, got, tt.want)
			}
		})
	}
}

func TestNoiseOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		rounds    []variantRound
		want      float64
		wantRatio []float64
	}{
		{"one round", []variantRound{{SoloP99Ms: 2, VanillaP99Ms: 2.2}}, 0, []float64{1.1}},
		// Ratios 0.9, 1.0, 1.1: CV 0.1, whatever the solo p99 drifted by.
		{"three rounds", []variantRound{{SoloP99Ms: 2, VanillaP99Ms: 1.8}, {SoloP99Ms: 3, VanillaP99Ms: 3},
			{SoloP99Ms: 4, VanillaP99Ms: 4.4}}, 0.1, []float64{0.9, 1, 1.1}},
		// A round whose solo measured nothing is left out rather than dividing by 0.
		{"empty solo", []variantRound{{SoloP99Ms: 0, VanillaP99Ms: 2}, {SoloP99Ms: 2, VanillaP99Ms: 2},
			{SoloP99Ms: 2, VanillaP99Ms: 2}}, 0, []float64{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := noiseOf(tt.rounds)
			if math.Abs(n.Value-tt.want) > 1e-9 || len(n.VanillaSoloRatios) != len(tt.wantRatio) {
				t.Fatalf("noise %+v; want %v over %v", n, tt.want, tt.wantRatio)
			}
			for i, r := range tt.wantRatio {
				if math.Abs(n.VanillaSoloRatios[i]-r) > 1e-9 {
					t.Fatalf("ratios %v, want %v", n.VanillaSoloRatios, tt.wantRatio)
				}
			}
			if n.Method == "" {
				t.Fatal("the noise does not say how it is computed")
			}
		})
	}
	if n := noiseOf([]variantRound{{SoloP99Ms: 1, VanillaP99Ms: 1}, {SoloP99Ms: 2, VanillaP99Ms: 2}}); n.SoloP99CV <= 0 {
		t.Fatalf("solo p99 1 and 2: CV %v", n.SoloP99CV)
	}
}

// phaseWith is a phase of 1 s whose latencies are n copies of p99 (so its p99 is p99),
// with batch using idle of the CPU left.
func phaseWith(name string, p99ms float64, idle float64) phaseResult {
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = time.Duration(math.Round(p99ms * float64(time.Millisecond)))
	}
	return phaseResult{Name: name, Seconds: 1, P99ms: p99ms, BatchCPU: idle, IdleShare: idle, latencies: lat}
}

// TestSummariseAndTargets builds two rounds of a variant by hand and checks the pooled
// figures, the per-path summary and every target check.
func TestSummariseAndTargets(t *testing.T) {
	t.Parallel()
	v := variant{Name: "base", Rate: 500, BatchPods: 4, Threads: 2, Burner: burnCPU, Load: loadShape{Kind: loadSteady}}
	solo := []phaseResult{phaseWith("solo", 2, 0), phaseWith("solo", 2, 0)}
	vanilla := []phaseResult{phaseWith("vanilla", 2.2, 0.9), phaseWith("vanilla", 2.0, 0.9)}
	sig := func(src string) agentSignals { return agentSignals{Source: src} }
	rounds := []variantRound{
		{Round: 1, SoloP99Ms: 2, VanillaP99Ms: 2.2, Agent: []agentRoundResult{
			newAgentRound("ebpf", sig("ebpf"), phaseWith("a", 2.0, 0.85), 2, 2.2),
			newAgentRound("psi", sig("psi"), phaseWith("a", 2.4, 0.70), 2, 2.2),
			newAgentRound("sampling", sig("psi"), phaseWith("a", 2.0, 0.90), 2, 2.2),
		}},
		{Round: 2, SoloP99Ms: 2, VanillaP99Ms: 2.0, Agent: []agentRoundResult{
			newAgentRound("ebpf", sig("ebpf"), phaseWith("a", 2.05, 0.85), 2, 2.0),
			newAgentRound("psi", sig("psi"), phaseWith("a", 2.2, 0.70), 2, 2.0),
			newAgentRound("sampling", sig("psi"), phaseWith("a", 2.0, 0.90), 2, 2.0),
		}},
	}
	paths := []string{"ebpf", "psi", "sampling", "auto"}
	vr := summarise(v, rounds, solo, vanilla, paths, map[string]string{"auto": "unknown field"})
	if vr.SoloP99Ms != 2 || vr.VanillaP99Ms != 2.2 || vr.RatioVanilla != 1.1 {
		t.Fatalf("pooled solo %v, vanilla %v, ratio %v", vr.SoloP99Ms, vr.VanillaP99Ms, vr.RatioVanilla)
	}
	// Ratios 1.1 and 1.0: mean 1.05, stdev 0.0707: CV 0.067.
	if math.Abs(vr.Noise.Value-0.067) > 1e-9 {
		t.Fatalf("noise %v", vr.Noise.Value)
	}
	byPath := map[string]variantPathSummary{}
	for _, p := range vr.Paths {
		byPath[p.Path] = p
	}
	if len(vr.Paths) != 4 {
		t.Fatalf("%d path summaries, want 4", len(vr.Paths))
	}
	e := byPath["ebpf"]
	// Round 1: 2.0/2.2 = 0.909; round 2: 2.05/2.0 = 1.025.
	if !e.SourceMatches || e.P99Ms != 2.05 || e.RatioSolo != 1.025 || e.WorstRatioVanilla != 1.025 || e.IdleShare != 0.85 {
		t.Fatalf("ebpf summary %+v", e)
	}
	if s := byPath["sampling"]; s.SourceMatches || !strings.Contains(s.Note, "ran psi") ||
		len(s.ActiveSources) != 1 || s.ActiveSources[0] != "psi" {
		t.Fatalf("sampling ran psi, summary %+v", s)
	}
	if a := byPath["auto"]; a.Rejected == "" || a.SourceMatches {
		t.Fatalf("auto was rejected, summary %+v", a)
	}

	sps := []signalPathInfo{
		{Path: "ebpf", SourceMatches: true, ReactionP99Ms: 30, ReactionsMs: []float64{10, 30}, AgentCPUPct: 0.8,
			AgentRSSMiB: 25, AgentPods: 110},
		{Path: "psi", SourceMatches: true, ReactionP99Ms: 80, ReactionsMs: []float64{80}, AgentCPUPct: 1.2,
			AgentRSSMiB: 25, AgentPods: 110},
		{Path: "sampling", SourceMatches: true, ReactionP99Ms: 90, ReactionsMs: []float64{90}, AgentPods: 110},
		{Path: "auto", Rejected: "unknown field"},
	}
	checks := targetChecks([]variantResult{vr}, sps)
	type key struct{ target, variant, path string }
	got := map[key]targetCheck{}
	for _, c := range checks {
		got[key{c.Target, c.Variant, c.Path}] = c
	}
	const worst = "ls_p99_ratio_vanilla_worst_round (limit 1 + noise)"
	tests := []struct {
		k                  key
		measured, met      bool
		limit, value, miss float64
	}{
		{k: key{"reaction_p99_ms", "", "ebpf"}, measured: true, met: true, limit: 50, value: 30},
		{k: key{"reaction_p99_ms", "", "psi"}, measured: true, met: false, limit: 50, value: 80},
		{k: key{"agent_cpu_pct (110 pods)", "", "psi"}, measured: true, met: false, limit: 1, value: 1.2},
		{k: key{"agent_rss_mib (110 pods)", "", "ebpf"}, measured: true, met: true, limit: 30, value: 25},
		{k: key{"agent_cpu_pct (110 pods)", "", "auto"}, measured: false, met: false, limit: 1},
		{k: key{"ls_p99_ratio_solo", "base", "ebpf"}, measured: true, met: true, limit: 1.05, value: 1.025},
		{k: key{"ls_p99_ratio_solo", "base", "psi"}, measured: true, met: false, limit: 1.05, value: 1.2},
		{k: key{worst, "base", "ebpf"}, measured: true, met: true, limit: 1.067, value: 1.025},
		// psi: 2.2/2.0 = 1.1 in round 2, above 1 + noise.
		{k: key{worst, "base", "psi"}, measured: true, met: false, limit: 1.067, value: 1.1},
		{k: key{"batch_idle_share", "base", "ebpf"}, measured: true, met: true, limit: 0.8, value: 0.85},
		{k: key{"batch_idle_share", "base", "psi"}, measured: true, met: false, limit: 0.8, value: 0.7},
		// Measured under psi while sampling was asked for: not filed under sampling.
		{k: key{"batch_idle_share", "base", "sampling"}, measured: false, met: false, limit: 0.8, value: 0.9},
		{k: key{"ls_p99_ratio_solo", "base", "auto"}, measured: false, met: false, limit: 1.05},
	}
	for _, tt := range tests {
		c, ok := got[tt.k]
		if !ok {
			t.Errorf("no check %+v", tt.k)
			continue
		}
		if c.Measured != tt.measured || c.Met != tt.met || math.Abs(c.Limit-tt.limit) > 1e-9 ||
			math.Abs(c.Value-tt.value) > 1e-9 {
			t.Errorf("%+v: %+v; want measured %v met %v limit %v value %v", tt.k, c, tt.measured, tt.met, tt.limit, tt.value)
		}
		if !c.Measured && c.Note == "" {
			t.Errorf("%+v: unmeasured without a note", tt.k)
		}
	}
	if _, ok := got[key{"reaction_p99_ms", "", "sampling"}]; ok {
		t.Error("the reaction target is for eBPF and PSI, not sampling")
	}
	if allMet(checks) {
		t.Error("all met, with failed checks")
	}
}

func TestAllMet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		checks []targetCheck
		want   bool
	}{
		{"none", nil, false},
		{"met", []targetCheck{check("x", "", "", 1, "<=", 2, true, "")}, true},
		{"unmeasured", []targetCheck{check("x", "", "", 1, "<=", 2, false, "not run")}, false},
		{"one missed", []targetCheck{check("x", "", "", 1, "<=", 2, true, ""), check("y", "", "", 1, ">=", 2, true, "")}, false},
		{"NaN", []targetCheck{check("x", "", "", math.NaN(), "<=", 2, true, "")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := allMet(tt.checks); got != tt.want {
				t.Fatalf("allMet = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestVariantsJSONShape marshals a result and checks the field names the docs and
// docs/benchmarks.md rely on.
func TestVariantsJSONShape(t *testing.T) {
	t.Parallel()
	v := defaultVariants(baseScenarioConfig())[4] // bursty: the load's durations in ms
	vr := summarise(v, []variantRound{{Round: 1, SoloP99Ms: 2, VanillaP99Ms: 0, Agent: []agentRoundResult{
		newAgentRound("psi", agentSignals{Source: "psi", CutsBySignal: map[string]float64{"psi_cpu": 1}},
			phaseWith("a", 2, 0.9), 2, 0)}}},
		[]phaseResult{phaseWith("s", 2, 0)}, []phaseResult{phaseWith("v", 0, 0)}, []string{"psi"}, nil)
	res := variantsResult{Rounds: 1, PhaseS: 5, Paths: []string{"psi"}, Variants: []variantResult{vr},
		SignalPaths: []signalPathInfo{{Path: "psi", Reaction: &agentSignals{Source: "psi"}}}}
	res.Targets = targetChecks(res.Variants, res.SignalPaths)
	b, err := json.Marshal(benchResult{Variants: &res})
	if err != nil {
		t.Fatalf("marshal (a NaN would fail here): %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	vs, ok := doc["variants"].(map[string]any)
	if !ok {
		t.Fatalf("no variants section: %s", b)
	}
	for _, k := range []string{"rounds", "phase_s", "paths", "scenarios", "signal_paths", "targets", "all_targets_met"} {
		if _, ok := vs[k]; !ok {
			t.Errorf("variants lacks %q", k)
		}
	}
	sc := vs["scenarios"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "config", "rounds", "ls_p99_solo_ms", "ls_p99_vanilla_ms", "ls_p99_ratio_vanilla",
		"batch_idle_share_vanilla", "noise", "paths"} {
		if _, ok := sc[k]; !ok {
			t.Errorf("scenario lacks %q", k)
		}
	}
	load := sc["config"].(map[string]any)["load"].(map[string]any)
	if load["kind"] != "bursty" || load["burst_on_ms"] != 300.0 || load["burst_off_ms"] != 700.0 {
		t.Errorf("load %v", load)
	}
	p := sc["paths"].([]any)[0].(map[string]any)
	for _, k := range []string{"path", "active_sources", "source_matches", "ls_p99_ms", "ls_p99_ratio_solo",
		"ls_p99_ratios_vanilla", "ls_p99_ratio_vanilla_worst", "batch_idle_share"} {
		if _, ok := p[k]; !ok {
			t.Errorf("path summary lacks %q", k)
		}
	}
	r := sc["rounds"].([]any)[0].(map[string]any)["agent"].([]any)[0].(map[string]any)
	for _, k := range []string{"path", "active_source", "source_matches", "ls_p99_ratio_solo", "ls_p99_ratio_vanilla",
		"batch_idle_share", "cuts_by_signal"} {
		if _, ok := r[k]; !ok {
			t.Errorf("agent round lacks %q", k)
		}
	}
	sp := vs["signal_paths"].([]any)[0].(map[string]any)
	for _, k := range []string{"path", "source_matches", "reaction_p50_ms", "reaction_p99_ms", "reaction_max_ms",
		"agent_cpu_pct", "agent_rss_mib", "agent_pods", "reaction_agent_metrics"} {
		if _, ok := sp[k]; !ok {
			t.Errorf("signal path lacks %q", k)
		}
	}
	tc := vs["targets"].([]any)[0].(map[string]any)
	for _, k := range []string{"target", "value", "op", "limit", "measured", "met"} {
		if _, ok := tc[k]; !ok {
			t.Errorf("target check lacks %q", k)
		}
	}
}

func TestEstimateDuration(t *testing.T) {
	t.Parallel()
	dc := demoConfig{phase: 8 * time.Second, warmup: time.Second, memory: true}
	bc := benchConfig{rounds: 5, steps: 30, sweep: []float64{.6, .7, .8, .9, .95, 1}, sweepPhase: 8 * time.Second,
		overhead: 30 * time.Second, trace: "x"}
	vc := variantConfig{variants: defaultVariants(baseScenarioConfig()), paths: []string{"ebpf", "psi", "sampling"},
		rounds: 3, phase: 10 * time.Second, steps: 20, overhead: 20 * time.Second}
	tests := []struct {
		name     string
		dc       demoConfig
		bc       benchConfig
		vc       variantConfig
		min, max time.Duration
	}{
		// The recorded full run before the variants took 8 min 12 s, with reaction steps
		// of 3.5 s; they now wait for the limit to restore (~14 s each in the 11-24 runs).
		{"main part", dc, bc, variantConfig{}, 11 * time.Minute, 16 * time.Minute},
		// The variants and paths alone took 26 min 33 s on 11-24 (10 s phases).
		{"variants and paths", demoConfig{warmup: time.Second}, benchConfig{}, vc, 22 * time.Minute, 32 * time.Minute},
		{"make bench-colo", dc, bc, vc, 33 * time.Minute, 48 * time.Minute},
		{"nothing", demoConfig{}, benchConfig{}, variantConfig{}, 0, 0},
		{"variants without paths", demoConfig{}, benchConfig{}, variantConfig{variants: vc.variants, rounds: 3,
			phase: time.Second}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := estimateDuration(tt.dc, tt.bc, tt.vc); got < tt.min || got > tt.max {
				t.Fatalf("estimate %v, want %v..%v", got, tt.min, tt.max)
			}
		})
	}
}
