package extenderbench

import (
	"context"
	"io"
	"testing"
	"time"

	extender "github.com/understory/understory/scheduler-extender"
)

// TestFailoverSmall runs the failover measurement on a tiny cluster with short
// leases: the standby takes over from a killed leader, the killed one refuses
// before, and the report says so.
func TestFailoverSmall(t *testing.T) {
	t.Parallel()
	for _, list := range []bool{false, true} {
		t.Run(map[bool]string{false: "barrier", true: "list"}[list], func(t *testing.T) {
			t.Parallel()
			failoverSmall(t, list)
		})
	}
}

func failoverSmall(t *testing.T, list bool) {
	o := DefaultOptions()
	o.FailoverList = list
	o.Nodes, o.RSSPods = 50, 500
	o.Runs = map[string]bool{RunFailover: true}
	lc := extender.DefaultLeaderConfig("understory-system", "x")
	lc.LeaseDuration, lc.RenewDeadline, lc.RetryPeriod = 2*time.Second, time.Second, 200*time.Millisecond
	o.leader = &lc
	rep, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f := rep.Failover
	if f == nil || !rep.Pass || !f.Pass {
		t.Fatalf("report %+v (failover %+v), want a pass", rep, f)
	}
	if f.FailoverSecs < lc.LeaseDuration.Seconds()-lc.RenewDeadline.Seconds() || f.LeaseSeconds != 2 {
		t.Fatalf("failover after %.2f s with a %v lease: faster than a kill allows", f.FailoverSecs, lc.LeaseDuration)
	}
	if want := map[bool]string{false: "barrier", true: "list"}[list]; f.CatchUpBy != want {
		t.Fatalf("caught up by %q, want %q", f.CatchUpBy, want)
	}
	t.Logf("failover %.2f s, catch-up %.3f s by %s, standby sync %.2f s", f.FailoverSecs, f.CatchUpSecs, f.CatchUpBy,
		f.SyncSeconds)
}
