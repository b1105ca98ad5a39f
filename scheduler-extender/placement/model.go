package placement

import (
	"errors"
	"fmt"
	"slices"

	"github.com/understory/understory/contract"
)

// Sentinel reasons a request does not fit a node.
var (
	ErrInsufficientCPU    = errors.New("insufficient cpu")
	ErrInsufficientMemory = errors.New("insufficient memory")
	ErrTooManyPods        = errors.New("too many pods")
	ErrInsufficientGPU    = errors.New("insufficient gpu")
	ErrGPUModel           = errors.New("gpu model not accepted")
	ErrInsufficientBatch  = errors.New("insufficient batch resources")
	ErrInvalidRequest     = errors.New("invalid request")
	// ErrInvalidDevices means a device list handed to Place does not match the request or the node.
	ErrInvalidDevices = errors.New("invalid gpu devices")
	// ErrNoFit means no node of a set can host a request.
	ErrNoFit = errors.New("no node fits")
)

// DefaultScoreCPUMilli is the CPU a request asking for none counts as when scoring
// (the kube-scheduler's non-zero default). Fit still uses the real 0.
const DefaultScoreCPUMilli = 100

// Request is what one pod asks of a node.
type Request struct {
	CPUMilli  int64 // requested CPU, for fit (0 allowed)
	MemoryMiB int64 // requested memory, for fit
	// NumGPU devices, each with GPUMilli free. A whole-GPU request has GPUMilli = 1000;
	// a sharing request has NumGPU = 1 and GPUMilli < 1000. NumGPU = 0 means no GPU.
	NumGPU   int
	GPUMilli int
	// Models are the GPU models the pod accepts; empty means any.
	Models []string
	// Batch extended resources (reclaimable capacity published by the agent).
	BatchCPUMilli  int64
	BatchMemoryMiB int64
}

// GPUTotalMilli is the pod's whole GPU demand in milli-GPU.
func (r Request) GPUTotalMilli() int64 { return int64(r.NumGPU) * int64(r.GPUMilli) }

// Validate rejects impossible requests.
func (r Request) Validate() error {
	switch {
	case r.CPUMilli < 0 || r.MemoryMiB < 0 || r.BatchCPUMilli < 0 || r.BatchMemoryMiB < 0:
		return fmt.Errorf("negative cpu or memory: %w", ErrInvalidRequest)
	case r.NumGPU < 0:
		return fmt.Errorf("gpu count %d is negative: %w", r.NumGPU, ErrInvalidRequest)
	case r.NumGPU == 0 && r.GPUMilli != 0:
		return fmt.Errorf("gpu-milli %d without a gpu: %w", r.GPUMilli, ErrInvalidRequest)
	case r.NumGPU > 0 && (r.GPUMilli < 1 || r.GPUMilli > contract.MilliPerGPU):
		return fmt.Errorf("gpu-milli %d must be in 1..%d: %w", r.GPUMilli, contract.MilliPerGPU, ErrInvalidRequest)
	case r.NumGPU > 1 && r.GPUMilli != contract.MilliPerGPU:
		return fmt.Errorf("a share of %d milli must be on exactly one gpu, not %d: %w", r.GPUMilli, r.NumGPU, ErrInvalidRequest)
	}
	return nil
}

// ScoreCPUMilli is the CPU the request counts as when scoring: its request, or
// DefaultScoreCPUMilli when it asks for none.
func (r Request) ScoreCPUMilli() int64 {
	if r.CPUMilli == 0 {
		return DefaultScoreCPUMilli
	}
	return r.CPUMilli
}

// Sharing reports whether the request takes a fraction of one GPU.
func (r Request) Sharing() bool { return r.NumGPU == 1 && r.GPUMilli < contract.MilliPerGPU }

// AcceptsModel reports whether the request may run on a GPU of the given model.
func (r Request) AcceptsModel(model string) bool {
	return len(r.Models) == 0 || slices.Contains(r.Models, model)
}

// Usage is what the node agent last saw a node use (CPU in millicores, memory in
// bytes): the part of its node-metrics annotation placement scores on.
type Usage struct {
	CPUCapacity, CPUUsed, CPULS int64
	MemoryCapacity, MemoryUsed  int64
	// GPUs is what the agent saw each GPU do, indexed by device index (as GPUFree);
	// nil when the agent reports no GPU figures (node-metrics version 1, no NVML).
	// A device beyond its length, or not Known, is unknown: never idle.
	GPUs []GPUUsage
}

// GPUUsage is one GPU over the agent's averaging window.
type GPUUsage struct {
	// Known is false for a device the agent did not report or reported unhealthy.
	Known bool
	// Util and LSUtil are the device's utilisation, whole and by latency-sensitive
	// pods, in percent (0..100).
	Util, LSUtil float64
	// Reclaimable is the share of the device (0..1) the agent lets batch use now.
	Reclaimable float64
	// LSFreeMilli is the SM share latency-sensitive work leaves free on the device,
	// in milli-GPU (node-metrics lsFree), when LSFreeKnown; an agent older than the
	// figure leaves it unknown.
	LSFreeMilli int
	LSFreeKnown bool
}

// lsFits reports whether the agent reports device d of u with at least milli of
// its SM share left free by latency-sensitive work.
func (u *Usage) lsFits(d, milli int) bool {
	return u != nil && d >= 0 && d < len(u.GPUs) && u.GPUs[d].Known && u.GPUs[d].LSFreeKnown &&
		u.GPUs[d].LSFreeMilli >= milli
}

// lsFitSet is, for a share request, the devices of n with r's milli free in the
// ledger whose LS-free share (lsFits) holds r as well; 0 for other requests, or
// when no device qualifies. A share goes to one of them when there is one: the
// ledger says what may be booked, the agent what LS leaves to batch now.
func lsFitSet(n *Node, r *Request) deviceSet {
	if !r.Sharing() || n.Usage == nil {
		return 0
	}
	var s deviceSet
	for i, f := range n.GPUFree {
		if f >= r.GPUMilli && n.Usage.lsFits(i, r.GPUMilli) {
			s |= 1 << uint(i)
		}
	}
	return s
}

// lsTerm is a share's node-score term for its chosen device d: +0.5 when the
// agent reports d's LS-free share holds the request, -0.5 when it reports it
// does not, 0 when unknown (or for a request that is not a share).
func lsTerm(n *Node, r *Request, d int) float64 {
	if !r.Sharing() || n.Usage == nil || d < 0 || d >= len(n.Usage.GPUs) {
		return 0
	}
	g := n.Usage.GPUs[d]
	switch {
	case !g.Known || !g.LSFreeKnown:
		return 0
	case g.LSFreeMilli >= r.GPUMilli:
		return 0.5
	}
	return -0.5
}

// candidate reports whether a share may take device i under pref (lsFitSet):
// any device when pref is empty, else only those in it.
func (pref deviceSet) candidate(i int) bool { return pref == 0 || pref&(1<<uint(i)) != 0 }

// seenBeforeIn is seenBefore among the candidates of pref.
func seenBeforeIn(free []int, i int, pref deviceSet) bool {
	for j := 0; j < i; j++ {
		if free[j] == free[i] && pref.candidate(j) {
			return true
		}
	}
	return false
}

// gpuIdle is how idle device d of u is now, in [-0.5, +0.5]: +0.5 for a device
// the agent reports wholly reclaimable and unused, -0.5 for one that latency-
// sensitive work fills. Unknown devices (and a nil u) score 0: between busy and
// idle, never as idle.
func (u *Usage) gpuIdle(d int) float64 {
	if u == nil || d < 0 || d >= len(u.GPUs) || !u.GPUs[d].Known {
		return 0
	}
	g := u.GPUs[d]
	idle := min(1, max(0, g.Reclaimable))
	idle = min(idle, 1-min(1, max(0, g.Util/100)))
	return idle - 0.5
}

// Node is the schedulable state of one node: capacity and its ledger of what is
// already placed on it, devices included.
type Node struct {
	Name  string
	Model string // GPU model (label nvidia.com/gpu.product); "" when the node has no GPU

	CPUMilli  int64 // allocatable
	MemoryMiB int64
	MaxPods   int

	UsedCPUMilli  int64
	UsedMemoryMiB int64
	Pods          int

	// GPUFree is the free milli-GPU of each device, indexed by device index. len = GPU count.
	GPUFree []int

	// Batch extended resources: allocatable and used.
	BatchCPUMilli, UsedBatchCPUMilli   int64
	BatchMemoryMiB, UsedBatchMemoryMiB int64

	// Usage is the node agent's latest utilisation snapshot; nil means unknown or
	// stale (whoever feeds placement decides what is too old, or from the future).
	// Placement never reads a nil Usage as idle.
	Usage *Usage
}
