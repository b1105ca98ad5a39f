package extender

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
)

// Gang membership keys of the three dialects the extender understands.
const (
	// LabelPodGroup names the scheduler-plugins (coscheduling) PodGroup of a pod;
	// minMember and scheduleTimeoutSeconds come from the PodGroup object.
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// AnnotationVolcanoGroupName and AnnotationVolcanoGroupNameAlt name a Volcano group.
	AnnotationVolcanoGroupName    = "scheduling.k8s.io/group-name"
	AnnotationVolcanoGroupNameAlt = "scheduling.volcano.sh/group-name"
	// AnnotationVolcanoMinMember is the Volcano group's minimum member count.
	AnnotationVolcanoMinMember = "scheduling.volcano.sh/group-min-member"
	// AnnotationKoordinatorName and AnnotationKoordinatorMinAvailable are Koordinator's lightweight gang protocol.
	AnnotationKoordinatorName         = "gang.scheduling.koordinator.sh/name"
	AnnotationKoordinatorMinAvailable = "gang.scheduling.koordinator.sh/min-available"
	// AnnotationGangState is written by the extender on planned members so that
	// kube-scheduler requeues them (a pod update moves a pod out of the
	// unschedulable queue) and so that people can see the plan.
	AnnotationGangState = contract.AnnotationGangState
)

// Gang dialects.
const (
	DialectPodGroup    = "podgroup"
	DialectVolcano     = "volcano"
	DialectKoordinator = "koordinator"
)

// Gang states reported in /status and metrics.
const (
	GangWaiting       = "waiting"
	GangPlanned       = "planned"
	GangBinding       = "binding"
	GangAdmitted      = "admitted"
	GangUnschedulable = "unschedulable"
	GangInvalid       = "invalid"
)

// MaxGangSize bounds minMember.
const MaxGangSize = 10000

// ErrInvalidGang means a pod's gang annotations or its PodGroup are malformed.
var ErrInvalidGang = errors.New("invalid gang spec")

// errGangBind is the base of every error a gang member's bind returns.
var errGangBind = errors.New("gang bind failed")

// gangRef is what a pod says about its gang.
type gangRef struct {
	key, namespace, name, dialect string
	min                           int   // from the pod's annotation (volcano, koordinator); 0 if absent
	err                           error // malformed annotation
}

// podGang reports the gang a pod belongs to, if any. The scheduler-plugins label
// wins over Volcano, Volcano over Koordinator.
func podGang(pod *corev1.Pod) (gangRef, bool) {
	ref := gangRef{namespace: pod.Namespace}
	minKey := ""
	switch {
	case pod.Labels[LabelPodGroup] != "":
		ref.name, ref.dialect = pod.Labels[LabelPodGroup], DialectPodGroup
	case pod.Annotations[AnnotationVolcanoGroupName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationVolcanoGroupName], DialectVolcano, AnnotationVolcanoMinMember
	case pod.Annotations[AnnotationVolcanoGroupNameAlt] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationVolcanoGroupNameAlt], DialectVolcano, AnnotationVolcanoMinMember
	case pod.Annotations[AnnotationKoordinatorName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationKoordinatorName], DialectKoordinator, AnnotationKoordinatorMinAvailable
	default:
		return ref, false
	}
	ref.key = ref.namespace + "/" + ref.name
	if minKey != "" {
		v, ok := pod.Annotations[minKey]
		if !ok {
			if ref.dialect != DialectVolcano { // Volcano's minMember is its PodGroup's
				ref.err = fmt.Errorf("annotation %s missing: %w", minKey, ErrInvalidGang)
			}
		} else if m, err := ParseMinMember(v); err != nil {
			ref.err = fmt.Errorf("annotation %s: %w", minKey, err)
		} else {
			ref.min = m
		}
	}
	return ref, true
}

// ParseMinMember parses a minimum member count: a decimal integer in 1..MaxGangSize.
func ParseMinMember(s string) (int, error) {
	m, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || m < 1 || m > MaxGangSize {
		return 0, fmt.Errorf("min member %q must be an integer in 1..%d: %w", s, MaxGangSize, ErrInvalidGang)
	}
	return m, nil
}

// reqKey identifies a request shape.
type reqKey struct {
	cpu, mem, bcpu, bmem int64
	num, milli           int
	models               string
}

func keyOf(r placement.Request) reqKey {
	return reqKey{r.CPUMilli, r.MemoryMiB, r.BatchCPUMilli, r.BatchMemoryMiB, r.NumGPU, r.GPUMilli, strings.Join(r.Models, ",")}
}

// gang is the extender's view of one gang.
type gang struct {
	key, namespace, name, dialect string
	members                       map[types.UID]*podEntry
	state                         string
	reason                        string // why it waits (last filter verdict)
	min                           int    // last resolved minMember
	plan                          *gangPlan

	everGen  uint64 // capGen the ever-fits verdict was computed at (0: none)
	everMin  int
	everKey  reqKey
	everCons string // constraints key of the pod it was computed for
	everFits int

	version  uint64       // bumped on every change of a member (keys noFit)
	planning bool         // a member's filter is planning outside the lock
	noFit    planCacheKey // the inputs of the last plan that did not fit (zero: none)
	noFitN   int          // how many members fit in it
}

// gangPlan is a reserved placement for a whole gang.
type gangPlan struct {
	id      uint64
	members map[types.UID]bool // value: reached bind
	arrived int
	expires time.Time
	// recorded is when the members' plan records expire, when later than
	// expires (a resumed record clamped to the plan TTL): the book keeps the
	// id finished until then, so that the record is not resumed again.
	recorded   time.Time
	committing bool
	done       chan struct{} // closed when the plan is finished (bound, failed or expired)
	results    map[types.UID]error
	err        error // whole-plan failure
}

// recordsExpire is when the members' records of pl expire.
func (pl *gangPlan) recordsExpire() time.Time {
	if pl.recorded.After(pl.expires) {
		return pl.recorded
	}
	return pl.expires
}

// planSlot is one member's place in a plan.
type planSlot struct {
	p    *podEntry
	node string
	devs []int
}

// planMember is what planning reads of a member: copied under the lock, so that
// planning can run without it.
type planMember struct {
	p    *podEntry // identity only: never read outside the lock
	req  placement.Request
	cons *podConstraints // replaced, never modified, by gangBook.join
}

func planMembersOf(ps []*podEntry) []planMember {
	out := make([]planMember, len(ps))
	for i, p := range ps {
		out[i] = planMember{p: p, req: p.req, cons: p.cons}
	}
	return out
}

// placeAll places members on nodes (cloning a node before its first change) and
// returns the slots of those that fit. meta[i] is the name, labels and taints of
// nodes[i]: a member goes only to nodes its constraints allow, condition taints
// counting or not as conditions says (see podConstraints.allows). It reads only
// its arguments: gang planning runs it without the index lock.
//
// Each member goes where placement.Select would send it. With a deterministic
// policy the scores are kept between members (rankings): placing a member
// changes one node, so only that node is scored again, and a gang of m members
// over n nodes costs about n + m scores instead of m·n.
func placeAll(pol placement.Policy, nodes []*placement.Node, meta []*corev1.Node, idx map[string]int, members []planMember, conditions bool) []planSlot {
	order := slices.Clone(members)
	slices.SortStableFunc(order, func(a, b planMember) int {
		return cmp.Or(cmp.Compare(b.req.GPUTotalMilli(), a.req.GPUTotalMilli()), cmp.Compare(b.req.CPUMilli, a.req.CPUMilli))
	})
	cloned := make(map[int]bool)
	allowed := make(map[string][]int) // constraints key → indices of the nodes they allow, ascending
	keep := rankable(pol)
	var ranks rankings
	var cand []*placement.Node
	var slots []planSlot
	for _, m := range order {
		key := m.cons.cacheKey()
		ix, ok := allowed[key]
		if !ok {
			ix = []int{}
			for i := range nodes {
				if m.cons.allows(meta[i], conditions) {
					ix = append(ix, i)
				}
			}
			allowed[key] = ix
		}
		var (
			best *placement.Node
			devs []int
			err  error
		)
		if keep && ranks.worth(key, m.req) {
			best, devs, err = ranks.of(pol, nodes, ix, key, m.req).Select()
		} else {
			cand = cand[:0]
			for _, i := range ix {
				cand = append(cand, nodes[i]) // after clones: nodes[i] is the current copy
			}
			best, devs, err = placement.Select(pol, cand, m.req, nil)
		}
		if err != nil {
			continue
		}
		i := idx[best.Name]
		if !cloned[i] {
			nodes[i], cloned[i] = nodes[i].Clone(), true
		}
		if nodes[i].Place(m.req, devs) != nil {
			continue
		}
		ranks.changed(i, nodes[i])
		slots = append(slots, planSlot{p: m.p, node: best.Name, devs: devs})
	}
	return slots
}

// rankable reports whether pol's scores are a function of node and request,
// so that placeAll may keep them between members: not for the random policy,
// which the index serves wrapped in lockedPolicy.
func rankable(pol placement.Policy) bool {
	if _, locked := pol.(*lockedPolicy); locked {
		return false
	}
	return placement.Concurrent(pol)
}

// maxRankings bounds the rankings placeAll keeps at once: a gang's members
// come sorted by size, so members of one shape and constraints mostly follow
// each other, and one ranking is n scores of memory.
const maxRankings = 8

// rankings are placeAll's placement.Rankings of its most recent (constraints,
// request) pairs, most recently used first. A pair gets one only when it comes
// again (worth): a gang whose members all differ costs what a Select per
// member costs, not a ranking made and dropped per member.
type rankings struct {
	live []ranked
	seen map[rankKey]bool
}

// rankKey identifies a (constraints, request) pair, as far as worth needs.
type rankKey struct {
	cons string
	req  reqKey
}

// worth reports whether the pair (cons, r) is worth a ranking: it has one, or
// it came before.
func (rs *rankings) worth(cons string, r placement.Request) bool {
	for _, e := range rs.live {
		if e.cons == cons && sameRequest(e.k.Request(), r) {
			return true
		}
	}
	k := rankKey{cons, keyOf(r)}
	if rs.seen[k] {
		return true
	}
	if rs.seen == nil {
		rs.seen = map[rankKey]bool{}
	}
	rs.seen[k] = true
	return false
}

// ranked is the ranking of one request over the nodes one constraints key
// allows: ix are their indices in placeAll's nodes, ascending, and the
// ranking's positions.
type ranked struct {
	cons string
	ix   []int
	k    *placement.Ranking
}

// of is the ranking of r over the nodes ix (of nodes) that constraints cons
// allow, made on first use.
func (rs *rankings) of(pol placement.Policy, nodes []*placement.Node, ix []int, cons string, r placement.Request) *placement.Ranking {
	for j, e := range rs.live {
		if e.cons == cons && sameRequest(e.k.Request(), r) {
			copy(rs.live[1:j+1], rs.live[:j])
			rs.live[0] = e
			return e.k
		}
	}
	cand := make([]*placement.Node, len(ix))
	for j, i := range ix {
		cand[j] = nodes[i]
	}
	e := ranked{cons: cons, ix: ix, k: placement.NewRanking(pol, cand, r)}
	if len(rs.live) < maxRankings {
		rs.live = append(rs.live, ranked{})
	}
	copy(rs.live[1:], rs.live[:len(rs.live)-1])
	rs.live[0] = e
	return e.k
}

// changed tells every ranking that holds node i that it is now n.
func (rs *rankings) changed(i int, n *placement.Node) {
	for _, e := range rs.live {
		if j, ok := slices.BinarySearch(e.ix, i); ok {
			e.k.Update(j, n)
		}
	}
}

// sameRequest reports whether a and b are the same request.
func sameRequest(a, b placement.Request) bool {
	return a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB && a.NumGPU == b.NumGPU && a.GPUMilli == b.GPUMilli &&
		a.BatchCPUMilli == b.BatchCPUMilli && a.BatchMemoryMiB == b.BatchMemoryMiB && slices.Equal(a.Models, b.Models)
}

// everJob is the "can the gang ever fit" check: how many of minMember members
// (the gang's own requests, padded with the filtered pod's) fit on the whole
// cluster emptied of every pod, each member only on the nodes its node
// selector, required node affinity and tolerations allow (condition taints such
// as not-ready or cordoned do not count: they pass). Its verdict is cached per
// capGen (node set, capacity, labels, taints), minMember, request shape and
// constraints of the filtered pod.
type everJob struct {
	capGen  uint64
	min     int
	key     reqKey
	cons    string
	nodes   []*placement.Node
	meta    []*corev1.Node
	idx     map[string]int
	members []planMember
	fits    int
}

// everCached returns g's cached verdict for minMember and p at capGen, if any.
func (g *gang) everCached(capGen uint64, minMember int, p *podEntry) (int, bool) {
	if g.everGen == capGen && g.everMin == minMember && g.everKey == keyOf(p.req) && g.everCons == p.cons.cacheKey() {
		return g.everFits, true
	}
	return 0, false
}

// newEverJob copies what everJob.run needs from the ledger (the whole
// cluster, emptied). Call with the index lock held.
func newEverJob(led gangLedger, g *gang, minMember int, p *podEntry) *everJob {
	_, capGen := led.generations()
	j := &everJob{capGen: capGen, min: minMember, key: keyOf(p.req), cons: p.cons.cacheKey()}
	j.nodes, j.meta, j.idx = led.emptyNodes()
	members := make([]*podEntry, 0, minMember)
	for _, m := range sortedMembers(g, p) {
		if m.reqErr == nil && len(members) < minMember {
			members = append(members, m)
		}
	}
	for len(members) < minMember {
		members = append(members, p)
	}
	j.members = planMembersOf(members)
	return j
}

func (j *everJob) run(pol placement.Policy) {
	j.fits = len(placeAll(pol, j.nodes, j.meta, j.idx, j.members, false))
}

// everStore caches j's verdict on g if the cluster's capacity is still at
// capGen, the generation j was taken at.
func (g *gang) everStore(capGen uint64, j *everJob) {
	if capGen == j.capGen {
		g.everGen, g.everMin, g.everKey, g.everCons, g.everFits = j.capGen, j.min, j.key, j.cons, j.fits
	}
}

// sortedMembers lists g's members with first in front, then by creation time and name.
func sortedMembers(g *gang, first *podEntry) []*podEntry {
	out := make([]*podEntry, 0, len(g.members))
	for _, m := range g.members {
		if m != first {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *podEntry) int {
		return cmp.Or(a.created.Compare(b.created), strings.Compare(a.name, b.name))
	})
	return append([]*podEntry{first}, out...)
}

// planCacheKey is what a gang plan read: the index generation (every node
// change bumps it), the gang's member version, the candidate names, minMember,
// the bound members and the member being filtered (it goes first).
type planCacheKey struct {
	gen, capGen, version uint64
	names                uint64
	min, bound           int
	trigger              types.UID
}

// hashNames identifies a candidate list.
func hashNames(seed maphash.Seed, names [][]byte) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, b := range names {
		_, _ = h.Write(b)
		_ = h.WriteByte(0)
	}
	return h.Sum64()
}

// gangJob is one gang plan computed without the index lock: copies of the
// candidate nodes and of the pending members' requests, planned greedily
// (largest first) with the serving policy, and, when no cached verdict exists,
// the "can it ever fit" check (everJob).
type gangJob struct {
	g                      *gang
	trigger                *podEntry
	key                    planCacheKey
	minMember, bound, need int
	ttl                    time.Duration
	policy                 placement.Policy
	members                []planMember
	nodes                  []*placement.Node // clones: planning changes them
	meta                   []*corev1.Node
	idx                    map[string]int
	slots                  []planSlot
	ever                   *everJob
}

// run plans the gang. It touches only the job's own copies: call it without the lock.
func (j *gangJob) run() {
	j.slots = placeAll(j.policy, j.nodes, j.meta, j.idx, j.members, true)
	if len(j.slots) < j.need && j.ever != nil {
		j.ever.run(j.policy)
	}
}
