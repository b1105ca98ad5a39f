package gpureal

import (
	"fmt"
	"strings"
)

// The targets the run is judged by (docs/benchmarks.md, "Real GPU", lists them).
const (
	targetP99VsAlone       = 1.25 // LS p99 / alone
	targetBatchKeep        = 0.50 // batch / time-sliced (nothing done)
	targetIdleFrac         = 0.90 // batch / alone after LS goes idle
	targetIdleWithinS      = 2.0  // seconds
	targetArrivalP99       = 2.0  // first-second LS p99 / alone
	targetAgentCPUPct      = 1.0  // % of one core, one busy GPU
	worseTolerance         = 0.05 // "worse than nothing" beyond this relative difference
	targetNameLevers       = "ls-p99-and-batch-share"
	targetNameIdle         = "idle-ls-batch-recovers"
	targetNameArrival      = "ls-arrival-first-second"
	targetNameNeverWorse   = "never-worse-than-nothing"
	targetNameAgentCPU     = "agent-cpu"
	targetTextLevers       = "LS p99 ≤ 1.25× alone while batch keeps ≥ 50 % of its time-sliced throughput"
	targetTextIdle         = "LS holds its context but is idle: batch ≥ 90 % of its alone throughput within 2 s"
	targetTextArrival      = "LS arrives where batch runs: LS p99 over its first second ≤ 2× alone"
	targetTextNeverWorse   = "never worse than doing nothing, on both axes at once"
	targetTextAgentCPU     = "agent CPU ≤ 1 % of a core with 1 busy GPU"
	targetNotEvaluated     = "not evaluated"
	targetNotEvaluatedNote = "a phase it needs is missing or measured nothing"
)

// targetResult is one target's verdict.
type targetResult struct {
	Name      string `json:"name"`
	Target    string `json:"target"`
	Evaluated bool   `json:"evaluated"`
	Met       bool   `json:"met"`
	// Value is the measured figure(s) the verdict rests on; Detail how it was judged.
	Value  string `json:"value"`
	Detail string `json:"detail,omitempty"`
}

func (t targetResult) verdict() string {
	switch {
	case !t.Evaluated:
		return targetNotEvaluated
	case t.Met:
		return "met"
	}
	return "NOT met"
}

// byName indexes phase results.
func byName(phases []phaseResult) map[string]*phaseResult {
	m := make(map[string]*phaseResult, len(phases))
	for i := range phases {
		m[phases[i].Name] = &phases[i]
	}
	return m
}

// evaluateTargets judges the five targets on the phases measured.
func evaluateTargets(phases []phaseResult) []targetResult {
	m := byName(phases)
	return []targetResult{targetLevers(m), targetIdle(m), targetArrival(m), targetNeverWorse(phases, m),
		targetAgentCPU(phases)}
}

// lsP99 and batchRate return a phase's figures, ok=false when it measured none.
func lsP99(p *phaseResult) (float64, bool) {
	if p == nil || p.LS == nil || p.LS.Requests == 0 {
		return 0, false
	}
	return p.LS.P99, true
}

func batchRate(p *phaseResult) (float64, bool) {
	if p == nil || p.Batch == nil {
		return 0, false
	}
	return p.Batch.PerSecond, true
}

// targetLevers: each lever's phase (freeze, MPS) against LS alone and the time-sliced
// batch of the nothing-done phase; met when one of them meets both bounds.
func targetLevers(m map[string]*phaseResult) targetResult {
	t := targetResult{Name: targetNameLevers, Target: targetTextLevers}
	alone, okA := lsP99(m[phLSAlone])
	sliced, okS := batchRate(m[phNothing])
	if !okA || !okS || alone <= 0 || sliced <= 0 {
		t.Detail = targetNotEvaluatedNote
		return t
	}
	var vals, met []string
	for _, name := range []string{phAgent, phMPS} {
		p99, ok1 := lsP99(m[name])
		rate, ok2 := batchRate(m[name])
		if !ok1 || !ok2 {
			continue
		}
		t.Evaluated = true
		r, share := p99/alone, rate/sliced
		vals = append(vals, fmt.Sprintf("%s: LS p99 %.2f× alone, batch %.0f %% of time-sliced", name, r, 100*share))
		if r <= targetP99VsAlone && share >= targetBatchKeep {
			met = append(met, name)
		}
	}
	t.Value = strings.Join(vals, "; ")
	t.Met = len(met) > 0
	if t.Met {
		t.Detail = "met by " + strings.Join(met, ", ")
	} else if !t.Evaluated {
		t.Detail = targetNotEvaluatedNote
	}
	return t
}

// targetIdle: after LS goes idle (context held), batch's trailing 0.5 s rate reaches 90 %
// of alone within 2 s and stays there on average for the rest of the window.
func targetIdle(m map[string]*phaseResult) targetResult {
	t := targetResult{Name: targetNameIdle, Target: targetTextIdle}
	p := m[phIdleAgent]
	if p == nil || p.Recovery == nil {
		t.Detail = targetNotEvaluatedNote
		return t
	}
	t.Evaluated = true
	rec := *p.Recovery
	if rec.Seconds < 0 {
		t.Value = fmt.Sprintf("never reached 90 %% (%.0f %% of alone after 2 s)", 100*rec.SustainedFrac)
		return t
	}
	t.Value = fmt.Sprintf("90 %% reached %.2f s after LS went idle; %.0f %% of alone from 2 s on", rec.Seconds,
		100*rec.SustainedFrac)
	t.Met = rec.Seconds <= targetIdleWithinS && rec.SustainedFrac >= targetIdleFrac
	t.Detail = "rate over a trailing 0.5 s window, from LS's last request; the sustained share must hold too"
	return t
}

// targetArrival: a new LS pod starting where batch runs.
func targetArrival(m map[string]*phaseResult) targetResult {
	t := targetResult{Name: targetNameArrival, Target: targetTextArrival}
	alone, ok := lsP99(m[phLSAlone])
	p := m[phArriveAgent]
	if !ok || alone <= 0 || p == nil || p.LS == nil || p.LS.Requests == 0 {
		t.Detail = targetNotEvaluatedNote
		return t
	}
	t.Evaluated = true
	r := p.LS.FirstSecondP99 / alone
	t.Value = fmt.Sprintf("first-second p99 %.2f ms = %.2f× alone (%.2f ms)", p.LS.FirstSecondP99, r, alone)
	t.Met = r <= targetArrivalP99
	return t
}

// pairVerdict says whether an agent phase is worse than its nothing-done pair on both
// axes at once: worse on one axis (beyond worseTolerance) without being better on the
// other. A phase without LS requests (LS idle) is judged on batch alone.
func pairVerdict(agent, nothing *phaseResult) (worse bool, why string) {
	var worseLS, betterLS, worseB, betterB bool
	var parts []string
	if a, ok := lsP99(agent); ok {
		if n, ok := lsP99(nothing); ok && n > 0 {
			worseLS, betterLS = a > n*(1+worseTolerance), a < n*(1-worseTolerance)
			parts = append(parts, fmt.Sprintf("LS p99 %.2f vs %.2f ms", a, n))
		}
	}
	if a, ok := batchRate(agent); ok {
		if n, ok := batchRate(nothing); ok && n > 0 {
			worseB, betterB = a < n*(1-worseTolerance), a > n*(1+worseTolerance)
			parts = append(parts, fmt.Sprintf("batch %.0f vs %.0f matmuls/s", a, n))
		}
	}
	return (worseLS && !betterB) || (worseB && !betterLS), strings.Join(parts, ", ")
}

func targetNeverWorse(phases []phaseResult, m map[string]*phaseResult) targetResult {
	t := targetResult{Name: targetNameNeverWorse, Target: targetTextNeverWorse,
		Detail: fmt.Sprintf("an agent phase fails when it is worse than its nothing-done pair on one axis (by more "+
			"than %.0f %%) and not better on the other", 100*worseTolerance)}
	var vals []string
	t.Met = true
	for i := range phases {
		p := &phases[i]
		n := m[p.Pair]
		if p.Pair == "" || n == nil {
			continue
		}
		t.Evaluated = true
		worse, why := pairVerdict(p, n)
		verdict := "ok"
		if worse {
			verdict, t.Met = "WORSE", false
		}
		vals = append(vals, fmt.Sprintf("%s vs %s: %s (%s)", p.Name, n.Name, verdict, why))
	}
	if !t.Evaluated {
		t.Met = false
	}
	t.Value = strings.Join(vals, "; ")
	return t
}

// targetAgentCPU: the highest CPU of the agent over the steady agent phases (LS and
// batch both busy on the one GPU, /status read once a second).
func targetAgentCPU(phases []phaseResult) targetResult {
	t := targetResult{Name: targetNameAgentCPU, Target: targetTextAgentCPU,
		Detail: "user+system CPU of the agent process (/proc/<pid>/stat) over each steady agent phase (LS and batch " +
			"busy; the bench reads /status once a second there); the highest"}
	worst, name := -1.0, ""
	for _, p := range phases {
		if p.LSMode == lsRun && p.AgentCPUPct != nil && *p.AgentCPUPct > worst {
			worst, name = *p.AgentCPUPct, p.Name
		}
	}
	if worst < 0 {
		t.Detail = targetNotEvaluatedNote
		return t
	}
	t.Evaluated = true
	t.Value = fmt.Sprintf("%.2f %% of a core (highest, in %s)", worst, name)
	t.Met = worst <= targetAgentCPUPct
	return t
}
