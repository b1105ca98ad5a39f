package extender

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/placement"
)

// The gangs' dialects and states (package gang), for those who embed the extender.
const (
	DialectPodGroup    = gang.DialectPodGroup
	DialectVolcano     = gang.DialectVolcano
	DialectKoordinator = gang.DialectKoordinator
	GangWaiting        = gang.GangWaiting
	GangPlanned        = gang.GangPlanned
	GangAdmitted       = gang.GangAdmitted
)

// PodGroupGVR and VolcanoPodGroupGVR are the PodGroup resources the extender
// watches (gang.PodGroupGVR, gang.VolcanoPodGroupGVR).
var PodGroupGVR, VolcanoPodGroupGVR = gang.PodGroupGVR, gang.VolcanoPodGroupGVR

// gangPort is the index as the gangs see it (gang.Index, gang.Ledger): the
// index's lock and pods, the ledger's copies and holds, the reservations'
// settlement of a Binding and the serving policy. Its methods are called
// with the index lock held, as the interfaces say.
type gangPort struct{ r *reservations }

var (
	_ gang.Index  = gangPort{}
	_ gang.Ledger = gangPort{}
	_ gang.Outbox = (*outbox)(nil)
)

func (g gangPort) Lock()    { g.r.ix.lock() }
func (g gangPort) Unlock()  { g.r.ix.unlock() }
func (g gangPort) RLock()   { g.r.ix.rlock() }
func (g gangPort) RUnlock() { g.r.ix.runlock() }

// Pod is the tracked pod uid; nil (the interface's, not a typed nil) when none.
func (g gangPort) Pod(uid types.UID) gang.Pod {
	if p := g.r.ix.pod(uid); p != nil {
		return p
	}
	return nil
}

func (g gangPort) Generations() (gen, capGen uint64) { return g.r.led.generations() }

func (g gangPort) Candidates(names [][]byte) ([]*placement.Node, []*corev1.Node, map[string]int) {
	return g.r.led.candidates(names)
}

func (g gangPort) EmptyNodes() ([]*placement.Node, []*corev1.Node, map[string]int) {
	return g.r.led.emptyNodes()
}

func (g gangPort) Plan(p gang.Pod, node string, devs []int) error {
	return g.r.led.placeOn(p.(*podEntry), node, devs, phasePlanned)
}

func (g gangPort) Release(p gang.Pod)           { g.r.led.release(p.(*podEntry)) }
func (g gangPort) Settle(p gang.Pod, err error) { g.r.settle(p.(*podEntry), err) }

// Policy is the serving policy; rankable unless it is the random one (served
// wrapped in lockedPolicy: its scores are no function of node and request).
func (g gangPort) Policy() (placement.Policy, bool) { return g.r.sc.servingPolicy(), g.r.sc.cacheable }
