package gang

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// placeAll places members on nodes (cloning a node before its first change) and
// returns the slots of those that fit. meta[i] is the name, labels and taints of
// nodes[i]: a member goes only to nodes its constraints allow, condition taints
// counting or not as conditions says (see podConstraints.allows). It reads only
// its arguments: gang planning runs it without the index lock.
//
// Each member goes where placement.Select would send it. With a rankable
// policy (its scores a function of node and request, as Ledger.Policy says:
// not the random one) the scores are kept between members (rankings): placing a member
// changes one node, so only that node is scored again, and a gang of m members
// over n nodes costs about n + m scores instead of m·n.
func placeAll(pol placement.Policy, rankable bool, nodes []*placement.Node, meta []*corev1.Node, idx map[string]int,
	members []planMember, conditions bool) []planSlot {
	order := slices.Clone(members)
	slices.SortStableFunc(order, func(a, b planMember) int {
		return cmp.Or(cmp.Compare(b.req.GPUTotalMilli(), a.req.GPUTotalMilli()), cmp.Compare(b.req.CPUMilli, a.req.CPUMilli))
	})
	cloned := make(map[int]bool)
	allowed := make(map[string][]int) // constraints key → indices of the nodes they allow, ascending
	keep := rankable
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
	req  wire.RequestKey
}

// worth reports whether the pair (cons, r) is worth a ranking: it has one, or
// it came before.
func (rs *rankings) worth(cons string, r placement.Request) bool {
	for _, e := range rs.live {
		if e.cons == cons && sameRequest(e.k.Request(), r) {
			return true
		}
	}
	k := rankKey{cons, wire.KeyOf(r)}
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
	key     wire.RequestKey
	cons    string
	nodes   []*placement.Node
	meta    []*corev1.Node
	idx     map[string]int
	members []planMember
	fits    int
}

// everCached returns g's cached verdict for minMember and p at capGen, if any.
func (g *gang) everCached(capGen uint64, minMember int, p Pod) (int, bool) {
	if g.everGen == capGen && g.everMin == minMember && g.everKey == wire.KeyOf(p.Request()) &&
		g.everCons == p.Member().cons.cacheKey() {
		return g.everFits, true
	}
	return 0, false
}

// newEverJob copies what everJob.run needs from the ledger (the whole
// cluster, emptied). Call with the index lock held.
func newEverJob(led Ledger, g *gang, minMember int, p Pod) *everJob {
	_, capGen := led.Generations()
	j := &everJob{capGen: capGen, min: minMember, key: wire.KeyOf(p.Request()), cons: p.Member().cons.cacheKey()}
	j.nodes, j.meta, j.idx = led.EmptyNodes()
	members := make([]Pod, 0, minMember)
	for _, m := range sortedMembers(g, p) {
		if m.RequestErr() == nil && len(members) < minMember {
			members = append(members, m)
		}
	}
	for len(members) < minMember {
		members = append(members, p)
	}
	j.members = planMembersOf(members)
	return j
}

func (j *everJob) run(pol placement.Policy, rankable bool) {
	j.fits = len(placeAll(pol, rankable, j.nodes, j.meta, j.idx, j.members, false))
}

// everStore caches j's verdict on g if the cluster's capacity is still at
// capGen, the generation j was taken at.
func (g *gang) everStore(capGen uint64, j *everJob) {
	if capGen == j.capGen {
		g.everGen, g.everMin, g.everKey, g.everCons, g.everFits = j.capGen, j.min, j.key, j.cons, j.fits
	}
}

// sortedMembers lists g's members with first in front, then by creation time and name.
func sortedMembers(g *gang, first Pod) []Pod {
	out := make([]Pod, 0, len(g.members))
	for _, m := range g.members {
		if m != first {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Pod) int {
		return cmp.Or(a.Created().Compare(b.Created()), strings.Compare(a.Name(), b.Name()))
	})
	return append([]Pod{first}, out...)
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
	trigger                Pod
	key                    planCacheKey
	minMember, bound, need int
	ttl                    time.Duration
	policy                 placement.Policy
	rankable               bool // the policy's scores may be kept between members (placeAll)
	members                []planMember
	nodes                  []*placement.Node // clones: planning changes them
	meta                   []*corev1.Node
	idx                    map[string]int
	slots                  []planSlot
	ever                   *everJob
}

// run plans the gang. It touches only the job's own copies: call it without the lock.
func (j *gangJob) run() {
	j.slots = placeAll(j.policy, j.rankable, j.nodes, j.meta, j.idx, j.members, true)
	if len(j.slots) < j.need && j.ever != nil {
		j.ever.run(j.policy, j.rankable)
	}
}
