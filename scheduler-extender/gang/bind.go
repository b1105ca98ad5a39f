package gang

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Binds binds a planned gang together: each member's bind waits until every
// member of the plan has reached bind (BeginBind); the last to arrive commits
// the whole plan (its caller creates one Binding per member) and FinishBind
// wakes the others. It is the gangs' bind coordination, apart from their
// planning (Gangs): it reads and settles the plans Gangs keeps in its
// registry, under the index lock, and fails a plan through Gangs.failPlan.
type Binds struct {
	gs *Gangs
}

// NewBinds is the bind coordination of gs's plans.
func NewBinds(gs *Gangs) *Binds { return &Binds{gs: gs} }

// Bind is a planned member's bind, as BeginBind decided it.
type Bind struct {
	g    *gang
	plan *gangPlan
	// Commit: the member is the last of its plan to arrive: the caller binds
	// All (every member of the plan the index still tracks, by name) and
	// reports the outcome with FinishBind.
	Commit bool
	All    []Pod
}

// Done is closed once the plan is finished (bound, failed or expired).
func (b *Bind) Done() <-chan struct{} { return b.plan.done }

// BeginBind marks gang member p as arrived at bind on node if its gang's plan
// holds it (the caller then moves p to binding). gang=false: p is not bound
// as a gang member (its gang is admitted; it binds like any pod). Call with
// the index lock held for writing.
func (gb *Binds) BeginBind(p Pod, node string) (b *Bind, err error, gang bool) {
	key, _ := p.Member().Gang()
	g := gb.gs.book.byKey[key]
	switch {
	case g != nil && g.plan != nil && g.plan.has(p):
	case g != nil && (g.min == 0 || g.bound() < g.min):
		return nil, fmt.Errorf("gang %s: no plan holds pod %s; it must pass filter again: %w", key, podKey(p), errGangBind), true
	default:
		return nil, nil, false
	}
	if p.Node() != node {
		return nil, fmt.Errorf("gang %s: member %s is planned on %s, not %s: %w", g.key, podKey(p), p.Node(), node, errGangBind), true
	}
	b = &Bind{g: g, plan: g.plan}
	if !g.plan.members[p.UID()] {
		g.plan.members[p.UID()] = true
		g.plan.arrived++
	}
	if g.plan.arrived == len(g.plan.members) && !g.plan.committing {
		g.plan.committing, g.state = true, GangBinding
		for uid := range g.plan.members {
			if m := gb.gs.ix.Pod(uid); m != nil {
				b.All = append(b.All, m)
			}
		}
		slices.SortFunc(b.All, func(x, y Pod) int { return strings.Compare(x.Name(), y.Name()) })
		b.Commit = true
	}
	return b, nil, true
}

// FinishBind records the outcome of a gang commit (each member's Binding
// error, by uid) and wakes every waiting member.
func (gb *Binds) FinishBind(b *Bind, results map[types.UID]error) {
	gs, g, plan := gb.gs, b.g, b.plan
	gs.ix.Lock()
	defer gs.ix.Unlock()
	bound, failed := 0, 0
	var any Pod
	for uid := range plan.members {
		p := gs.ix.Pod(uid)
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
		if p.Binding() {
			gs.led.Settle(p, err)
		}
	}
	plan.results = results
	if g.plan == plan {
		g.plan = nil
	}
	gs.book.finish(plan.id, plan.recordsExpire())
	if failed == 0 {
		g.state, g.reason = GangAdmitted, ""
		gs.count("bound")
		if any != nil {
			gs.out.Emit(any, false, "GangBound", fmt.Sprintf("gang %s: %d members bound", g.key, bound))
		}
	} else {
		reason := fmt.Sprintf("gang %s: %d members bound, %d failed", g.key, bound, failed)
		g.state, g.reason = GangWaiting, reason
		gs.count("bind_failed")
		if any != nil {
			gs.out.Emit(any, true, "GangBindFailed", reason)
		}
	}
	close(plan.done)
}

// BindTimeout fails b's plan if it is still waiting for members at bind.
func (gb *Binds) BindTimeout(b *Bind) {
	gb.gs.ix.Lock()
	defer gb.gs.ix.Unlock()
	if g, plan := b.g, b.plan; g.plan == plan && !plan.committing {
		gb.gs.failPlan(g, fmt.Sprintf("bind timeout with %d/%d members at bind", plan.arrived, len(plan.members)), "bind_timeout")
	}
}

// Result is member uid's outcome once b.Done() is closed.
func (gb *Binds) Result(b *Bind, uid types.UID) error {
	gb.gs.ix.RLock()
	defer gb.gs.ix.RUnlock()
	if b.plan.err != nil {
		return b.plan.err
	}
	return b.plan.results[uid]
}
