package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of ConfigReload.Reloads.
const (
	// ReloadApplied: a changed configuration file passed parsing and validation; its
	// live fields are in force (fields that need a restart are reported, not applied).
	ReloadApplied = "applied"
	// ReloadRejected: a changed file failed parsing or validation; the configuration
	// in force stays.
	ReloadRejected = "rejected"
)

// ConfigReload is the node agent's metric set for reloading its configuration file
// while it runs (config.Reloader in koordlet/config).
type ConfigReload struct {
	// Reloads counts changed configuration files by result (applied, rejected).
	Reloads *prometheus.CounterVec
	// LastSuccess is 1 when the last changed file was applied (or none changed since
	// the start), 0 when it was rejected.
	LastSuccess prometheus.Gauge
	// Info is 1 for the hash of the configuration file in force (sha256 of its
	// bytes), the only series: a reload replaces it.
	Info *prometheus.GaugeVec
	// RestartPending is how many changed fields wait for a restart of the agent
	// (they cannot change while it runs).
	RestartPending prometheus.Gauge
}

// NewConfigReload creates the reload metrics and registers them on reg. Both results
// start at zero and LastSuccess at 1.
func NewConfigReload(reg prometheus.Registerer) (*ConfigReload, error) {
	const ns, sub = "understory", "koordlet"
	m := &ConfigReload{
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "config_reloads_total",
			Help: "Changes of the agent's configuration file, by result: applied, or rejected (the configuration in force stays)."},
			[]string{"result"}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "config_last_reload_success",
			Help: "1 when the last change of the configuration file was applied (or none since the start), 0 when it was rejected."}),
		Info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_info",
			Help: "1 for the sha256 of the configuration file in force."}, []string{"hash"}),
		RestartPending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "config_restart_pending_fields",
			Help: "Changed configuration fields that take effect only when the agent restarts."}),
	}
	for _, c := range []prometheus.Collector{m.Reloads, m.LastSuccess, m.Info, m.RestartPending} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.Reloads.WithLabelValues(ReloadApplied)
	m.Reloads.WithLabelValues(ReloadRejected)
	m.LastSuccess.Set(1)
	return m, nil
}

// SetInForce makes hash the only series of Info.
func (m *ConfigReload) SetInForce(hash string) {
	m.Info.Reset()
	m.Info.WithLabelValues(hash).Set(1)
}
