package placement

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
)

// Select returns the feasible node with the highest score for r and the devices
// the policy chose on it. Ties are broken at random with rng; with a nil rng the
// earliest of the tied nodes in nodes wins (the openb replay passes nodes in a
// seeded random order, which is how the FGD artifact breaks ties). The error wraps
// ErrInvalidRequest for an impossible r and ErrNoFit when no node fits.
// Select reads the nodes and never changes them.
func Select(p Policy, nodes []*Node, r Request, rng *rand.Rand) (best *Node, devices []int, err error) {
	if err := r.Validate(); err != nil {
		return nil, nil, err
	}
	sc, fast := p.(scorer)
	var (
		bestScore float64
		bestSet   deviceSet
		bestDevs  []int
		ties      int
	)
	for _, n := range nodes {
		var (
			v    float64
			set  deviceSet
			devs []int
			ok   bool
		)
		if fast {
			v, set, ok = sc.score(n, &r)
		} else {
			v, devs, ok = p.Score(n, r)
		}
		if !ok {
			continue
		}
		switch {
		case best == nil || v > bestScore:
			ties = 1
		case v == bestScore:
			ties++
			if rng == nil || rng.Intn(ties) != 0 {
				continue
			}
		default:
			continue
		}
		best, bestScore, bestSet, bestDevs = n, v, set, devs
	}
	if best == nil {
		return nil, nil, fmt.Errorf("%d nodes for %d cpu, %dMiB, %dx%d milli gpu %v: %w",
			len(nodes), r.CPUMilli, r.MemoryMiB, r.NumGPU, r.GPUMilli, r.Models, ErrNoFit)
	}
	if fast {
		bestDevs = bestSet.slice()
	}
	return best, bestDevs, nil
}

// Ranking is Select repeated for one request over nodes that change one at a
// time, as when a gang's members are placed one after another: it keeps each
// node's score and scores again only the nodes the caller reports changed
// (Update), and keeps the best in a tournament tree, so that a Select after k
// changes costs k scores and k·log n comparisons. Its Select returns exactly
// what Select(p, nodes, r, nil) returns for the nodes as they are now, provided
// p's score is a function of the node and the request alone: true of every
// policy Concurrent reports, never of random (its draws depend on how often it
// is called). It reads the nodes and never changes them; it is not safe for
// concurrent use.
type Ranking struct {
	p     Policy
	sc    scorer
	fast  bool
	r     Request
	err   error // why r is invalid
	nodes []*Node
	stale []bool // scored before the node's last change (or never)
	dirty []int  // the stale positions since the last Select (all of them before the first)
	v     []float64
	ok    []bool
	set   []deviceSet // the scorer's devices (fast)
	devs  [][]int     // Policy.Score's devices (!fast)
	nans  int         // feasible nodes scored NaN: the tree cannot rank them (Select scans)
	// tree is a tournament over the positions: tree[leaves+i] is i, or -1 when
	// node i does not fit; each inner entry is the better of its two children
	// (better), tree[1] the best of all.
	tree   []int32
	leaves int
	built  bool
}

// NewRanking ranks nodes (the slice is copied, the nodes are not) for r with
// p. Nothing is scored before the first Select.
func NewRanking(p Policy, nodes []*Node, r Request) *Ranking {
	n := len(nodes)
	k := &Ranking{p: p, r: r, err: r.Validate(), nodes: slices.Clone(nodes),
		stale: make([]bool, n), v: make([]float64, n), ok: make([]bool, n)}
	k.sc, k.fast = p.(scorer)
	if k.fast {
		k.set = make([]deviceSet, n)
	} else {
		k.devs = make([][]int, n)
	}
	for i := range k.stale {
		k.stale[i] = true
	}
	k.leaves = 1
	for k.leaves < n {
		k.leaves *= 2
	}
	k.tree = make([]int32, 2*k.leaves)
	return k
}

// Request is the request k ranks nodes for.
func (k *Ranking) Request() Request { return k.r }

// Update reports that the node at position i changed, or was replaced by n
// (a copy, say): it is scored again at the next Select.
func (k *Ranking) Update(i int, n *Node) {
	k.nodes[i] = n
	if !k.stale[i] {
		k.stale[i] = true
		k.dirty = append(k.dirty, i)
	}
}

// Select is Select(p, nodes, r, nil) over k's nodes: the feasible node with
// the highest score (the earliest of tied ones) and the devices the policy
// chose on it, or an error wrapping ErrInvalidRequest or ErrNoFit.
func (k *Ranking) Select() (best *Node, devices []int, err error) {
	if k.err != nil {
		return nil, nil, k.err
	}
	if !k.built {
		for i := range k.nodes {
			k.score(i)
			k.tree[k.leaves+i] = k.leaf(i)
		}
		for j := k.leaves + len(k.nodes); j < len(k.tree); j++ {
			k.tree[j] = -1
		}
		for j := k.leaves - 1; j >= 1; j-- {
			k.tree[j] = k.better(k.tree[2*j], k.tree[2*j+1])
		}
		k.built = true
	}
	for _, i := range k.dirty {
		k.score(i)
		j := k.leaves + i
		k.tree[j] = k.leaf(i)
		for j /= 2; j >= 1; j /= 2 {
			k.tree[j] = k.better(k.tree[2*j], k.tree[2*j+1])
		}
	}
	k.dirty = k.dirty[:0]
	at := -1
	if len(k.tree) > 1 {
		at = int(k.tree[1])
	}
	if k.nans > 0 {
		// Select's own comparison, which a NaN makes order-dependent: only a
		// higher score displaces the best, so a NaN wins only as the first
		// feasible node, and nothing after it can displace it.
		at = -1
		for i := range k.nodes {
			if k.ok[i] && (at < 0 || k.v[i] > k.v[at]) {
				at = i
			}
		}
	}
	if at < 0 {
		r := k.r
		return nil, nil, fmt.Errorf("%d nodes for %d cpu, %dMiB, %dx%d milli gpu %v: %w",
			len(k.nodes), r.CPUMilli, r.MemoryMiB, r.NumGPU, r.GPUMilli, r.Models, ErrNoFit)
	}
	if k.fast {
		return k.nodes[at], k.set[at].slice(), nil
	}
	return k.nodes[at], k.devs[at], nil
}

// score scores position i again.
func (k *Ranking) score(i int) {
	if k.ok[i] && math.IsNaN(k.v[i]) {
		k.nans--
	}
	if k.fast {
		k.v[i], k.set[i], k.ok[i] = k.sc.score(k.nodes[i], &k.r)
	} else {
		k.v[i], k.devs[i], k.ok[i] = k.p.Score(k.nodes[i], k.r)
	}
	if k.ok[i] && math.IsNaN(k.v[i]) {
		k.nans++
	}
	k.stale[i] = false
}

// leaf is position i's entry in the tree: i, or -1 when node i does not fit.
func (k *Ranking) leaf(i int) int32 {
	if !k.ok[i] {
		return -1
	}
	return int32(i)
}

// better is the better of positions a < b (either -1: none) as Select ranks
// them: the higher score, the earlier on a tie. Without NaNs this is an order,
// so the tree's root is what Select's scan finds.
func (k *Ranking) better(a, b int32) int32 {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	case k.v[b] > k.v[a]:
		return b
	}
	return a
}
