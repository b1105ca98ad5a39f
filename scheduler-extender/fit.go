package extender

import (
	"fmt"
	"math/bits"
)

// Fit reports whether r fits n now: nil, or an error wrapping one of ErrInsufficientCPU,
// ErrInsufficientMemory, ErrTooManyPods, ErrInsufficientGPU, ErrGPUModel,
// ErrInsufficientBatch (or ErrInvalidRequest for an impossible r).
// A node with MaxPods <= 0 has no pod-count limit.
func (n *Node) Fit(r Request) error {
	if err := r.Validate(); err != nil {
		return err
	}
	err := n.check(&r)
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

// check is Fit for a valid request, without allocating: it returns a bare sentinel.
func (n *Node) check(r *Request) error {
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
	if len(n.GPUFree) > MaxGPUsPerNode || n.countFree(r.GPUMilli) < r.NumGPU {
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
	n.UsedCPUMilli += r.CPUMilli
	n.UsedMemoryMiB += r.MemoryMiB
	n.UsedBatchCPUMilli += r.BatchCPUMilli
	n.UsedBatchMemoryMiB += r.BatchMemoryMiB
	n.Pods++
	for _, d := range devices {
		n.GPUFree[d] -= r.GPUMilli
	}
	return nil
}

// Unplace is the inverse of Place. It has no error to return, so it never lets a
// counter go below zero nor a device above MilliPerGPU, and skips device indices
// that do not exist.
func (n *Node) Unplace(r Request, devices []int) {
	n.UsedCPUMilli = max(0, n.UsedCPUMilli-r.CPUMilli)
	n.UsedMemoryMiB = max(0, n.UsedMemoryMiB-r.MemoryMiB)
	n.UsedBatchCPUMilli = max(0, n.UsedBatchCPUMilli-r.BatchCPUMilli)
	n.UsedBatchMemoryMiB = max(0, n.UsedBatchMemoryMiB-r.BatchMemoryMiB)
	n.Pods = max(0, n.Pods-1)
	for _, d := range devices {
		if d >= 0 && d < len(n.GPUFree) {
			n.GPUFree[d] = min(MilliPerGPU, n.GPUFree[d]+r.GPUMilli)
		}
	}
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
func bestFitDevice(free []int, milli int) int {
	best := -1
	for i, f := range free {
		if f >= milli && (best < 0 || f < free[best]) {
			best = i
		}
	}
	return best
}

// trailing is the lowest device index in s (s != 0).
func trailing(s deviceSet) int { return bits.TrailingZeros64(uint64(s)) }
