package extender

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/metrics"
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
	reqErr          error // why the pod cannot be turned into a Request (user error)
	gang            gangRef
	hasGang         bool
	cons            *podConstraints // gang members only: selector, required affinity, tolerations
	persisted       *persistedPlan  // gang members only: the plan its gang-state annotation records
	seq             uint64          // order in which the index learned of it (first claim wins a device)
	informer        bool            // seen by the pod informer (not only in extender args)
	seen            time.Time       // last time extender args carried it (for !informer pods)

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

// nodeEntry is one node's precomputed placement state.
type nodeEntry struct {
	n   *placement.Node
	gen uint64 // bumped on every change of n (an optimistic filter re-checks it)
	// meta is the node's name, labels and taints, for gang members' constraints.
	meta *corev1.Node
	// metrics is the node's last decodable node-metrics annotation and usage its
	// placement form; n.Usage is usage while the metrics are fresh.
	metrics    *metrics.NodeMetrics
	usage      *placement.Usage
	metricsErr string
	// alloc is kubelet's allocation of whole GPUs from the last decodable
	// metrics (version 2; nil when unreported): gpualloc.go.
	alloc *kubeletAlloc
	pods       map[types.UID]*podEntry            // pods charged here
	learned    bool                               // known only from extender args (nodeCacheCapable false)
	seen       time.Time                          // last time extender args carried it (learned nodes)
	cache      [scoreSlots]atomic.Pointer[scored] // verdicts by request shape, round robin
	nextSlot   atomic.Uint32
}

// State is the extender's in-memory index: nodes, the pods placed on them, pods
// the extender reserved or assumed, and gangs. One RWMutex guards it all; scoring
// runs under the read lock, every change under the write lock.
type State struct {
	cfg Config
	now func() time.Time

	mu        sync.RWMutex
	nodes     map[string]*nodeEntry
	pods      map[types.UID]*podEntry
	orphans   map[string]map[types.UID]*podEntry // bound to a node not (yet) in the index
	gangs     gangBook                           // gangs, their PodGroups and plan ids
	gen       uint64                             // source of nodeEntry.gen
	podSeq    uint64                             // source of podEntry.seq
	capGen    uint64                             // bumped when the node set or a node's capacity, labels or taints change (keys gang "ever fits" checks)
	policy    placement.Policy
	workload  *placement.Workload // the policy's target workload (nil: none yet)
	epoch     uint64              // bumped when policy changes
	cacheable bool                // the policy is deterministic: verdicts may be cached
	seed      maphash.Seed
	shapes    shapeTable    // request shapes: verdict cache keys
	lists     resolvedLists // NodeNames lists resolved to entries
	out       outbox        // Events and nudges to send once the lock is released
	met       *metrics.Extender
	contact   *apiContact

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

// NewState returns an empty index serving cfg.Policy.
func NewState(cfg Config, now func() time.Time) (*State, error) {
	if now == nil {
		now = time.Now
	}
	s := &State{
		cfg: cfg, now: now,
		nodes: map[string]*nodeEntry{}, pods: map[types.UID]*podEntry{},
		orphans: map[string]map[types.UID]*podEntry{}, gangs: newGangBook(cfg, now()),
		seed: maphash.MakeSeed(), contact: newAPIContact(now), lists: resolvedLists{seed: maphash.MakeSeed()},
	}
	if err := s.setPolicy(nil); err != nil {
		return nil, err
	}
	return s, nil
}

// setPolicy rebuilds the policy for workload w. Call with mu held for writing (or before sharing s).
func (s *State) setPolicy(w *placement.Workload) error {
	p, err := placement.NewPolicy(s.cfg.Policy, w, nil)
	if err != nil {
		return fmt.Errorf("building policy: %w", err)
	}
	s.cacheable = placement.Concurrent(p)
	if !s.cacheable {
		p = &lockedPolicy{p: p}
	}
	s.policy, s.workload = p, w
	s.epoch++
	return nil
}

// lockedPolicy serialises a policy that is not safe for concurrent use (random:
// it draws from one rng), since filters score under the read lock.
type lockedPolicy struct {
	mu sync.Mutex
	p  placement.Policy
}

var _ placement.Policy = (*lockedPolicy)(nil)

func (l *lockedPolicy) Name() string { return l.p.Name() }

func (l *lockedPolicy) Score(n *placement.Node, r placement.Request) (float64, []int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p.Score(n, r)
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
	return s.setPolicy(w)
}

// bump marks e changed. Call with mu held for writing.
func (s *State) bump(e *nodeEntry) {
	s.gen++
	e.gen = s.gen
}

// hold charges p on node e in the given phase; devices must be valid for p (checked
// by reserve) or observed. Call with mu held for writing.
func (s *State) hold(p *podEntry, e *nodeEntry, devs []int, phase podPhase) {
	s.release(p)
	p.node, p.devices, p.phase, p.charged = e.n.Name, devs, phase, true
	e.n.Charge(p.req, devs)
	e.pods[p.uid] = p
	s.bump(e)
}

// reserve places p on e if it fits there with devs (Node.Place checks both).
func (s *State) reserve(p *podEntry, e *nodeEntry, devs []int, phase podPhase) error {
	if p.charged {
		s.release(p)
	}
	if err := e.n.Place(p.req, devs); err != nil {
		return err
	}
	e.n.Discharge(p.req, devs) // Place charged it; hold charges it again symmetrically
	s.hold(p, e, slices.Clone(devs), phase)
	return nil
}

// release frees whatever p holds and makes it pending. Call with mu held for writing.
func (s *State) release(p *podEntry) {
	if p.charged {
		if e, ok := s.nodes[p.node]; ok {
			e.n.Discharge(p.req, p.devices)
			delete(e.pods, p.uid)
			s.bump(e)
		}
	}
	if o, ok := s.orphans[p.node]; ok {
		delete(o, p.uid)
		if len(o) == 0 {
			delete(s.orphans, p.node)
		}
	}
	p.charged, p.node, p.devices, p.phase, p.inferred, p.expires = false, "", nil, phasePending, false, time.Time{}
	p.unconfirmed = false
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
	fresh := nodeFromAPI(obj)
	e, ok := s.nodes[obj.Name]
	if !ok {
		e = &nodeEntry{n: fresh, meta: nodeMeta(obj), pods: map[types.UID]*podEntry{}, learned: learned}
		s.nodes[obj.Name] = e
		s.capGen++
		// Pods bound here before the node was known, in the order the index
		// learned them: the first to claim a device keeps it.
		orphans := slices.SortedFunc(maps.Values(s.orphans[obj.Name]), func(a, b *podEntry) int {
			return cmp.Compare(a.seq, b.seq)
		})
		delete(s.orphans, obj.Name)
		for _, p := range orphans {
			phase, devs := p.phase, p.devices
			s.chargeBound(p, e, devs, phase)
		}
	} else {
		if !sameCapacity(e.n, fresh) {
			s.capGen++
			for _, p := range e.pods {
				fresh.Charge(p.req, p.devices)
			}
			e.n = fresh
		}
		if !sameMeta(e.meta, obj) {
			s.capGen++
			e.meta = nodeMeta(obj)
		}
		if !learned {
			e.learned = false
		}
	}
	e.metrics, e.usage, e.metricsErr, e.alloc = nil, nil, "", nil
	// Version 2 (GPU figures, kubelet's allocation) where the agent writes it,
	// else version 1.
	switch m, err := metrics.DecodeNodeAnnotations(obj.Annotations); {
	case errors.Is(err, metrics.ErrNoNodeMetrics):
		e.metricsErr = "no " + metrics.AnnotationNodeMetrics + " annotation"
	case err != nil:
		e.metricsErr = err.Error()
	default:
		e.metrics, e.usage, e.alloc = &m, usageOf(&m), allocOf(&m)
	}
	s.refreshUsage(e, s.now())
	s.reconcileGPUs(e)
	s.bump(e)
	return e
}

// refreshUsage sets n.Usage from the node's metrics while they are fresh; nil otherwise.
func (s *State) refreshUsage(e *nodeEntry, now time.Time) bool {
	var u *placement.Usage
	if e.metrics != nil && metricsFresh(e.metrics, now, s.cfg.MetricsMaxAge, s.cfg.MetricsMaxSkew) {
		u = e.usage
	}
	if u == e.n.Usage {
		return false
	}
	e.n.Usage = u
	return true
}

// metricsFresh reports whether m is at most maxAge old at now and stamped at
// most maxSkew in the future: a future timestamp (a node clock ahead of ours, a
// hand-written annotation) would otherwise read as fresh forever.
func metricsFresh(m *metrics.NodeMetrics, now time.Time, maxAge, maxSkew time.Duration) bool {
	return m.Timestamp.Sub(now) <= maxSkew && m.Fresh(now, maxAge)
}

// usageOf is the part of the node agent's metrics placement scores on.
func usageOf(m *metrics.NodeMetrics) *placement.Usage {
	u := &placement.Usage{CPUCapacity: m.CPU.Capacity, CPUUsed: m.CPU.Used, CPULS: m.CPU.LS,
		MemoryCapacity: m.Memory.Capacity, MemoryUsed: m.Memory.Used}
	if m.GPU != nil && len(m.GPU.Devices) > 0 {
		// Devices are in increasing Index order (validated), indices below
		// MaxGPUsPerNode; a gap is a device the agent did not report: unknown.
		u.GPUs = make([]placement.GPUUsage, m.GPU.Devices[len(m.GPU.Devices)-1].Index+1)
		for _, d := range m.GPU.Devices {
			u.GPUs[d.Index] = placement.GPUUsage{Known: d.Healthy, Util: d.Util, LSUtil: d.LSUtil,
				Reclaimable: d.Reclaimable}
		}
	}
	return u
}

func sameCapacity(a, b *placement.Node) bool {
	return a.Model == b.Model && a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB && a.MaxPods == b.MaxPods &&
		len(a.GPUFree) == len(b.GPUFree) && a.BatchCPUMilli == b.BatchCPUMilli && a.BatchMemoryMiB == b.BatchMemoryMiB
}

// nodeFromAPI is the empty placement state of a node: allocatable capacity, GPU
// count from allocatable nvidia.com/gpu (capped at MaxGPUsPerNode) and model from
// the nvidia.com/gpu.product label.
func nodeFromAPI(obj *corev1.Node) *placement.Node {
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
	if q, ok := a[ResourceGPU]; ok && q.Sign() > 0 {
		g := int(min(q.Value(), placement.MaxGPUsPerNode))
		n.GPUFree = make([]int, g)
		for i := range n.GPUFree {
			n.GPUFree[i] = placement.MilliPerGPU
		}
		n.Model = obj.Labels[LabelGPUProduct]
	}
	if q, ok := a[ResourceBatchCPU]; ok && q.Sign() > 0 {
		n.BatchCPUMilli = q.Value()
	}
	if q, ok := a[ResourceBatchMemory]; ok && q.Sign() > 0 {
		n.BatchMemoryMiB = q.Value() / mib
	}
	return n
}

// DeleteNode forgets a node. Pods bound there wait as orphans for their own delete
// events; reservations and plans on it are released.
func (s *State) DeleteNode(name string) {
	s.lock()
	defer s.unlock()
	s.deleteNodeLocked(name)
}

func (s *State) deleteNodeLocked(name string) {
	e, ok := s.nodes[name]
	if !ok {
		return
	}
	delete(s.nodes, name)
	s.capGen++
	for _, p := range e.pods {
		switch p.phase {
		case phaseBound, phaseAssumed:
			p.charged = false
			s.addOrphan(p)
		default:
			p.charged = false
			s.releasePlanOf(p, fmt.Sprintf("node %s deleted", name))
			s.release(p)
		}
	}
}

func (s *State) addOrphan(p *podEntry) {
	o := s.orphans[p.node]
	if o == nil {
		o = map[types.UID]*podEntry{}
		s.orphans[p.node] = o
	}
	o[p.uid] = p
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
	s.gangs.join(p, pod)
	if fromInformer {
		p.persisted = nil
		if p.hasGang {
			p.persisted = pod.persisted
		}
	}

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
	e, known := s.nodes[node]
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
			s.gangs.confirm(p)
		}
		return p
	}
	s.releasePlanOf(p, "pod bound elsewhere")
	s.release(p)
	p.node, p.phase = node, phaseBound
	if !known {
		p.devices = devs
		s.addOrphan(p)
		return p
	}
	if kdevs != nil {
		// kubelet's word: held as reported, then the node's other whole-GPU pods
		// are moved around it (and what still over-commits is reported).
		s.hold(p, e, kdevs, phaseBound)
		s.reconcileGPUs(e)
	} else {
		s.chargeBound(p, e, devs, phaseBound)
	}
	s.gangs.confirm(p)
	return p
}

// chargeBound charges p, bound (or assumed) on e, on the devices devs its
// annotation names (nil when missing or malformed). Devices that are not
// r.NumGPU distinct devices of e are replaced by inferred ones; so are devices
// that pods charged before p already fill (a pod copied with its devices
// annotation, or two pods claiming one device): the first pod keeps them, and
// the conflict is reported as an Event on p and counted. Call with mu held for writing.
func (s *State) chargeBound(p *podEntry, e *nodeEntry, devs []int, phase podPhase) {
	inferred := false
	if p.req.NumGPU > 0 {
		switch {
		case !placement.ValidDevices(e.n, p.req, devs):
			devs, inferred = placement.InferDevices(e.n, p.req), true
		case !devicesFree(e.n, p.req, devs):
			claimed := devs
			devs, inferred = placement.InferDevices(e.n, p.req), true
			s.deviceConflict(p, e, claimed, devs)
		}
	}
	s.hold(p, e, devs, phase)
	p.inferred = inferred
}

// devicesFree reports whether each of devs has r's milli free on n.
func devicesFree(n *placement.Node, r placement.Request, devs []int) bool {
	for _, d := range devs {
		if n.GPUFree[d] < r.GPUMilli {
			return false
		}
	}
	return true
}

// deviceConflict reports that p claims devices (claimed) which pods charged
// on e before it hold: they keep them, and p is accounted on devs.
func (s *State) deviceConflict(p *podEntry, e *nodeEntry, claimed, devs []int) {
	var holders []string
	for _, o := range e.pods {
		for _, d := range o.devices {
			if slices.Contains(claimed, d) {
				holders = append(holders, o.key())
				break
			}
		}
	}
	slices.Sort(holders)
	s.emit(p, true, "GPUDeviceConflict", fmt.Sprintf("%s=%s names devices of node %s that %s already hold: "+
		"the first holder keeps them; %s is accounted on devices %s instead", AnnotationGPUDevices,
		FormatDevices(claimed), e.n.Name, strings.Join(holders, ", "), p.key(), FormatDevices(devs)))
	if s.met != nil {
		s.met.DeviceConflicts.Inc()
	}
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
	s.releasePlanOf(p, fmt.Sprintf("member %s deleted", p.key()))
	s.release(p)
	s.gangs.leave(p)
	delete(s.pods, uid)
}

// argsLifetime is how many AssumedTTLs a pod or node known only from extender
// args (never from an informer) is kept after it was last seen.
const argsLifetime = 10

// expireReservations releases filter reservations older than AssumedTTL and
// returns how many; it also forgets what only extender args ever showed and
// that has not been seen for argsLifetime AssumedTTLs: pods (deleted before the
// informer saw them, or an extender without informers), whatever they hold
// unless a bind is in flight, and learned nodes (nodeCacheCapable false).
func (s *State) expireReservations(now time.Time) int {
	n := 0
	life := argsLifetime * s.cfg.AssumedTTL
	for uid, p := range s.pods {
		if p.phase == phaseReserved && now.After(p.expires) {
			s.release(p)
			n++
		}
		if !p.informer && p.phase != phaseBinding && now.Sub(p.seen) > life {
			s.deletePodLocked(uid)
		}
	}
	for name, e := range s.nodes {
		if e.learned && now.Sub(e.seen) > life {
			s.deleteNodeLocked(name)
		}
	}
	return n
}

// refreshAllUsage re-applies the metrics max age to every node.
func (s *State) refreshAllUsage(now time.Time) {
	for _, e := range s.nodes {
		if s.refreshUsage(e, now) {
			s.bump(e)
		}
	}
}
