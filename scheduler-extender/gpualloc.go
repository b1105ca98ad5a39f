package extender

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/understory/understory/contract"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/placement"
)

// Whole GPUs (nvidia.com/gpu) are handed out by NVIDIA's device plugin, not by
// the extender: the devices its ledger books for a whole-GPU pod are a guess
// until the node agent reports, in node-metrics version 2, what kubelet really
// allocated (kubelet's PodResources API). This file reconciles the ledger with
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
		l.out.emit(p, true, "GPUDeviceConflict", fmt.Sprintf("kubelet allocated devices %s of node %s to %s, but %s "+
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
