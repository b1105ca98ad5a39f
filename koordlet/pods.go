package koordlet

import (
	"fmt"
	"log/slog"
	"path"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
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

func newLayout(cfg Config) (layout, error) {
	d, err := cgroups.ParseDriver(cfg.CgroupDriver)
	if err != nil {
		return layout{}, err
	}
	n := cgroups.Naming{Driver: d, Root: cfg.KubeletCgroupRoot}
	tier, err := tierCgroup(n, cfg.TierParent, cfg.TierName)
	if err != nil {
		return layout{}, err
	}
	return layout{naming: n, tier: tier}, nil
}

// TierCgroup is the batch tier's cgroup for kubelet's --cgroup-root and driver, in
// parent (TierParentKubepods or TierParentBestEffort), named as kubelet names a child
// of that cgroup (cgroups.Naming.TierPathIn).
func TierCgroup(d cgroups.Driver, kubeletRoot, parent, name string) (string, error) {
	return tierCgroup(cgroups.Naming{Driver: d, Root: kubeletRoot}, parent, name)
}

func tierCgroup(n cgroups.Naming, parent, name string) (string, error) {
	q, ok := tierParentQOS(parent)
	if !ok {
		return "", fmt.Errorf("tier parent %q: %w", parent, ErrInvalidConfig)
	}
	return n.TierPathIn(q, name)
}

// qos is kubelet's QoS-level cgroup of q.
func (l layout) qos(q cgroups.KubeQOS) string { return l.naming.QOSPath(q) }

// kubepods is the cgroup holding every pod.
func (l layout) kubepods() string { return l.qos(cgroups.QOSGuaranteed) }

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
	a.gpu.podsChanged()
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
