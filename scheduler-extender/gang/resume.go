package gang

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
)

// A committed gang plan is written onto every member as contract.AnnotationGangState
// "planned:<id>:<node>:<devices>:<expiry unix seconds>" (devices
// comma-separated, empty without GPU). The write doubles as the nudge that
// requeues a member, and lets an extender restarted mid-plan resume the plan
// instead of losing the capacity it held: once its informers have synced, a
// gang without a plan whose pending members all carry the same unexpired plan
// (as many as it still needs) is reserved again as recorded.
//
// The annotation sits on the tenant's own pod, so a record is a claim, not a
// fact: the admission policy keeps tenants from writing it, and the reader
// honours only what an extender could have written (resumableRecord,
// resumePlanLocked):
//   - its expiry: an extender writes write time + the gang's plan TTL, so a
//     record expiring later than now + TTL + planClockSkew was not written by
//     one and is refused; one within the skew (another replica's clock running
//     ahead) is clamped to now + TTL. A resumed plan never holds capacity
//     longer than the TTL from the moment it is resumed.
//   - its id: ids are an extender's start time in nanoseconds plus a count,
//     so an id later than now + planClockSkew was never issued and is refused.
//   - each member's slot: exactly as many devices as the member requests GPUs
//     (gpu-milli or whole GPUs); placing it then checks the node is known and
//     the devices exist and have the member's milli free.

// persistedPlan is one member's part of a plan, as its annotation records it.
type persistedPlan struct {
	id      uint64
	node    string
	devices []int
	expires time.Time
}

// formatPlanState is the contract.AnnotationGangState value of a member's slot.
func formatPlanState(id uint64, sl planSlot, expires time.Time) string {
	return fmt.Sprintf("planned:%d:%s:%s:%d", id, sl.node, contract.FormatGPUDevices(sl.devs), expires.Unix())
}

// parsePlanState reads a contract.AnnotationGangState value; ok=false for anything but
// a well-formed plan (older releases wrote "planned:<id>:<node>": not resumable).
func parsePlanState(v string) (persistedPlan, bool) {
	parts := strings.Split(v, ":")
	if len(parts) != 5 || parts[0] != "planned" || parts[2] == "" {
		return persistedPlan{}, false
	}
	id, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return persistedPlan{}, false
	}
	exp, err := strconv.ParseInt(parts[4], 10, 64)
	if err != nil {
		return persistedPlan{}, false
	}
	pp := persistedPlan{id: id, node: parts[2], expires: time.Unix(exp, 0)}
	if parts[3] != "" {
		if pp.devices, err = contract.ParseGPUDevices(parts[3]); err != nil {
			return persistedPlan{}, false
		}
	}
	return pp, true
}

// persistedOf is the plan pod's annotation records, if any.
func persistedOf(pod *corev1.Pod) *persistedPlan {
	if v, ok := pod.Annotations[contract.AnnotationGangState]; ok {
		if pp, ok := parsePlanState(v); ok {
			return &pp
		}
	}
	return nil
}

// planClockSkew is how far the clock of the extender that wrote a plan record
// (another replica, before a failover) may run ahead of this one's.
const planClockSkew = 5 * time.Second

// resumableRecord bounds a recorded plan to what an extender could have
// written (see the top of this file): it returns the expiry to honour
// (clamped to now + ttl) and ok=false for a record no extender wrote. ttl is
// the gang's plan TTL (Gangs.book.minMember).
func resumableRecord(pp *persistedPlan, now time.Time, ttl time.Duration) (time.Time, bool) {
	latest := now.Add(ttl)
	switch {
	case !now.Before(pp.expires):
		return time.Time{}, false // expired
	case pp.expires.After(latest.Add(planClockSkew)):
		return time.Time{}, false // longer than any extender holds a plan
	case pp.id > planIDBase(now.Add(planClockSkew)):
		return time.Time{}, false // an id no extender has issued yet
	}
	if pp.expires.After(latest) {
		return latest, true
	}
	return pp.expires, true
}

// resumePlanLocked reserves g's recorded plan again if it still applies: no
// plan now, trigger's recorded plan within the bounds of resumableRecord, and
// exactly the members the gang still needs pending with that plan, each slot
// one device per GPU the member requests (as an extender plans it) on a node
// the index knows, fitting there (ledger.placeOn). ttl is the gang's plan TTL.
// Call with the index lock held for writing.
func (gs *Gangs) resumePlanLocked(g *gang, trigger Pod, minMember int, ttl time.Duration) bool {
	pp := trigger.Member().persisted
	if g.plan != nil || g.planning || pp == nil || trigger.Holds() {
		return false
	}
	expires, ok := resumableRecord(pp, gs.now(), ttl)
	if !ok {
		return false
	}
	if gs.book.finished(pp.id) {
		return false // released or committed by this process: its annotations are history
	}
	need := minMember - g.bound()
	var slots []planSlot
	for _, m := range g.members {
		mp := m.Member().persisted
		if mp == nil || mp.id != pp.id || m.Holds() || m.RequestErr() != nil {
			continue
		}
		if len(mp.devices) != m.Request().NumGPU {
			return false // a member's part was not written by an extender: none of it is
		}
		slots = append(slots, planSlot{p: m, node: mp.node, devs: slices.Clone(mp.devices)})
	}
	if need <= 0 || len(slots) != need {
		return false
	}
	slices.SortFunc(slots, func(a, b planSlot) int { return strings.Compare(a.p.Name(), b.p.Name()) })
	if err := gs.commitPlan(g, trigger, slots, pp.id, expires, true); err != nil {
		return false
	}
	g.plan.recorded = pp.expires
	gs.count("resumed")
	return true
}

// ResumePlans resumes every gang's recorded plan that applies (housekeeping,
// after the informers synced) and forgets finished plans once expired. Call
// with the index lock held for writing.
func (gs *Gangs) ResumePlans() {
	gs.book.prune(gs.now())
	for _, g := range gs.book.byKey {
		if g.plan != nil || g.planning {
			continue
		}
		for _, m := range g.members {
			if m.Member().persisted == nil || m.Holds() {
				continue
			}
			// Every member records the same plan: one try per gang and pass.
			if minMember, ttl, err, _ := gs.book.minMember(g, m); err == nil && minMember <= gs.cfg.MaxMembers {
				gs.resumePlanLocked(g, m, minMember, ttl)
			}
			break
		}
	}
}

// planIDBase makes plan ids unique across restarts (they key the recorded
// plans): ids start from the extender's start time in nanoseconds.
func planIDBase(now time.Time) uint64 { return uint64(max(0, now.UnixNano())) }
