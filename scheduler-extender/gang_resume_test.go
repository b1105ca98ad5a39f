package extender

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

// TestResumeBoundsForgedPlan: a plan record is read from the member's own
// pod, which a tenant could write. The housekeeping pass that resumes recorded
// plans honours only what an extender could have written: a resumed plan
// holds capacity at most the plan TTL from now (a 10-year expiry is refused,
// one a clock skew beyond the TTL is clamped), a slot must name a known node
// and one device per GPU the member requests, and the id must not be later
// than now. Once the TTL has passed, whatever was held is released and a
// 1-GPU pod fits the node. Before, a one-member "gang" held all 4 GPUs of a
// node for as long as its record said.
func TestResumeBoundsForgedPlan(t *testing.T) {
	t.Parallel()
	ttl := DefaultConfig().GangPlanTTL
	start := newFakeClock().Now()
	// Plan ids are an extender's start time in nanoseconds plus a count, and
	// a record may expire up to 5 s (the gangs' clock skew) past the TTL.
	planIDBase := func(t time.Time) uint64 { return uint64(t.UnixNano()) }
	const planClockSkew = 5 * time.Second
	ownID := planIDBase(start.Add(-time.Hour)) + 3 // an extender started an hour ago, its third plan
	record := func(id uint64, node, devs string, expires time.Time) string {
		return fmt.Sprintf("planned:%d:%s:%s:%d", id, node, devs, expires.Unix())
	}
	member := func(req podtest.Opt, state string) *corev1.Pod {
		return podtest.Pod("ns", "m0", append(podtest.Volcano("g", 1), req, podtest.Created(0), podtest.Annotate(contract.AnnotationGangState, state))...)
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		resumed bool
	}{
		{"ten-year expiry on all 4 GPUs",
			member(podtest.GPUs(4), record(ownID, "n0", "0,1,2,3", start.Add(10*365*24*time.Hour))), false},
		{"expiry a clock skew beyond the TTL: clamped to the TTL",
			member(podtest.GPUs(4), record(ownID, "n0", "0,1,2,3", start.Add(ttl+planClockSkew-time.Second))), true},
		{"more devices than the member requests",
			member(podtest.GPUs(1), record(ownID, "n0", "0,1,2,3", start.Add(ttl/2))), false},
		{"two devices for a GPU share",
			member(podtest.Milli(500), record(ownID, "n0", "0,1", start.Add(ttl/2))), false},
		{"no device for a GPU pod",
			member(podtest.GPUs(1), record(ownID, "n0", "", start.Add(ttl/2))), false},
		{"unknown node",
			member(podtest.GPUs(1), record(ownID, "n9", "0", start.Add(ttl/2))), false},
		{"an id no extender issued yet",
			member(podtest.GPUs(1), record(planIDBase(start.Add(time.Hour)), "n0", "0", start.Add(ttl/2))), false},
		{"own record", member(podtest.GPUs(4), record(ownID, "n0", "0,1,2,3", start.Add(ttl))), true},
		{"own record of a GPU share", member(podtest.Milli(500), record(ownID, "n0", "2", start.Add(ttl))), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			s := testServer(t, clock, Deps{})
			s.state.UpsertNode(testNode("n0", "A100", 4, 64, 256))
			s.state.UpsertPod(tc.pod)
			s.Housekeep()
			got := phaseOf(s, tc.pod.UID)
			if resumed := got == "planned@n0"; resumed != tc.resumed {
				t.Fatalf("after housekeeping m0 is %s, want resumed %v", got, tc.resumed)
			}
			clock.Advance(ttl + time.Second)
			s.Housekeep()
			if got := phaseOf(s, tc.pod.UID); got != "pending@" {
				t.Fatalf("plan TTL after the resume m0 is %s, want pending (released)", got)
			}
			if free := gpuFree(s, "n0"); !slices.Equal(free, []int{1000, 1000, 1000, 1000}) {
				t.Fatalf("plan TTL after the resume n0 has %v milli free, want every GPU free", free)
			}
			probe := podtest.Pod("ns", "probe", podtest.GPUs(1))
			s.state.UpsertPod(probe)
			if node := passedOne(t, filter(t, startHTTP(t, s), probe, "n0")); node != "n0" {
				t.Fatalf("a 1-GPU pod passed %s, want n0", node)
			}
		})
	}
}
