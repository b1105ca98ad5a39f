package gang

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
)

// gangBook is the registry of gangs: which pods belong to which gang, what
// their PodGroups say (minMember, timeout) and which plan ids are used up. It
// makes no placement and holds no capacity (the index does); it is guarded by the
// index lock.
type gangBook struct {
	byKey     map[string]*gang
	podGroups map[string]podGroupSpec // scheduler-plugins PodGroups by namespace/name
	volcano   map[string]podGroupSpec // Volcano PodGroups by namespace/name
	planSeq   uint64                  // last plan id (ids start at planIDBase)
	done      map[uint64]time.Time    // plans released or committed, id → expiry: never resumed

	planTTL, bindTimeout time.Duration // Config.PlanTTL, Config.BindTimeout
}

func newGangBook(cfg Config, now time.Time) gangBook {
	return gangBook{byKey: map[string]*gang{}, podGroups: map[string]podGroupSpec{},
		volcano: map[string]podGroupSpec{}, planSeq: planIDBase(now), done: map[uint64]time.Time{},
		planTTL: cfg.PlanTTL, bindTimeout: cfg.BindTimeout}
}

// join keeps p's gang membership in line with its record rec (nil: in no gang).
func (b *gangBook) join(p Pod, rec *Record) {
	m := p.Member()
	if m.hasGang && (rec == nil || rec.ref.key != m.gang.key) {
		b.leave(p)
	}
	m.cons = nil
	if rec == nil {
		return
	}
	ref := &rec.ref
	m.gang, m.hasGang, m.cons = *ref, true, rec.cons
	g := b.byKey[ref.key]
	if g == nil {
		g = &gang{key: ref.key, namespace: ref.namespace, name: ref.name, dialect: ref.dialect,
			members: map[types.UID]Pod{}, state: GangWaiting}
		b.byKey[ref.key] = g
	}
	g.members[p.UID()] = p
	g.version++
	b.settle(g, p)
}

// leave drops p from its gang, and the gang once it has no member, plan or planning.
func (b *gangBook) leave(p Pod) {
	m := p.Member()
	if !m.hasGang {
		return
	}
	m.hasGang = false
	g := b.byKey[m.gang.key]
	if g == nil {
		return
	}
	delete(g.members, p.UID())
	g.version++
	b.forgetIfEmpty(g)
}

// forgetIfEmpty drops g once it has no member, no plan and no planning.
func (b *gangBook) forgetIfEmpty(g *gang) {
	if b.byKey[g.key] == g && len(g.members) == 0 && g.plan == nil && !g.planning {
		delete(b.byKey, g.key)
	}
}

// confirm updates p's gang once p is bound.
func (b *gangBook) confirm(p Pod) {
	if m := p.Member(); m.hasGang {
		b.settle(b.byKey[m.gang.key], p)
	}
}

// settle brings a gang without a plan up to date with what its members and its
// PodGroup say (minMember), and admits it once that many members are bound. A
// restarted extender learns its gangs this way, from pods a previous one bound,
// which no filter call sized. A gang being planned, or holding a plan, is left to
// filter and the plan; an invalid one to filter.
func (b *gangBook) settle(g *gang, p Pod) {
	if g == nil || g.plan != nil || g.planning || g.state == GangInvalid {
		return
	}
	if n, _, err, _ := b.minMember(g, p); err == nil && n > 0 {
		g.min = n
	}
	if g.min > 0 && g.bound() >= g.min {
		g.state, g.reason = GangAdmitted, ""
	}
}

// bound is how many members are bound or assumed.
func (g *gang) bound() int {
	n := 0
	for _, m := range g.members {
		if m.Bound() {
			n++
		}
	}
	return n
}

// minMember resolves a gang's minMember and plan TTL. retryable errors (a
// PodGroup not seen yet) leave the pod schedulable later; others need the pod fixed.
func (b *gangBook) minMember(g *gang, p Pod) (minMember int, ttl time.Duration, err error, retryable bool) {
	ref := &p.Member().gang
	ttl = b.planTTL
	if g.dialect == DialectPodGroup {
		spec, ok := b.podGroups[g.key]
		switch {
		case !ok:
			return 0, 0, fmt.Errorf("gang %s: PodGroup not found (is the scheduling.x-k8s.io CRD installed?)", g.key), true
		case spec.err != nil:
			return 0, 0, fmt.Errorf("gang %s: PodGroup: %w", g.key, spec.err), false
		}
		if spec.timeout > 0 {
			ttl = max(spec.timeout, b.bindTimeout)
		}
		return spec.minMember, ttl, nil, false
	}
	if g.dialect == DialectVolcano {
		// Volcano's PodGroup is the truth; the per-member annotation only
		// stands in where no Volcano PodGroup is seen (Volcano not installed,
		// or the extender's VolcanoPodGroups off).
		if spec, ok := b.volcano[g.key]; ok {
			if spec.err != nil {
				return 0, 0, fmt.Errorf("gang %s: Volcano PodGroup: %w", g.key, spec.err), false
			}
			return spec.minMember, ttl, nil, false
		}
		if ref.err == nil && ref.min == 0 {
			return 0, 0, fmt.Errorf("gang %s: Volcano PodGroup not found and no %s annotation", g.key,
				contract.AnnotationVolcanoMinMember), true
		}
	}
	if ref.err != nil {
		return 0, 0, fmt.Errorf("gang %s: %w", g.key, ref.err), false
	}
	return ref.min, ttl, nil, false
}

// setGroup records a PodGroup spec in m (podGroups or volcano); the gang's
// "can it ever fit" verdict is recomputed.
func (b *gangBook) setGroup(m map[string]podGroupSpec, key string, spec podGroupSpec) {
	m[key] = spec
	if g := b.byKey[key]; g != nil {
		g.everGen = 0
		for _, p := range g.members {
			b.settle(g, p) // any member: the PodGroup decides minMember
			break
		}
	}
}

// nextPlanID is a plan id unique across restarts.
func (b *gangBook) nextPlanID() uint64 {
	b.planSeq++
	return b.planSeq
}

// finish marks plan id used up until its expiry: its records are history.
func (b *gangBook) finish(id uint64, expires time.Time) { b.done[id] = expires }

// finished reports whether plan id was released or committed by this process.
func (b *gangBook) finished(id uint64) bool {
	_, ok := b.done[id]
	return ok
}

// prune forgets used-up plan ids whose records have expired.
func (b *gangBook) prune(now time.Time) {
	for id, exp := range b.done {
		if now.After(exp) {
			delete(b.done, id)
		}
	}
}
