package gang

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// testNode is a node of cpu cores, memGi GiB and gpus GPUs of model, as the
// index builds its ledger (placement.Node) and its name, labels and taints.
func testNode(name, model string, gpus, cpu, memGi int) (*placement.Node, *corev1.Node) {
	n := &placement.Node{Name: name, CPUMilli: int64(cpu) * 1000, MemoryMiB: int64(memGi) << 10, MaxPods: 110}
	meta := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if gpus > 0 {
		n.Model, n.GPUFree = model, slices.Repeat([]int{contract.MilliPerGPU}, gpus)
		meta.Labels["nvidia.com/gpu.product"] = model
	}
	return n, meta
}

// fakePhase is where a fakePod stands.
type fakePhase int

const (
	fakePending fakePhase = iota
	fakePlanned
	fakeBinding
	fakeBound
)

// fakePod is a gang.Pod as an index would track it.
type fakePod struct {
	uid             types.UID
	namespace, name string
	created         time.Time
	req             placement.Request
	reqErr          error
	node            string
	devs            []int
	phase           fakePhase
	m               Member
}

func (p *fakePod) UID() types.UID { return p.uid }

func (p *fakePod) Namespace() string { return p.namespace }

func (p *fakePod) Name() string { return p.name }

func (p *fakePod) Created() time.Time { return p.created }

func (p *fakePod) Request() placement.Request { return p.req }

func (p *fakePod) RequestErr() error { return p.reqErr }

func (p *fakePod) Node() string { return p.node }

func (p *fakePod) Holds() bool { return p.phase != fakePending }

func (p *fakePod) Planned() bool { return p.phase == fakePlanned }

func (p *fakePod) Binding() bool { return p.phase == fakeBinding }

func (p *fakePod) Bound() bool { return p.phase == fakeBound }

func (p *fakePod) Member() *Member { return &p.m }

// fakeIndex is an index for the gangs alone (Index, Ledger, Outbox): nodes as
// ledgers, pods as fakePods, Events as lines. Its ledger copies work as the
// extender's do, so that planning costs here what it costs there.
type fakeIndex struct {
	mu       sync.RWMutex
	gs       *Gangs
	pol      placement.Policy
	pods     map[types.UID]*fakePod
	nodes    map[string]*placement.Node
	meta     map[string]*corev1.Node
	gen, cap uint64
	events   []string
}

var (
	_ Index  = (*fakeIndex)(nil)
	_ Ledger = (*fakeIndex)(nil)
	_ Outbox = (*fakeIndex)(nil)
)

// newFakeIndex is an empty index serving the default policy, with its gangs.
func newFakeIndex(cfg Config, now func() time.Time) *fakeIndex {
	pol, err := placement.NewPolicy(placement.DefaultPolicy, nil, nil)
	if err != nil {
		panic(err)
	}
	ix := &fakeIndex{pol: pol, pods: map[types.UID]*fakePod{}, nodes: map[string]*placement.Node{}, meta: map[string]*corev1.Node{}}
	ix.gs = New(cfg, ix, ix, ix, nil, now)
	return ix
}

// addNode adds a node (call before the index is shared).
func (ix *fakeIndex) addNode(n *placement.Node, meta *corev1.Node) {
	ix.nodes[n.Name], ix.meta[n.Name] = n, meta
	ix.cap++
}

// addPod records pod from the informer: pending, or bound on node with devs
// (charged there).
func (ix *fakeIndex) addPod(pod *corev1.Pod, node string, devs []int) *fakePod {
	ix.Lock()
	defer ix.Unlock()
	p := &fakePod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, created: pod.CreationTimestamp.Time}
	p.req, p.reqErr = wire.PodRequest(pod)
	ix.pods[p.uid] = p
	ix.gs.PodUpdated(p, RecordOf(pod), true)
	if node != "" {
		ix.nodes[node].Charge(p.req, devs)
		p.node, p.devs, p.phase = node, devs, fakeBound
		ix.gen++
		ix.gs.PodBound(p)
	}
	return p
}

func (ix *fakeIndex) Lock() { ix.mu.Lock() }

func (ix *fakeIndex) Unlock() { ix.mu.Unlock() }

func (ix *fakeIndex) RLock() { ix.mu.RLock() }

func (ix *fakeIndex) RUnlock() { ix.mu.RUnlock() }

func (ix *fakeIndex) Pod(uid types.UID) Pod {
	if p := ix.pods[uid]; p != nil {
		return p
	}
	return nil
}

func (ix *fakeIndex) Generations() (uint64, uint64) { return ix.gen, ix.cap }

func (ix *fakeIndex) Candidates(names [][]byte) ([]*placement.Node, []*corev1.Node, map[string]int) {
	idx := make(map[string]int, len(names))
	var nodes []*placement.Node
	var meta []*corev1.Node
	for _, b := range names {
		if n, ok := ix.nodes[string(b)]; ok {
			if _, dup := idx[n.Name]; !dup {
				idx[n.Name] = len(nodes)
				nodes, meta = append(nodes, n.Clone()), append(meta, ix.meta[n.Name])
			}
		}
	}
	return nodes, meta, idx
}

func (ix *fakeIndex) EmptyNodes() ([]*placement.Node, []*corev1.Node, map[string]int) {
	entries := make([]*placement.Node, 0, len(ix.nodes))
	for _, e := range ix.nodes {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b *placement.Node) int { return strings.Compare(a.Name, b.Name) })
	nodes, meta := make([]*placement.Node, len(entries)), make([]*corev1.Node, len(entries))
	idx := make(map[string]int, len(entries))
	for i, e := range entries {
		n := &placement.Node{Name: e.Name, Model: e.Model, CPUMilli: e.CPUMilli, MemoryMiB: e.MemoryMiB, MaxPods: e.MaxPods,
			BatchCPUMilli: e.BatchCPUMilli, BatchMemoryMiB: e.BatchMemoryMiB, GPUFree: make([]int, len(e.GPUFree))}
		for d := range n.GPUFree {
			n.GPUFree[d] = contract.MilliPerGPU
		}
		nodes[i], meta[i], idx[n.Name] = n, ix.meta[n.Name], i
	}
	return nodes, meta, idx
}

func (ix *fakeIndex) Plan(pod Pod, node string, devs []int) error {
	p := pod.(*fakePod)
	ix.Release(p)
	n := ix.nodes[node]
	if n == nil {
		return fmt.Errorf("node %s vanished", node)
	}
	if err := n.Place(p.req, devs); err != nil {
		return err
	}
	p.node, p.devs, p.phase = node, slices.Clone(devs), fakePlanned
	ix.gen++
	return nil
}

func (ix *fakeIndex) Release(pod Pod) {
	p := pod.(*fakePod)
	if p.phase != fakePending {
		ix.nodes[p.node].Discharge(p.req, p.devs)
		ix.gen++
	}
	p.node, p.devs, p.phase = "", nil, fakePending
}

func (ix *fakeIndex) Settle(pod Pod, err error) {
	if err != nil {
		ix.Release(pod)
		return
	}
	pod.(*fakePod).phase = fakeBound
}

func (ix *fakeIndex) Policy() (placement.Policy, bool) { return ix.pol, placement.Concurrent(ix.pol) }

func (ix *fakeIndex) Emit(p Pod, warning bool, reason, msg string) {
	ix.events = append(ix.events, fmt.Sprintf("%s %s: %s", podKey(p), reason, msg))
}

func (ix *fakeIndex) Nudge(p Pod, value string) {
	ix.events = append(ix.events, fmt.Sprintf("%s nudge: %s", podKey(p), value))
}
