package koordlet

import (
	"fmt"
	"log/slog"
	"path"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// podState is one pod of the agent's table: who it is and what its spec says (the
// table's part, syncPods), what the sampler found and read of its cgroup (read) and what
// the actuator wrote and holds on it (act). Each row is written by its owner only; the
// actuator drops a cgroup it found gone (podRead.lose), and a cgroup the sampler opened
// anew holds none of the old one's limits (sample.reopened, actuator.reopened).
type podState struct {
	uid       types.UID
	namespace string
	name      string
	class     qos.Class
	kubeQOS   cgroups.KubeQOS
	// candidates are where the pod's cgroup may be, in order of preference.
	candidates []string
	// classErr is the annotation error, if the pod's QoS annotation is invalid.
	classErr error
	// terminating: the pod's deletion was requested. It keeps its share of the budget
	// but is never frozen (it must handle SIGTERM) nor an eviction candidate.
	terminating bool
	// spec is what the agent reads from the pod's spec (requests, batch limits).
	spec podSpec
	// lastErr is why the pod's cgroup could not be found, read or written last; shown in
	// /status. The sampler and the actuator each set it when they fail.
	lastErr error

	read podRead
	act  podAct
}

// podRead is the sampler's row of a pod: where its cgroup is and what was read of it.
type podRead struct {
	cgroup string // the candidate found, relative to the hierarchy root
	inTier bool   // the pod runs below the agent's tier
	group  *cgroups.Group
	reader *cgroups.UsageReader
	// memReader reads memUsage from files kept open (opened on the first slow period
	// that needs the pod's memory).
	memReader *cgroups.MemoryReader
	rate      collect.Rate
	// nextOpen is when to look for a missing cgroup again, or, for a batch pod held in
	// place, whether it has moved below the tier since.
	nextOpen time.Time

	usage  float64 // cores over the last period
	fresh  bool    // usage is from this period
	demand demand  // smoothed usage, for splitting the budget
	// sampledAt is when usage was last read (pods other than LS are read every
	// slowEvery periods).
	sampledAt time.Time
	// memUsage is the pod's memory working set at the last slow period (batch pods and
	// pods outside the cgroup their class implies), bytes.
	memUsage float64
	// stats are the pod's CPU statistics at the last read (throttling).
	stats cpuStats
}

// podAct is the actuator's row of a pod: what the agent wrote and holds on its cgroup.
type podAct struct {
	// frozen: the agent froze the pod's cgroup (in-place batch).
	frozen bool
	// set up: in-place batch pods get SCHED_IDLE and minimum weight once.
	setUp bool
	// memory is the pod's own memory limit (its understory.io/batch-memory limit) in
	// force; wroteMemory is set once the agent has written one (kubelet's limit then
	// goes back when the pod leaves batch).
	memory      memState
	wroteMemory bool
	// quota is the per-pod CFS limit in force (its Cores: -1 when unlimited, NaN when
	// unknown: never written or the last write failed, rewritten next period) and the
	// descendants' limits lowered for a v1 cut.
	quota cpuState
}

// newPodAct is the actuator's row of a pod whose limits are unknown (a new pod, or a
// cgroup opened anew).
func newPodAct() podAct { return podAct{quota: unknownCPU(), memory: unknownMemory()} }

func (p *podState) key() string { return p.namespace + "/" + p.name }

// mismatched reports whether the pod does not run where kubelet's cgroup for its class
// would put it (an LS pod in BestEffort, a batch or BE pod outside it), below the tier
// aside.
func (p *podState) mismatched() bool {
	return !p.read.inTier && (p.class == qos.ClassLS) == (p.kubeQOS == cgroups.QOSBestEffort)
}

// close releases the pod's open files.
func (r *podRead) close() {
	if r.reader != nil {
		_ = r.reader.Close()
		r.reader = nil
	}
	if r.memReader != nil {
		_ = r.memReader.Close()
		r.memReader = nil
	}
	r.group = nil
}

// lose drops a cgroup found gone (by a read or a write) and looks for it again after
// reopenBackoff.
func (r *podRead) lose(now time.Time) {
	r.close()
	r.nextOpen = now.Add(reopenBackoff)
}

// kubeQOSOf maps the Kubernetes QoS class to kubelet's cgroup level.
func kubeQOSOf(c corev1.PodQOSClass) cgroups.KubeQOS {
	switch c {
	case corev1.PodQOSGuaranteed:
		return cgroups.QOSGuaranteed
	case corev1.PodQOSBurstable:
		return cgroups.QOSBurstable
	default:
		return cgroups.QOSBestEffort
	}
}

// layout names the cgroups the agent uses, for the configured kubelet driver and root.
type layout struct {
	naming cgroups.Naming // kubelet's driver and --cgroup-root
	tier   string         // the batch tier
}

func newLayout(cfg config.Config) (layout, error) {
	n, tier, err := cfg.Cgroups()
	if err != nil {
		return layout{}, err
	}
	return layout{naming: n, tier: tier}, nil
}

// qos is kubelet's QoS-level cgroup of q.
func (l layout) qos(q cgroups.KubeQOS) string { return l.naming.QOSPath(q) }

// kubepods is the cgroup holding every pod.
func (l layout) kubepods() string { return l.qos(cgroups.QOSGuaranteed) }

// freezerPin is the empty cgroup the duty cycle keeps frozen while it cycles batch pods
// (duty.Cycler.SetPin), in kubelet's root cgroup. It is left in place, empty and
// thawed, when the agent stops.
const freezerPin = "understory-freezer-pin"

// freezerPin is where the GPU duty cycle's freezer pin lives: in kubelet's root cgroup,
// next to kubepods.
func (l layout) freezerPin() string {
	root, _ := l.naming.RootPath() // newLayout checked the root
	return path.Join(root, freezerPin)
}

// podCgroups returns where a pod's processes may be: for batch pods first below the tier
// (where the NRI plugin puts them), then kubelet's own pod cgroup.
func (l layout) podCgroups(class qos.Class, q cgroups.KubeQOS, uid types.UID) ([]string, error) {
	kubelet, err := l.naming.PodPath(q, string(uid))
	if err != nil {
		return nil, err
	}
	if class != qos.ClassBatch {
		return []string{kubelet}, nil
	}
	tier, err := cgroups.TierPodPath(l.naming.Driver, l.tier, string(uid))
	if err != nil {
		return nil, err
	}
	return []string{tier, kubelet}, nil
}

// syncPods brings the pod table in line with the source's current list: new pods are
// classified and their cgroups resolved, gone pods are forgotten.
func (a *Agent) syncPods(pods []*corev1.Pod) {
	seen := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		if pod == nil || pod.UID == "" || !podActive(pod) {
			continue
		}
		seen[pod.UID] = true
		class, classErr := qos.Classify(pod)
		kq := kubeQOSOf(qos.KubeQOSClass(pod))
		spec := specOf(pod, kq)
		st := a.pods[pod.UID]
		if st != nil && st.class == class && st.kubeQOS == kq {
			st.classErr = classErr
			st.spec = spec
			st.terminating = pod.DeletionTimestamp != nil
			st.namespace, st.name = pod.Namespace, pod.Name // a rediscovered pod gets its name
			continue
		}
		if st != nil {
			if st.class == qos.ClassBatch && class != qos.ClassBatch {
				a.restore.leaveBatch(st, spec)
			}
			a.act.forget(st)
			a.sampler.drop(st)
		}
		st = &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, class: class, kubeQOS: kq,
			classErr: classErr, spec: spec, terminating: pod.DeletionTimestamp != nil, act: newPodAct()}
		cgs, err := a.layout.podCgroups(class, kq, pod.UID)
		if err != nil {
			st.lastErr = err
		}
		st.candidates = cgs
		a.pods[pod.UID] = st
		a.ctl.seenPod(pod)
		if classErr != nil {
			a.metrics.Errors.WithLabelValues(metrics.ErrKindAnnotation).Inc()
			a.log.Warn("invalid QoS annotation; pod keeps its default class", "pod", st.key(), "class", class, "err", classErr)
			a.events.Warn(pod, "InvalidQoSClass", fmt.Sprintf("%v; the pod stays in class %s", classErr, class))
		}
	}
	for uid, st := range a.pods {
		if !seen[uid] {
			a.act.forget(st)
			a.sampler.drop(st)
			delete(a.pods, uid)
			a.act.removeTierPod(st)
		}
	}
	a.resort()
}

// resort rebuilds the sorted pod list and the pods' requests after the pod table
// changed.
func (a *Agent) resort() {
	a.sampler.readAll()
	a.gpuPods.changed()
	a.sorted = a.sorted[:0]
	a.requests = qos.Requests{}
	for _, st := range a.pods {
		a.sorted = append(a.sorted, st)
		if st.class == qos.ClassLS {
			a.requests.LSCPU += st.spec.cpuRequest
			a.requests.LSMemory += st.spec.memRequest
		}
		// Whatever the class: kubelet counts the batch resources of every pod
		// against allocatable.
		a.requests.BatchCPU += st.spec.batchCPU
		a.requests.BatchMemory += float64(st.spec.batchMemory)
	}
	sort.Slice(a.sorted, func(i, j int) bool {
		if ki, kj := a.sorted[i].key(), a.sorted[j].key(); ki != kj {
			return ki < kj
		}
		return a.sorted[i].uid < a.sorted[j].uid
	})
}

// podActive reports whether the pod can still run processes.
func podActive(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// removeTierPod deletes a gone batch pod's cgroup below the tier, which the runtime
// leaves behind (it removes only the container cgroups). A group still holding tasks is
// left alone.
func (x *actuator) removeTierPod(st *podState) {
	if st.class != qos.ClassBatch || len(st.candidates) == 0 {
		return
	}
	// The runtime made it with mkdir -p in every hierarchy, so remove it from all of them.
	if err := x.hier.RemoveEmpty(st.candidates[0]); err != nil {
		x.log.Debug("tier cgroup of a gone pod not removed", "cgroup", st.candidates[0], "err", err)
	}
}

// reopenBackoff is how long a missing pod cgroup is left alone before the next look.
const reopenBackoff = time.Second

func logAttrsPod(st *podState) slog.Attr {
	return slog.Group("pod", "name", st.key(), "uid", string(st.uid), "cgroup", st.read.cgroup)
}

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

// gpuPods is the pod snapshot the control loop hands the GPU loop (koordlet/gpubridge):
// rebuilt on the next slow period once stale says the pod table or a pod's cgroup
// changed, kept only while GPU features are on (on).
type gpuPods struct {
	on    bool
	pods  atomic.Pointer[gpu.PodMap]
	stale bool
}

// view is the GPU loop's view of the pods: the snapshot the control loop last
// published. Safe for concurrent use.
func (g *gpuPods) view() gpu.PodView {
	if m := g.pods.Load(); m != nil {
		return *m
	}
	return gpu.PodMap(nil)
}

// follow takes what the control loop saw change this period (a pod's cgroup, cgroup),
// and on a slow period hands the GPU loop a new snapshot of pods if anything changed
// since the last one; most periods change nothing, and the GPU loop keeps the snapshot it
// has.
func (g *gpuPods) follow(cgroup, slow bool, pods []*podState) {
	g.stale = g.stale || cgroup
	if slow && g.stale {
		g.publish(pods)
		g.stale = false
	}
}

// changed marks the snapshot stale: the pod table changed.
func (g *gpuPods) changed() { g.stale = true }

// publish replaces the GPU loop's pod snapshot with pods (none with GPU features off).
func (g *gpuPods) publish(pods []*podState) {
	if !g.on {
		return
	}
	m := make(gpu.PodMap, len(pods))
	for _, st := range pods {
		m[st.uid] = gpu.PodInfo{UID: st.uid, Namespace: st.namespace, Name: st.name, Class: st.class,
			Cgroup: st.read.cgroup, Containers: st.spec.containers, Priority: st.spec.priority,
			StartTime: st.spec.started, Terminating: st.terminating}
	}
	g.pods.Store(&m)
}

// batchCgroups are the cgroups of the batch pods among pods that the agent found.
func batchCgroups(pods []*podState) []string {
	var out []string
	for _, st := range pods {
		if st.class == qos.ClassBatch && st.read.cgroup != "" {
			out = append(out, st.read.cgroup)
		}
	}
	return out
}

// MPSOptions are the NRI plugin's MPS client planner (the GPU loop's partitions; nil
// when the agent's MPS is off: gpu.mps.mode disabled, or GPU features off) and the
// clients' setup (gpu.mps).
func (a *Agent) MPSOptions() (devices.MPSPlanner, devices.MPSSetup) {
	return a.gpu.MPSPlanner(), a.cfg.GPU.MPSSetup()
}

// GPUs is the node's GPU inventory for the NRI plugin (empty with GPU features off or
// before the first scrape).
func (a *Agent) GPUs() []devices.GPU { return a.gpu.Inventory() }

// TimesliceOptions is the NRI plugin's time-slice planner: the GPU loop's Timeslices,
// or nil with gpu.timeslice off or GPU features off.
func (a *Agent) TimesliceOptions() devices.TimeslicePlanner { return a.gpu.TimeslicePlanner() }
