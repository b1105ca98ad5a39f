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
understory_batch_actions_total{action="rewritten"} 0
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
understory_errors_total{kind="signal_read"} 0
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
	// Utilisation: one cut seen within a period, one a period late, one past the last
	// bucket. A run-queue delay cut written 3 ms after the eBPF read that saw it.
	for _, v := range []float64{0.104, 0.21, 3} {
		m.CutReaction.WithLabelValues(SignalUtilisation).Observe(v)
		m.Cuts.WithLabelValues(SignalUtilisation).Inc()
	}
	m.CutReaction.WithLabelValues(SignalRunqueueDelay).Observe(0.003)
	m.Cuts.WithLabelValues(SignalRunqueueDelay).Inc()
	m.HarmSignals.WithLabelValues(SignalRunqueueDelay).Add(2)
	want := `
# HELP understory_batch_cut_reaction_seconds Per batch CPU budget cut, by the signal that caused it: time from the harm signal (PSI event, eBPF read) or, for utilisation, from the start of the sample window in which the LS (or system) rise became visible, to after the cut quota was written.
# TYPE understory_batch_cut_reaction_seconds histogram
` + emptyReaction("psi_cpu") + emptyReaction("psi_memory") + `understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.001"} 0
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.0025"} 0
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.005"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.01"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.025"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.05"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.075"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.1"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.15"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.2"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.3"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.5"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.75"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="1"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="2"} 1
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="+Inf"} 1
understory_batch_cut_reaction_seconds_sum{signal="runqueue_delay"} 0.003
understory_batch_cut_reaction_seconds_count{signal="runqueue_delay"} 1
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.001"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.0025"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.005"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.01"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.025"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.05"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.075"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.1"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.15"} 1
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.2"} 1
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.3"} 2
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.5"} 2
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.75"} 2
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="1"} 2
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="2"} 2
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="+Inf"} 3
understory_batch_cut_reaction_seconds_sum{signal="utilisation"} 3.314
understory_batch_cut_reaction_seconds_count{signal="utilisation"} 3
# HELP understory_batch_cuts_total Batch CPU budget cuts by the signal that caused them.
# TYPE understory_batch_cuts_total counter
understory_batch_cuts_total{signal="psi_cpu"} 0
understory_batch_cuts_total{signal="psi_memory"} 0
understory_batch_cuts_total{signal="runqueue_delay"} 1
understory_batch_cuts_total{signal="utilisation"} 3
# HELP understory_ls_harm_signals_total LS harm seen, by signal, whether it cut batch or not.
# TYPE understory_ls_harm_signals_total counter
understory_ls_harm_signals_total{signal="psi_cpu"} 0
understory_ls_harm_signals_total{signal="psi_memory"} 0
understory_ls_harm_signals_total{signal="runqueue_delay"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "understory_batch_cut_reaction_seconds",
		"understory_batch_cuts_total", "understory_ls_harm_signals_total"); err != nil {
		t.Fatal(err)
	}
}

// emptyReaction is the exposition of a cut reaction series with no observation.
func emptyReaction(signal string) string {
	var b strings.Builder
	for _, le := range []string{"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2",
		"0.3", "0.5", "0.75", "1", "2", "+Inf"} {
		b.WriteString(`understory_batch_cut_reaction_seconds_bucket{signal="` + signal + `",le="` + le + `"} 0` + "\n")
	}
	b.WriteString(`understory_batch_cut_reaction_seconds_sum{signal="` + signal + `"} 0` + "\n")
	b.WriteString(`understory_batch_cut_reaction_seconds_count{signal="` + signal + `"} 0` + "\n")
	return b.String()
}

// The signal source in use is 1, the others 0; each unavailable better one says why.
func TestAgentSignalSourceGolden(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewAgent(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SignalSource.WithLabelValues(SourcePSI).Set(1)
	m.SignalUnavailable.WithLabelValues(SourceEBPF, "no_btf").Set(1)
	const want = `
# HELP understory_signal_source 1 for the LS harm signal source in use (ebpf, psi, sampling), 0 for the others.
# TYPE understory_signal_source gauge
understory_signal_source{source="ebpf"} 0
understory_signal_source{source="psi"} 1
understory_signal_source{source="sampling"} 0
# HELP understory_signal_source_unavailable 1 for each better LS harm signal source that could not be used, with why.
# TYPE understory_signal_source_unavailable gauge
understory_signal_source_unavailable{reason="no_btf",source="ebpf"} 1
`
	if err := testutil.CollectAndCompare(m.SignalSource, strings.NewReader(want), "understory_signal_source"); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "understory_signal_source",
		"understory_signal_source_unavailable"); err != nil {
		t.Fatal(err)
	}
}
