package koordlet

import (
	"strings"
	"time"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/understory/understory/cgroups"
)

// podSpec is what the agent takes from a pod's spec: its requests (LS requests enter the
// maxUsageRequest formula), a batch pod's own limits of the batch resources (enforced
// inside the batch budget), what orders eviction candidates, and the values kubelet
// wrote to the pod cgroup (restored when a batch pod stops being batch).
type podSpec struct {
	cpuRequest float64 // cores
	memRequest float64 // bytes
	// batchCPU is the pod's understory.io/batch-cpu limit in cores, 0 when none.
	batchCPU float64
	// batchMemory is the pod's understory.io/batch-memory limit in bytes, 0 when none.
	batchMemory int64
	priority    int32
	started     time.Time
	kubelet     kubeletCgroup
	// containers maps the runtime's container IDs (no runtime prefix) to container
	// names, for the GPU loop's per-container metrics.
	containers map[string]string
}

// kubeletCgroup is what kubelet writes to a pod's cgroup (pkg/kubelet/cm,
// ResourceConfigForPod): the weight from the CPU requests, a CFS quota only when every
// container declares a CPU limit, a memory limit only when every container declares one;
// a BestEffort pod gets the minimum weight and neither limit.
type kubeletCgroup struct {
	shares      uint64
	quota       time.Duration // cgroups.Unlimited when none
	memoryLimit int64         // -1 when none
}

// kubeletCFSPeriod is kubelet's default --cpu-cfs-quota-period.
const kubeletCFSPeriod = 100 * time.Millisecond

// The kernel's and kubelet's bounds of cpu.shares and of a CFS quota.
const (
	maxShares = 262144
	minQuota  = time.Millisecond
)

func specOf(pod *corev1.Pod, kq cgroups.KubeQOS) podSpec {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	limits := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	s := podSpec{
		cpuRequest: float64(reqs.Cpu().MilliValue()) / 1000,
		memRequest: float64(reqs.Memory().Value()),
		kubelet:    kubeletCgroup{shares: minShares, quota: cgroups.Unlimited, memoryLimit: -1},
	}
	if q, ok := batchQuantity(limits, reqs, contract.ResourceBatchCPU); ok {
		s.batchCPU = float64(q.Value()) / 1000 // the resource counts millicores
	}
	if q, ok := batchQuantity(limits, reqs, contract.ResourceBatchMemory); ok {
		s.batchMemory = q.Value()
	}
	if pod.Spec.Priority != nil {
		s.priority = *pod.Spec.Priority
	}
	s.containers = containerIDs(pod)
	if pod.Status.StartTime != nil {
		s.started = pod.Status.StartTime.Time
	} else {
		s.started = pod.CreationTimestamp.Time
	}
	if kq == cgroups.QOSBestEffort {
		return s
	}
	s.kubelet.shares = milliCPUToShares(reqs.Cpu().MilliValue())
	cpuDeclared, memDeclared := true, true
	for _, c := range pod.Spec.Containers {
		if c.Resources.Limits.Cpu().IsZero() {
			cpuDeclared = false
		}
		if c.Resources.Limits.Memory().IsZero() {
			memDeclared = false
		}
	}
	if cpuDeclared {
		s.kubelet.quota = milliCPUToQuota(limits.Cpu().MilliValue())
	}
	if memDeclared {
		s.kubelet.memoryLimit = limits.Memory().Value()
	}
	return s
}

// milliCPUToShares is kubelet's MilliCPUToShares.
func milliCPUToShares(milli int64) uint64 {
	if milli <= 0 {
		return minShares
	}
	return uint64(min(max(milli*1024/1000, minShares), maxShares))
}

// milliCPUToQuota is kubelet's MilliCPUToQuota over its default period.
func milliCPUToQuota(milli int64) time.Duration {
	if milli <= 0 {
		return cgroups.Unlimited
	}
	return max(time.Duration(milli)*kubeletCFSPeriod/1000, minQuota)
}

// containerIDs maps the IDs of the pod's started containers ("containerd://<id>" in the
// status) to their names; nil when none has started.
func containerIDs(pod *corev1.Pod) map[string]string {
	var out map[string]string
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			_, id, ok := strings.Cut(cs.ContainerID, "://")
			if !ok || id == "" {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[id] = cs.Name
		}
	}
	return out
}

// batchQuantity is a pod's limit of a batch resource, else its request; Understory's
// name first, then Koordinator's alias (a pod the admission webhook did not rename).
func batchQuantity(limits, reqs corev1.ResourceList, name string) (resource.Quantity, bool) {
	for _, n := range []corev1.ResourceName{corev1.ResourceName(name), corev1.ResourceName(contract.KoordinatorAlias(name))} {
		if q, ok := limits[n]; ok {
			return q, true
		}
		if q, ok := reqs[n]; ok {
			return q, true
		}
	}
	return resource.Quantity{}, false
}
