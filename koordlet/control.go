package koordlet

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the decide step's state: the qos controller (budget, guard, write
// policy, escalator, reclaimer, pod conditions), and what it last decided.

// controller is the control loop's decision state. Its decisions are qos's
// (qos.Controller.Plan); it keeps what they need between periods and what /status shows.
type controller struct {
	q       qos.Controller
	metrics *metrics.Agent
	// last is the budget in force and before the one it replaced; lastUtil the last
	// period's utilisation budget (the Budgeter's) and lastUsage its usage: a wake-up
	// between periods decides from them.
	last, before, lastUtil qos.Budget
	lastUsage              Usage
	lastReclaim            qos.Reclaimed
	lastEscalation         qos.EscalationDecision
	lastCut                cutRecord
	// unattributed is the kubepods CPU no known pod accounts for, at the last period
	// that read every pod; it counts as LS.
	unattributed float64
}

// newController builds the decision state; conditions says whether the pods' condition
// is written (Kubernetes mode).
func newController(cfg config.Config, guard *qos.Guard, m *metrics.Agent, conditions bool) *controller {
	c := &controller{
		q: qos.Controller{Budgeter: qos.NewBudgeter(cfg.Policy), Guard: guard, Writes: writePolicy(cfg),
			MemoryThreshold: cfg.BatchResources.Memory.Threshold,
			Escalator:       qos.NewEscalator(cfg.Escalation, cfg.Period.Duration),
			Reclaimer:       qos.NewReclaimer(cfg.BatchResources)},
		metrics: m,
	}
	if conditions {
		c.q.Conditions = qos.NewBatchConditions()
	}
	return c
}

// signalled reports whether the agent has a harm signal (eBPF or PSI): then only harm
// cuts batch; in sampling mode utilisation does.
func (c *controller) signalled() bool { return c.q.Guard != nil }

// plan decides the period from its sample and the batch limits in force, and remembers
// what /status and the next decisions need.
func (c *controller) plan(s sample, in qos.BatchLimits) qos.Plan {
	s.CPU.Unattributed = c.unattributed
	p := c.q.Plan(s.Sample, in)
	c.unattributed = p.Attribution.Unattributed
	c.lastUtil = p.Util
	c.adopt(p.Budget)
	if p.Reclaim {
		c.lastReclaim = p.Reclaimed
	}
	c.lastEscalation = p.Escalation
	at := p.Attribution
	c.lastUsage = Usage{Node: s.CPU.NodeCores, LS: at.LS, UnknownPods: at.UnknownPods, BE: at.BE, Batch: at.Batch,
		System: at.System, CPUs: s.CPU.CPUs}
	return p
}

// adopt makes b the budget in force.
func (c *controller) adopt(b qos.Budget) { c.before, c.last = c.last, b }

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
	c.adopt(p.Budget)
	return p, true
}

// final is the graceful stop's plan: batch bounded at target cores in all, every limit
// written exactly.
func (c *controller) final(target float64, now time.Time, in qos.BatchLimits) qos.Plan {
	p := qos.Plan{Budget: qos.Budget{Applied: target, Reason: "shutdown"}}
	c.q.PlanWrites(&p, qos.Sample{Now: now}, in, true)
	return p
}

// seenPod tells the pod conditions of a pod new to the agent, with the condition it
// carries from an earlier run of the agent.
func (c *controller) seenPod(pod *corev1.Pod) {
	if c.q.Conditions != nil {
		c.q.Conditions.Seed(pod)
	}
}

// reconfigure takes the live fields of a reloaded configuration (old: the one in force
// until now). A new policy or guard setting continues from the budget in force.
func (c *controller) reconfigure(old, cfg config.Config, now time.Time) {
	if cfg.Policy != old.Policy {
		c.q.Budgeter = continueBudgeter(cfg.Policy, c.lastUtil)
	}
	if cfg.Signals.GuardConfig != old.Signals.GuardConfig && c.q.Guard != nil {
		c.q.Guard = continueGuard(cfg.Signals.GuardConfig, c.q.Guard, now)
	}
	c.q.Writes = writePolicy(cfg)
}

// recordBudget counts a cut or a restore of the budget in force (against the one before
// it) and remembers the cut. For a cut by a harm signal the reaction is from when the
// signal was seen to written, just after the quotas were written; for a utilisation cut
// it is window (from the start of the sample window in which the rise became visible to
// the write). Restores are counted from the third period on (restored says so).
func (c *controller) recordBudget(b qos.Budget, cause qos.Signal, h signals.Harm, now, written time.Time,
	window time.Duration, restored bool) {
	switch {
	case b.Applied < c.before.Applied:
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
	case b.Applied > c.before.Applied && restored:
		c.metrics.Actions.WithLabelValues(metrics.ActionRestore).Inc()
	}
}
