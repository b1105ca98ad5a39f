package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestAgentMetricsGolden(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewAgent(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.BatchBudget.Set(1.25)
	m.Errors.WithLabelValues(ErrKindCgroupWrite).Add(2)
	m.Actions.WithLabelValues(ActionCut).Inc()
	m.Pods.WithLabelValues("batch").Set(3)
	m.BatchResource.WithLabelValues("cpu", "published").Set(2.5)
	m.Memory.WithLabelValues("ls").Set(1 << 30)
	const want = `
# HELP understory_batch_resource Terms of the batch resources published on the Node (cpu in cores, memory in bytes): published = damped(max(clamp(capacity × threshold − ls_term − be_usage − system_usage), batch_request)).
# TYPE understory_batch_resource gauge
understory_batch_resource{resource="cpu",term="published"} 2.5
# HELP understory_memory_usage_bytes Node memory by class (working sets), what the node uses, and the capacity pods may use.
# TYPE understory_memory_usage_bytes gauge
understory_memory_usage_bytes{class="ls"} 1.073741824e+09
# HELP understory_batch_actions_total Actions taken on batch pods: budget cuts and restores, pod setup.
# TYPE understory_batch_actions_total counter
understory_batch_actions_total{action="cut"} 1
understory_batch_actions_total{action="memory_cut"} 0
understory_batch_actions_total{action="memory_cut_refused"} 0
understory_batch_actions_total{action="pod_setup"} 0
understory_batch_actions_total{action="quota_clamped"} 0
understory_batch_actions_total{action="restore"} 0
understory_batch_actions_total{action="restore_kubelet"} 0
# HELP understory_batch_cpu_budget_cores CPU the agent currently lets batch pods use, in cores.
# TYPE understory_batch_cpu_budget_cores gauge
understory_batch_cpu_budget_cores 1.25
# HELP understory_errors_total Errors by kind; cgroup writes are retried the next period.
# TYPE understory_errors_total counter
understory_errors_total{kind="annotation"} 0
understory_errors_total{kind="batch_resource"} 0
understory_errors_total{kind="cgroup_read"} 0
understory_errors_total{kind="cgroup_write"} 2
understory_errors_total{kind="node_patch"} 0
understory_errors_total{kind="node_status"} 0
understory_errors_total{kind="pod_source"} 0
understory_errors_total{kind="proc_read"} 0
# HELP understory_pods Pods on the node by QoS class.
# TYPE understory_pods gauge
understory_pods{class="batch"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"understory_batch_actions_total", "understory_batch_cpu_budget_cores", "understory_errors_total", "understory_pods",
		"understory_batch_resource", "understory_memory_usage_bytes"); err != nil {
		t.Fatal(err)
	}
	// A second registration on the same registry is an error, not a panic.
	if _, err := NewAgent(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

func TestAgentCutReactionGolden(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewAgent(reg)
	if err != nil {
		t.Fatal(err)
	}
	// One cut seen within a period, one a period late, one past the last bucket.
	for _, v := range []float64{0.104, 0.21, 3} {
		m.CutReaction.Observe(v)
	}
	const want = `
# HELP understory_batch_cut_reaction_seconds Per batch CPU budget cut: time from the start of the sample window in which the LS (or system) rise became visible to after the cut quota was written (an upper bound on LS's wait).
# TYPE understory_batch_cut_reaction_seconds histogram
understory_batch_cut_reaction_seconds_bucket{le="0.01"} 0
understory_batch_cut_reaction_seconds_bucket{le="0.025"} 0
understory_batch_cut_reaction_seconds_bucket{le="0.05"} 0
understory_batch_cut_reaction_seconds_bucket{le="0.075"} 0
understory_batch_cut_reaction_seconds_bucket{le="0.1"} 0
understory_batch_cut_reaction_seconds_bucket{le="0.15"} 1
understory_batch_cut_reaction_seconds_bucket{le="0.2"} 1
understory_batch_cut_reaction_seconds_bucket{le="0.3"} 2
understory_batch_cut_reaction_seconds_bucket{le="0.5"} 2
understory_batch_cut_reaction_seconds_bucket{le="0.75"} 2
understory_batch_cut_reaction_seconds_bucket{le="1"} 2
understory_batch_cut_reaction_seconds_bucket{le="2"} 2
understory_batch_cut_reaction_seconds_bucket{le="+Inf"} 3
understory_batch_cut_reaction_seconds_sum 3.314
understory_batch_cut_reaction_seconds_count 3
`
	if err := testutil.CollectAndCompare(m.CutReaction, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
