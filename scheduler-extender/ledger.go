package extender

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/placement"
)

// ledger is the capacity the index accounts: the node entries, each with its
// device ledger (placement.Node), and the pods charged on them. It is the only
// one to charge, hold and release (hold, place, placeOn, release), to charge
// what the informers show bound (chargeBound: the first pod to claim a device
// keeps it) and to follow kubelet's allocation of whole GPUs (reconcileGPUs,
// gpus.go); it keeps pods bound to nodes it does not know as orphans, and
// copies its ledgers for planning without the lock (candidates, emptyNodes).
//
// The index (State) adds, refreshes and deletes the node entries themselves
// (their capacity, labels, taints and metrics), moving capGen as it does. Every
// method is called with the index lock held (for writing unless it says
// otherwise). Every change of a node's placement state goes through bump: it
// keys the verdicts scoring caches per node.
type ledger struct {
	nodes   map[string]*nodeEntry
	orphans map[string]map[types.UID]*podEntry // bound to a node not (yet) in the index
	gen     uint64                             // source of nodeEntry.gen
	capGen  uint64                             // bumped when the node set or a node's capacity, labels or taints change (keys gang "ever fits" checks)
	out     *outbox                            // the index's: Events to send once the lock is released
	met     *metrics.Extender                  // nil: not counted
}

// bump marks e changed. Call with the index lock held for writing.
func (l *ledger) bump(e *nodeEntry) {
	l.gen++
	e.gen = l.gen
}

// hold charges p on node e in the given phase; devices must be valid for p (checked
// by reserve) or observed. Call with the index lock held for writing.
func (l *ledger) hold(p *podEntry, e *nodeEntry, devs []int, phase podPhase) {
	l.release(p)
	p.node, p.devices, p.phase, p.charged = e.n.Name, devs, phase, true
	e.n.Charge(p.req, devs)
	e.pods[p.uid] = p
	l.bump(e)
}

// place places p on e in phase if it fits there with devs (Node.Place checks
// both): the reservations' and the gang plans' way to hold capacity. Call with
// the index lock held for writing.
func (l *ledger) place(p *podEntry, e *nodeEntry, devs []int, phase podPhase) error {
	if p.charged {
		l.release(p)
	}
	if err := e.n.Place(p.req, devs); err != nil {
		return err
	}
	e.n.Discharge(p.req, devs) // Place charged it; hold charges it again symmetrically
	l.hold(p, e, slices.Clone(devs), phase)
	return nil
}

// release frees whatever p holds and makes it pending. Call with the index lock held for writing.
func (l *ledger) release(p *podEntry) {
	if p.charged {
		if e, ok := l.nodes[p.node]; ok {
			e.n.Discharge(p.req, p.devices)
			delete(e.pods, p.uid)
			l.bump(e)
		}
	}
	if o, ok := l.orphans[p.node]; ok {
		delete(o, p.uid)
		if len(o) == 0 {
			delete(l.orphans, p.node)
		}
	}
	p.charged, p.node, p.devices, p.phase, p.inferred, p.expires = false, "", nil, phasePending, false, time.Time{}
	p.unconfirmed = false
}

func (l *ledger) addOrphan(p *podEntry) {
	o := l.orphans[p.node]
	if o == nil {
		o = map[types.UID]*podEntry{}
		l.orphans[p.node] = o
	}
	o[p.uid] = p
}

// chargeBound charges p, bound (or assumed) on e, on the devices devs its
// annotation names (nil when missing or malformed). Devices that are not
// r.NumGPU distinct devices of e are replaced by inferred ones; so are devices
// that pods charged before p already fill (a pod copied with its devices
// annotation, or two pods claiming one device): the first pod keeps them, and
// the conflict is reported as an Event on p and counted. Call with the index lock held for writing.
func (l *ledger) chargeBound(p *podEntry, e *nodeEntry, devs []int, phase podPhase) {
	inferred := false
	if p.req.NumGPU > 0 {
		switch {
		case !placement.ValidDevices(e.n, p.req, devs):
			devs, inferred = placement.InferDevices(e.n, p.req), true
		case !devicesFree(e, p.req, devs):
			claimed := devs
			devs, inferred = placement.InferDevices(e.n, p.req), true
			l.deviceConflict(p, e, claimed, devs)
		}
	}
	l.hold(p, e, devs, phase)
	p.inferred = inferred
}

// devicesFree reports whether each of devs has r's milli free on e, for a pod
// observed there: a slot that takes no new booking (an unhealthy GPU) counts as
// free, since the pod runs where it runs and the ledger cannot tell better.
func devicesFree(e *nodeEntry, r placement.Request, devs []int) bool {
	for _, d := range devs {
		if e.n.GPUFree[d] < r.GPUMilli && !e.gpus.isOff(d) {
			return false
		}
	}
	return true
}

// deviceConflict reports that p claims devices (claimed) which pods charged
// on e before it hold: they keep them, and p is accounted on devs.
func (l *ledger) deviceConflict(p *podEntry, e *nodeEntry, claimed, devs []int) {
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
	l.out.Emit(p, true, "GPUDeviceConflict", fmt.Sprintf("%s=%s names devices of node %s that %s already hold: "+
		"the first holder keeps them; %s is accounted on devices %s instead", contract.AnnotationGPUDevices,
		contract.FormatGPUDevices(claimed), e.n.Name, strings.Join(holders, ", "), p.key(), contract.FormatGPUDevices(devs)))
	if l.met != nil {
		l.met.DeviceConflicts.Inc()
	}
}

// generations is the index generation (every ledger change moves it) and the
// capacity generation (node set, capacity, labels, taints). Call with the index lock held.
func (l *ledger) generations() (gen, capGen uint64) { return l.gen, l.capGen }

// candidates copies the known nodes of names (each once, in order) for planning
// without the lock: clones of their ledgers, their names, labels and taints,
// and each name's index. Call with the index lock held.
func (l *ledger) candidates(names [][]byte) ([]*placement.Node, []*corev1.Node, map[string]int) {
	idx := make(map[string]int, len(names))
	var nodes []*placement.Node
	var meta []*corev1.Node
	for _, b := range names {
		if e, ok := l.nodes[string(b)]; ok {
			if _, dup := idx[e.n.Name]; !dup {
				idx[e.n.Name] = len(nodes)
				nodes = append(nodes, e.n.Clone())
				meta = append(meta, e.meta)
			}
		}
	}
	return nodes, meta, idx
}

// emptyNodes copies every node, sorted by name, emptied of every pod (full
// capacity, no usage), with its name, labels and taints: the cluster a gang
// "can it ever fit" check plans on. Call with the index lock held.
func (l *ledger) emptyNodes() ([]*placement.Node, []*corev1.Node, map[string]int) {
	entries := make([]*nodeEntry, 0, len(l.nodes))
	for _, e := range l.nodes {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b *nodeEntry) int { return strings.Compare(a.n.Name, b.n.Name) })
	nodes, meta := make([]*placement.Node, len(entries)), make([]*corev1.Node, len(entries))
	idx := make(map[string]int, len(entries))
	for i, e := range entries {
		n := &placement.Node{Name: e.n.Name, Model: e.n.Model, CPUMilli: e.n.CPUMilli, MemoryMiB: e.n.MemoryMiB, MaxPods: e.n.MaxPods,
			BatchCPUMilli: e.n.BatchCPUMilli, BatchMemoryMiB: e.n.BatchMemoryMiB, GPUFree: make([]int, len(e.n.GPUFree))}
		for d := range n.GPUFree {
			n.GPUFree[d] = e.gpus.capacity(d)
		}
		nodes[i], meta[i], idx[n.Name] = n, e.meta, i
	}
	return nodes, meta, idx
}

// placeOn places p on the node named node (place); an error when the node is
// unknown or p does not fit there with devs. Call with the index lock held for writing.
func (l *ledger) placeOn(p *podEntry, node string, devs []int, phase podPhase) error {
	e := l.nodes[node]
	if e == nil {
		return fmt.Errorf("node %s vanished", node)
	}
	return l.place(p, e, devs, phase)
}

// node is the node named name (nil when unknown). Call with the index lock held.
func (l *ledger) node(name string) *nodeEntry { return l.nodes[name] }
