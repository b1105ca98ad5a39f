package extender

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
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
// container creation. Without agent data the count falls back to allocatable
// nvidia.com/gpu divided by the device plugin's replicas (gpuSourceAllocatable),
// and /status says so. Whole GPUs are kubelet's choice: the ledger follows its
// allocation once the agent reports it (reconcileGPUs, below).

// AnnotationGPUModel lists the GPU models a pod accepts, comma-separated (the
// shared names, gpu-milli, batch-cpu, batch-memory, nvidia.com/gpu and
// gpu-devices, are package contract's).
const AnnotationGPUModel = wire.AnnotationGPUModel

// PodRequest turns a pod into what it asks of a node (wire.PodRequest).
func PodRequest(pod *corev1.Pod) (placement.Request, error) { return wire.PodRequest(pod) }

// ErrGPUModel is the reason a node's GPU model is refused (placement.ErrGPUModel);
// filter reports it verbatim.
var ErrGPUModel = placement.ErrGPUModel

// GPU feature discovery's labels: the GPU model, and on nodes where NVIDIA's
// device plugin shares GPUs, how.
const (
	// LabelGPUProduct is the node label naming its GPU model.
	LabelGPUProduct = "nvidia.com/gpu.product"
	// LabelGPUReplicas is the device plugin's replicas per physical GPU (1 without sharing).
	LabelGPUReplicas = "nvidia.com/gpu.replicas"
	// LabelGPUSharingStrategy is the device plugin's sharing: none, time-slicing or mps.
	LabelGPUSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	// LabelGPUCount is the number of physical GPUs GPU feature discovery saw.
	LabelGPUCount = "nvidia.com/gpu.count"
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
	model := wire.NormalizeModel(obj.Labels[LabelGPUProduct])
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
				model = wire.NormalizeModel(strings.ReplaceAll(d.Model, " ", "-")) // GPU feature discovery's spelling
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

// onUnavailableGPU reports whether p holds a device its node's agent now reports
// unavailable (unhealthy, or not listed). Call with the index lock held.
func (l *ledger) onUnavailableGPU(p *podEntry) bool {
	e := l.nodes[p.node]
	return p.charged && e != nil && e.gpus.offIn(p.devices)
}

// Whole GPUs (nvidia.com/gpu) are handed out by NVIDIA's device plugin, not by
// the extender: the devices its ledger books for a whole-GPU pod are a guess
// until the node agent reports, in node-metrics version 2, what kubelet really
// allocated (kubelet's PodResources API). reconcileGPUs moves the ledger to
// that report. Shares (understory.io/gpu-milli) are placed by the extender and
// enforced by the agent's NRI plugin, so for them the annotation stays the truth.

// kubeletAlloc is one node's last reported allocation of whole GPUs.
type kubeletAlloc struct {
	byUID  map[types.UID][]int
	byName map[string][]int // namespace/name, for entries the agent could not give a UID
}

// allocOf indexes the allocation of m; nil when m reports none (version 1, no
// PodResources API on the node).
func allocOf(m *contract.NodeMetrics) *kubeletAlloc {
	if m == nil || m.GPU == nil || m.GPU.Alloc == nil {
		return nil
	}
	a := &kubeletAlloc{byUID: map[types.UID][]int{}, byName: map[string][]int{}}
	for _, p := range m.GPU.Alloc.Pods {
		devs := slices.Sorted(slices.Values(p.Devices))
		if p.UID != "" {
			a.byUID[types.UID(p.UID)] = devs
		} else {
			a.byName[p.Namespace+"/"+p.Name] = devs
		}
	}
	return a
}

// kubeletDevices returns the devices kubelet allocated to p on e, sorted; nil when
// the node reports no allocation for p or p is not a whole-GPU pod of e. An entry
// named only by namespace/name is trusted only while the node's metrics are fresh:
// a stale one may name an earlier pod of the same name (a StatefulSet's).
func kubeletDevices(e *nodeEntry, p *podEntry) []int {
	if e.alloc == nil || p.req.NumGPU == 0 || p.req.Sharing() {
		return nil
	}
	devs, ok := e.alloc.byUID[p.uid]
	if !ok && e.n.Usage != nil {
		devs = e.alloc.byName[p.key()]
	}
	if !placement.ValidDevices(e.n, p.req, devs) {
		return nil
	}
	return devs
}

// reconcileGPUs moves the whole-GPU pods charged on e to the devices kubelet
// allocated them. Whole-GPU pods kubelet has not reported yet keep their devices
// where those are still free, else they are re-inferred around the confirmed
// ones. What still over-commits a device afterwards (a share booked on a device
// kubelet gave wholly to a pod, or more whole pods than devices) is reported as a
// GPUDeviceConflict Event. Call with the index lock held for writing.
func (l *ledger) reconcileGPUs(e *nodeEntry) {
	if e.alloc == nil || len(e.n.GPUFree) == 0 {
		return
	}
	var moved, guessed []*podEntry
	kdevs := map[types.UID][]int{}
	for _, p := range e.pods {
		if p.req.NumGPU == 0 || p.req.Sharing() || (p.phase != phaseBound && p.phase != phaseAssumed) {
			continue
		}
		if d := kubeletDevices(e, p); d != nil {
			if !slices.Equal(d, sortedCopy(p.devices)) {
				moved, kdevs[p.uid] = append(moved, p), d
			}
		} else {
			guessed = append(guessed, p)
		}
	}
	if len(moved) == 0 {
		return
	}
	// Deterministic order: the first pod the index learned of keeps a device.
	byAge := func(a, b *podEntry) int { return cmp.Compare(a.seq, b.seq) }
	slices.SortFunc(moved, byAge)
	slices.SortFunc(guessed, byAge)
	for _, p := range moved {
		e.n.Discharge(p.req, p.devices)
	}
	for _, p := range guessed {
		e.n.Discharge(p.req, p.devices)
	}
	for _, p := range moved {
		p.devices, p.inferred = kdevs[p.uid], false
		e.n.Charge(p.req, p.devices)
		if l.met != nil {
			l.met.GPUReconciled.Inc()
		}
	}
	for _, p := range guessed {
		if !devicesFree(e, p.req, p.devices) {
			p.devices, p.inferred = placement.InferDevices(e.n, p.req), true
		}
		e.n.Charge(p.req, p.devices)
	}
	l.bump(e)
	l.reportOvercommit(e, moved)
}

// reportOvercommit emits a GPUDeviceConflict Event on each pod of moved whose
// kubelet-allocated devices are over-committed in the ledger.
func (l *ledger) reportOvercommit(e *nodeEntry, moved []*podEntry) {
	for _, p := range moved {
		var over []int
		for _, d := range p.devices {
			if e.n.GPUFree[d] < 0 && !e.gpus.isOff(d) {
				over = append(over, d)
			}
		}
		if len(over) == 0 {
			continue
		}
		var holders []string
		for _, o := range e.pods {
			if o != p && slices.ContainsFunc(o.devices, func(d int) bool { return slices.Contains(over, d) }) {
				holders = append(holders, o.key())
			}
		}
		slices.Sort(holders)
		l.out.Emit(p, true, "GPUDeviceConflict", fmt.Sprintf("kubelet allocated devices %s of node %s to %s, but %s "+
			"also hold them: the devices are over-committed until one of them leaves", contract.FormatGPUDevices(over),
			e.n.Name, p.key(), strings.Join(holders, ", ")))
		if l.met != nil {
			l.met.DeviceConflicts.Inc()
		}
	}
}

func sortedCopy(d []int) []int {
	if slices.IsSorted(d) {
		return d
	}
	return slices.Sorted(slices.Values(d))
}
