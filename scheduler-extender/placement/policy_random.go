package placement

import "math/rand"

// randomPolicy scores every feasible node with a fresh random number, so Select
// picks uniformly among them; a share goes to a random device that holds it,
// whole GPUs to the lowest-index free ones. It draws from its rng on every
// score, so it is not safe for concurrent use (the extender serialises it).
type randomPolicy struct {
	rng *rand.Rand
}

var _ Policy = (*randomPolicy)(nil)

func (p *randomPolicy) Name() string { return PolicyRandom }

func (p *randomPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

func (p *randomPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.Check(r) != nil {
		return 0, 0, false
	}
	if !r.Sharing() {
		return p.rng.Float64(), lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU), true
	}
	dev, seen := -1, 0
	pref := lsFitSet(n, r)
	for i, f := range n.GPUFree {
		if f >= r.GPUMilli && pref.candidate(i) {
			seen++
			if p.rng.Intn(seen) == 0 {
				dev = i
			}
		}
	}
	return p.rng.Float64(), 1 << uint(dev), true
}
