package koordlet

import (
	"time"

	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the decide step's state: the qos controller (budget, guard, write
// policy), the reclaimer and the escalator, and what they last decided.

// controller is the control loop's decision state. Its decisions are qos's; it keeps
// what they need between periods and what /status shows.
type controller struct {
	q         qos.Controller
	reclaim   *qos.Reclaimer
	escalator *qos.Escalator
	metrics   *metrics.Agent
	// last is the budget in force; lastUtil the last period's utilisation budget (the
	// Budgeter's) and lastUsage its usage: a wake-up between periods decides from them.
	last, lastUtil qos.Budget
	lastUsage      Usage
	lastReclaim    qos.Reclaimed
	lastEscalation qos.EscalationDecision
	lastCut        cutRecord
	// unattributed is the kubepods CPU no known pod accounts for, at the last period
	// that read every pod; it counts as LS.
	unattributed float64
}

func newController(cfg Config, guard *qos.Guard, m *metrics.Agent) *controller {
	return &controller{
		q: qos.Controller{Budgeter: qos.NewBudgeter(cfg.Policy), Guard: guard,
			Writes:          qos.WritePolicy{CFSPeriod: cfg.CFSPeriod.Duration, MinPodCPU: cfg.MinPodCPU},
			MemoryThreshold: cfg.BatchResources.Memory.Threshold},
		reclaim:   qos.NewReclaimer(cfg.BatchResources),
		escalator: qos.NewEscalator(cfg.Escalation, cfg.Period.Duration),
		metrics:   m,
	}
}

// signalled reports whether the agent has a harm signal (eBPF or PSI): then only harm
// cuts batch; in sampling mode utilisation does.
func (c *controller) signalled() bool { return c.q.Guard != nil }

// plan decides the period from its sample and the batch limits in force.
func (c *controller) plan(s sample, in qos.BatchLimits) qos.Plan {
	s.CPU.Unattributed = c.unattributed
	p := c.q.Plan(s.Sample, in)
	c.unattributed = p.Attribution.Unattributed
	c.lastUtil = p.Util
	return p
}

// react decides a wake-up of the signal source between two periods: harm cuts batch at
// once, without waiting for the next utilisation sample; the budget's other terms are
// the last period's. ok is false when nothing is to be written: no period has measured
// the node yet (the tier is still at the start-up bound), or the guard holds the budget
// in force (evidence from before the last cut, batch at its floor).
func (c *controller) react(h qos.HarmSample, now time.Time, in qos.BatchLimits) (qos.Plan, bool) {
	if c.lastUtil.NodeCPUs <= 0 {
		return qos.Plan{}, false
	}
	p := qos.Plan{Util: c.lastUtil}
	p.Budget, p.Cause = c.q.Guarded(c.lastUtil, h, now)
	if p.Budget.Applied == c.last.Applied {
		return qos.Plan{}, false
	}
	c.q.PlanWrites(&p, qos.Sample{Now: now}, in, false)
	return p, true
}

// final is the graceful stop's plan: batch bounded at target cores in all, every limit
// written exactly.
func (c *controller) final(target float64, now time.Time, in qos.BatchLimits) qos.Plan {
	p := qos.Plan{Budget: qos.Budget{Applied: target, Reason: "shutdown"}}
	c.q.PlanWrites(&p, qos.Sample{Now: now}, in, true)
	return p
}

// recordBudget counts a cut or a restore of the budget in force and remembers it. For a
// cut by a harm signal the reaction is from when the signal was seen to written, just
// after the quotas were written; for a utilisation cut it is window (from the start of
// the sample window in which the rise became visible to the write). Restores are counted
// from the third period on (restored says so).
func (c *controller) recordBudget(b qos.Budget, cause qos.Signal, h signals.Harm, now, written time.Time,
	window time.Duration, restored bool) {
	switch {
	case b.Applied < c.last.Applied:
		if cause == qos.SignalNone {
			cause = qos.SignalUtilisation
		}
		rec := cutRecord{signal: cause, at: now, reaction: window, seen: now.Add(-window)}
		if cause != qos.SignalUtilisation {
			rec.reaction, rec.seen, rec.pod, rec.value = max(0, written.Sub(h.At)), h.At, h.Pod, h.Value
		}
		c.metrics.Actions.WithLabelValues(metrics.ActionCut).Inc()
		c.metrics.Cuts.WithLabelValues(string(cause)).Inc()
		c.metrics.CutReaction.WithLabelValues(string(cause)).Observe(rec.reaction.Seconds())
		c.lastCut = rec
	case b.Applied > c.last.Applied && restored:
		c.metrics.Actions.WithLabelValues(metrics.ActionRestore).Inc()
	}
	c.last = b
}
