package extender

import (
	"fmt"
	"math"

	"github.com/understory/understory/metrics"
	"strconv"
	"strings"
)

// UnderstoryParams are the weights of the understory policy (see docs/scoring.md).
type UnderstoryParams struct {
	// Floor squashes ΔF like FGD (⌊100·σ(ΔF/1000)⌋) instead of using it raw.
	Floor bool
	// Pack weighs the best-fit term (1 − free share left after placement, in [0,1]).
	Pack float64
	// PackCPU splits Pack between CPU (PackCPU) and GPU (1 − PackCPU).
	PackCPU float64
	// Usage weighs the live-utilisation term.
	Usage float64
	// Quant, if > 0, rounds raw ΔF down to multiples of Quant milli (ties then go
	// to the node order).
	Quant float64
	// Strand weighs the stranded-GPU term: the share of the node's GPU left that the
	// CPU left cannot feed at the workload's CPU-per-GPU ratio.
	Strand float64
	// Demand weights the classes by count·(1 + Demand·GPUs asked) instead of count.
	Demand float64
	// Waste weighs the change in expected per-device waste (modelTable.waste).
	Waste float64
	// Sig, if > 0, squashes ΔF as ⌊Levels·σ(ΔF/Sig)⌋ (FGD: Sig 1000, Levels 100).
	Sig, Levels float64
	// Loose, if set, breaks device ties by index instead of preferring the tighter device.
	Loose bool
	// Blend mixes FGD's frag (0) and modelTable.fillFrag (1).
	Blend float64
	// Reserve weighs keeping contended GPU models free: placing d milli on a node of
	// model X costs Reserve·(1 − always(X))·d, where 1 − always(X) is the share of
	// classes that could run on X.
	Reserve float64
	// Size prefers (> 0) or avoids (< 0) nodes with more GPUs, per GPU/8.
	Size float64
	// Used prefers nodes that already host a pod.
	Used float64
}

// DefaultUnderstoryParams are the weights the extender serves.
func DefaultUnderstoryParams() UnderstoryParams {
	return UnderstoryParams{Pack: 0.05, PackCPU: 0.5, Usage: 0.5}
}

// ParseUnderstoryParams overrides the defaults with "key=value,..." (keys: floor,
// pack, packcpu, usage).
func ParseUnderstoryParams(s string) (UnderstoryParams, error) {
	p := DefaultUnderstoryParams()
	if strings.TrimSpace(s) == "" {
		return p, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return p, fmt.Errorf("understory param %q: %w", kv, ErrInvalidRequest)
		}
		switch k {
		case "floor":
			p.Floor = f != 0
		case "pack":
			p.Pack = f
		case "packcpu":
			p.PackCPU = f
		case "usage":
			p.Usage = f
		case "quant":
			p.Quant = f
		case "strand":
			p.Strand = f
		case "demand":
			p.Demand = f
		case "waste":
			p.Waste = f
		case "sig":
			p.Sig = f
		case "levels":
			p.Levels = f
		case "loose":
			p.Loose = f != 0
		case "blend":
			p.Blend = f
		case "reserve":
			p.Reserve = f
		case "size":
			p.Size = f
		case "used":
			p.Used = f
		default:
			return p, fmt.Errorf("understory param %q unknown: %w", k, ErrInvalidRequest)
		}
	}
	return p, nil
}

// NewUnderstoryPolicy returns the understory policy with explicit weights.
func NewUnderstoryPolicy(w *Workload, p UnderstoryParams) Policy {
	if w == nil {
		w = NewWorkload(nil, DefaultCoverage)
	}
	return newUnderstory(w, p)
}

type understoryPolicy struct {
	w *Workload
	p UnderstoryParams
}

var _ Policy = (*understoryPolicy)(nil)

func newUnderstory(w *Workload, p UnderstoryParams) *understoryPolicy {
	return &understoryPolicy{w: w.demandWeighted(p.Demand), p: p}
}

func (p *understoryPolicy) Name() string { return PolicyUnderstory }

func (p *understoryPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

func (p *understoryPolicy) delta(d float64) float64 {
	switch {
	case p.p.Floor:
		return fgdScore(d)
	case p.p.Sig > 0:
		return math.Floor(p.p.Levels / (1 + math.Exp(-d/p.p.Sig)))
	case p.p.Quant > 0:
		return math.Floor(d / p.p.Quant)
	}
	return d / 1000
}

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

func (p *understoryPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.check(r) != nil {
		return 0, 0, false
	}
	t := p.w.table(n.Model)
	cpu, sc := n.FreeCPUMilli(), r.ScoreCPUMilli()
	cpuAfter := max(0, cpu-sc)
	f0 := p.frag(t, cpu, n.GPUFree)
	var buf [MaxGPUsPerNode]int
	free := buf[:len(n.GPUFree)]
	copy(free, n.GPUFree)
	var best float64
	var devs deviceSet
	rsv := p.p.Reserve * (1 - t.always) * float64(r.GPUTotalMilli())
	if r.Sharing() {
		dev := -1
		for i, f := range n.GPUFree {
			if f < r.GPUMilli || seenBefore(n.GPUFree, i) {
				continue
			}
			free[i] = f - r.GPUMilli
			// Among devices, also prefer the tighter one (a share of a used GPU).
			s := p.delta(f0-p.frag(t, cpuAfter, free)+p.p.Waste*(t.waste[f]-t.waste[free[i]])-rsv) - 1e-6*float64(free[i])
			free[i] = f
			if dev < 0 || s > best {
				best, dev = s, i
			}
		}
		devs = 1 << uint(dev)
	} else {
		devs = lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU)
		for d := devs; d != 0; d &= d - 1 {
			free[trailing(d)] -= r.GPUMilli
		}
		dw := 0.0
		for d := devs; d != 0; d &= d - 1 {
			i := trailing(d)
			dw += t.waste[n.GPUFree[i]] - t.waste[free[i]]
		}
		best = p.delta(f0 - p.frag(t, cpuAfter, free) + p.p.Waste*dw - rsv)
		for d := devs; d != 0; d &= d - 1 {
			free[trailing(d)] += r.GPUMilli
		}
	}
	if p.p.Strand != 0 && len(n.GPUFree) > 0 && p.w.cpuPerGPU > 0 {
		gpuLeft := float64(n.FreeGPUMilli() - r.GPUTotalMilli())
		fed := float64(cpuAfter) / p.w.cpuPerGPU
		if gpuLeft > fed {
			best -= p.p.Strand * (gpuLeft - fed) / float64(len(n.GPUFree)*MilliPerGPU)
		}
	}
	best += p.p.Size * float64(len(n.GPUFree)) / 8
	if n.Pods > 0 {
		best += p.p.Used
	}
	if p.p.Usage != 0 {
		best += p.p.Usage * usageTerm(n.Usage)
	}
	if p.p.Pack != 0 {
		var gpuLeft, gpuCap int64
		for _, f := range n.GPUFree {
			gpuLeft += int64(f)
		}
		gpuCap = int64(len(n.GPUFree)) * MilliPerGPU
		gpuLeft -= r.GPUTotalMilli()
		fill := 0.0
		if n.CPUMilli > 0 {
			fill += p.p.PackCPU * (1 - float64(cpuAfter)/float64(n.CPUMilli))
		}
		if gpuCap > 0 {
			fill += (1 - p.p.PackCPU) * (1 - float64(gpuLeft)/float64(gpuCap))
		}
		best += p.p.Pack * fill
	}
	return best, devs, true
}

// usageTerm ranks a node by what the node agent saw it use: +0.5 for an idle
// node, -0.5 for one whose CPU or memory is fully used, minus the share of CPU
// latency-sensitive pods use (LS-heavy nodes are avoided even when otherwise
// quiet). Unknown or stale metrics (nil) score 0: between busy and idle, never
// as idle.
func usageTerm(u *metrics.NodeMetrics) float64 {
	if u == nil || u.CPU.Capacity <= 0 {
		return 0
	}
	busy := float64(u.CPU.Used) / float64(u.CPU.Capacity)
	if u.Memory.Capacity > 0 {
		busy = max(busy, float64(u.Memory.Used)/float64(u.Memory.Capacity))
	}
	ls := float64(u.CPU.LS) / float64(u.CPU.Capacity)
	return 0.5 - min(1, max(0, busy)) - min(1, max(0, ls))
}
