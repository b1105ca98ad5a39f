package extender

import (
	"cmp"
	"hash/maphash"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/placement"
)

// Gangs admits gangs all-or-nothing: it keeps the gang registry (gangBook:
// members, PodGroups, plan ids), decides a gang member's filter and plans the
// gang (gang_plan.go), commits, fails and expires plans and resumes recorded
// ones after a restart (gang_resume.go). Binding a plan's members together is
// gangBinds' (gang_bind.go). It holds no capacity of its own: it asks the
// index's ledger (gangLedger) to place and release its members, and the index
// tells it what happens to pods (podObserver).
//
// It shares the index's lock: every lower-case method is called with it held
// (for writing unless it says otherwise); the exported ones and filter (which
// drops it while planning) take it.
type Gangs struct {
	cfg  Config
	now  func() time.Time
	ix   gangIndex
	led  gangLedger
	pol  policySource
	book gangBook
	out  *outbox           // Events and nudges, sent after the lock
	met  *metrics.Extender // nil: not counted
	seed maphash.Seed      // hashes candidate lists (planCacheKey)
}

// gangIndex is what Gangs needs of the cluster index (State): its lock and
// its pods. Every method but the lock's is called with the lock held.
type gangIndex interface {
	lock()
	unlock()
	rlock()
	runlock()
	// pod is the tracked pod uid, nil when none.
	pod(uid types.UID) *podEntry
}

// gangLedger is what Gangs needs of the index's ledger. Call with the index
// lock held.
type gangLedger interface {
	// generations: index (every ledger change) and capacity generation.
	generations() (gen, capGen uint64)
	// candidates copies the known nodes of names (ledger clones), emptyNodes
	// the whole cluster emptied: what planning reads without the lock.
	candidates(names [][]byte) ([]*placement.Node, []*corev1.Node, map[string]int)
	emptyNodes() ([]*placement.Node, []*corev1.Node, map[string]int)
	// placeOn holds p on node with devs in phase if it fits; release frees it.
	placeOn(p *podEntry, node string, devs []int, phase podPhase) error
	release(p *podEntry)
}

// policySource is the index's serving policy (scoring), for planning. Call
// with the index lock held.
type policySource interface {
	servingPolicy() placement.Policy
}

var (
	_ gangIndex    = (*State)(nil)
	_ gangLedger   = (*ledger)(nil)
	_ policySource = (*scoring)(nil)
	_ podObserver  = (*Gangs)(nil)
)

// newGangs returns the gangs of index ix, and makes them its observer. Call
// before ix is shared.
func newGangs(cfg Config, ix *State, now func() time.Time) *Gangs {
	gs := &Gangs{cfg: cfg, now: now, ix: ix, led: ix.led, pol: ix.sc, book: newGangBook(cfg, now()), out: ix.out,
		seed: maphash.MakeSeed()}
	ix.obs = gs
	return gs
}

// podUpdated keeps p's gang membership, constraints and recorded plan in line
// with rec (podObserver). A recorded plan is taken from the informer only.
func (gs *Gangs) podUpdated(p *podEntry, rec *podRecord, fromInformer bool) {
	gs.book.join(p, rec)
	if fromInformer {
		p.persisted = nil
		if p.hasGang {
			p.persisted = rec.persisted
		}
	}
}

// podBound admits p's gang once enough members are bound (podObserver).
func (gs *Gangs) podBound(p *podEntry) { gs.book.confirm(p) }

// podReleasing breaks the plan p is part of (podObserver).
func (gs *Gangs) podReleasing(p *podEntry, reason string) { gs.releasePlanOf(p, reason) }

// podDeleted drops p from its gang (podObserver).
func (gs *Gangs) podDeleted(p *podEntry) { gs.book.leave(p) }

func (gs *Gangs) count(ev string) {
	if gs.met != nil {
		gs.met.GangTransitions.WithLabelValues(ev).Inc()
	}
}

// UpsertPodGroup records a PodGroup (scheduling.x-k8s.io/v1alpha1).
func (gs *Gangs) UpsertPodGroup(u *unstructured.Unstructured) {
	gs.upsertGroup(func(b *gangBook) map[string]podGroupSpec { return b.podGroups }, u, parsePodGroup)
}

// DeletePodGroup forgets a PodGroup; its members wait until it comes back.
func (gs *Gangs) DeletePodGroup(namespace, name string) {
	gs.deleteGroup(func(b *gangBook) map[string]podGroupSpec { return b.podGroups }, namespace, name)
}

// UpsertVolcanoPodGroup records a Volcano PodGroup (scheduling.volcano.sh/v1beta1).
func (gs *Gangs) UpsertVolcanoPodGroup(u *unstructured.Unstructured) {
	gs.upsertGroup(func(b *gangBook) map[string]podGroupSpec { return b.volcano }, u, parseVolcanoPodGroup)
}

// DeleteVolcanoPodGroup forgets a Volcano PodGroup.
func (gs *Gangs) DeleteVolcanoPodGroup(namespace, name string) {
	gs.deleteGroup(func(b *gangBook) map[string]podGroupSpec { return b.volcano }, namespace, name)
}

func (gs *Gangs) deleteGroup(which func(*gangBook) map[string]podGroupSpec, namespace, name string) {
	gs.ix.lock()
	defer gs.ix.unlock()
	delete(which(&gs.book), namespace+"/"+name)
}

func (gs *Gangs) upsertGroup(which func(*gangBook) map[string]podGroupSpec, u *unstructured.Unstructured,
	parse func(*unstructured.Unstructured) podGroupSpec) {
	if u == nil {
		return
	}
	spec := parse(u)
	gs.ix.lock()
	defer gs.ix.unlock()
	gs.book.setGroup(which(&gs.book), u.GetNamespace()+"/"+u.GetName(), spec)
}

// status lists every gang for /status, by key. Call with the index lock held
// (read suffices).
func (gs *Gangs) status() []GangStatus {
	out := []GangStatus{}
	for _, g := range gs.book.byKey {
		st := GangStatus{Gang: g.key, Dialect: g.dialect, State: g.state, MinMember: g.min,
			Members: len(g.members), Bound: g.bound(), Reason: g.reason}
		if pl := g.plan; pl != nil {
			for uid := range pl.members {
				if m := gs.ix.pod(uid); m != nil {
					st.Plan = append(st.Plan, m.name+"→"+m.node)
					if m.persisted != nil && m.persisted.id == pl.id {
						st.Recorded++
					}
				}
			}
			slices.Sort(st.Plan)
			st.AtBind = pl.arrived
			t := pl.expires
			st.PlanExpiry = &t
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b GangStatus) int { return cmp.Compare(a.Gang, b.Gang) })
	return out
}

// countStates counts gangs by state into m (metrics). Call with the index lock
// held (read suffices).
func (gs *Gangs) countStates(m map[string]int) {
	for _, g := range gs.book.byKey {
		m[g.state]++
	}
}
