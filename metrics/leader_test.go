package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLeaderGolden: the leader metrics' names, help and starting values.
func TestLeaderGolden(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewLeader(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Leading.Set(1)
	m.Transitions.Add(2)
	m.CatchUpSeconds.Set(0.024)
	want := `# HELP understory_extender_leader 1 while this replica leads and serves (filter, prioritize, bind), else 0 (standby, catching up, lost).
# TYPE understory_extender_leader gauge
understory_extender_leader 1
# HELP understory_extender_leader_catchup_seconds How long this replica, once it took the lease, caught up with the API before it served.
# TYPE understory_extender_leader_catchup_seconds gauge
understory_extender_leader_catchup_seconds 0.024
# HELP understory_extender_leader_transitions_total Leaders this replica observed taking the lease (the first it saw and every change since, itself included).
# TYPE understory_extender_leader_transitions_total counter
understory_extender_leader_transitions_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLeader(reg); err == nil {
		t.Fatal("registering the leader metrics twice: no error")
	}
}
