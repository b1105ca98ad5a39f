package placement

import (
	"fmt"
	"math/rand"
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
