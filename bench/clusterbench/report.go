package clusterbench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"
)

// SizeResult is one size's figures (docs/cluster-bench.md explains each).
type SizeResult struct {
	Nodes         int     `json:"nodes"`
	Jobs          int     `json:"jobs"`
	LSTraceSource string  `json:"ls_trace"`
	SetupSecs     float64 `json:"setup_s"`
	// SetupNodesSecs is the part creating the nodes and LS pods.
	SetupNodesSecs float64 `json:"setup_nodes_s"`
	MeasuredSecs   float64 `json:"measured_s"`
	WallSecs       float64 `json:"wall_s"`

	// Utilisation and allocation, time means over the measured part, fractions of
	// the cluster's allocatable CPU. Without = the same LS, no batch on these nodes
	// (batch on dedicated nodes elsewhere).
	CPUUtilWith       float64 `json:"cpu_util_with"`
	CPUUtilWithout    float64 `json:"cpu_util_without"`
	CPUUtilGainPoints float64 `json:"cpu_util_gain_points"`
	CPUAllocWith      float64 `json:"cpu_alloc_with"`
	CPUAllocWithout   float64 `json:"cpu_alloc_without"`
	// BatchCPUPublished is the mean understory.io/batch-cpu on the Nodes, as a
	// fraction of allocatable CPU; BatchCPUAllocated what batch pods held of it.
	BatchCPUPublished float64 `json:"batch_cpu_published"`
	BatchCPUAllocated float64 `json:"batch_cpu_allocated"`
	GPUAlloc          float64 `json:"gpu_alloc"`
	GPUUtil           float64 `json:"gpu_util"`
	GPUs              int     `json:"gpus"`
	// LS oversubscription, node-seconds (must be 0): CPU = LS + system + the batch
	// the agent lets run above allocatable; memory = LS usage + batch memory
	// requested above allocatable.
	LSOversubscribedCPUNodeSecs int     `json:"ls_oversubscribed_cpu_node_s"`
	LSOversubscribedMemNodeSecs int     `json:"ls_oversubscribed_mem_node_s"`
	NodeSeconds                 float64 `json:"node_s"`

	BatchSubmitted int `json:"batch_pods_submitted"`
	BatchBound     int `json:"batch_pods_bound"`
	BatchRunning   int `json:"batch_pods_run"`
	BatchCompleted int `json:"batch_pods_completed"`
	// KwokBindToRunP50Secs is kwok's median lag from bind to Running.
	KwokBindToRunP50Secs  float64 `json:"kwok_bind_to_running_p50_s"`
	BatchPendingAtEnd     int     `json:"batch_pods_pending_at_end"`
	BatchCompletedPerHour float64 `json:"batch_pods_completed_per_hour"`
	QueueDelayP50Secs     float64 `json:"queue_delay_p50_s"`
	QueueDelayP99Secs     float64 `json:"queue_delay_p99_s"`

	SchedulerPodsPerSec     float64 `json:"scheduler_pods_per_s"`
	SchedulerPeakPodsPerSec float64 `json:"scheduler_peak_pods_per_s"`

	ExtenderFilterCalls int64   `json:"extender_filter_calls"`
	ExtenderFilterP50Ms float64 `json:"extender_filter_p50_ms"`
	ExtenderFilterP99Ms float64 `json:"extender_filter_p99_ms"`
	ExtenderCPUCores    float64 `json:"extender_cpu_cores"`
	ExtenderRSSMiB      float64 `json:"extender_rss_peak_mib"`
	// ExtenderRunqueueWaitShare is the part of the extender's runnable time it spent
	// waiting for a CPU (its threads' schedstat over the measured part), and
	// ExtenderRunqueueWaitMsPerFilter that wait per filter call (all its threads'
	// waits, informers' included, over the filter calls): the machine's share of its
	// latency. ExtenderLockHoldP99Ms is the p99 of its index write-lock holds
	// (-lock-hold-metric), which filters wait behind.
	ExtenderRunqueueWaitShare       float64 `json:"extender_runqueue_wait_share"`
	ExtenderRunqueueWaitMsPerFilter float64 `json:"extender_runqueue_wait_ms_per_filter"`
	ExtenderLockHoldP99Ms           float64 `json:"extender_lock_hold_p99_ms"`
	// ComponentNice is the niceness the extender and the webhook ran at.
	ComponentNice int `json:"component_nice"`

	// The admission webhook (cmd/admission, a child process; Admission false:
	// -clusterbench.admission=false, batch pods created in its output form).
	// Calls and latency from its understory_admission_duration_seconds{endpoint=
	// "mutate"}; AdmissionAPIServerP99Ms is kube-apiserver's side of the call (TLS
	// and network included); AdmissionFailOpen the calls kube-apiserver gave up on
	// and admitted the pod unmutated (failurePolicy Ignore).
	Admission               bool    `json:"admission"`
	AdmissionCalls          int64   `json:"admission_calls"`
	AdmissionCallsPerSec    float64 `json:"admission_calls_per_s"`
	AdmissionMutateP50Ms    float64 `json:"admission_mutate_p50_ms"`
	AdmissionMutateP99Ms    float64 `json:"admission_mutate_p99_ms"`
	AdmissionAPIServerP99Ms float64 `json:"admission_apiserver_p99_ms"`
	AdmissionFailOpen       int64   `json:"admission_fail_open"`
	AdmissionCPUCores       float64 `json:"admission_cpu_cores"`
	AdmissionRSSMiB         float64 `json:"admission_rss_peak_mib"`
	// BatchUnconverted counts the batch pods of the whole run (warm-up included)
	// that carried cpu or memory instead of batch resources (must be 0).
	BatchUnconverted int `json:"batch_pods_unconverted"`

	// Kueue in front (Options.Kueue, -clusterbench.kueue; kueue.go): Workloads
	// first seen, first seen Admitted and Finished in the measured part, those
	// created and not admitted by its end, and the wait from a Workload's creation
	// to its first admission (of those admitted in the measured part). Tenant CPU
	// shares: each tenant's mean share of the batch-cpu the tenants' ClusterQueues
	// have reserved together, over samples every 5 s; the fair-share error the
	// largest |share − 0.5| / 0.5. Evictions: Workloads evicted at least once in
	// the whole run, and evictions by reason (status.schedulingStats). Partial
	// gangs: gang Jobs with some but not all members bound at the end (must be 0).
	// CPU and peak RSS of Kueue's manager and of the quota follower; the workers of
	// its Job and Workload reconcilers.
	Kueue                      bool               `json:"kueue"`
	KueueWorkers               int                `json:"kueue_workers,omitempty"`
	KueueWorkloadsCreated      int                `json:"kueue_workloads_created,omitempty"`
	KueueWorkloadsAdmitted     int                `json:"kueue_workloads_admitted,omitempty"`
	KueueWorkloadsFinished     int                `json:"kueue_workloads_finished,omitempty"`
	KueueWorkloadsPendingAtEnd int                `json:"kueue_workloads_pending_at_end,omitempty"`
	KueueAdmissionWaitP50Secs  float64            `json:"kueue_admission_wait_p50_s,omitempty"`
	KueueAdmissionWaitP99Secs  float64            `json:"kueue_admission_wait_p99_s,omitempty"`
	KueueTenantCPUShares       map[string]float64 `json:"kueue_tenant_cpu_shares,omitempty"`
	KueueFairShareError        float64            `json:"kueue_fair_share_error,omitempty"`
	KueueShareSamples          int                `json:"kueue_share_samples,omitempty"`
	KueueWorkloadsEvicted      int                `json:"kueue_workloads_evicted,omitempty"`
	KueueEvictionsByReason     map[string]int     `json:"kueue_evictions_by_reason,omitempty"`
	KueuePartialGangs          int                `json:"kueue_partial_gangs,omitempty"`
	KueueCPUCores              float64            `json:"kueue_cpu_cores,omitempty"`
	KueueRSSMiB                float64            `json:"kueue_rss_peak_mib,omitempty"`
	KueueQuotaCPUCores         float64            `json:"kueue_quota_cpu_cores,omitempty"`
	KueueQuotaRSSMiB           float64            `json:"kueue_quota_rss_peak_mib,omitempty"`

	AgentStatusPatchesPerSec  float64 `json:"agent_status_patches_per_s"`
	AgentMetricsPatchesPerSec float64 `json:"agent_metrics_patches_per_s"`
	AgentNodeWritesPerSec     float64 `json:"agent_node_writes_per_s"`
	// AgentMetricsWritesByReason is the node-metrics writes of the measured part
	// per second by qos.ReportReason (heartbeat, cpu, memory, shape, first, ...).
	AgentMetricsWritesByReason map[string]float64 `json:"agent_metrics_writes_per_s_by_reason,omitempty"`
	// NodeMetricsMaxInterval and NodeMetricsChange are the agents' report policy.
	NodeMetricsMaxIntervalS float64 `json:"node_metrics_max_interval_s"`
	NodeMetricsChange       float64 `json:"node_metrics_change"`
	AgentPatchErrors        int64   `json:"agent_patch_errors"`

	APIRequestsPerSec float64       `json:"api_requests_per_s"`
	APIRequests       []RequestRate `json:"api_requests"`

	// KueueSeries is the cohort sampled every 5 s of the measured part (Kueue
	// mode): what quota, admission and the placed pods hold, to tell where
	// admitted work waits.
	KueueSeries []KueuePoint `json:"kueue_series,omitempty"`

	// Series is the cluster's CPU utilisation with and without co-location, one
	// point per 10 s (for the plot).
	Series []Point `json:"series"`
	// LoadAvg is /proc/loadavg at the end.
	LoadAvg string `json:"loadavg"`
}

// Point is one step of the utilisation series.
type Point struct {
	T       float64 `json:"t_s"`
	With    float64 `json:"with"`
	Without float64 `json:"without"`
}

// KueuePoint is one sample of the tenants' cohort, in batch-cpu cores: the
// ClusterQueues' nominalQuota summed (what the follower set), what their admitted
// Workloads reserve, and what the batch pods bound to nodes hold; and the
// Workloads not yet admitted once. Reserved well above bound: admitted work
// without placed pods, which the Admitted* counts locate: the admitted,
// unfinished Workloads whose Job has no pods yet (not unsuspended, or its pods
// not created), has pods waiting to be bound, has pods running, or has all its
// pods finished (the Workload not yet Finished, its quota still held).
type KueuePoint struct {
	T                   float64 `json:"t_s"`
	QuotaCores          float64 `json:"quota_cores"`
	ReservedCores       float64 `json:"reserved_cores"`
	BoundCores          float64 `json:"bound_cores"`
	WaitingWorkloads    int     `json:"waiting_workloads"`
	AdmittedNoPods      int     `json:"admitted_without_pods"`
	AdmittedPodsUnbound int     `json:"admitted_pods_unbound"`
	AdmittedRunning     int     `json:"admitted_running"`
	AdmittedPodsDone    int     `json:"admitted_pods_done"`
}

// summarize fills the utilisation figures from the stand-in's per-tick sums.
func (r *SizeResult) summarize(series []second, tick time.Duration) {
	var tot second
	n := 0
	var pt Point
	k := 0
	for i, s := range series {
		if s.nodes == 0 { // no worker reached this tick (late workers fill the next)
			continue
		}
		tot.add(s)
		n++
		pt.With += (s.lsCPU + s.sysCPU + s.batchUsedCPU) / s.capCPU
		pt.Without += (s.lsCPU + s.sysCPU) / s.capCPU
		k++
		if step := int(10 * time.Second / tick); (i+1)%max(step, 1) == 0 {
			r.Series = append(r.Series, Point{T: float64(i+1) * tick.Seconds(), With: pt.With / float64(k), Without: pt.Without / float64(k)})
			pt, k = Point{}, 0
		}
	}
	if n == 0 || tot.capCPU == 0 {
		return
	}
	r.CPUUtilWith = (tot.lsCPU + tot.sysCPU + tot.batchUsedCPU) / tot.capCPU
	r.CPUUtilWithout = (tot.lsCPU + tot.sysCPU) / tot.capCPU
	r.CPUUtilGainPoints = 100 * (r.CPUUtilWith - r.CPUUtilWithout)
	r.CPUAllocWith = (tot.lsReqCPU + tot.batchAllocCPU) / tot.capCPU
	r.CPUAllocWithout = tot.lsReqCPU / tot.capCPU
	r.BatchCPUPublished = tot.publishedCPU / tot.capCPU
	r.BatchCPUAllocated = tot.batchAllocCPU / tot.capCPU
	if tot.gpuMilli > 0 {
		r.GPUAlloc = tot.gpuAlloc / tot.gpuMilli
		r.GPUUtil = r.GPUAlloc
		r.GPUs = int(tot.gpuMilli / float64(n) / 1000)
	}
	r.LSOversubscribedCPUNodeSecs = int(float64(tot.oversubCPU) * tick.Seconds())
	r.LSOversubscribedMemNodeSecs = int(float64(tot.oversubMem) * tick.Seconds())
	r.NodeSeconds = float64(tot.nodes) * tick.Seconds()
}

// Slope is how one cost grows with nodes: the least-squares slope per node and the
// log-log exponent between the smallest and largest size (1 = linear).
type Slope struct {
	Metric   string  `json:"metric"`
	PerNode  float64 `json:"per_node"`
	Exponent float64 `json:"exponent"`
	// Linear: the exponent is at most 1.1 (no faster than linear, with noise).
	Linear bool `json:"linear_or_better"`
}

// Target is one of the benchmark's targets (docs/cluster-bench.md) and whether this run
// met it.
type Target struct {
	Name  string  `json:"name"`
	Nodes int     `json:"nodes"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
}

// Report is bench/out/cluster.json.
type Report struct {
	Benchmark  string       `json:"benchmark"`
	Date       string       `json:"date"`
	Kubernetes string       `json:"kubernetes"`
	Kwok       string       `json:"kwok"`
	Machine    Machine      `json:"machine"`
	Options    Options      `json:"options"`
	Sizes      []SizeResult `json:"sizes"`
	Slopes     []Slope      `json:"slopes"`
	Targets    []Target     `json:"targets"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go"`
	OS        string `json:"os"`
}

func thisMachine() Machine {
	return Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
}

// cost is a figure whose growth with nodes is reported.
type cost struct {
	name string
	get  func(SizeResult) float64
}

// costs are the figures whose growth with nodes is reported.
func costs() []cost {
	return []cost{
		{"api_requests_per_s", func(r SizeResult) float64 { return r.APIRequestsPerSec }},
		{"agent_node_writes_per_s", func(r SizeResult) float64 { return r.AgentNodeWritesPerSec }},
		{"extender_filter_p99_ms", func(r SizeResult) float64 { return r.ExtenderFilterP99Ms }},
		{"extender_cpu_cores", func(r SizeResult) float64 { return r.ExtenderCPUCores }},
		{"extender_rss_peak_mib", func(r SizeResult) float64 { return r.ExtenderRSSMiB }},
		{"admission_mutate_p99_ms", func(r SizeResult) float64 { return r.AdmissionMutateP99Ms }},
		{"admission_cpu_cores", func(r SizeResult) float64 { return r.AdmissionCPUCores }},
		{"admission_rss_peak_mib", func(r SizeResult) float64 { return r.AdmissionRSSMiB }},
	}
}

// Slopes computes how each cost grows over the sizes (at least two).
func Slopes(sizes []SizeResult) []Slope {
	if len(sizes) < 2 {
		return nil
	}
	s := append([]SizeResult(nil), sizes...)
	sort.Slice(s, func(a, b int) bool { return s[a].Nodes < s[b].Nodes })
	var out []Slope
	for _, c := range costs() {
		var sx, sy, sxx, sxy float64
		for _, r := range s {
			x, y := float64(r.Nodes), c.get(r)
			sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
		}
		n := float64(len(s))
		sl := Slope{Metric: c.name}
		if d := n*sxx - sx*sx; d != 0 {
			sl.PerNode = (n*sxy - sx*sy) / d
		}
		lo, hi := s[0], s[len(s)-1]
		if a, b := c.get(lo), c.get(hi); a > 0 && b > 0 && hi.Nodes > lo.Nodes {
			sl.Exponent = math.Log(b/a) / math.Log(float64(hi.Nodes)/float64(lo.Nodes))
		}
		sl.Linear = sl.Exponent <= 1.1
		out = append(out, sl)
	}
	return out
}

// Targets checks the benchmark's targets on the sizes they name (when run).
func Targets(sizes []SizeResult) []Target {
	var out []Target
	for _, r := range sizes {
		if r.Nodes == 1000 {
			out = append(out, Target{Name: "cpu_util_gain_points", Nodes: r.Nodes, Value: r.CPUUtilGainPoints, Limit: 20,
				Met: r.CPUUtilGainPoints >= 20})
		}
		out = append(out, Target{Name: "ls_oversubscribed_node_s", Nodes: r.Nodes,
			Value: float64(r.LSOversubscribedCPUNodeSecs + r.LSOversubscribedMemNodeSecs), Limit: 0,
			Met: r.LSOversubscribedCPUNodeSecs+r.LSOversubscribedMemNodeSecs == 0})
		if r.Nodes == 5000 {
			out = append(out,
				Target{Name: "extender_filter_p99_ms", Nodes: r.Nodes, Value: r.ExtenderFilterP99Ms, Limit: 10, Met: r.ExtenderFilterP99Ms <= 10},
				Target{Name: "agent_node_writes_per_s", Nodes: r.Nodes, Value: r.AgentNodeWritesPerSec, Limit: 100, Met: r.AgentNodeWritesPerSec <= 100},
				Target{Name: "extender_rss_peak_mib", Nodes: r.Nodes, Value: r.ExtenderRSSMiB, Limit: 1024, Met: r.ExtenderRSSMiB <= 1024})
		}
	}
	return out
}

// WriteReport writes r as indented JSON to path (its directory created).
func WriteReport(path string, r Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// ReadReport reads a report written by WriteReport.
func ReadReport(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if err != nil {
		return r, fmt.Errorf("reading report: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decoding report %s: %w", path, err)
	}
	return r, nil
}

// NewReport is the report of sizes run with o.
func NewReport(o Options, kube, kwok string, sizes []SizeResult) Report {
	o.Log = nil
	return Report{Benchmark: "cluster", Date: time.Now().UTC().Format(time.RFC3339), Kubernetes: kube, Kwok: kwok,
		Machine: thisMachine(), Options: o, Sizes: sizes, Slopes: Slopes(sizes), Targets: Targets(sizes)}
}
