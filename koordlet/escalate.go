package koordlet

import (
	"context"
	"errors"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/evict"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// evictor performs the evictions the escalator decides, off the control loop
// (evict.Evictor; a dry-run one in static mode).
type evictor interface {
	Submit(req qos.EvictionRequest, candidates []qos.EvictionCandidate) error
	Run(ctx context.Context) error
	Status() evict.Status
}

var _ evictor = (*evict.Evictor)(nil)

// freezeTimeout bounds one freeze or thaw in the control loop: a task stuck in
// uninterruptible sleep keeps a v1 freezer FREEZING; the loop must go on.
const freezeTimeout = 50 * time.Millisecond

// escalate runs the graded actions after the period's budget: throttle (the budget
// itself), freeze batch while LS leaves it nothing for longer than freezeAfter, and
// evict batch pods (lowest priority, largest memory, newest first) only when node memory
// crosses the eviction threshold or batch has been starved past starvationTimeout. Memory
// is the last sample, as old as the sampler's mem.at.
func (a *Agent) escalate(b qos.Budget, hasBatch bool, now time.Time) {
	mem := &a.sampler.mem
	in := qos.EscalationInput{Now: now, Budget: b, HasBatch: hasBatch, MemoryAt: mem.at}
	if mem.ok {
		in.MemoryUsed, in.MemoryCapacity = int64(mem.last.Used), int64(mem.last.Capacity)
	}
	d := a.ctl.escalator.Decide(in)
	a.ctl.lastEscalation = d
	a.escMetrics.Level.Set(float64(d.Level))
	if d.Froze {
		a.escMetrics.Freezes.WithLabelValues(qos.EscalationReasonCPUContention).Inc()
		a.log.Info("LS leaves batch nothing; freezing batch", "starved_for", d.StarvedFor.Duration)
		a.batchEv.frozen(a.sorted, d, b, now)
	}
	if d.Thawed {
		a.log.Info("LS left room again; thawing batch")
	}
	a.act.setFrozen(a.sorted, d.Freeze)
	if d.Evict != nil {
		cands := evictionCandidates(a.sorted)
		if len(cands) == 0 {
			return
		}
		if err := a.evictor.Submit(*d.Evict, cands); err != nil {
			a.log.Error("submitting an eviction", "err", err)
		}
	}
}

// evictionCandidates are the batch pods the agent knows by name and that are not being
// deleted already; LS and BE pods are never candidates.
func evictionCandidates(pods []*podState) []qos.EvictionCandidate {
	var out []qos.EvictionCandidate
	for _, st := range pods {
		if st.class != qos.ClassBatch || st.terminating || st.namespace == "" {
			continue
		}
		out = append(out, qos.EvictionCandidate{UID: st.uid, Namespace: st.namespace, Name: st.name,
			Class: st.class, Priority: st.spec.priority, MemoryBytes: int64(st.memUsage), StartTime: st.spec.started})
	}
	qos.OrderEvictionCandidates(out)
	return out
}

// setFrozen freezes (or thaws) the tier and the in-place batch pods. A pod being deleted
// is never kept frozen: it could not handle SIGTERM. Groups that fail are retried next
// period.
func (x *actuator) setFrozen(pods []*podState, freeze bool) {
	if x.tier != nil && x.tierFrozen != freeze {
		if x.freeze(x.tier, freeze) {
			x.tierFrozen = freeze
		}
	}
	if !freeze && x.frozenPods == 0 {
		return // the common case: nothing to walk
	}
	for _, st := range pods {
		if st.class != qos.ClassBatch || st.inTier || st.group == nil {
			continue
		}
		want := freeze && !st.terminating
		if st.frozen == want {
			continue
		}
		if x.freeze(st.group, want) {
			x.setPodFrozen(st, want)
		}
	}
}

// setPodFrozen records a pod's freezer state and keeps frozenPods in step.
func (x *actuator) setPodFrozen(st *podState, frozen bool) {
	if st.frozen == frozen {
		return
	}
	st.frozen = frozen
	if frozen {
		x.frozenPods++
	} else {
		x.frozenPods--
	}
}

// freeze freezes or thaws one group within freezeTimeout and reports whether the group
// now counts as in the state asked: a thaw that succeeded, or a freeze that succeeded
// or timed out. A freeze that timed out goes on in the kernel (v2 keeps cgroup.freeze
// 1, v1 stays FREEZING), so it counts as frozen and a thaw, the shutdown's too, reaches it.
func (x *actuator) freeze(g *cgroups.Group, freeze bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	var err error
	if freeze {
		err = g.FreezeContext(ctx)
	} else {
		err = g.ThawContext(ctx)
	}
	if err != nil && !errors.Is(err, cgroups.ErrNotExist) {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		x.log.Warn("freezing or thawing batch; retrying next period", "cgroup", g.Path(), "freeze", freeze, "err", err)
	}
	return err == nil || (freeze && !errors.Is(err, cgroups.ErrNotExist))
}

// thawAll thaws the tier and every batch pod the agent froze (shutdown).
func (x *actuator) thawAll(pods []*podState) {
	if x.tier != nil {
		if x.freeze(x.tier, false) {
			x.tierFrozen = false
		}
	}
	for _, st := range pods {
		if st.frozen && st.group != nil {
			if x.freeze(st.group, false) {
				x.setPodFrozen(st, false)
			}
		}
	}
}

// forget releases a pod the table drops or replaces: a pod the agent froze is thawed
// (a pod that left batch must run; a gone one no longer counts in frozenPods).
func (x *actuator) forget(st *podState) {
	if st.frozen && st.group != nil {
		x.freeze(st.group, false)
	}
	x.setPodFrozen(st, false)
	st.close()
}
