package gang

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
	"github.com/understory/understory/scheduler-extender/wire"
)

// Gangs admits gangs all-or-nothing: it keeps the gang registry (gangBook:
// members, PodGroups, plan ids), decides a gang member's filter and plans the
// gang (filter.go), commits, fails and expires plans and resumes recorded ones
// after a restart (resume.go). Binding a plan's members together is Binds'
// (bind.go). It holds no capacity of its own: it asks the index's ledger
// (Ledger) to place and release its members, and the index tells it what
// happens to pods (PodUpdated, PodBound, PodReleasing, PodDeleted).
//
// It shares the index's lock: every method is called with it held (for
// writing unless it says otherwise) but the PodGroup feed, which takes it, and
// Filter, which drops it while planning.
type Gangs struct {
	cfg  Config
	now  func() time.Time
	ix   Index
	led  Ledger
	out  Outbox
	book gangBook
	met  *metrics.Extender // nil: not counted
	seed maphash.Seed      // hashes candidate lists (planCacheKey)
}

// Config is what the gangs read of the extender's configuration.
type Config struct {
	// MaxMembers caps a gang's minMember (planning costs minMember Selects).
	MaxMembers int
	// PlanTTL is how long a plan holds capacity while its members reach bind.
	PlanTTL time.Duration
	// BindTimeout bounds how long a member's bind waits for the rest of its gang.
	BindTimeout time.Duration
}

// Index is what the gangs need of the cluster index: its lock and its pods.
// Every method but the lock's is called with the lock held.
type Index interface {
	Lock()
	Unlock()
	RLock()
	RUnlock()
	// Pod is the tracked pod uid, nil when none.
	Pod(uid types.UID) Pod
}

// Ledger is what the gangs need of the index's capacity and policy. Call with
// the index lock held (for writing where it changes a pod).
type Ledger interface {
	// Generations: the index's (every ledger change moves it) and the capacity
	// generation (node set, capacity, labels, taints).
	Generations() (gen, capGen uint64)
	// Candidates copies the known nodes of names (ledger clones), EmptyNodes
	// the whole cluster emptied: what planning reads without the lock. Both
	// return the nodes, their names, labels and taints, and each name's index.
	Candidates(names [][]byte) ([]*placement.Node, []*corev1.Node, map[string]int)
	EmptyNodes() ([]*placement.Node, []*corev1.Node, map[string]int)
	// Plan holds p on node with devs as a planned gang member if it fits there.
	Plan(p Pod, node string, devs []int) error
	// Release frees what p holds and makes it pending.
	Release(p Pod)
	// Settle records the outcome err of the Binding of p (at bind): assumed,
	// released, or held as a reservation when the outcome is unknown.
	Settle(p Pod, err error)
	// Policy is the serving policy; rankable says its scores are a function
	// of node and request (so planning may keep them between members).
	Policy() (pol placement.Policy, rankable bool)
}

// Outbox queues what the gangs decide under the index lock but must not do
// there: Events, and the gang-state annotation writes that nudge members.
type Outbox interface {
	Emit(p Pod, warning bool, reason, msg string)
	Nudge(p Pod, value string)
}

// New returns the gangs of an index; met counts gang transitions (nil: not
// counted). The index must tell them what happens to its pods.
func New(cfg Config, ix Index, led Ledger, out Outbox, met *metrics.Extender, now func() time.Time) *Gangs {
	return &Gangs{cfg: cfg, now: now, ix: ix, led: led, out: out, met: met, book: newGangBook(cfg, now()),
		seed: maphash.MakeSeed()}
}

// PodUpdated keeps p's gang membership, constraints and recorded plan in line
// with its record rec (nil: in no gang). A recorded plan is taken from the
// informer only. Call with the index lock held for writing.
func (gs *Gangs) PodUpdated(p Pod, rec *Record, fromInformer bool) {
	gs.book.join(p, rec)
	if fromInformer {
		m := p.Member()
		m.persisted = nil
		if m.hasGang {
			m.persisted = rec.persisted
		}
	}
}

// PodBound admits p's gang once enough members are bound.
func (gs *Gangs) PodBound(p Pod) { gs.book.confirm(p) }

// PodReleasing breaks the plan p is part of: the index is about to drop what
// p holds, for reason.
func (gs *Gangs) PodReleasing(p Pod, reason string) { gs.releasePlanOf(p, reason) }

// PodDeleted drops p from its gang.
func (gs *Gangs) PodDeleted(p Pod) { gs.book.leave(p) }

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
	gs.ix.Lock()
	defer gs.ix.Unlock()
	delete(which(&gs.book), namespace+"/"+name)
}

func (gs *Gangs) upsertGroup(which func(*gangBook) map[string]podGroupSpec, u *unstructured.Unstructured,
	parse func(*unstructured.Unstructured) podGroupSpec) {
	if u == nil {
		return
	}
	spec := parse(u)
	gs.ix.Lock()
	defer gs.ix.Unlock()
	gs.book.setGroup(which(&gs.book), u.GetNamespace()+"/"+u.GetName(), spec)
}

// Status lists every gang for /status, by key. Call with the index lock held
// (read suffices).
func (gs *Gangs) Status() []wire.GangStatus {
	out := []wire.GangStatus{}
	for _, g := range gs.book.byKey {
		st := wire.GangStatus{Gang: g.key, Dialect: g.dialect, State: g.state, MinMember: g.min,
			Members: len(g.members), Bound: g.bound(), Reason: g.reason}
		if pl := g.plan; pl != nil {
			for uid := range pl.members {
				if m := gs.ix.Pod(uid); m != nil {
					st.Plan = append(st.Plan, m.Name()+"→"+m.Node())
					if pp := m.Member().persisted; pp != nil && pp.id == pl.id {
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
	slices.SortFunc(out, func(a, b wire.GangStatus) int { return cmp.Compare(a.Gang, b.Gang) })
	return out
}

// CountStates counts gangs by state into m (metrics). Call with the index lock
// held (read suffices).
func (gs *Gangs) CountStates(m map[string]int) {
	for _, g := range gs.book.byKey {
		m[g.state]++
	}
}
