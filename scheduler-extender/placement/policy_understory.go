package placement

import (
	"math"
	"slices"
)

// UnderstoryParams are the weights of the understory policy (docs/scoring.md).
type UnderstoryParams struct {
	// Quant is the step, in milli-GPU of fragmentation, ΔF is rounded down to;
	// nodes within a step tie and the node order decides. <= 0 keeps ΔF raw.
	Quant float64
	// Blend mixes FGD's one-pod fragmentation (0) with the multi-pod one (1).
	Blend float64
	// Reserve weighs keeping contended GPU models free: placing d milli on a node
	// of model X costs Reserve·(1 − always(X))·d milli of ΔF.
	Reserve float64
	// Usage weighs the live-utilisation term, in Quant steps.
	Usage float64
	// GPUUsage weighs the live GPU term (how idle the chosen devices are now, per
	// the node agent), in Quant steps. It also picks a share's device among those
	// of equal fragmentation.
	GPUUsage float64
}

// DefaultUnderstoryCoverage is the share of pods understory's target workload
// covers (PolicyCoverage): wider than FGD's 95 %, so that rare classes (the small
// shares that fill the residues larger shares leave, pods pinned to a GPU model)
// count.
const DefaultUnderstoryCoverage = 0.995

// DefaultUnderstoryParams are the weights the extender serves (tuned on openb seed 42).
func DefaultUnderstoryParams() UnderstoryParams {
	return UnderstoryParams{Quant: 100, Blend: 0.3, Reserve: 1, Usage: 1, GPUUsage: 1}
}

// NewUnderstoryPolicy returns the understory policy with explicit weights.
func NewUnderstoryPolicy(w *Workload, p UnderstoryParams) Policy {
	if w == nil {
		w = NewWorkload(nil, DefaultCoverage)
	}
	return newUnderstory(w, p)
}

// understoryPolicy is fragmentation-gradient placement that keeps the node order's
// packing (quantised ΔF), sees CPU stranding and share residues (multi-pod
// fragmentation), keeps contended GPU models free, and prefers nodes the agent
// reports idle. docs/scoring.md has the formula and the measurements.
type understoryPolicy struct {
	w *Workload
	p UnderstoryParams
}

var _ Policy = (*understoryPolicy)(nil)

func newUnderstory(w *Workload, p UnderstoryParams) *understoryPolicy {
	return &understoryPolicy{w: w, p: p}
}

func (p *understoryPolicy) Name() string { return PolicyUnderstory }

func (p *understoryPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

// blend is the weight of the multi-pod fragmentation in F_u, in [0, 1].
func (p *understoryPolicy) blend() float64 { return min(1, max(0, p.p.Blend)) }

// frag is F_u: FGD's fragmentation blended with the multi-pod one (the
// reference evaluation; score uses modelTable.eval when the node fits its
// fixed-size summary).
func (p *understoryPolicy) frag(t *modelTable, cpu int64, free []int) float64 {
	switch b := p.p.Blend; {
	case b <= 0:
		return t.frag(cpu, free)
	case b >= 1:
		return t.fillFrag(cpu, free)
	default:
		return (1-b)*t.frag(cpu, free) + b*t.fillFrag(cpu, free)
	}
}

// level turns a fragmentation decrease into score steps.
func (p *understoryPolicy) level(d float64) float64 {
	if p.p.Quant > 0 {
		return math.Floor(d / p.p.Quant)
	}
	return d / 1000
}

func (p *understoryPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.Check(r) != nil {
		return 0, 0, false
	}
	t := p.w.table(n.Model)
	cpu := n.FreeCPUMilli()
	cpuAfter := cpu - r.ScoreCPUMilli()
	reserve := p.p.Reserve * (1 - t.always) * float64(r.GPUTotalMilli())
	var st fragStats
	fast := t.stats(n.GPUFree, &st)
	var f0 float64
	var free []int // the slow path's scratch copy of n.GPUFree
	if fast {
		f0 = t.eval(&st, cpu, p.blend())
	} else {
		f0 = p.frag(t, cpu, n.GPUFree)
		free = slices.Clone(n.GPUFree)
	}
	// after is F once r has taken its share of every device in ds.
	after := func(ds deviceSet) float64 {
		if fast {
			s2 := st
			for d := ds; d != 0; d &= d - 1 {
				f := n.GPUFree[trailing(d)]
				t.add(&s2, f, -1)
				t.add(&s2, f-r.GPUMilli, 1)
			}
			return t.eval(&s2, cpuAfter, p.blend())
		}
		for d := ds; d != 0; d &= d - 1 {
			free[trailing(d)] -= r.GPUMilli
		}
		f1 := p.frag(t, cpuAfter, free)
		for d := ds; d != 0; d &= d - 1 {
			free[trailing(d)] += r.GPUMilli
		}
		return f1
	}
	var best float64
	var devs deviceSet
	if r.Sharing() {
		dev := -1
		live := p.p.GPUUsage != 0 && n.Usage != nil && len(n.Usage.GPUs) > 0
		pref := lsFitSet(n, r) // devices whose LS-free share holds the request, if any
		for i, f := range n.GPUFree {
			if f < r.GPUMilli || !pref.candidate(i) {
				continue
			}
			// Devices with equal free milli leave equal fragmentation: without live
			// figures the first of them stands for all (with them, each is scored:
			// they differ in how idle they are).
			if !live && seenBeforeIn(n.GPUFree, i, pref) {
				continue
			}
			s := p.level(f0 - after(1<<uint(i)) - reserve)
			if live {
				s += p.p.GPUUsage * n.Usage.gpuIdle(i)
			}
			if dev < 0 || s > best {
				best, dev = s, i
			}
		}
		devs = 1 << uint(dev)
		if live {
			best += p.p.GPUUsage * lsTerm(n, r, dev)
		}
	} else {
		devs = lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU)
		best = p.level(f0 - after(devs) - reserve)
		if p.p.GPUUsage != 0 && r.NumGPU > 0 {
			// Which whole devices the pod gets is the device plugin's choice; the
			// node is ranked by how idle its free devices are on average.
			best += p.p.GPUUsage * meanIdle(n, r.GPUMilli)
		}
	}
	if p.p.Usage != 0 {
		best += p.p.Usage * usageTerm(n.Usage)
	}
	return best, devs, true
}

// meanIdle is the mean gpuIdle of n's devices with at least milli free.
func meanIdle(n *Node, milli int) float64 {
	if n.Usage == nil || len(n.Usage.GPUs) == 0 {
		return 0
	}
	var sum float64
	k := 0
	for i, f := range n.GPUFree {
		if f >= milli {
			sum += n.Usage.gpuIdle(i)
			k++
		}
	}
	if k == 0 {
		return 0
	}
	return sum / float64(k)
}

// usageTerm ranks a node by what the node agent saw it use: +0.5 for an idle
// node, -0.5 for one whose CPU or memory is fully used, minus the share of CPU
// latency-sensitive pods use (LS-heavy nodes are avoided even when otherwise
// quiet). Unknown or stale metrics (nil) score 0: between busy and idle, never
// as idle.
func usageTerm(u *Usage) float64 {
	if u == nil || u.CPUCapacity <= 0 {
		return 0
	}
	busy := float64(u.CPUUsed) / float64(u.CPUCapacity)
	if u.MemoryCapacity > 0 {
		busy = max(busy, float64(u.MemoryUsed)/float64(u.MemoryCapacity))
	}
	ls := float64(u.CPULS) / float64(u.CPUCapacity)
	return 0.5 - min(1, max(0, busy)) - min(1, max(0, ls))
}
