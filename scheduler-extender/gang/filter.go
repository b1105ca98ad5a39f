package gang

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/wire"
)

// A gang member's filter, and the life of a gang's plan: planned (outside the
// index lock), committed, failed, expired. Where a gang's nodes are decided:
// Filter → filterLocked (the plan to follow, a resumed one, or a gangJob) →
// gangJob.run → placeAll (placement.Select per member, plan.go).

// Filter is the filter of gang member p over the candidates names. done=false
// means the gang is already admitted and p is placed like any pod (the
// caller goes on with it).
// Call with the index lock held for writing: it returns with it held, but
// drops it while the gang is planned (gangJob.run costs minMember Selects over
// the candidates: it runs on copies and commits only what still holds).
func (gs *Gangs) Filter(p Pod, names [][]byte, out wire.Outcome) (wire.Outcome, bool) {
	out, done, job := gs.filterLocked(p, names, out)
	if job != nil {
		gs.ix.Unlock()
		job.run()
		gs.ix.Lock()
		out = gs.finishLocked(job, names, out)
	}
	return out, done
}

// filterLocked decides a gang member's filter under the index lock.
// done=false means the gang is already admitted and p is placed like any pod.
// A non-nil job means the gang must be planned: the caller (filter) runs
// job.run without the lock and then finishLocked with it. Call with the index
// lock held for writing.
func (gs *Gangs) filterLocked(p Pod, names [][]byte, out wire.Outcome) (wire.Outcome, bool, *gangJob) {
	g := gs.book.byKey[p.Member().gang.key]
	minMember, ttl, err, retry := gs.book.minMember(g, p)
	if err == nil && minMember > gs.cfg.MaxMembers {
		err = fmt.Errorf("gang %s: minMember %d exceeds this extender's limit of %d (-max-gang-members): %w",
			g.key, minMember, gs.cfg.MaxMembers, ErrInvalidGang)
	}
	if err != nil {
		if !retry {
			g.state = GangInvalid
		}
		g.reason = err.Error()
		out.FailAll(names, err.Error(), !retry)
		return out, true, nil
	}
	g.min = minMember
	bound := g.bound()
	if bound >= minMember && g.plan == nil {
		g.state, g.reason = GangAdmitted, ""
		return out, false, nil
	}
	if g.plan != nil {
		if !g.plan.has(p) {
			out.FailAll(names, fmt.Sprintf("gang %s: a plan holds %d other members; waiting for them to bind", g.key, len(g.plan.members)), false)
			return out, true, nil
		}
		gs.filterPlannedLocked(g, p, names, &out)
		return out, true, nil
	}
	if g.planning {
		out.FailAll(names, fmt.Sprintf("gang %s: another member is planning the gang; retry", g.key), false)
		return out, true, nil
	}
	if gs.resumePlanLocked(g, p, minMember, ttl) && p.Planned() {
		// The plan recorded before a restart holds again: follow it.
		gs.filterPlannedLocked(g, p, names, &out)
		return out, true, nil
	}

	need := minMember - bound
	pending := make([]Pod, 0, need)
	for _, m := range sortedMembers(g, p) {
		if !m.Holds() && m.RequestErr() == nil && len(pending) < need {
			pending = append(pending, m)
		}
	}
	gen, capGen := gs.led.Generations()
	key := planCacheKey{gen: gen, capGen: capGen, version: g.version, names: hashNames(gs.seed, names), min: minMember, bound: bound,
		trigger: p.UID()}
	if key == g.noFit {
		// Nothing the last plan read has changed: it still does not fit.
		return gs.waitLocked(g, p, names, out, bound+g.noFitN, minMember, nil), true, nil
	}
	job := &gangJob{g: g, trigger: p, key: key, minMember: minMember, bound: bound, need: need, ttl: ttl,
		members: planMembersOf(pending)}
	job.policy, job.rankable = gs.led.Policy()
	job.nodes, job.meta, job.idx = gs.led.Candidates(names)
	if _, ok := g.everCached(capGen, minMember, p); !ok {
		job.ever = newEverJob(gs.led, g, minMember, p)
	}
	g.planning = true
	return out, true, job
}

// finishLocked commits a planned gang if everything it planned still holds
// (Node.Place re-checks each slot), or records why the gang waits. Call with
// the index lock held for writing.
func (gs *Gangs) finishLocked(j *gangJob, names [][]byte, out wire.Outcome) wire.Outcome {
	g, p := j.g, j.trigger
	g.planning = false
	out.Reset()
	gs.book.forgetIfEmpty(g) // its last member may have left while it was planned
	if gs.book.byKey[g.key] != g || gs.ix.Pod(p.UID()) != p || g.plan != nil {
		out.FailAll(names, fmt.Sprintf("gang %s changed while it was planned; retry", g.key), false)
		return out
	}
	if len(j.members) == j.need && len(j.slots) == j.need {
		for _, sl := range j.slots {
			if gs.ix.Pod(sl.p.UID()) != sl.p || sl.p.Holds() {
				out.FailAll(names, fmt.Sprintf("gang %s: a member changed while the gang was planned; retry", g.key), false)
				return out
			}
		}
		if err := gs.commitPlan(g, p, j.slots, gs.book.nextPlanID(), gs.now().Add(j.ttl), false); err != nil {
			out.FailAll(names, wire.ReasonChangedRetry, false)
			return out
		}
		out.Passed = append(out.Passed[:0], p.Node())
		out.FailOthers(names, p.Node(), fmt.Sprintf("gang %s: member planned on node %s", g.key, p.Node()))
		return out
	}
	g.noFit, g.noFitN = j.key, len(j.slots)
	return gs.waitLocked(g, p, names, out, j.bound+len(j.slots), j.minMember, j.ever)
}

// waitLocked refuses every node for a gang that does not fit now: as never
// fitting (unresolvable) when minMember members cannot fit the empty cluster,
// otherwise as waiting. ever is the check run for this verdict, nil when a cached
// one exists. Call with the index lock held for writing.
func (gs *Gangs) waitLocked(g *gang, p Pod, names [][]byte, out wire.Outcome, fits, minMember int, ever *everJob) wire.Outcome {
	reason := fmt.Sprintf("gang %s: %d/%d members fit", g.key, fits, minMember)
	if len(g.members) < minMember {
		reason += fmt.Sprintf(" (%d of %d members exist)", len(g.members), minMember)
	}
	_, capGen := gs.led.Generations()
	everFits, ok := g.everCached(capGen, minMember, p)
	if !ok && ever != nil {
		g.everStore(capGen, ever)
		everFits, ok = ever.fits, true
	}
	if ok && everFits < minMember {
		reason = fmt.Sprintf("gang %s: minMember %d can never fit the cluster (at most %d fit on empty nodes)", g.key, minMember, everFits)
		if g.state != GangUnschedulable {
			gs.out.Emit(p, true, "GangUnschedulable", reason)
			gs.count("unschedulable")
		}
		g.state, g.reason = GangUnschedulable, reason
		out.FailAll(names, reason, true)
		return out
	}
	if g.reason != reason {
		gs.out.Emit(p, false, "GangWaiting", reason)
	}
	g.state, g.reason = GangWaiting, reason
	out.FailAll(names, reason, false)
	return out
}

// filterPlannedLocked passes a planned member's node only, or releases the
// plan when that node is no longer a candidate for it. Call with the index
// lock held for writing.
func (gs *Gangs) filterPlannedLocked(g *gang, p Pod, names [][]byte, out *wire.Outcome) {
	node := p.Node()
	for _, b := range names {
		if string(b) == node {
			out.Passed = append(out.Passed[:0], node)
		}
	}
	if len(out.Passed) == 0 {
		reason := fmt.Sprintf("gang %s: planned node %s is not feasible for member %s; plan released", g.key, node, podKey(p))
		gs.failPlan(g, reason, "plan_broken")
		out.FailAll(names, reason, false)
		return
	}
	out.FailOthers(names, node, fmt.Sprintf("gang %s: member planned on node %s", g.key, node))
}

func (pl *gangPlan) has(p Pod) bool {
	_, ok := pl.members[p.UID()]
	return ok
}

// commitPlan reserves every slot as plan id until expires and records the
// plan on every member (which nudges the others); resumed plans (recorded
// before a restart) are not recorded again.
func (gs *Gangs) commitPlan(g *gang, trigger Pod, slots []planSlot, id uint64, expires time.Time, resumed bool) error {
	plan := &gangPlan{id: id, members: map[types.UID]bool{}, expires: expires,
		done: make(chan struct{}), results: map[types.UID]error{}}
	for i, sl := range slots {
		if err := gs.led.Plan(sl.p, sl.node, sl.devs); err != nil {
			for _, done := range slots[:i] {
				gs.led.Release(done.p)
			}
			return fmt.Errorf("reserving gang %s plan: %w", g.key, err)
		}
		plan.members[sl.p.UID()] = false
	}
	g.plan, g.state, g.reason = plan, GangPlanned, ""
	var where []string
	for _, sl := range slots {
		where = append(where, sl.p.Name()+"→"+sl.node)
		if !resumed {
			gs.out.Nudge(sl.p, formatPlanState(plan.id, sl, plan.expires))
		}
	}
	verb := "reserves"
	if resumed {
		verb = "resumed after a restart, reserves"
	}
	gs.out.Emit(trigger, false, "GangPlanned", fmt.Sprintf("gang %s: plan %d %s %d members until %s: %s",
		g.key, plan.id, verb, len(slots), plan.expires.UTC().Format(time.RFC3339), strings.Join(where, ", ")))
	if !resumed {
		gs.count("planned")
	}
	return nil
}

// failPlan releases g's plan: every member that has not been bound is made
// pending and every member waiting at bind is woken with reason. Call with the
// index lock held for writing (as every method below).
func (gs *Gangs) failPlan(g *gang, reason, metric string) {
	plan := g.plan
	if plan == nil || plan.committing {
		return
	}
	g.plan = nil
	gs.book.finish(plan.id, plan.recordsExpire())
	var any Pod
	for uid := range plan.members {
		if m := gs.ix.Pod(uid); m != nil {
			any = m
			if m.Planned() || m.Binding() {
				gs.led.Release(m)
			}
		}
	}
	plan.err = fmt.Errorf("gang %s: %s: %w", g.key, reason, errGangBind)
	close(plan.done)
	g.state, g.reason = GangWaiting, reason
	if any != nil {
		gs.out.Emit(any, true, "GangPlanReleased", fmt.Sprintf("gang %s: plan %d released: %s", g.key, plan.id, reason))
	}
	gs.count(metric)
}

// releasePlanOf fails the plan p is part of, if any.
func (gs *Gangs) releasePlanOf(p Pod, reason string) {
	m := p.Member()
	if !m.hasGang {
		return
	}
	if g := gs.book.byKey[m.gang.key]; g != nil && g.plan != nil {
		if _, ok := g.plan.members[p.UID()]; ok {
			gs.failPlan(g, reason, "plan_broken")
		}
	}
}

// ExpirePlans fails plans whose TTL passed before every member reached bind.
func (gs *Gangs) ExpirePlans(now time.Time) {
	for _, g := range gs.book.byKey {
		if pl := g.plan; pl != nil && !pl.committing && now.After(pl.expires) {
			gs.failPlan(g, fmt.Sprintf("plan expired with %d/%d members at bind", pl.arrived, len(pl.members)), "plan_expired")
		}
	}
}
