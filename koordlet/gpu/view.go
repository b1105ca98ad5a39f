package gpu

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// deviceView is one GPU of a scrape with its processes sorted by class.
type deviceView struct {
	dev Device
	// lsActive: a process not of a batch pod is on the GPU: of an LS or BE pod (BE pods
	// rank above batch like on the CPU, so they count with LS here), of a pod the agent
	// does not know (yet), or of no pod (the safe side: it may be LS, e.g. one that has
	// not joined its pod cgroup yet, or a host service).
	lsActive bool
	// lsUtil is the non-batch processes' utilisation, plus that of processes no pod
	// could be attributed to (the safe side: they may be LS); batchUtil the batch pods'.
	// Of a device read with its utilisation only (UtilNow: its batch frozen), lsUtil is
	// the device's and batchUtil 0.
	lsUtil, batchUtil float64
	// others counts the processes not of a batch pod (LS, BE, or not attributed).
	others int
	// ls are the non-batch pods with processes on the GPU, in order of first process.
	ls []PodInfo
	// batch are the batch pods with processes on the GPU, in order of first process;
	// batchPIDs their processes (nil without batch).
	batch     []PodInfo
	batchPIDs map[types.UID][]int
	pods      []metrics.GPUPodUsage
}

// viewDevice classifies d's processes by the pod they run in.
func viewDevice(d Device, pods PodView) deviceView {
	v := deviceView{dev: d}
	for _, p := range d.Processes {
		if !p.Pod.Attributed() {
			// No pod: counted as LS, the safe side (docs/gpu.md, Classify).
			v.lsActive = true
			v.lsUtil += p.SMUtil
			v.others++
			continue
		}
		info, ok := pods.Pod(p.Pod.UID)
		if !ok {
			// A pod the agent does not know (yet): treat like an unattributed process.
			v.lsActive = true
			v.lsUtil += p.SMUtil
			v.others++
			continue
		}
		v.pods = append(v.pods, metrics.GPUPodUsage{Namespace: info.Namespace, Pod: info.Name,
			Container: info.Containers[p.Pod.ContainerID], Util: p.SMUtil, MemUtil: p.MemUtil, MemUsed: p.MemUsed})
		if info.Class != qos.ClassBatch {
			v.lsActive = true
			v.others++
			v.lsUtil += p.SMUtil
			if !slices.ContainsFunc(v.ls, func(q PodInfo) bool { return q.UID == info.UID }) {
				v.ls = append(v.ls, info)
			}
			continue
		}
		v.batchUtil += p.SMUtil
		if _, seen := v.batchPIDs[info.UID]; !seen {
			if v.batchPIDs == nil {
				v.batchPIDs = map[types.UID][]int{}
			}
			v.batch = append(v.batch, info)
		}
		v.batchPIDs[info.UID] = append(v.batchPIDs[info.UID], int(p.PID))
	}
	if d.UtilNow && !d.UtilUnsupported {
		// ScrapeUtil, asked only while the loop holds the GPU's batch frozen: nothing of
		// batch computes, so the GPU's utilisation of now is the other processes'; their
		// per-process figures are a full read's (metrics keep those).
		v.lsUtil, v.batchUtil = d.Util, 0
	}
	return v
}

// cadence is what the next step's scrape plan needs of the view, of the step's decision
// d for its GPU, and of whether all of the GPU's batch pods took it (Manager.apply).
func (v deviceView) cadence(d qos.GPUThrottleDecision, whole bool) gpuCadence {
	return gpuCadence{known: true, healthy: v.dev.Healthy, batch: len(v.batch) > 0,
		shared: len(v.batch) > 0 && v.others > 0, scrapedAt: v.dev.ScrapedAt,
		frozen: whole && d.Frozen && d.Lever == qos.GPULeverFreeze, mps: !d.Frozen && d.Lever == qos.GPULeverMPS}
}

// input is the GPU throttle's input for the view. A device the collector could not read
// is Unknown (its freeze is held). levers.go completes it: LS arrivals, the MPS server's
// share taken out of LS, the MPS lever and caps. Where the driver reports no per-process utilisation
// (MIG), only the presence of LS counts.
func (v deviceView) input() qos.GPUThrottleInput {
	if !v.dev.Healthy {
		return qos.GPUThrottleInput{Index: v.dev.Index, Unknown: true}
	}
	in := qos.GPUThrottleInput{Index: v.dev.Index, LSActive: v.lsActive, LSUtil: min(v.lsUtil, 100),
		BatchUtil: min(v.batchUtil, 100), BatchPods: len(v.batch)}
	if v.dev.UtilUnsupported {
		in.LSUtil, in.BatchUtil = 0, 0
	}
	return in
}

// podNames returns "namespace/name" of each pod (nil for none, left out of /status).
func podNames(pods []PodInfo) []string {
	if len(pods) == 0 {
		return nil
	}
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Namespace + "/" + p.Name
	}
	return out
}

// snapshot is the metrics' view of one scrape; decisions are sorted by GPU, tss are the
// views' time-slice decisions (nil: gpu.timeslice off).
func snapshot(views []deviceView, decisions []qos.GPUThrottleDecision, tss []*TimesliceStatus,
	took time.Duration) metrics.GPUSnapshot {
	s := metrics.GPUSnapshot{Available: true, CollectSeconds: took.Seconds(),
		Devices: make([]metrics.GPUDeviceUsage, len(views))}
	for i, v := range views {
		s.Devices[i] = metrics.GPUDeviceUsage{Index: v.dev.Index, UUID: v.dev.UUID, Model: v.dev.Model,
			Util: v.dev.Util, MemUtil: v.dev.MemUtil, UtilUnknown: v.dev.UtilUnsupported,
			MemUsed: v.dev.MemUsed, MemTotal: v.dev.MemTotal, Healthy: v.dev.Healthy, Pods: v.pods}
		if d, ok := decisionFor(decisions, v.dev.Index); ok {
			s.Devices[i].Throttle = &metrics.GPUThrottle{Duty: d.Duty, LSUtil: d.LSUtil, Reason: d.Reason,
				Lever: d.Lever, LSCapPercent: d.LSCapPercent, BatchCapPercent: d.BatchCapPercent,
				BatchMemLimitBytes: d.BatchMemLimitMiB << 20}
		}
		if i < len(tss) {
			s.Devices[i].Timeslices = timesliceMetrics(tss[i])
		}
	}
	return s
}
