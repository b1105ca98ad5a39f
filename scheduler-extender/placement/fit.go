package placement

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"

	"github.com/understory/understory/contract"
)

// Fit reports whether r fits n now: nil, or an error wrapping one of ErrInsufficientCPU,
// ErrInsufficientMemory, ErrTooManyPods, ErrInsufficientGPU, ErrGPUModel,
// ErrInsufficientBatch (or ErrInvalidRequest for an impossible r).
// A node with MaxPods <= 0 has no pod-count limit.
func (n *Node) Fit(r Request) error {
	if err := r.Validate(); err != nil {
		return err
	}
	err := n.Check(&r)
	if err == nil {
		return nil
	}
	switch err {
	case ErrTooManyPods:
		return fmt.Errorf("node %s: %d of %d pods: %w", n.Name, n.Pods, n.MaxPods, err)
	case ErrInsufficientCPU:
		return fmt.Errorf("node %s: cpu %dm free, %dm requested: %w", n.Name, n.CPUMilli-n.UsedCPUMilli, r.CPUMilli, err)
	case ErrInsufficientMemory:
		return fmt.Errorf("node %s: memory %dMiB free, %dMiB requested: %w", n.Name, n.MemoryMiB-n.UsedMemoryMiB, r.MemoryMiB, err)
	case ErrInsufficientBatch:
		return fmt.Errorf("node %s: batch cpu %dm, batch memory %dMiB free; %dm, %dMiB requested: %w", n.Name,
			n.BatchCPUMilli-n.UsedBatchCPUMilli, n.BatchMemoryMiB-n.UsedBatchMemoryMiB, r.BatchCPUMilli, r.BatchMemoryMiB, err)
	case ErrGPUModel:
		return fmt.Errorf("node %s: model %q not in %v: %w", n.Name, n.Model, r.Models, err)
	default:
		return fmt.Errorf("node %s: %d gpus with %d milli free needed, %d have it: %w", n.Name, r.NumGPU, r.GPUMilli, n.countFree(r.GPUMilli), err)
	}
}

// Check is Fit for a valid request (r is not validated), without allocating: it
// returns a bare sentinel, so callers may compare it with ==.
func (n *Node) Check(r *Request) error {
	switch {
	case n.MaxPods > 0 && n.Pods >= n.MaxPods:
		return ErrTooManyPods
	case r.CPUMilli > n.CPUMilli-n.UsedCPUMilli:
		return ErrInsufficientCPU
	case r.MemoryMiB > n.MemoryMiB-n.UsedMemoryMiB:
		return ErrInsufficientMemory
	case r.BatchCPUMilli > 0 && r.BatchCPUMilli > n.BatchCPUMilli-n.UsedBatchCPUMilli,
		r.BatchMemoryMiB > 0 && r.BatchMemoryMiB > n.BatchMemoryMiB-n.UsedBatchMemoryMiB:
		return ErrInsufficientBatch
	}
	if r.NumGPU == 0 {
		return nil
	}
	if len(n.GPUFree) == 0 {
		return ErrInsufficientGPU
	}
	if !r.AcceptsModel(n.Model) {
		return ErrGPUModel
	}
	if len(n.GPUFree) > contract.MaxGPUsPerNode || n.countFree(r.GPUMilli) < r.NumGPU {
		return ErrInsufficientGPU
	}
	return nil
}

// countFree is the number of devices with at least milli free.
func (n *Node) countFree(milli int) int {
	c := 0
	for _, f := range n.GPUFree {
		if f >= milli {
			c++
		}
	}
	return c
}

// FreeCPUMilli is the CPU not yet requested.
func (n *Node) FreeCPUMilli() int64 { return n.CPUMilli - n.UsedCPUMilli }

// FreeGPUMilli is the milli-GPU free over all devices.
func (n *Node) FreeGPUMilli() int64 {
	var s int64
	for _, f := range n.GPUFree {
		s += int64(f)
	}
	return s
}

// Place subtracts r from n on the given devices (device indices: NumGPU of them,
// one for a share). It checks fit and devices first and changes nothing on error.
func (n *Node) Place(r Request, devices []int) error {
	if err := n.Fit(r); err != nil {
		return err
	}
	if len(devices) != r.NumGPU {
		return fmt.Errorf("node %s: %d devices for a %d-gpu request: %w", n.Name, len(devices), r.NumGPU, ErrInvalidDevices)
	}
	var seen uint64
	for _, d := range devices {
		if d < 0 || d >= len(n.GPUFree) {
			return fmt.Errorf("node %s: device %d of %d: %w", n.Name, d, len(n.GPUFree), ErrInvalidDevices)
		}
		if seen&(1<<uint(d)) != 0 {
			return fmt.Errorf("node %s: device %d twice: %w", n.Name, d, ErrInvalidDevices)
		}
		seen |= 1 << uint(d)
		if n.GPUFree[d] < r.GPUMilli {
			return fmt.Errorf("node %s: device %d has %d milli free, %d requested: %w", n.Name, d, n.GPUFree[d], r.GPUMilli, ErrInvalidDevices)
		}
	}
	n.Charge(r, devices)
	return nil
}

// Charge books r on the given devices of n without any check, and Discharge
// takes it off again: the ledger of a node mirrors what it runs, and observed
// reality (pods bound by others, annotations written by hand) may over-commit a
// node. Devices that do not exist are skipped. Use Place to book only what fits.
func (n *Node) Charge(r Request, devices []int) { n.add(r, devices, 1) }

// Discharge is the inverse of Charge (and of a successful Place).
func (n *Node) Discharge(r Request, devices []int) { n.add(r, devices, -1) }

func (n *Node) add(r Request, devices []int, sign int64) {
	n.UsedCPUMilli += sign * r.CPUMilli
	n.UsedMemoryMiB += sign * r.MemoryMiB
	n.UsedBatchCPUMilli += sign * r.BatchCPUMilli
	n.UsedBatchMemoryMiB += sign * r.BatchMemoryMiB
	n.Pods += int(sign)
	for _, d := range devices {
		if d >= 0 && d < len(n.GPUFree) {
			n.GPUFree[d] -= int(sign) * r.GPUMilli
		}
	}
}

// ValidDevices reports whether devices name r.NumGPU distinct devices of n
// (free or not).
func ValidDevices(n *Node, r Request, devices []int) bool {
	if len(devices) != r.NumGPU {
		return false
	}
	var seen uint64
	for _, d := range devices {
		if d < 0 || d >= len(n.GPUFree) || d >= contract.MaxGPUsPerNode || seen&(1<<uint(d)) != 0 {
			return false
		}
		seen |= 1 << uint(d)
	}
	return true
}

// InferDevices picks devices for a pod already running on n whose device list
// is missing or wrong: the best-fitting device for a share, the freest devices
// (lowest index on ties, returned ascending) otherwise. It may over-commit: that
// is what reality did.
func InferDevices(n *Node, r Request) []int {
	if r.Sharing() {
		if d := bestFitDevice(n.GPUFree, r.GPUMilli); d >= 0 {
			return []int{d}
		}
	}
	idx := make([]int, len(n.GPUFree))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(n.GPUFree[b], n.GPUFree[a]) })
	out := slices.Clone(idx[:min(r.NumGPU, len(idx))])
	slices.Sort(out)
	return out
}

// Clone returns a deep copy of n.
func (n *Node) Clone() *Node {
	c := *n
	c.GPUFree = append([]int(nil), n.GPUFree...)
	if n.Usage != nil {
		u := *n.Usage
		c.Usage = &u
	}
	return &c
}

// deviceSet is a set of device indices as a bit mask (bit i = device i); it lets
// scoring pick devices without allocating.
type deviceSet uint64

func (s deviceSet) slice() []int {
	if s == 0 {
		return nil
	}
	out := make([]int, 0, bits.OnesCount64(uint64(s)))
	for s != 0 {
		i := bits.TrailingZeros64(uint64(s))
		out = append(out, i)
		s &^= 1 << uint(i)
	}
	return out
}

// lowestFree is the set of the k lowest-index devices with at least milli free.
func lowestFree(free []int, milli, k int) deviceSet {
	var s deviceSet
	for i, f := range free {
		if k == 0 {
			break
		}
		if f >= milli {
			s |= 1 << uint(i)
			k--
		}
	}
	return s
}

// bestFitDevice is the device with the least free milli that still holds milli
// (lowest index on ties), or -1.
func bestFitDevice(free []int, milli int) int { return bestFitDeviceIn(free, milli, 0) }

// bestFitDeviceIn is bestFitDevice among the candidates of pref (lsFitSet).
func bestFitDeviceIn(free []int, milli int, pref deviceSet) int {
	best := -1
	for i, f := range free {
		if f >= milli && pref.candidate(i) && (best < 0 || f < free[best]) {
			best = i
		}
	}
	return best
}

// trailing is the lowest device index in s (s != 0).
func trailing(s deviceSet) int { return bits.TrailingZeros64(uint64(s)) }
