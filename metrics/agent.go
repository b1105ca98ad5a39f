package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Error kinds counted by Agent.Errors.
const (
	ErrKindCgroupRead  = "cgroup_read"
	ErrKindCgroupWrite = "cgroup_write"
	ErrKindProcRead    = "proc_read"
	ErrKindAnnotation  = "annotation"
	ErrKindPodSource   = "pod_source"
	ErrKindNodePatch   = "node_patch"
	// ErrKindBatchResource is a batch resource computed from unusable inputs (NaN,
	// negative, absurd) and clamped before it was published.
	ErrKindBatchResource = "batch_resource"
	// ErrKindNodeStatus is a failed write of the batch resources to the Node's status.
	ErrKindNodeStatus = "node_status"
	// ErrKindSignalRead is a harm signal source that could not read (an eBPF map, a PSI
	// file): utilisation decides for that period.
	ErrKindSignalRead = "signal_read"
)

// Batch actions counted by Agent.Actions.
const (
	ActionCut     = "cut"
	ActionRestore = "restore"
	ActionPodSet  = "pod_setup"
	// ActionMemoryCut is a memory limit of the tier or a batch pod lowered.
	ActionMemoryCut = "memory_cut"
	// ActionMemoryCutRefused is a memory cut the kernel refused because the memory is in
	// use and could not be reclaimed (the old limit stays; retried).
	ActionMemoryCutRefused = "memory_cut_refused"
	// ActionQuotaClamped is a CPU cut the kernel accepted only down to a child cgroup's
	// own quota (cgroup v1): the nearest limit it accepts is kept, never "unlimited".
	ActionQuotaClamped = "quota_clamped"
	// ActionRestoreKubelet is a pod that left batch given back kubelet's cgroup values.
	ActionRestoreKubelet = "restore_kubelet"
	// ActionRewritten is a setting of the tier or a batch pod that another writer changed
	// (systemd re-applying a unit's defaults on daemon-reload, say), written again.
	ActionRewritten = "rewritten"
)

// Causes of a batch budget cut, the signal label of Agent.Cuts, Agent.CutReaction and
// Agent.HarmSignals (the values of qos.Signal).
const (
	SignalRunqueueDelay = "runqueue_delay"
	SignalPSICPU        = "psi_cpu"
	SignalPSIMemory     = "psi_memory"
	SignalUtilisation   = "utilisation"
)

// Sources of the harm signal, the source label of Agent.SignalSource (signals.Mode).
const (
	SourceEBPF     = "ebpf"
	SourcePSI      = "psi"
	SourceSampling = "sampling"
)

// Agent is the node agent's Prometheus metric set.
type Agent struct {
	NodeCPU        prometheus.Gauge
	NodeCPUs       prometheus.Gauge
	LSCPU          prometheus.Gauge
	BECPU          prometheus.Gauge
	SystemCPU      prometheus.Gauge
	BatchCPU       prometheus.Gauge
	BatchBudget    prometheus.Gauge
	BatchThrottled prometheus.Counter
	BatchPeriods   prometheus.Counter
	CPUPressure    *prometheus.GaugeVec
	Pods           *prometheus.GaugeVec
	Actions        *prometheus.CounterVec
	Errors         *prometheus.CounterVec
	LoopDuration   prometheus.Histogram
	LastTick       prometheus.Gauge
	// BatchResource is every term of the published batch resources, by resource (cpu
	// in cores, memory in bytes) and term (capacity, ls_term, raw, published, ...).
	BatchResource *prometheus.GaugeVec
	// Memory is the node's memory by class (ls, be, batch, system, used, capacity).
	Memory *prometheus.GaugeVec
	// TierMemoryLimit is the memory limit in force on the batch tier.
	TierMemoryLimit prometheus.Gauge
	// NodeStatusWrites counts successful writes of the batch resources to the Node.
	NodeStatusWrites prometheus.Counter
	// NodeMetricsWrites counts successful writes of the node-metrics annotations by
	// why the window was written (NodeMetricsReasons, the values of qos.ReportReason).
	NodeMetricsWrites *prometheus.CounterVec
	// CutReaction observes, per budget cut, by the signal that caused it, how long LS
	// waited for batch to give way: for a harm signal, from when the signal was seen
	// (the PSI event, the eBPF map read that saw the delay) to after the cut quota was
	// written; for a utilisation cut, from the start of the sample window in which the
	// rise of LS (or system) usage became visible (an upper bound).
	CutReaction *prometheus.HistogramVec
	// Cuts counts batch CPU budget cuts by the signal that caused them.
	Cuts *prometheus.CounterVec
	// HarmSignals counts LS harm seen by each signal, whether it cut or not (batch
	// already at its floor, or evidence from before the last cut).
	HarmSignals *prometheus.CounterVec
	// SignalSource is 1 for the harm signal source in use (ebpf, psi, sampling), 0 for
	// the others.
	SignalSource *prometheus.GaugeVec
	// SignalUnavailable is 1 for each better source that could not be used, with why
	// (permission, no_btf, no_tracefs, no_cgroup2, unsupported, error).
	SignalUnavailable *prometheus.GaugeVec
}

// NewAgent creates the agent's metrics and registers them on reg.
func NewAgent(reg prometheus.Registerer) (*Agent, error) {
	const ns = "understory"
	m := &Agent{
		NodeCPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "node_cpu_usage_cores",
			Help: "CPU the whole node used over the last control period, in cores."}),
		NodeCPUs: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "node_cpu_capacity_cores",
			Help: "Online CPUs of the node."}),
		LSCPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "ls_cpu_usage_cores",
			Help: "CPU used by latency-sensitive pods (and pods the agent does not know), in cores."}),
		BECPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "be_cpu_usage_cores",
			Help: "CPU used by BE pods, in cores."}),
		SystemCPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "system_cpu_usage_cores",
			Help: "CPU used outside pods (system daemons, kubelet, the agent), in cores."}),
		BatchCPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_cpu_usage_cores",
			Help: "CPU used by batch pods, in cores."}),
		BatchBudget: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_cpu_budget_cores",
			Help: "CPU the agent currently lets batch pods use, in cores."}),
		BatchThrottled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "batch_cpu_throttled_seconds_total",
			Help: "Time batch cgroups spent throttled by their CFS quota."}),
		BatchPeriods: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "batch_cpu_throttled_periods_total",
			Help: "CFS periods in which batch cgroups were throttled."}),
		CPUPressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "cpu_pressure_some_avg10_ratio",
			Help: "PSI cpu 'some' avg10 as a ratio, for the node and the batch tier."}, []string{"scope"}),
		Pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "pods",
			Help: "Pods on the node by QoS class."}, []string{"class"}),
		Actions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batch_actions_total",
			Help: "Actions taken on batch pods: budget cuts and restores, pod setup."}, []string{"action"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Errors by kind; cgroup writes are retried the next period."}, []string{"kind"}),
		LoopDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "control_loop_duration_seconds",
			Help:    "Time one control period's work took.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3}}),
		LastTick: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "control_loop_last_run_timestamp_seconds",
			Help: "Unix time of the last completed control period."}),
		BatchResource: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "batch_resource",
			Help: "Terms of the batch resources published on the Node (cpu in cores, memory in bytes): " +
				"published = damped(max(clamp(capacity × threshold − ls_term − be_usage − system_usage), batch_request))."},
			[]string{"resource", "term"}),
		Memory: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "memory_usage_bytes",
			Help: "Node memory by class (working sets), what the node uses, and the capacity pods may use."},
			[]string{"class"}),
		TierMemoryLimit: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_memory_limit_bytes",
			Help: "Memory limit in force on the batch tier (0 while unknown)."}),
		NodeStatusWrites: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "node_status_writes_total",
			Help: "Writes of the batch resources to the Node's status."}),
		NodeMetricsWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_metrics_writes_total",
			Help: "Writes of the node-metrics annotations to the Node, by why the window was written (first, retry, " +
				"shape, gpu_alloc, cpu, memory, gpu: a material change; heartbeat: nothing changed for maxInterval)."},
			[]string{"reason"}),
		CutReaction: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "batch_cut_reaction_seconds",
			Help: "Per batch CPU budget cut, by the signal that caused it: time from the harm signal (PSI event, " +
				"eBPF read) or, for utilisation, from the start of the sample window in which the LS (or system) " +
				"rise became visible, to after the cut quota was written.",
			// 1 ms to 2 s: a signal's wake-up writes within milliseconds; a utilisation cut
			// takes one period (100 ms) to see the rise and the write within the next; 2 s
			// is a stalled agent.
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2}},
			[]string{"signal"}),
		Cuts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batch_cuts_total",
			Help: "Batch CPU budget cuts by the signal that caused them."}, []string{"signal"}),
		HarmSignals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "ls_harm_signals_total",
			Help: "LS harm seen, by signal, whether it cut batch or not."}, []string{"signal"}),
		SignalSource: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "signal_source",
			Help: "1 for the LS harm signal source in use (ebpf, psi, sampling), 0 for the others."}, []string{"source"}),
		SignalUnavailable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "signal_source_unavailable",
			Help: "1 for each better LS harm signal source that could not be used, with why."},
			[]string{"source", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.NodeCPU, m.NodeCPUs, m.LSCPU, m.BECPU, m.SystemCPU, m.BatchCPU,
		m.BatchBudget, m.BatchThrottled, m.BatchPeriods, m.CPUPressure, m.Pods, m.Actions, m.Errors,
		m.LoopDuration, m.LastTick, m.BatchResource, m.Memory, m.TierMemoryLimit, m.NodeStatusWrites,
		m.NodeMetricsWrites, m.CutReaction, m.Cuts, m.HarmSignals, m.SignalSource, m.SignalUnavailable} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Known label values start at zero so dashboards and rate() see them from the first scrape.
	for _, k := range []string{ErrKindCgroupRead, ErrKindCgroupWrite, ErrKindProcRead, ErrKindAnnotation, ErrKindPodSource,
		ErrKindNodePatch, ErrKindBatchResource, ErrKindNodeStatus, ErrKindSignalRead} {
		m.Errors.WithLabelValues(k)
	}
	for _, a := range []string{ActionCut, ActionRestore, ActionPodSet, ActionMemoryCut, ActionMemoryCutRefused,
		ActionRestoreKubelet, ActionQuotaClamped, ActionRewritten} {
		m.Actions.WithLabelValues(a)
	}
	for _, sig := range []string{SignalRunqueueDelay, SignalPSICPU, SignalPSIMemory, SignalUtilisation} {
		m.Cuts.WithLabelValues(sig)
		m.CutReaction.WithLabelValues(sig)
		if sig != SignalUtilisation {
			m.HarmSignals.WithLabelValues(sig)
		}
	}
	for _, src := range []string{SourceEBPF, SourcePSI, SourceSampling} {
		m.SignalSource.WithLabelValues(src)
	}
	for _, r := range NodeMetricsReasons() {
		m.NodeMetricsWrites.WithLabelValues(r)
	}
	return m, nil
}

// NodeMetricsReasons are the reason label values of Agent.NodeMetricsWrites: the
// values of qos.ReportReason (a koordlet test keeps the two lists alike).
func NodeMetricsReasons() []string {
	return []string{"first", "retry", "shape", "gpu_alloc", "cpu", "memory", "gpu", "heartbeat"}
}
