package qos

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// String renders the plan for people, one decision a line, in the order the agent acts:
// the budget and why, the CPU by class, every limit write (and every hold) with its
// reason, the graded action, its freezer writes and evictions, the batch resources, the
// events and the pod conditions. It answers "why did batch get N cores, and when was it
// frozen" for one period. It serves the tests (TestControllerPlan); the agent's
// /debug/plans records the same decisions as JSON (koordlet/debugplans.go).
func (p Plan) String() string {
	var b strings.Builder
	line := func(format string, args ...any) {
		fmt.Fprintf(&b, format, args...)
		b.WriteByte('\n')
	}
	if p.Cause != SignalNone {
		line("budget %.2f cores: %s by %s", p.Budget.Applied, p.Budget.Reason, p.Cause)
	} else {
		line("budget %.2f cores: %s", p.Budget.Applied, p.Budget.Reason)
	}
	if u := p.Util; u.Reason != "" {
		line("utilisation %.2f cores: %s; target %.2f = clamp(%.0f CPUs × %.2f − LS %.2f − system %.2f, %.2f, %.2f)",
			u.Applied, u.Reason, u.Target, u.NodeCPUs, u.Threshold, u.LSUsage, u.SystemUsage, u.Min, u.Max)
	}
	if at := p.Attribution; at != (Attribution{}) {
		line("cpu used: LS %.2f (%.2f of it unknown pods), BE %.2f, batch %.2f, system %.2f", at.LSEstimate,
			at.UnknownPods, at.BE, at.Batch, at.System)
	}
	for _, e := range p.PodMemory {
		line("%s memory pod %s %s: %s", verb(e.Write), e.ID, bytesString(float64(e.Max)), e.Reason)
	}
	for _, e := range p.CPU {
		line("%s cpu %s %.3f cores (quota %v): %s", verb(e.Write), target(e.Kind, e.ID), e.Cores, e.Quota, e.Reason)
	}
	if e := p.TierMemory; e.Reason != "" {
		line("%s memory tier %s: %s", verb(e.Write), bytesString(float64(e.Max)), e.Reason)
	}
	if d := p.Escalation; d.Reason != "" {
		line("escalation %s: %s%s", d.Level, d.Reason, escalationTerms(d))
	}
	for _, f := range p.Freezes {
		what := "thaw"
		if f.Freeze {
			what = "freeze"
		}
		line("%s %s: %s", what, target(f.Kind, f.ID), f.Reason)
	}
	if r := p.Escalation.Evict; r != nil {
		names := make([]string, len(p.EvictCandidates))
		for i, c := range p.EvictCandidates {
			names[i] = c.Namespace + "/" + c.Name
		}
		line("evict %s; candidates in order: [%s]", r, strings.Join(names, " "))
	}
	if p.Reclaim {
		c, m := p.Reclaimed.CPU, p.Reclaimed.Memory
		line("batch resources: cpu %.3f cores (%s: %s), memory %s (%s: %s)", c.Published, publishVerb(c.Write),
			c.Reason, bytesString(m.Published), publishVerb(m.Write), m.Reason)
	}
	for _, n := range p.Notices {
		line("event %s %s: %s", n.Pod, n.Kind, n.Message)
	}
	for _, c := range p.Conditions {
		line("condition %s %s=%s %s: %s", c.Pod, ConditionBatchSlowed, c.Condition.Reason.Status(), c.Condition.Reason,
			c.Condition.Message)
	}
	for _, uid := range p.Forget {
		line("forget condition %s", uid)
	}
	return b.String()
}

// target names a write's group: "tier", or the kind and the pod's ID.
func target(kind CPUTargetKind, id string) string {
	if kind == TargetTier {
		return "tier"
	}
	return string(kind) + " " + id
}

func verb(write bool) string {
	if write {
		return "write"
	}
	return "hold"
}

func publishVerb(write bool) string {
	if write {
		return "publish"
	}
	return "keep"
}

// escalationTerms are the numbers behind an escalation decision, for String.
func escalationTerms(d EscalationDecision) string {
	var parts []string
	if d.Starved {
		parts = append(parts, "starved for "+d.StarvedFor.Duration.Round(time.Millisecond).String())
	}
	if d.Froze {
		parts = append(parts, "froze now")
	}
	if d.Thawed {
		parts = append(parts, "thawed now")
	}
	if d.MemoryPressure {
		parts = append(parts, fmt.Sprintf("memory pressure (%.0f%% used)", 100*d.MemoryUsedRatio))
	}
	if !d.NextEvictionAt.IsZero() {
		parts = append(parts, "next eviction at "+d.NextEvictionAt.UTC().Format(time.TimeOnly))
	}
	for _, f := range []struct {
		on   bool
		what string
	}{{d.ClockJump, "clock jump"}, {d.CPUUnknown, "cpu unknown"}, {d.MemoryUnknown, "memory unknown"}} {
		if f.on {
			parts = append(parts, f.what)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// bytesString is a byte count in MiB, or GiB from 1 GiB.
func bytesString(v float64) string {
	switch {
	case math.IsNaN(v):
		return "unknown"
	case math.Abs(v) >= 1<<30:
		return fmt.Sprintf("%.2fGiB", v/(1<<30))
	}
	return fmt.Sprintf("%.1fMiB", v/(1<<20))
}
