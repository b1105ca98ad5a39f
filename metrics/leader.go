package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Leader is the scheduler extender's leader election metric set (one per
// replica; only with -leader-elect).
type Leader struct {
	// Leading is 1 while this replica leads and serves (filter, prioritize,
	// bind), else 0 (standby, catching up, lost). Summed over the replicas it
	// is 1: 0 means no replica serves (UnderstoryExtenderNoLeader).
	Leading prometheus.Gauge
	// Transitions counts the leaders this replica observed taking the lease.
	Transitions prometheus.Counter
	// CatchUpSeconds is how long this replica's last takeover caught up with
	// the API before it served.
	CatchUpSeconds prometheus.Gauge
}

// NewLeader creates the leader metrics and registers them on reg.
func NewLeader(reg prometheus.Registerer) (*Leader, error) {
	m := &Leader{
		Leading: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ExtenderNamespace, Name: "leader",
			Help: "1 while this replica leads and serves (filter, prioritize, bind), else 0 (standby, catching up, lost)."}),
		Transitions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ExtenderNamespace,
			Name: "leader_transitions_total",
			Help: "Leaders this replica observed taking the lease (the first it saw and every change since, itself included)."}),
		CatchUpSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ExtenderNamespace,
			Name: "leader_catchup_seconds",
			Help: "How long this replica, once it took the lease, caught up with the API before it served."}),
	}
	for _, c := range []prometheus.Collector{m.Leading, m.Transitions, m.CatchUpSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering leader metrics: %w", err)
		}
	}
	return m, nil
}
