package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestEscalationMetricsGolden(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewEscalation(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Evictions.WithLabelValues(EvictReasonMemoryPressure, EvictResultEvicted).Add(2)
	m.Evictions.WithLabelValues(EvictReasonCPUStarvation, EvictResultBlockedPDB).Inc()
	m.Freezes.WithLabelValues(FreezeReasonCPUContention).Inc()
	m.Level.Set(1)

	tests := []struct {
		name      string
		collector prometheus.Collector
		want      string
	}{
		{name: "evictions", collector: m.Evictions, want: `
# HELP understory_evictions_total Evictions of batch pods through the Eviction API, by reason and result.
# TYPE understory_evictions_total counter
understory_evictions_total{reason="cpu-starvation",result="blocked_pdb"} 1
understory_evictions_total{reason="cpu-starvation",result="dry_run"} 0
understory_evictions_total{reason="cpu-starvation",result="error"} 0
understory_evictions_total{reason="cpu-starvation",result="evicted"} 0
understory_evictions_total{reason="cpu-starvation",result="not_found"} 0
understory_evictions_total{reason="cpu-starvation",result="unavailable"} 0
understory_evictions_total{reason="gpu-starvation",result="blocked_pdb"} 0
understory_evictions_total{reason="gpu-starvation",result="dry_run"} 0
understory_evictions_total{reason="gpu-starvation",result="error"} 0
understory_evictions_total{reason="gpu-starvation",result="evicted"} 0
understory_evictions_total{reason="gpu-starvation",result="not_found"} 0
understory_evictions_total{reason="gpu-starvation",result="unavailable"} 0
understory_evictions_total{reason="memory-pressure",result="blocked_pdb"} 0
understory_evictions_total{reason="memory-pressure",result="dry_run"} 0
understory_evictions_total{reason="memory-pressure",result="error"} 0
understory_evictions_total{reason="memory-pressure",result="evicted"} 2
understory_evictions_total{reason="memory-pressure",result="not_found"} 0
understory_evictions_total{reason="memory-pressure",result="unavailable"} 0
`},
		{name: "freezes", collector: m.Freezes, want: `
# HELP understory_batch_freeze_total Times batch pods were frozen because LS pods needed their CPU, by reason.
# TYPE understory_batch_freeze_total counter
understory_batch_freeze_total{reason="cpu-contention"} 1
`},
		{name: "level", collector: m.Level, want: `
# HELP understory_batch_escalation_level Graded action on batch pods in force: 0 throttle (CPU budget only), 1 freeze, 2 evict.
# TYPE understory_batch_escalation_level gauge
understory_batch_escalation_level 1
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := testutil.CollectAndCompare(tt.collector, strings.NewReader(tt.want)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestEscalationMetricsRegisterTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := NewEscalation(reg); err != nil {
		t.Fatal(err)
	}
	// A second registration on the same registry is an error, not a panic.
	if _, err := NewEscalation(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	// It coexists with the agent's own set.
	if _, err := NewAgent(reg); err != nil {
		t.Fatalf("NewAgent next to NewEscalation: %v", err)
	}
}
