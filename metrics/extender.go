package metrics

import (
	"fmt"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ExtenderNamespace prefixes every metric of the scheduler extender.
const ExtenderNamespace = "understory_extender"

// ExtenderSnapshot is the extender's cluster-state view at scrape time.
type ExtenderSnapshot struct {
	// Nodes known to the index; GPUs is their device count.
	Nodes int
	GPUs  int
	// GPUMilliCapacity and GPUMilliAllocated sum every device (1000 per GPU).
	GPUMilliCapacity  int64
	GPUMilliAllocated int64
	// Pods holds tracked pods by phase (reserved, planned, binding, assumed, bound).
	Pods map[string]int
	// Gangs holds gangs by state (waiting, planned, binding, admitted, unschedulable, invalid).
	Gangs map[string]int
	// CacheStaleness is each informer's staleness by name (nodes, pods,
	// podgroups...): 0 while its watch is open, else the time since it last
	// heard from the API server.
	CacheStaleness map[string]time.Duration
	// StaleNodeMetrics counts nodes whose node-metrics annotation is missing, invalid or too old.
	StaleNodeMetrics int
}

// ExtenderSource produces the snapshot; it is called once per scrape.
type ExtenderSource interface {
	ExtenderSnapshot() ExtenderSnapshot
}

// Extender is the scheduler extender's metric set.
type Extender struct {
	// Requests counts HTTP requests by verb (filter, prioritize, bind, status...) and status code.
	Requests *prometheus.CounterVec
	// Latency observes request handling time by verb.
	Latency *prometheus.HistogramVec
	// FilterNodes counts filter verdicts per node: passed, failed, unresolvable.
	FilterNodes *prometheus.CounterVec
	// Binds counts bind outcomes: bound, error.
	Binds *prometheus.CounterVec
	// ReservationsExpired counts filter reservations released because no bind came.
	ReservationsExpired prometheus.Counter
	// GangTransitions counts gang events: planned, resumed, bound, plan_expired, bind_timeout,
	// bind_failed, plan_broken, unschedulable.
	GangTransitions *prometheus.CounterVec
	// DeviceConflicts counts bound pods whose devices annotation named devices
	// that pods accounted before them already held (the first holder keeps them).
	DeviceConflicts prometheus.Counter
	// GPUReconciled counts whole-GPU pods whose devices the extender moved to the
	// ones kubelet really allocated (node-metrics version 2).
	GPUReconciled prometheus.Counter
}

// NewExtender registers the extender's metrics on reg. src feeds the gauges at scrape time.
func NewExtender(reg prometheus.Registerer, src ExtenderSource) (*Extender, error) {
	m := &Extender{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "requests_total",
			Help: "HTTP requests served, by verb and status code.",
		}, []string{"verb", "code"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ExtenderNamespace, Name: "request_duration_seconds",
			Help:    "Time to handle one extender request, by verb.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30},
		}, []string{"verb"}),
		FilterNodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "filter_nodes_total",
			Help: "Per-node filter verdicts: passed, failed (may pass later), unresolvable.",
		}, []string{"result"}),
		Binds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "binds_total",
			Help: "Bind outcomes: bound or error.",
		}, []string{"result"}),
		ReservationsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "reservations_expired_total",
			Help: "Filter reservations released because their bind never came.",
		}),
		GangTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "gang_transitions_total",
			Help: "Gang events: planned, resumed (a plan recorded before a restart reserved again), bound, plan_expired, " +
				"bind_timeout, bind_failed, plan_broken, unschedulable.",
		}, []string{"event"}),
		DeviceConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "device_conflicts_total",
			Help: "Bound pods whose devices annotation named devices other pods already held (the first holder keeps them).",
		}),
		GPUReconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ExtenderNamespace, Name: "gpu_ledger_reconciled_total",
			Help: "Whole-GPU pods whose devices in the extender's ledger were moved to the ones kubelet allocated " +
				"(reported by the node agent in node-metrics version 2).",
		}),
	}
	// Every known label value starts at 0, so that rate() sees the first event (a
	// counter that appears at 1 has no earlier sample to rise from).
	for _, r := range []string{"passed", "failed", "unresolvable"} {
		m.FilterNodes.WithLabelValues(r)
	}
	for _, r := range []string{"bound", "error"} {
		m.Binds.WithLabelValues(r)
	}
	for _, e := range []string{"planned", "resumed", "bound", "plan_expired", "bind_timeout", "bind_failed",
		"plan_broken", "unschedulable"} {
		m.GangTransitions.WithLabelValues(e)
	}
	cs := []prometheus.Collector{m.Requests, m.Latency, m.FilterNodes, m.Binds, m.ReservationsExpired,
		m.GangTransitions, m.DeviceConflicts, m.GPUReconciled, newExtenderCollector(src)}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering extender metrics: %w", err)
		}
	}
	return m, nil
}

// extenderCollector turns an ExtenderSnapshot into gauges at scrape time.
type extenderCollector struct {
	src                                 ExtenderSource
	nodes, gpus, gpuCap, gpuAlloc, pods *prometheus.Desc
	gangs, staleness, staleMetrics      *prometheus.Desc
}

func newExtenderCollector(src ExtenderSource) *extenderCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ExtenderNamespace, "", name), help, labels, nil)
	}
	return &extenderCollector{
		src:      src,
		nodes:    d("nodes", "Nodes in the extender's index."),
		gpus:     d("gpus", "GPU devices in the extender's index."),
		gpuCap:   d("gpu_milli_capacity", "Sum of GPU capacity in milli-GPU."),
		gpuAlloc: d("gpu_milli_allocated", "Sum of allocated (bound, assumed or reserved) milli-GPU."),
		pods:     d("pods", "Tracked pods by phase.", "phase"),
		gangs:    d("gangs", "Gangs by state.", "state"),
		staleness: d("cache_staleness_seconds", "Per informer: 0 while its watch is open, else seconds since it "+
			"last heard from the API server.", "informer"),
		staleMetrics: d("node_metrics_stale_nodes", "Nodes whose node-metrics annotation is missing, invalid or older than the max age."),
	}
}

func (c *extenderCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodes, c.gpus, c.gpuCap, c.gpuAlloc, c.pods, c.gangs, c.staleness, c.staleMetrics} {
		ch <- d
	}
}

func (c *extenderCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.ExtenderSnapshot()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(c.nodes, float64(s.Nodes))
	g(c.gpus, float64(s.GPUs))
	g(c.gpuCap, float64(s.GPUMilliCapacity))
	g(c.gpuAlloc, float64(s.GPUMilliAllocated))
	for _, k := range sortedKeys(s.Pods) {
		g(c.pods, float64(s.Pods[k]), k)
	}
	for _, k := range sortedKeys(s.Gangs) {
		g(c.gangs, float64(s.Gangs[k]), k)
	}
	for _, k := range sortedKeys(s.CacheStaleness) {
		g(c.staleness, s.CacheStaleness[k].Seconds(), k)
	}
	g(c.staleMetrics, float64(s.StaleNodeMetrics))
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
