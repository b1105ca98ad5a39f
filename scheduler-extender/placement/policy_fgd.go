package placement

import (
	"math"

	"github.com/understory/understory/contract"
)

// fgdPolicy is Fragmentation Gradient Descent (Weng et al., USENIX ATC'23): place
// where the expected fragmentation F of the node grows least,
// score = ⌊100·σ((F(n) − F(n′))/1000)⌋ with n′ the node after placement (CPU
// included). A share tries every device that holds it and keeps the best (lowest
// index on ties); whole GPUs take the lowest-index free devices.
type fgdPolicy struct {
	w *Workload
}

var _ Policy = (*fgdPolicy)(nil)

func (p *fgdPolicy) Name() string { return PolicyFGD }

func (p *fgdPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

// fgdScore squashes a fragmentation decrease the way the artifact does.
func fgdScore(delta float64) float64 {
	return float64(int64(1.0 / (1.0 + math.Exp(-delta/1000)) * 100))
}

func (p *fgdPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.Check(r) != nil {
		return 0, 0, false
	}
	t := p.w.table(n.Model)
	cpu, sc := n.FreeCPUMilli(), r.ScoreCPUMilli()
	f0 := t.frag(cpu, n.GPUFree)
	var buf [contract.MaxGPUsPerNode]int
	free := buf[:len(n.GPUFree)]
	copy(free, n.GPUFree)
	if r.Sharing() {
		best, dev := -1.0, -1
		pref := lsFitSet(n, r)
		for i, f := range n.GPUFree {
			if f < r.GPUMilli || !pref.candidate(i) || seenBeforeIn(n.GPUFree, i, pref) {
				continue
			}
			free[i] = f - r.GPUMilli
			s := fgdScore(f0 - t.frag(cpu-sc, free))
			free[i] = f
			if s > best {
				best, dev = s, i
			}
		}
		return best, 1 << uint(dev), true
	}
	devs := lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU)
	if cpu < sc {
		// The artifact cannot subtract the scoring CPU, scores the node unchanged.
		return fgdScore(0), devs, true
	}
	for d := devs; d != 0; d &= d - 1 {
		free[trailing(d)] -= r.GPUMilli
	}
	return fgdScore(f0 - t.frag(cpu-sc, free)), devs, true
}

// seenBefore reports whether a device before i has the same free milli as i (so
// placing on i scores the same as on that one).
func seenBefore(free []int, i int) bool {
	for j := 0; j < i; j++ {
		if free[j] == free[i] {
			return true
		}
	}
	return false
}
