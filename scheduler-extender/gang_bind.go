package extender

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// gangBinds binds a planned gang together: each member's bind waits
// (binder.Bind) until every member of the plan has reached bind; the last to
// arrive commits the whole plan (one Binding per member) and finishBind wakes
// the others. It is the gangs' bind coordination, apart from their planning
// (Gangs): it reads and settles the plans Gangs keeps in its registry, under
// the index lock, and fails a plan through Gangs.failPlan.
type gangBinds struct {
	gs *Gangs
}

// beginBindLocked moves gang member p to phaseBinding on node if its gang's
// plan holds it: job.commit when p is the last member to arrive (the caller
// then binds job.all). gang=false: p is not bound as a gang member (its gang
// is admitted; it binds like any pod). Call with the index lock held for writing.
func (gb *gangBinds) beginBindLocked(p *podEntry, node string) (job bindJob, err error, gang bool) {
	g := gb.gs.book.byKey[p.gang.key]
	switch {
	case g != nil && g.plan != nil && g.plan.has(p):
	case g != nil && (g.min == 0 || g.bound() < g.min):
		return job, fmt.Errorf("gang %s: no plan holds pod %s; it must pass filter again: %w", p.gang.key, p.key(), errGangBind), true
	default:
		return job, nil, false
	}
	job = bindJob{g: g, plan: g.plan}
	if p.node != node {
		return job, fmt.Errorf("gang %s: member %s is planned on %s, not %s: %w", g.key, p.key(), p.node, node, errGangBind), true
	}
	if !g.plan.members[p.uid] {
		g.plan.members[p.uid] = true
		g.plan.arrived++
	}
	p.phase = phaseBinding
	job.member = memberOf(p)
	if g.plan.arrived == len(g.plan.members) && !g.plan.committing {
		g.plan.committing, g.state = true, GangBinding
		for uid := range g.plan.members {
			if m := gb.gs.ix.pod(uid); m != nil {
				job.all = append(job.all, memberOf(m))
			}
		}
		slices.SortFunc(job.all, func(a, b bindMember) int { return strings.Compare(a.name, b.name) })
		job.commit = true
	}
	return job, nil, true
}

// finishBind records the outcome of a gang commit (each member's Binding
// error) and wakes every waiting member.
func (gb *gangBinds) finishBind(g *gang, plan *gangPlan, results map[types.UID]error) {
	gb.gs.ix.lock()
	defer gb.gs.ix.unlock()
	bound, failed := 0, 0
	var any *podEntry
	for uid := range plan.members {
		p := gb.gs.ix.pod(uid)
		err, tried := results[uid]
		if !tried {
			// Gone from the index before the commit: no Binding was attempted.
			err = fmt.Errorf("gang %s: member %s left before the commit: %w", g.key, uid, errGangBind)
			results[uid] = err
		}
		if err != nil {
			failed++
		} else {
			bound++
		}
		if p == nil {
			continue
		}
		any = p
		if p.phase != phaseBinding {
			continue
		}
		switch {
		case errors.Is(err, ErrBindUnconfirmed):
			holdUnconfirmed(p, gb.gs.now().Add(gb.gs.cfg.AssumedTTL))
		case err != nil:
			gb.gs.led.release(p)
		default:
			p.phase = phaseAssumed
		}
	}
	plan.results = results
	if g.plan == plan {
		g.plan = nil
	}
	gb.gs.book.finish(plan.id, plan.recordsExpire())
	if failed == 0 {
		g.state, g.reason = GangAdmitted, ""
		gb.gs.count("bound")
		if any != nil {
			gb.gs.out.emit(any, false, "GangBound", fmt.Sprintf("gang %s: %d members bound", g.key, bound))
		}
	} else {
		reason := fmt.Sprintf("gang %s: %d members bound, %d failed", g.key, bound, failed)
		g.state, g.reason = GangWaiting, reason
		gb.gs.count("bind_failed")
		if any != nil {
			gb.gs.out.emit(any, true, "GangBindFailed", reason)
		}
	}
	close(plan.done)
}

// bindTimeout fails plan if it is still waiting for members at bind.
func (gb *gangBinds) bindTimeout(g *gang, plan *gangPlan) {
	gb.gs.ix.lock()
	defer gb.gs.ix.unlock()
	if g.plan == plan && !plan.committing {
		gb.gs.failPlan(g, fmt.Sprintf("bind timeout with %d/%d members at bind", plan.arrived, len(plan.members)), "bind_timeout")
	}
}

// planResult is a member's outcome once plan.done is closed.
func (gb *gangBinds) planResult(plan *gangPlan, uid types.UID) error {
	gb.gs.ix.rlock()
	defer gb.gs.ix.runlock()
	if plan.err != nil {
		return plan.err
	}
	return plan.results[uid]
}
