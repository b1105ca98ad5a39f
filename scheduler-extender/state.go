package extender

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/placement"
)

// ErrUnknownPod means the extender has never seen the pod and could not fetch it.
var ErrUnknownPod = errors.New("pod unknown to the extender")

// podPhase is where a tracked pod stands in the extender's accounting.
type podPhase int

const (
	phasePending  podPhase = iota // known, holds nothing
	phaseReserved                 // a filter reserved a node for it; expires after AssumedTTL
	phasePlanned                  // part of a gang plan; expires with the plan
	phaseBinding                  // its bind is in progress (or waiting for its gang)
	phaseAssumed                  // Binding created; the informer has not shown it bound yet
	phaseBound                    // the informer shows spec.nodeName
)

func (p podPhase) String() string {
	return [...]string{"pending", "reserved", "planned", "binding", "assumed", "bound"}[p]
}

// holds reports whether a pod in this phase holds capacity on its node.
func (p podPhase) holds() bool { return p != phasePending }

// podEntry is one tracked pod.
type podEntry struct {
	uid             types.UID
	namespace, name string
	created         time.Time
	req             placement.Request
	reqErr          error       // why the pod cannot be turned into a Request (user error)
	gm              gang.Member // the gangs' part: its gang, constraints, recorded plan
	seq             uint64      // order in which the index learned of it (first claim wins a device)
	informer        bool        // seen by the pod informer (not only in extender args)
	seen            time.Time   // last time extender args carried it (for !informer pods)

	phase   podPhase
	node    string // node it is bound to or reserved on
	charged bool   // its request is subtracted from node's entry
	devices []int
	// inferred devices were chosen by the extender because the annotation was missing or wrong.
	inferred bool
	// unconfirmed: a phaseReserved hold after a Binding whose outcome is unknown
	// (holdUnconfirmed); a filter of the pod keeps it instead of releasing it.
	unconfirmed bool
	expires     time.Time // for phaseReserved
}

func (p *podEntry) key() string { return p.namespace + "/" + p.name }

// inGang reports whether p is a gang member.
func (p *podEntry) inGang() bool {
	_, ok := p.gm.Gang()
	return ok
}

// A podEntry is a gang.Pod: what the gangs read of a member.
func (p *podEntry) UID() types.UID             { return p.uid }
func (p *podEntry) Namespace() string          { return p.namespace }
func (p *podEntry) Name() string               { return p.name }
func (p *podEntry) Created() time.Time         { return p.created }
func (p *podEntry) Request() placement.Request { return p.req }
func (p *podEntry) RequestErr() error          { return p.reqErr }
func (p *podEntry) Node() string               { return p.node }
func (p *podEntry) Holds() bool                { return p.phase.holds() }
func (p *podEntry) Planned() bool              { return p.phase == phasePlanned }
func (p *podEntry) Binding() bool              { return p.phase == phaseBinding }
func (p *podEntry) Bound() bool                { return p.phase == phaseAssumed || p.phase == phaseBound }
func (p *podEntry) Member() *gang.Member       { return &p.gm }

// nodeEntry is one node's precomputed placement state.
type nodeEntry struct {
	n   *placement.Node
	gen uint64 // bumped on every change of n (an optimistic filter re-checks it)
	// meta is the node's name, labels and taints, for gang members' constraints.
	meta *corev1.Node
	// metrics is the node's last decodable node-metrics annotation and usage its
	// placement form; n.Usage is usage while the metrics are fresh.
	metrics    *contract.NodeMetrics
	usage      *placement.Usage
	metricsErr string
	// alloc is kubelet's allocation of whole GPUs from the last decodable
	// metrics (version 2; nil when unreported): gpus.go.
	alloc *kubeletAlloc
	// gpus is the node's physical GPUs by slot (gpus.go); gpuList the agent's
	// newest decoded GPU list, kept while later annotations lack one or do not
	// decode (what is installed does not change with a stale or broken annotation).
	gpus     gpuTable
	gpuList  *contract.NodeMetrics
	pods     map[types.UID]*podEntry            // pods charged here
	learned  bool                               // known only from extender args (nodeCacheCapable false)
	seen     time.Time                          // last time extender args carried it (learned nodes)
	cache    [scoreSlots]atomic.Pointer[scored] // verdicts by request shape, round robin
	nextSlot atomic.Uint32
}

// State is the cluster index: the nodes and the pods the informers (or
// request bodies) show. It takes the informers' upserts and deletes (and what
// only request bodies carry: podFromArgs, learnNodes, forgetArgsOnly), follows
// node metrics (usage, kubelet's GPU allocation) and answers /status. Its
// ledger (ledger.go) holds the node entries and charges pods on them (the
// index adds, refreshes and deletes the entries themselves); its scoring
// (scoring.go) scores requests with the serving policy.
//
// Filter, Prioritize and binding are the reservations' (filter.go, bind.go),
// gangs the gang package's. They and the index share one lock, State's RWMutex
// (lock, rlock): every lower-case method of the index, the ledger and scoring
// is called with it held; scoring runs under the read lock, every change under
// the write lock. The index never calls the gangs: what it does to pods it
// tells its podObserver (the gangs), under the lock.
type State struct {
	cfg Config
	now func() time.Time

	mu     sync.RWMutex
	pods   map[types.UID]*podEntry
	podSeq uint64 // source of podEntry.seq
	led    *ledger
	sc     *scoring
	out    *outbox     // Events to send once the lock is released
	obs    podObserver // told what happens to pods (the gangs); never nil

	// lockHold observes every hold of the write lock in seconds (nil: not
	// measured, and lock/unlock cost one nil check more than mu's own).
	// Set before the State is shared; heldSince is written under the lock.
	lockHold  prometheus.Observer
	heldSince time.Time
}

// lock takes the write lock (and notes when, when holds are measured).
func (s *State) lock() {
	s.mu.Lock()
	if s.lockHold != nil {
		s.heldSince = time.Now() // the real clock: s.now may be a test's
	}
}

// unlock releases the write lock (observing the hold, when measured).
func (s *State) unlock() {
	if s.lockHold != nil {
		s.lockHold.Observe(time.Since(s.heldSince).Seconds())
	}
	s.mu.Unlock()
}

// rlock and runlock take and release the read lock.
func (s *State) rlock()   { s.mu.RLock() }
func (s *State) runlock() { s.mu.RUnlock() }

// podObserver is told, under the index's write lock, what the index does to
// pods: the gang registry keeps memberships and plans in line with it. Owned
// by the index, implemented by gang.Gangs; the index calls nothing else of theirs.
type podObserver interface {
	// PodUpdated: p was (re)recorded from a record whose gang part is rec
	// (fromInformer: the informer's truth, else a request body); gang
	// membership follows rec.
	PodUpdated(p gang.Pod, rec *gang.Record, fromInformer bool)
	// PodBound: the informer shows p bound (phaseBound).
	PodBound(p gang.Pod)
	// PodReleasing: the index is about to drop what p holds (p deleted, bound
	// elsewhere, its node deleted): a plan holding p is broken, for reason.
	PodReleasing(p gang.Pod, reason string)
	// PodDeleted: p leaves the index.
	PodDeleted(p gang.Pod)
}

// noObserver is the observer of an index without gangs (NewState alone).
type noObserver struct{}

func (noObserver) PodUpdated(gang.Pod, *gang.Record, bool) {}
func (noObserver) PodBound(gang.Pod)                       {}
func (noObserver) PodReleasing(gang.Pod, string)           {}
func (noObserver) PodDeleted(gang.Pod)                     {}

// NewState returns an empty index serving cfg.Policy, without gangs (NewServer
// wires its Gangs as the index's observer) and with an outbox of its own.
func NewState(cfg Config, now func() time.Time) (*State, error) {
	if now == nil {
		now = time.Now
	}
	out := &outbox{}
	led := &ledger{nodes: map[string]*nodeEntry{}, orphans: map[string]map[types.UID]*podEntry{}, out: out}
	s := &State{
		cfg: cfg, now: now, pods: map[types.UID]*podEntry{}, led: led, out: out, obs: noObserver{},
		sc: &scoring{policyName: cfg.Policy, led: led},
	}
	if err := s.sc.setPolicy(nil); err != nil {
		return nil, err
	}
	return s, nil
}

// servable says whether a Server may serve s with cfg (Deps.State): made with cfg,
// no node or pod, no other Server (its observer still NewState's no-op).
func (s *State) servable(cfg Config) bool {
	s.rlock()
	defer s.runlock()
	_, unserved := s.obs.(noObserver)
	return unserved && s.cfg == cfg && len(s.pods) == 0 && len(s.led.nodes) == 0 && len(s.led.orphans) == 0
}

// RefreshWorkload rebuilds the target workload from every tracked pod's request.
func (s *State) RefreshWorkload() error {
	s.mu.RLock()
	reqs := make([]placement.Request, 0, len(s.pods))
	for _, p := range s.pods {
		if p.reqErr == nil {
			reqs = append(reqs, p.req)
		}
	}
	s.mu.RUnlock()
	coverage := s.cfg.WorkloadCoverage
	if coverage == 0 {
		coverage = placement.PolicyCoverage(s.cfg.Policy)
	}
	w := placement.NewWorkload(reqs, coverage)
	s.lock()
	defer s.unlock()
	return s.sc.setPolicy(w)
}

// UpsertNode adds or refreshes a node from the API object.
func (s *State) UpsertNode(obj *corev1.Node) {
	if obj == nil {
		return
	}
	s.lock()
	defer s.unlock()
	s.upsertNodeLocked(obj, false)
}

func (s *State) upsertNodeLocked(obj *corev1.Node, learned bool) *nodeEntry {
	// Version 2 (GPU figures, kubelet's allocation) where the agent writes it,
	// else version 1.
	m, merr := contract.DecodeNodeAnnotations(obj.Annotations)
	e, ok := s.led.nodes[obj.Name]
	gpuList := (*contract.NodeMetrics)(nil)
	if ok {
		gpuList = e.gpuList
	}
	if merr == nil && m.GPU != nil && len(m.GPU.Devices) > 0 {
		gpuList = &m
	}
	fresh, table := nodeFromAPI(obj, gpuList)
	if !ok {
		e = &nodeEntry{n: fresh, meta: nodeMeta(obj), pods: map[types.UID]*podEntry{}, learned: learned,
			gpus: table, gpuList: gpuList}
		s.led.nodes[obj.Name] = e
		s.led.capGen++
		// Pods bound here before the node was known, in the order the index
		// learned them: the first to claim a device keeps it.
		orphans := slices.SortedFunc(maps.Values(s.led.orphans[obj.Name]), func(a, b *podEntry) int {
			return cmp.Compare(a.seq, b.seq)
		})
		delete(s.led.orphans, obj.Name)
		for _, p := range orphans {
			phase, devs := p.phase, p.devices
			s.led.chargeBound(p, e, devs, phase)
		}
	} else {
		e.gpuList = gpuList
		if !sameCapacity(e.n, fresh) || !e.gpus.equal(&table) {
			s.led.capGen++
			for _, p := range e.pods {
				// A reservation follows its GPU's UUID to the GPU's index in the
				// new list: its annotation is written at bind, from these devices.
				// A pod whose annotation is written (binding, assumed, bound) or
				// recorded in a gang plan keeps its indices: the NRI plugin
				// resolves the annotation's index at each container creation.
				if p.phase == phaseReserved {
					if devs, moved := table.rekey(&e.gpus, p.devices); moved {
						p.devices = devs
					}
				}
				fresh.Charge(p.req, p.devices)
			}
			e.n, e.gpus = fresh, table
		}
		if !sameMeta(e.meta, obj) {
			s.led.capGen++
			e.meta = nodeMeta(obj)
		}
		if !learned {
			e.learned = false
		}
	}
	e.metrics, e.usage, e.metricsErr, e.alloc = nil, nil, "", nil
	switch err := merr; {
	case errors.Is(err, contract.ErrNoNodeMetrics):
		e.metricsErr = "no " + contract.AnnotationNodeMetrics + " annotation"
	case err != nil:
		e.metricsErr = err.Error()
	default:
		e.metrics, e.usage, e.alloc = &m, usageOf(&m), allocOf(&m)
	}
	s.refreshUsage(e, s.now())
	s.led.reconcileGPUs(e)
	s.led.bump(e)
	return e
}

// refreshUsage sets n.Usage from the node's metrics while they are fresh; nil otherwise.
func (s *State) refreshUsage(e *nodeEntry, now time.Time) bool {
	var u *placement.Usage
	if e.metrics != nil && e.metrics.Fresh(now, s.cfg.MetricsMaxAge, s.cfg.MetricsMaxSkew) {
		u = e.usage
	}
	if u == e.n.Usage {
		return false
	}
	e.n.Usage = u
	return true
}

// usageOf is the part of the node agent's metrics placement scores on.
func usageOf(m *contract.NodeMetrics) *placement.Usage {
	u := &placement.Usage{CPUCapacity: m.CPU.Capacity, CPUUsed: m.CPU.Used, CPULS: m.CPU.LS,
		MemoryCapacity: m.Memory.Capacity, MemoryUsed: m.Memory.Used}
	if m.GPU != nil && len(m.GPU.Devices) > 0 {
		// Devices are in increasing Index order (validated), indices below
		// MaxGPUsPerNode; a gap is a device the agent did not report: unknown.
		u.GPUs = make([]placement.GPUUsage, m.GPU.Devices[len(m.GPU.Devices)-1].Index+1)
		for _, d := range m.GPU.Devices {
			g := placement.GPUUsage{Known: d.Healthy, Util: d.Util, LSUtil: d.LSUtil, Reclaimable: d.Reclaimable}
			if d.Healthy && d.LSFreeMilli != nil {
				g.LSFreeKnown, g.LSFreeMilli = true, *d.LSFreeMilli
			}
			u.GPUs[d.Index] = g
		}
	}
	return u
}

func sameCapacity(a, b *placement.Node) bool {
	return a.Model == b.Model && a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB && a.MaxPods == b.MaxPods &&
		len(a.GPUFree) == len(b.GPUFree) && a.BatchCPUMilli == b.BatchCPUMilli && a.BatchMemoryMiB == b.BatchMemoryMiB
}

// mib is a mebibyte: nodes' memory is accounted in MiB.
const mib = 1 << 20

// nodeFromAPI is the empty placement state of a node: allocatable capacity and
// its GPU slots, model and table (nodeGPUs: from the agent's GPU list in m when
// there is one, else from allocatable nvidia.com/gpu over the device plugin's
// replicas; the model from the nvidia.com/gpu.product label without -SHARED).
func nodeFromAPI(obj *corev1.Node, m *contract.NodeMetrics) (*placement.Node, gpuTable) {
	a := obj.Status.Allocatable
	n := &placement.Node{Name: obj.Name}
	if q, ok := a[corev1.ResourceCPU]; ok && q.Sign() > 0 {
		n.CPUMilli = q.MilliValue()
	}
	if q, ok := a[corev1.ResourceMemory]; ok && q.Sign() > 0 {
		n.MemoryMiB = q.Value() / mib
	}
	if q, ok := a[corev1.ResourcePods]; ok && q.Sign() > 0 {
		n.MaxPods = int(min(q.Value(), 1<<20))
	}
	var t gpuTable
	n.GPUFree, n.Model, t = nodeGPUs(obj, m)
	if q, ok := a[contract.ResourceBatchCPU]; ok && q.Sign() > 0 {
		n.BatchCPUMilli = q.Value()
	}
	if q, ok := a[contract.ResourceBatchMemory]; ok && q.Sign() > 0 {
		n.BatchMemoryMiB = q.Value() / mib
	}
	return n, t
}

// nodeMeta is the part of a node that gang members' constraints read. It
// shares obj's label map and taint slice (informer objects are never modified).
func nodeMeta(obj *corev1.Node) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Labels: obj.Labels},
		Spec: corev1.NodeSpec{Taints: obj.Spec.Taints}}
}

// sameMeta reports whether a and b have the same name, labels and taints.
func sameMeta(a, b *corev1.Node) bool {
	return a.Name == b.Name && maps.Equal(a.Labels, b.Labels) &&
		slices.EqualFunc(a.Spec.Taints, b.Spec.Taints, func(x, y corev1.Taint) bool { return x.MatchTaint(&y) && x.Value == y.Value })
}

// DeleteNode forgets a node. Pods bound there wait as orphans for their own delete
// events; reservations and plans on it are released.
func (s *State) DeleteNode(name string) {
	s.lock()
	defer s.unlock()
	s.deleteNodeLocked(name)
}

func (s *State) deleteNodeLocked(name string) {
	e, ok := s.led.nodes[name]
	if !ok {
		return
	}
	delete(s.led.nodes, name)
	s.led.capGen++
	for _, p := range e.pods {
		switch p.phase {
		case phaseBound, phaseAssumed:
			p.charged = false
			s.led.addOrphan(p)
		default:
			p.charged = false
			s.obs.PodReleasing(p, fmt.Sprintf("node %s deleted", name))
			s.led.release(p)
		}
	}
}

// UpsertPod records a pod from the informer (or from a fetch).
func (s *State) UpsertPod(pod *corev1.Pod) {
	if pod == nil {
		return
	}
	s.upsertRecord(podRecordOf(pod))
}

// upsertRecord records a pod the informer stores as rec (podRecordOf, computed
// outside the lock).
func (s *State) upsertRecord(rec *podRecord) {
	s.lock()
	defer s.unlock()
	s.upsertPodLocked(rec, true)
}

// upsertPodLocked records pod; fromInformer distinguishes informer truth from a pod
// seen only in extender arguments.
func (s *State) upsertPodLocked(pod *podRecord, fromInformer bool) *podEntry {
	if pod.phase == corev1.PodSucceeded || pod.phase == corev1.PodFailed {
		s.deletePodLocked(pod.UID)
		return nil
	}
	p, ok := s.pods[pod.UID]
	if !ok {
		s.podSeq++
		p = &podEntry{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, created: pod.CreationTimestamp.Time,
			seq: s.podSeq}
		s.pods[pod.UID] = p
	}
	if fromInformer {
		p.informer = true
	} else {
		p.seen = s.now()
	}
	req, err := pod.req, pod.reqErr
	if err != nil && !p.charged {
		// Keep what it asks of CPU and memory so a bound pod is still accounted.
		req.NumGPU, req.GPUMilli, req.Models = 0, 0, nil
	}
	if !p.charged {
		p.req = req
	}
	p.reqErr = err
	s.obs.PodUpdated(p, pod.gang, fromInformer)

	node := pod.nodeName
	if !fromInformer {
		// A request body is no witness of a binding: kube-scheduler never asks
		// about a bound pod, and a pod that only a body claims bound would hold
		// its devices with nothing ever to release them.
		node = ""
	}
	if node == "" {
		return p // pending: keep whatever the extender holds for it
	}
	// Bound: the API server is the truth.
	var devs []int
	fromAnnotation := false
	if p.req.NumGPU > 0 && len(pod.devices) == p.req.NumGPU {
		devs, fromAnnotation = pod.devices, true // shared with the record: never modified
	}
	same := p.charged && p.node == node
	if !fromAnnotation && same {
		devs = p.devices
	}
	e, known := s.led.nodes[node]
	var kdevs []int // what kubelet allocated: the truth for whole GPUs
	if known {
		if kdevs = kubeletDevices(e, p); kdevs != nil {
			devs, fromAnnotation = kdevs, true
		}
	}
	if same && slices.Equal(devs, p.devices) {
		if fromAnnotation {
			p.inferred = false
		}
		if p.phase != phaseBound {
			p.phase, p.unconfirmed = phaseBound, false
			s.obs.PodBound(p)
		}
		return p
	}
	s.obs.PodReleasing(p, "pod bound elsewhere")
	s.led.release(p)
	p.node, p.phase = node, phaseBound
	if !known {
		p.devices = devs
		s.led.addOrphan(p)
		return p
	}
	if kdevs != nil {
		// kubelet's word: held as reported, then the node's other whole-GPU pods
		// are moved around it (and what still over-commits is reported).
		s.led.hold(p, e, kdevs, phaseBound)
		s.led.reconcileGPUs(e)
	} else {
		s.led.chargeBound(p, e, devs, phaseBound)
	}
	s.obs.PodBound(p)
	return p
}

// DeletePod forgets a pod and frees what it held.
func (s *State) DeletePod(uid types.UID) {
	s.lock()
	defer s.unlock()
	s.deletePodLocked(uid)
}

func (s *State) deletePodLocked(uid types.UID) {
	p, ok := s.pods[uid]
	if !ok {
		return
	}
	s.obs.PodReleasing(p, fmt.Sprintf("member %s deleted", p.key()))
	s.led.release(p)
	s.obs.PodDeleted(p)
	delete(s.pods, uid)
}

// argsLifetime is how many AssumedTTLs a pod or node known only from extender
// args (never from an informer) is kept after it was last seen.
const argsLifetime = 10

// forgetArgsOnly forgets what only extender args ever showed and that has
// not been seen for argsLifetime AssumedTTLs: pods (deleted before the
// informer saw them, or an extender without informers), whatever they hold
// unless a bind is in flight, and learned nodes (nodeCacheCapable false).
// Call with mu held for writing.
func (s *State) forgetArgsOnly(now time.Time) {
	life := argsLifetime * s.cfg.AssumedTTL
	for uid, p := range s.pods {
		if !p.informer && p.phase != phaseBinding && now.Sub(p.seen) > life {
			s.deletePodLocked(uid)
		}
	}
	for name, e := range s.led.nodes {
		if e.learned && now.Sub(e.seen) > life {
			s.deleteNodeLocked(name)
		}
	}
}

// refreshAllUsage re-applies the metrics max age to every node.
func (s *State) refreshAllUsage(now time.Time) {
	for _, e := range s.led.nodes {
		if s.refreshUsage(e, now) {
			s.led.bump(e)
		}
	}
}

// pod is the tracked pod uid (nil when none). Call with mu held.
func (s *State) pod(uid types.UID) *podEntry { return s.pods[uid] }

// forEachPod calls f on every tracked pod (f may release or delete it). Call
// with mu held for writing.
func (s *State) forEachPod(f func(*podEntry)) {
	for _, p := range s.pods {
		f(p)
	}
}

// learnNodes records nodes a nodeCacheCapable=false request body carried that
// the informer does not know (they expire: forgetArgsOnly). Call with mu held
// for writing.
func (s *State) learnNodes(learned []*corev1.Node) {
	now := s.now()
	for _, n := range learned {
		if e, ok := s.led.nodes[n.Name]; !ok || e.learned {
			s.upsertNodeLocked(n, true).seen = now
		}
	}
}

// podFromArgs is the entry of a pod a request body carries: the informer's when
// it has one, else recorded from the body (upsertPodLocked, not a witness of a
// binding). nil: the pod has terminated. Call with mu held for writing; it
// drops the lock while it makes the pod's record (PodRequest, copies), as the
// informer's transform makes its own outside the lock.
func (s *State) podFromArgs(pod *corev1.Pod) *podEntry {
	p := s.pods[pod.UID]
	if p == nil || !p.informer {
		s.unlock()
		rec := podRecordOf(pod)
		s.lock()
		if p = s.pods[pod.UID]; p == nil || !p.informer {
			p = s.upsertPodLocked(rec, false)
		}
	}
	return p
}
