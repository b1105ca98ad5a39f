package extender

import (
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
)

// A node's GPUs are what is physically there, not what kubelet's allocatable
// nvidia.com/gpu counts: NVIDIA's device plugin multiplies that count by its
// time-slicing (or MPS) replicas, and drops an unhealthy GPU from it, which
// shifts every index after it. The node agent's node-metrics (version 2) list
// the physical GPUs with their NVML index, UUID, model and health; the ledger's
// device slots are those NVML indices, the ones understory.io/gpu-devices names
// and the agent's NRI plugin resolves through its own NVML inventory. A slot the
// agent reports unhealthy, or does not list, takes no new booking (its capacity
// is 0; pods already on it stay charged there: that is where they run; a
// reservation on it is placed again at bind). When the agent's list changes (a
// GPU re-enumerated at another index), reservations follow their GPU's UUID to
// its new slot (rekey): their annotation is written at bind from it. Pods whose
// annotation is written keep its index, which the NRI plugin resolves at each
// container creation. Without agent data the count
// falls back to allocatable nvidia.com/gpu divided by the device plugin's
// replicas (gpuSourceAllocatable), and /status says so.

// GPU feature discovery's labels on nodes where NVIDIA's device plugin shares GPUs.
const (
	// LabelGPUReplicas is the device plugin's replicas per physical GPU (1 without sharing).
	LabelGPUReplicas = "nvidia.com/gpu.replicas"
	// LabelGPUSharingStrategy is the device plugin's sharing: none, time-slicing or mps.
	LabelGPUSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	// LabelGPUCount is the number of physical GPUs GPU feature discovery saw.
	LabelGPUCount = "nvidia.com/gpu.count"
	// sharedModelSuffix is what the device plugin's sharing appends to the product
	// label (renameByDefault false): NVIDIA-H100-80GB-HBM3-SHARED.
	sharedModelSuffix = "-SHARED"
)

// Where a node's GPU slots come from (/status nodes[].gpuSource).
const (
	// gpuSourceAgent: the node agent's node-metrics version 2 GPU list.
	gpuSourceAgent = "agent"
	// gpuSourceAllocatable: no agent GPU list; allocatable nvidia.com/gpu divided by
	// the device plugin's replicas, indices assumed to be NVML's 0..n-1.
	gpuSourceAllocatable = "allocatable"
)

// gpuTable is what the extender knows of a node's physical GPUs, by slot (NVML index).
type gpuTable struct {
	uuids  []string // by slot; "" where unknown (no agent data, or an index the agent did not list)
	off    uint64   // slots taking no new booking: reported unhealthy, or not listed by the agent
	source string   // gpuSourceAgent, gpuSourceAllocatable; "" for a node without GPUs
}

func (t *gpuTable) equal(o *gpuTable) bool {
	return t.off == o.off && t.source == o.source && slices.Equal(t.uuids, o.uuids)
}

// isOff reports whether slot d takes no new booking.
func (t *gpuTable) isOff(d int) bool { return d >= 0 && d < 64 && t.off&(1<<uint(d)) != 0 }

// capacity is slot d's capacity in milli-GPU: 0 for a slot that is off.
func (t *gpuTable) capacity(d int) int {
	if t.isOff(d) {
		return 0
	}
	return contract.MilliPerGPU
}

// slotOf is the slot of the GPU with this UUID; -1 when the table has none.
func (t *gpuTable) slotOf(uuid string) int {
	if uuid == "" {
		return -1
	}
	return slices.Index(t.uuids, uuid)
}

// uuid is slot d's UUID ("" when unknown).
func (t *gpuTable) uuid(d int) string {
	if d < 0 || d >= len(t.uuids) {
		return ""
	}
	return t.uuids[d]
}

// rekey maps devices booked under old to the slots their GPUs have in t: the
// same slots when every device's UUID is unknown in either table (no agent
// data), else the slots of the UUIDs. ok is false (devs returned unchanged)
// when a device's GPU is known under old but absent from t: it left the node.
func (t *gpuTable) rekey(old *gpuTable, devs []int) (out []int, ok bool) {
	out = devs
	cloned := false
	for i, d := range devs {
		u := old.uuid(d)
		if u == "" || t.uuid(d) == u {
			continue
		}
		s := t.slotOf(u)
		if s < 0 {
			return devs, false
		}
		if !cloned {
			out, cloned = slices.Clone(devs), true // devs may be shared with a pod record: never modified
		}
		out[i] = s
	}
	return out, true
}

// offIn reports whether any of devs is a slot that takes no new booking.
func (t *gpuTable) offIn(devs []int) bool {
	return slices.ContainsFunc(devs, t.isOff)
}

// usable is the number of slots that take bookings.
func (t *gpuTable) usable(slots int) int {
	return slots - bits.OnesCount64(t.off&(1<<uint(min(slots, 64))-1))
}

// nodeGPUs is a node's GPU slots (each at its capacity), its GPU model and where
// they come from: the agent's GPU list in m when it has one, else allocatable
// nvidia.com/gpu over the device plugin's replicas (gpuTable). A node without
// allocatable nvidia.com/gpu has none (the device plugin is what runs GPU pods).
func nodeGPUs(obj *corev1.Node, m *contract.NodeMetrics) ([]int, string, gpuTable) {
	q, ok := obj.Status.Allocatable[contract.ResourceGPU]
	if !ok || q.Sign() <= 0 {
		return nil, "", gpuTable{}
	}
	model := NormalizeModel(obj.Labels[LabelGPUProduct])
	if m != nil && m.GPU != nil && len(m.GPU.Devices) > 0 {
		// Increasing indices below MaxGPUsPerNode, UUIDs unique (validated).
		devs := m.GPU.Devices
		t := gpuTable{source: gpuSourceAgent, uuids: make([]string, devs[len(devs)-1].Index+1)}
		free := make([]int, len(t.uuids))
		for d := range t.uuids {
			t.off |= 1 << uint(d) // until listed healthy
		}
		for _, d := range devs {
			t.uuids[d.Index] = d.UUID
			if d.Healthy {
				t.off &^= 1 << uint(d.Index)
				free[d.Index] = contract.MilliPerGPU
			}
			if model == "" && d.Model != "" {
				model = NormalizeModel(strings.ReplaceAll(d.Model, " ", "-")) // GPU feature discovery's spelling
			}
		}
		return free, model, t
	}
	n := q.Value()
	if r, err := strconv.ParseInt(obj.Labels[LabelGPUReplicas], 10, 64); err == nil && r > 1 {
		n = (n + r - 1) / r
	}
	if c, err := strconv.ParseInt(obj.Labels[LabelGPUCount], 10, 64); err == nil && c > 0 {
		n = min(n, c)
	}
	free := make([]int, min(n, contract.MaxGPUsPerNode))
	for i := range free {
		free[i] = contract.MilliPerGPU
	}
	return free, model, gpuTable{source: gpuSourceAllocatable, uuids: make([]string, len(free))}
}

// NormalizeModel is a GPU model name as model constraints compare it: without
// the -SHARED suffix NVIDIA's device plugin adds to nvidia.com/gpu.product when it
// shares the GPUs (time-slicing, MPS), which names the sharing, not the model.
func NormalizeModel(model string) string {
	return strings.TrimSuffix(strings.TrimSpace(model), sharedModelSuffix)
}

// onUnavailableGPU reports whether p holds a device its node's agent now reports
// unavailable (unhealthy, or not listed). Call with the index lock held.
func (l *ledger) onUnavailableGPU(p *podEntry) bool {
	e := l.nodes[p.node]
	return p.charged && e != nil && e.gpus.offIn(p.devices)
}
