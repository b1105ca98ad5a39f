package gpureal

import (
	"strings"
	"testing"
)

func ptr(v float64) *float64 { return &v }

// phasesOf builds phase results: LS p99 (0: none), batch rate (<0: none).
type fig struct {
	name  string
	p99   float64
	batch float64
}

func phasesOf(figs ...fig) []phaseResult {
	specs := map[string]phaseSpec{}
	for _, s := range plan(defaultPlanConfig()) {
		specs[s.Name] = s
	}
	var out []phaseResult
	for _, f := range figs {
		p := phaseResult{phaseSpec: specs[f.name]}
		if f.p99 > 0 {
			p.LS = &lsStats{Requests: 100, P50: f.p99 * 0.9, P99: f.p99, FirstSecondP99: f.p99}
		}
		if f.batch >= 0 {
			p.Batch = &batchStats{PerSecond: f.batch}
		}
		out = append(out, p)
	}
	return out
}

// measuredDutyCycle is what the fractional duty cycle measured on an H200, the lever
// per-context slices replaced (docs/gpu.md): LS no better, batch worse.
func measuredDutyCycle() []phaseResult {
	return phasesOf(
		fig{phBatchAlone, 0, 591}, fig{phLSAlone, 3.37, -1}, fig{phNothing, 8.63, 339},
		fig{phDeepNothing1, 8.33, 64}, fig{phIdleNothing, 0, 590},
		fig{phAgent, 8.09, 80}, fig{phDeepAgent1, 8.64, 320}, fig{phIdleAgent, 0, 470},
	)
}

func TestPairVerdict(t *testing.T) {
	t.Parallel()
	m := byName(measuredDutyCycle())
	for _, tc := range []struct {
		agent, nothing string
		worse          bool
	}{
		// LS better, batch worse: a trade, not worse on both axes.
		{phAgent, phNothing, false},
		// LS p99 3.7 % worse (within the tolerance), batch better.
		{phDeepAgent1, phDeepNothing1, false},
		// LS idle: batch worse for nothing in return (it loses a fifth of its rate).
		{phIdleAgent, phIdleNothing, true},
	} {
		worse, why := pairVerdict(m[tc.agent], m[tc.nothing])
		if worse != tc.worse || why == "" {
			t.Errorf("%s vs %s: worse %v (%s), want %v", tc.agent, tc.nothing, worse, why, tc.worse)
		}
	}
	// Worse on LS with batch no better.
	p := phasesOf(fig{phNothing, 8, 300}, fig{phAgent, 9, 300})
	if worse, _ := pairVerdict(&p[1], &p[0]); !worse {
		t.Error("LS 12 % worse, batch equal: not judged worse")
	}
}

func TestEvaluateTargets(t *testing.T) {
	t.Parallel()
	good := phasesOf(
		fig{phBatchAlone, 0, 600}, fig{phLSAlone, 3.3, -1}, fig{phNothing, 8.6, 340},
		fig{phIdleNothing, 0, 600}, fig{phAgent, 3.4, 0}, fig{phMPS, 3.9, 190},
		fig{phIdleAgent, 0, 590}, fig{phArriveAgent, 5.0, 300},
	)
	m := byName(good)
	m[phIdleAgent].Recovery = &recovery{Seconds: 1.2, SustainedFrac: 0.97}
	m[phAgent].AgentCPUPct = ptr(0.6)
	m[phMPS].AgentCPUPct = ptr(0.8)
	m[phIdleAgent].AgentCPUPct = ptr(3) // sampled fast: not a steady phase, not judged

	for _, tc := range []struct {
		name   string
		phases []phaseResult
		edit   func(m map[string]*phaseResult)
		want   map[string]string // target → verdict
		value  map[string]string // target → text its value must hold
	}{
		{"all met (MPS meets the lever target)", good, nil,
			map[string]string{targetNameLevers: "met", targetNameIdle: "met", targetNameArrival: "met",
				targetNameNeverWorse: "met", targetNameAgentCPU: "met"},
			map[string]string{targetNameLevers: "agent-mps: LS p99 1.18× alone, batch 56 %",
				targetNameAgentCPU: "0.80 % of a core (highest, in agent-mps)"}},
		{"the measured fractional duty cycle", measuredDutyCycle(), nil,
			map[string]string{targetNameLevers: "NOT met", targetNameIdle: targetNotEvaluated,
				targetNameArrival: targetNotEvaluated, targetNameNeverWorse: "NOT met",
				targetNameAgentCPU: targetNotEvaluated},
			map[string]string{targetNameNeverWorse: "ls-idle-agent vs ls-idle-nothing: WORSE"}},
		{"slow recovery", good, func(m map[string]*phaseResult) {
			m[phIdleAgent].Recovery = &recovery{Seconds: 2.6, SustainedFrac: 0.95}
		}, map[string]string{targetNameIdle: "NOT met"}, nil},
		{"recovered but not sustained", good, func(m map[string]*phaseResult) {
			m[phIdleAgent].Recovery = &recovery{Seconds: 0.8, SustainedFrac: 0.8}
		}, map[string]string{targetNameIdle: "NOT met"}, nil},
		{"arrival too slow", good, func(m map[string]*phaseResult) {
			m[phArriveAgent].LS.FirstSecondP99 = 7
		}, map[string]string{targetNameArrival: "NOT met"}, map[string]string{targetNameArrival: "2.12× alone"}},
		{"agent CPU too high", good, func(m map[string]*phaseResult) {
			m[phAgent].AgentCPUPct = ptr(1.4)
		}, map[string]string{targetNameAgentCPU: "NOT met"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			phases := clonePhases(tc.phases)
			if tc.edit != nil {
				tc.edit(byName(phases))
			}
			got := map[string]targetResult{}
			for _, r := range evaluateTargets(phases) {
				got[r.Name] = r
			}
			if len(got) != 5 {
				t.Fatalf("%d targets, want 5", len(got))
			}
			for name, want := range tc.want {
				if v := got[name].verdict(); v != want {
					t.Errorf("%s: %s (%s; %s), want %s", name, v, got[name].Value, got[name].Detail, want)
				}
			}
			for name, sub := range tc.value {
				if !strings.Contains(got[name].Value, sub) {
					t.Errorf("%s: value %q does not hold %q", name, got[name].Value, sub)
				}
			}
		})
	}
}

// clonePhases copies the results deep enough for an edit.
func clonePhases(in []phaseResult) []phaseResult {
	out := make([]phaseResult, len(in))
	for i, p := range in {
		if p.LS != nil {
			ls := *p.LS
			p.LS = &ls
		}
		if p.Recovery != nil {
			r := *p.Recovery
			p.Recovery = &r
		}
		out[i] = p
	}
	return out
}

func TestFillRatios(t *testing.T) {
	t.Parallel()
	phases := phasesOf(fig{phBatchAlone, 0, 600}, fig{phDeepAlone, 0, 610}, fig{phLSAlone, 3.3, -1},
		fig{phNothing, 6.6, 300}, fig{phDeepNothing1, 8, 61}, fig{phAgent, 3.3, 150}, fig{phDeepAgent1, 4, 305})
	fillRatios(phases)
	m := byName(phases)
	check := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got < want-1e-9 || *got > want+1e-9 {
			t.Errorf("%s: ratio %v, want %v", name, got, want)
		}
	}
	check("nothing LS p99 / alone", m[phNothing].Ratios.LSP99VsAlone, 2)
	check("nothing batch / alone", m[phNothing].Ratios.BatchVsAlone, 0.5)
	check("deep batch / deep alone", m[phDeepNothing1].Ratios.BatchVsAlone, 0.1)
	check("agent batch / nothing", m[phAgent].Ratios.BatchVsNothing, 0.5)
	check("agent LS p99 / nothing", m[phAgent].Ratios.LSP99VsNothing, 0.5)
	check("deep agent batch / deep nothing", m[phDeepAgent1].Ratios.BatchVsNothing, 5)
	if m[phLSAlone].Ratios.LSP99VsAlone != nil || m[phBatchAlone].Ratios.BatchVsAlone != nil {
		t.Error("a baseline got a ratio against itself")
	}
}
