package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fixedSource ExtenderSnapshot

func (f fixedSource) ExtenderSnapshot() ExtenderSnapshot { return ExtenderSnapshot(f) }

func TestExtenderGauges(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewExtender(reg, fixedSource{
		Nodes: 3, GPUs: 10, GPUMilliCapacity: 10000, GPUMilliAllocated: 2500,
		Pods:             map[string]int{"bound": 4, "reserved": 1},
		Gangs:            map[string]int{"waiting": 2},
		CacheStaleness:   map[string]time.Duration{"nodes": 0, "pods": 1500 * time.Millisecond},
		StaleNodeMetrics: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Binds.WithLabelValues("bound").Add(2)
	m.GangTransitions.WithLabelValues("planned").Inc()
	want := `
# HELP understory_extender_binds_total Bind outcomes: bound or error.
# TYPE understory_extender_binds_total counter
understory_extender_binds_total{result="bound"} 2
understory_extender_binds_total{result="error"} 0
# HELP understory_extender_cache_staleness_seconds Per informer: 0 while its watch is open, else seconds since it last heard from the API server.
# TYPE understory_extender_cache_staleness_seconds gauge
understory_extender_cache_staleness_seconds{informer="nodes"} 0
understory_extender_cache_staleness_seconds{informer="pods"} 1.5
# HELP understory_extender_device_conflicts_total Bound pods whose devices annotation named devices other pods already held (the first holder keeps them).
# TYPE understory_extender_device_conflicts_total counter
understory_extender_device_conflicts_total 0
# HELP understory_extender_filter_nodes_total Per-node filter verdicts: passed, failed (may pass later), unresolvable.
# TYPE understory_extender_filter_nodes_total counter
understory_extender_filter_nodes_total{result="failed"} 0
understory_extender_filter_nodes_total{result="passed"} 0
understory_extender_filter_nodes_total{result="unresolvable"} 0
# HELP understory_extender_gang_transitions_total Gang events: planned, resumed (a plan recorded before a restart reserved again), bound, plan_expired, bind_timeout, bind_failed, plan_broken, unschedulable.
# TYPE understory_extender_gang_transitions_total counter
understory_extender_gang_transitions_total{event="bind_failed"} 0
understory_extender_gang_transitions_total{event="bind_timeout"} 0
understory_extender_gang_transitions_total{event="bound"} 0
understory_extender_gang_transitions_total{event="plan_broken"} 0
understory_extender_gang_transitions_total{event="plan_expired"} 0
understory_extender_gang_transitions_total{event="planned"} 1
understory_extender_gang_transitions_total{event="resumed"} 0
understory_extender_gang_transitions_total{event="unschedulable"} 0
# HELP understory_extender_gangs Gangs by state.
# TYPE understory_extender_gangs gauge
understory_extender_gangs{state="waiting"} 2
# HELP understory_extender_gpu_ledger_reconciled_total Whole-GPU pods whose devices in the extender's ledger were moved to the ones kubelet allocated (reported by the node agent in node-metrics version 2).
# TYPE understory_extender_gpu_ledger_reconciled_total counter
understory_extender_gpu_ledger_reconciled_total 0
# HELP understory_extender_gpu_milli_allocated Sum of allocated (bound, assumed or reserved) milli-GPU.
# TYPE understory_extender_gpu_milli_allocated gauge
understory_extender_gpu_milli_allocated 2500
# HELP understory_extender_gpu_milli_capacity Sum of GPU capacity in milli-GPU.
# TYPE understory_extender_gpu_milli_capacity gauge
understory_extender_gpu_milli_capacity 10000
# HELP understory_extender_gpus GPU devices in the extender's index.
# TYPE understory_extender_gpus gauge
understory_extender_gpus 10
# HELP understory_extender_node_metrics_stale_nodes Nodes whose node-metrics annotation is missing, invalid or older than the max age.
# TYPE understory_extender_node_metrics_stale_nodes gauge
understory_extender_node_metrics_stale_nodes 1
# HELP understory_extender_nodes Nodes in the extender's index.
# TYPE understory_extender_nodes gauge
understory_extender_nodes 3
# HELP understory_extender_pods Tracked pods by phase.
# TYPE understory_extender_pods gauge
understory_extender_pods{phase="bound"} 4
understory_extender_pods{phase="reserved"} 1
# HELP understory_extender_reservations_expired_total Filter reservations released because their bind never came.
# TYPE understory_extender_reservations_expired_total counter
understory_extender_reservations_expired_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestNewExtenderDuplicateRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := NewExtender(reg, fixedSource{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewExtender(reg, fixedSource{}); err == nil {
		t.Fatal("second registration on the same registry succeeded")
	}
}
