package extender

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
)

// A committed gang plan is written onto every member as AnnotationGangState
// "planned:<id>:<node>:<devices>:<expiry unix seconds>" (devices
// comma-separated, empty without GPU). The write doubles as the nudge that
// requeues a member, and lets an extender restarted mid-plan resume the plan
// instead of losing the capacity it held: once its informers have synced, a
// gang without a plan whose pending members all carry the same unexpired plan
// (as many as it still needs) is reserved again exactly as recorded.

// persistedPlan is one member's part of a plan, as its annotation records it.
type persistedPlan struct {
	id      uint64
	node    string
	devices []int
	expires time.Time
}

// formatPlanState is the AnnotationGangState value of a member's slot.
func formatPlanState(id uint64, sl planSlot, expires time.Time) string {
	return fmt.Sprintf("planned:%d:%s:%s:%d", id, sl.node, contract.FormatGPUDevices(sl.devs), expires.Unix())
}

// parsePlanState reads an AnnotationGangState value; ok=false for anything but
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
	if v, ok := pod.Annotations[AnnotationGangState]; ok {
		if pp, ok := parsePlanState(v); ok {
			return &pp
		}
	}
	return nil
}

// resumePlanLocked reserves g's recorded plan again if it still applies: no
// plan now, trigger's recorded plan unexpired, and exactly the members the gang
// still needs pending with that plan, each slot fitting its node (Node.Place).
// Call with the index lock held for writing.
func (gs *Gangs) resumePlanLocked(g *gang, trigger *podEntry, minMember int) bool {
	pp := trigger.persisted
	now := gs.now()
	if g.plan != nil || g.planning || pp == nil || !now.Before(pp.expires) || trigger.phase.holds() {
		return false
	}
	if gs.book.finished(pp.id) {
		return false // released or committed by this process: its annotations are history
	}
	need := minMember - g.bound()
	var slots []planSlot
	for _, m := range g.members {
		if m.persisted == nil || m.persisted.id != pp.id || m.phase.holds() || m.reqErr != nil {
			continue
		}
		slots = append(slots, planSlot{p: m, node: m.persisted.node, devs: slices.Clone(m.persisted.devices)})
	}
	if need <= 0 || len(slots) != need {
		return false
	}
	slices.SortFunc(slots, func(a, b planSlot) int { return strings.Compare(a.p.name, b.p.name) })
	if err := gs.commitPlanAs(g, trigger, slots, pp.id, pp.expires, true); err != nil {
		return false
	}
	gs.count("resumed")
	return true
}

// resumePlans resumes every gang's recorded plan that applies (housekeeping,
// after the informers synced) and forgets finished plans once expired. Call
// with the index lock held for writing.
func (gs *Gangs) resumePlans() {
	gs.book.prune(gs.now())
	for _, g := range gs.book.byKey {
		if g.plan != nil || g.planning {
			continue
		}
		for _, m := range g.members {
			if m.persisted == nil || m.phase.holds() {
				continue
			}
			// Every member records the same plan: one try per gang and pass.
			if minMember, _, err, _ := gs.book.minMember(g, m); err == nil && minMember <= gs.cfg.MaxGangMembers {
				gs.resumePlanLocked(g, m, minMember)
			}
			break
		}
	}
}

// planIDBase makes plan ids unique across restarts (they key the recorded
// plans): ids start from the extender's start time in nanoseconds.
func planIDBase(now time.Time) uint64 { return uint64(max(0, now.UnixNano())) }
