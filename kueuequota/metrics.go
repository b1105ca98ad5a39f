package kueuequota

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published *prometheus.GaugeVec
	nominal   *prometheus.GaugeVec
	target    *prometheus.GaugeVec
	updates   *prometheus.CounterVec
	evictions *prometheus.CounterVec
	requeues  prometheus.Counter
	errors    prometheus.Counter
	lastPass  prometheus.Gauge
	leader    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understory_kueue_quota_published",
			Help: "Sum over schedulable Nodes of the allocatable batch resource, in its units, at the last pass.",
		}, []string{"resource"}),
		nominal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understory_kueue_quota_nominal",
			Help: "nominalQuota the follower decided for the ClusterQueue and resource at the last pass.",
		}, []string{"cluster_queue", "resource"}),
		target: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understory_kueue_quota_target",
			Help: "The ClusterQueue's weighted part of what is published: what its nominalQuota follows.",
		}, []string{"cluster_queue", "resource"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understory_kueue_quota_updates_total",
			Help: "ClusterQueue updates written, by direction (up, down, both).",
		}, []string{"cluster_queue", "direction"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understory_kueue_quota_evictions_total",
			Help: "Workloads deactivated because their cohort's reservations exceeded the quotas.",
		}, []string{"cluster_queue"}),
		requeues: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "understory_kueue_quota_requeues_total",
			Help: "Workloads reactivated after Kueue evicted them (requeued).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "understory_kueue_quota_errors_total",
			Help: "Passes that failed in part, and ClusterQueues left out for an invalid weight.",
		}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "understory_kueue_quota_last_pass_timestamp_seconds",
			Help: "Unix time of the last pass.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "understory_kueue_quota_leader",
			Help: "1 while this replica runs passes (it holds the leader Lease, or runs without leader election), else 0.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.nominal, m.target, m.updates, m.evictions, m.requeues, m.errors, m.lastPass, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering kueue quota metrics: %w", err)
		}
	}
	return m, nil
}
