package extender

import (
	"math/rand"
	"sync"
)

// randomPolicy scores every feasible node with a fresh random number, so Select
// picks uniformly among them; a share goes to a random device that holds it,
// whole GPUs to the lowest-index free ones.
type randomPolicy struct {
	mu  sync.Mutex
	rng *rand.Rand
}

var _ Policy = (*randomPolicy)(nil)

func (p *randomPolicy) Name() string { return PolicyRandom }

func (p *randomPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

func (p *randomPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.check(r) != nil {
		return 0, 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !r.Sharing() {
		return p.rng.Float64(), lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU), true
	}
	dev, seen := -1, 0
	for i, f := range n.GPUFree {
		if f >= r.GPUMilli {
			seen++
			if p.rng.Intn(seen) == 0 {
				dev = i
			}
		}
	}
	return p.rng.Float64(), 1 << uint(dev), true
}
