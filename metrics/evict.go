package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of Escalation.Evictions and Escalation.Freezes; the same strings as
// qos.EvictReason* and qos.EscalationReasonCPUContention (this package imports
// no Understory package; koordlet/evict's tests check that they agree).
const (
	EvictReasonMemoryPressure = "memory-pressure"
	EvictReasonCPUStarvation  = "cpu-starvation"
	EvictReasonGPUStarvation  = "gpu-starvation"
	FreezeReasonCPUContention = "cpu-contention"
)

// Results of Escalation.Evictions.
const (
	// EvictResultEvicted: the API server accepted the eviction.
	EvictResultEvicted = "evicted"
	// EvictResultBlockedPDB: refused with 429 (a PodDisruptionBudget).
	EvictResultBlockedPDB = "blocked_pdb"
	// EvictResultNotFound: the pod was already gone (or replaced).
	EvictResultNotFound = "not_found"
	// EvictResultError: any other failure; the pod is backed off.
	EvictResultError = "error"
	// EvictResultUnavailable: the agent may not evict (RBAC 403) or the API
	// server has no policy/v1 eviction; reported once, retried rarely.
	EvictResultUnavailable = "unavailable"
	// EvictResultDryRun: static mode or dry run; reported, not performed.
	EvictResultDryRun = "dry_run"
)

// Escalation is the node agent's metric set for the graded actions on batch
// pods (throttle, freeze, evict). It is separate from Agent so that the
// evictor can be built and tested on its own.
type Escalation struct {
	// Evictions counts eviction attempts by reason and result.
	Evictions *prometheus.CounterVec
	// Freezes counts the times batch was frozen, by reason.
	Freezes *prometheus.CounterVec
	// Level is the escalation level in force (qos.EscalationLevel).
	Level prometheus.Gauge
}

// NewEscalation creates the escalation metrics and registers them on reg.
// Every known reason/result starts at zero.
func NewEscalation(reg prometheus.Registerer) (*Escalation, error) {
	const ns = "understory"
	m := &Escalation{
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "evictions_total",
			Help: "Evictions of batch pods through the Eviction API, by reason and result."},
			[]string{"reason", "result"}),
		Freezes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batch_freeze_total",
			Help: "Times batch pods were frozen because LS pods needed their CPU, by reason."},
			[]string{"reason"}),
		Level: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_escalation_level",
			Help: "Graded action on batch pods in force: 0 throttle (CPU budget only), 1 freeze, 2 evict."}),
	}
	for _, c := range []prometheus.Collector{m.Evictions, m.Freezes, m.Level} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, reason := range []string{EvictReasonMemoryPressure, EvictReasonCPUStarvation, EvictReasonGPUStarvation} {
		for _, result := range []string{EvictResultEvicted, EvictResultBlockedPDB, EvictResultNotFound,
			EvictResultError, EvictResultUnavailable, EvictResultDryRun} {
			m.Evictions.WithLabelValues(reason, result)
		}
	}
	m.Freezes.WithLabelValues(FreezeReasonCPUContention)
	return m, nil
}
