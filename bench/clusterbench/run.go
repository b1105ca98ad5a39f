package clusterbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/qos"
)

// ErrBadOptions marks refused options.
var ErrBadOptions = errors.New("bad cluster-bench options")

var errScrape = errors.New("scrape failed")

// Options configure one size's run.
type Options struct {
	Nodes int
	// GPUNodeShare of the nodes are GPU nodes (shapes from openb's GPU node list);
	// the rest take the shapes of openb's CPU-only nodes.
	GPUNodeShare float64
	// Warmup runs the agents before jobs arrive; Duration is the measured part, in
	// which jobs arrive.
	Warmup, Duration time.Duration
	Seed             int64
	// OpenbDir holds openb_pod_list_default.csv and the node lists.
	OpenbDir string
	// LSTrace is a trace file (docs/cluster-bench.md); empty: the synthetic trace.
	LSTrace string
	// CPULoad, GPULoad, Compression, GangShare, GangMax: WorkloadParams.
	CPULoad, GPULoad, Compression float64
	GangShare                     float64
	GangMax                       int
	MaxDuration                   time.Duration
	// AgentTick is the stand-in's control period; NodeMetricsPeriod the agent's
	// nodeMetricsPeriod (10 s); SystemCPUFraction the CPU used outside pods.
	AgentTick, NodeMetricsPeriod time.Duration
	// NodeMetricsReport is the agents' nodeMetricsReport: when a window's node
	// metrics are written (a material change, else every MaxInterval).
	NodeMetricsReport qos.ReportPolicy
	SystemCPUFraction float64
	AgentWorkers      int
	// KwokBin is the kwok binary (scripts/kwok.sh); ModuleRoot the repository
	// (the extender and the admission webhook are built from it).
	KwokBin, ModuleRoot string
	SchedulerQPS        float32
	// ComponentNice is the niceness of Understory's own processes, the extender and
	// the webhook (0: as the rest). In a cluster each has its own CPU; on one
	// machine that the API server, etcd, kwok and kube-scheduler saturate, their
	// latencies would otherwise measure the machine's run queue (docs/cluster-bench.md).
	ComponentNice int
	// Admission runs the admission webhook (cmd/admission) and creates batch pods
	// as users write them; false creates them in its output form (admission.go).
	Admission bool
	// Kueue puts Kueue (v0.17.0, kueueharness) in front of the extender: each
	// trace job becomes a suspended batch/v1 Job in a tenant's LocalQueue of the
	// shipped manifests/components/kueue, kube-controller-manager's Job
	// controller creates its pods once Kueue admits it, and the quota follower
	// (cmd/kueue-quota, a child process) keeps the ClusterQueues' quotas following
	// what the agents publish, one pass every KueueQuotaInterval (kueue.go).
	// KueueWorkers is the number of workers of Kueue's Job and Workload
	// reconcilers (controller.groupKindConcurrency; Kueue's install ships 5).
	Kueue              bool
	KueueQuotaInterval time.Duration
	KueueWorkers       int
	Log                io.Writer `json:"-"`
}

// DefaultOptions are the defaults for n nodes.
func DefaultOptions(n int) Options {
	return Options{Nodes: n, GPUNodeShare: 0.2, Warmup: 60 * time.Second, Duration: 8 * time.Minute, Seed: 42,
		CPULoad: 0.9, GPULoad: 0.7, Compression: 20, GangShare: 0.1, GangMax: 8, MaxDuration: 4 * time.Minute,
		AgentTick: time.Second, NodeMetricsPeriod: 10 * time.Second, NodeMetricsReport: qos.DefaultReportPolicy(),
		SystemCPUFraction: 0.03, AgentWorkers: 8,
		SchedulerQPS: 500, Admission: true, ComponentNice: -10, KueueQuotaInterval: 30 * time.Second,
		KueueWorkers: 20}
}

// Validate reports refused options.
func (o Options) Validate() error {
	var errs []error
	bad := func(f string, v any) { errs = append(errs, fmt.Errorf("%s=%v: %w", f, v, ErrBadOptions)) }
	if o.Nodes < 1 || o.Nodes > 100000 {
		bad("nodes", o.Nodes)
	}
	if !(o.GPUNodeShare >= 0 && o.GPUNodeShare <= 1) {
		bad("gpu-node-share", o.GPUNodeShare)
	}
	if o.Duration < 10*time.Second || o.Warmup < 0 {
		bad("duration/warmup", o.Duration.String()+"/"+o.Warmup.String())
	}
	if !(o.CPULoad >= 0 && o.CPULoad <= 10) || !(o.GPULoad >= 0 && o.GPULoad <= 10) {
		bad("load", fmt.Sprint(o.CPULoad, o.GPULoad))
	}
	if !(o.Compression > 0) || o.MaxDuration < time.Second {
		bad("compression/max-duration", fmt.Sprint(o.Compression, o.MaxDuration))
	}
	if !(o.GangShare >= 0 && o.GangShare <= 1) || o.GangMax < 2 {
		bad("gang", fmt.Sprint(o.GangShare, o.GangMax))
	}
	if o.AgentTick < 100*time.Millisecond || o.NodeMetricsPeriod < o.AgentTick || o.AgentWorkers < 1 {
		bad("agent", fmt.Sprint(o.AgentTick, o.NodeMetricsPeriod, o.AgentWorkers))
	}
	if err := o.NodeMetricsReport.Validate(); err != nil {
		bad("node-metrics-report", err)
	}
	if o.ComponentNice < -20 || o.ComponentNice > 19 {
		bad("component-nice", o.ComponentNice)
	}
	if o.Kueue && o.KueueQuotaInterval < time.Second {
		bad("kueue-quota-interval", o.KueueQuotaInterval)
	}
	if o.Kueue && (o.KueueWorkers < 1 || o.KueueWorkers > 1000) {
		bad("kueue-workers", o.KueueWorkers)
	}
	if !(o.SystemCPUFraction >= 0 && o.SystemCPUFraction < 1) {
		bad("system-cpu", o.SystemCPUFraction)
	}
	return errors.Join(errs...)
}

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "cluster-bench: "+format+"\n", args...)
	}
}

// Run runs one size on a fresh control plane (everything it starts ends with tb's
// cleanups) and returns its figures.
func Run(ctx context.Context, tb testing.TB, o Options) (SizeResult, error) {
	if err := o.Validate(); err != nil {
		return SizeResult{}, err
	}
	began := time.Now()
	res := SizeResult{Nodes: o.Nodes}
	// Traces.
	tasks, err := ReadOpenbTasks(filepath.Join(o.OpenbDir, "openb_pod_list_default.csv"))
	if err != nil {
		return res, err
	}
	cpuShapes, gpuShapes, err := ReadOpenbNodeShapes(filepath.Join(o.OpenbDir, "openb_node_list_all_node.csv"))
	if err != nil {
		return res, err
	}
	var tr *LSTrace
	if o.LSTrace != "" {
		if tr, err = ReadLSTrace(o.LSTrace); err != nil {
			return res, err
		}
	} else {
		tr = Synthesize(DefaultSynthParams(o.Nodes, o.Warmup+o.Duration, o.Seed))
	}
	res.LSTraceSource = tr.Source
	nodes := make([]benchNode, o.Nodes)
	nGPU := int(math.Round(o.GPUNodeShare * float64(o.Nodes)))
	var spare, gpuMilli float64
	for i := range nodes {
		sh := cpuShapes[i%len(cpuShapes)]
		if i < nGPU && len(gpuShapes) > 0 {
			sh = gpuShapes[i%len(gpuShapes)]
		}
		nt := tr.Nodes[i%len(tr.Nodes)]
		nodes[i] = benchNode{name: nodeName(i), shape: sh, lsCPUReq: nt.CPURequest, lsMemReq: nt.MemRequest}
		mean := 0.0
		for _, s := range nt.Samples {
			mean += s.CPU
		}
		mean /= float64(len(nt.Samples))
		spare += math.Max(0, 0.9-mean-o.SystemCPUFraction) * float64(sh.CPUMilli)
		gpuMilli += float64(sh.GPUs * 1000)
	}
	// Jobs arrive from settle into the warm-up on, so the measured part starts with
	// the batch backlog built up.
	settle := min(10*time.Second, o.Warmup)
	jobs, err := BuildWorkload(tasks, WorkloadParams{Span: o.Warmup - settle + o.Duration, Compression: o.Compression,
		MinDuration: 10 * time.Second, MaxDuration: o.MaxDuration, CPULoad: o.CPULoad, GPULoad: o.GPULoad,
		SpareCPUMilli: spare, GPUMilli: gpuMilli, GangShare: o.GangShare, GangMax: o.GangMax, Seed: o.Seed})
	if err != nil {
		return res, err
	}
	res.Jobs = len(jobs)
	o.logf("%d nodes (%d GPU), %d jobs over %v", o.Nodes, nGPU, len(jobs), o.Warmup-settle+o.Duration)

	// The control plane, kwok, the extender, kube-scheduler.
	// WatchList off: with it, kube-apiserver turns every watch from resourceVersion
	// "0" (kwok's informers always ask for that) into a streaming list, which needs
	// etcd's RequestWatchProgress; Debian's etcd 3.4 lacks it, so each such watch
	// fails at once and kwok saw pods only at its re-lists, seconds apart.
	cp := controlplane.Start(ctx, tb, controlplane.Options{EtcdOnTmpfs: true, APIServerArgs: []string{
		"--max-requests-inflight=1000", "--max-mutating-requests-inflight=500", "--feature-gates=WatchList=false"}})
	for _, ns := range []string{nsBatch, nsLS} {
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			return res, err
		}
	}
	dir := tb.TempDir()
	t0 := time.Now()
	if err := createAll(ctx, cp.Client(), nodes); err != nil {
		return res, err
	}
	res.SetupNodesSecs = time.Since(t0).Seconds()
	stages := filepath.Join(dir, "kwok.yaml")
	if err := os.WriteFile(stages, []byte(kwokStages), 0o600); err != nil {
		return res, fmt.Errorf("writing kwok stages: %w", err)
	}
	kwok, err := startChild(dir, "kwok", 0, o.KwokBin, "--kubeconfig="+cp.Kubeconfig(), "--config="+stages,
		"--manage-all-nodes=false", "--manage-nodes-with-label-selector="+kwokLabel+"=true",
		"--node-lease-duration-seconds=40", "--cidr=10.0.0.1/8")
	if err != nil {
		return res, err
	}
	tb.Cleanup(kwok.stop)
	dumpOnFailure(tb, kwok)
	cmds := []string{"./cmd/scheduler-extender", "./cmd/admission"}
	if o.Kueue {
		cmds = append(cmds, "./cmd/kueue-quota")
	}
	if err := buildCommands(ctx, o.ModuleRoot, dir, cmds...); err != nil {
		return res, err
	}
	extBin := filepath.Join(dir, "scheduler-extender")
	admManifests, err := readAdmissionManifests(o.ModuleRoot)
	if err != nil {
		return res, err
	}
	webhook, newBatchPod, err := setupAdmission(ctx, tb, cp, dir, filepath.Join(dir, "admission"), admManifests, o.Admission, o.ComponentNice)
	if err != nil {
		return res, err
	}
	port, err := freePort()
	if err != nil {
		return res, err
	}
	ext, err := startChild(dir, "extender", o.ComponentNice, extBin, "-kubeconfig="+cp.Kubeconfig(),
		"-listen=127.0.0.1:"+strconv.Itoa(port), "-no-podgroup", "-kube-api-qps=1000", "-kube-api-burst=2000", "-lock-hold-metric")
	if err != nil {
		return res, err
	}
	tb.Cleanup(ext.stop)
	dumpOnFailure(tb, ext)
	extURL := "http://127.0.0.1:" + strconv.Itoa(port)
	if err := waitHTTP(ctx, ext, extURL+"/readyz", 3*time.Minute); err != nil {
		return res, fmt.Errorf("extender: %w\n%s", err, controlplane.TailFile(ext.log, 20))
	}
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		return res, err
	}
	schedCfg, err := controlplane.ManifestSchedulerConfig(manifest, extURL)
	if err != nil {
		return res, err
	}
	cp.StartScheduler(tb, schedCfg, controlplane.WithClientRate(o.SchedulerQPS, int32(2*o.SchedulerQPS)))
	namespaces := []string{nsBatch}
	var kq *kueueSetup
	if o.Kueue {
		if kq, err = startKueue(ctx, tb, cp, o, dir, filepath.Join(dir, "kueue-quota")); err != nil {
			return res, err
		}
		namespaces = append(namespaces, kueueTenants()...)
	}

	// The agents and the pod tracker.
	used := make([]usage, len(nodes))
	tk := newTracker(cp.Client(), nodes, used, namespaces...)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := tk.run(runCtx); err != nil {
		return res, err
	}
	agents := newStandIn(cp.Client(), tr, nodes, used, o)
	agentDone := make(chan struct{})
	go func() { defer close(agentDone); agents.run(runCtx, o.AgentWorkers) }()
	defer func() { stop(); <-agentDone }()
	res.SetupSecs = time.Since(began).Seconds()
	o.logf("set up in %.0fs (nodes %.0fs); warming up %v", res.SetupSecs, res.SetupNodesSecs, o.Warmup)
	warm := time.Now()
	subErr := make(chan error, 1)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(settle):
	}
	admin := cp.Client()
	create := func(ctx context.Context, _ int, j Job) error {
		for m := range j.Members {
			p := newBatchPod(j, m)
			tk.submitted(p.Namespace, p.Name, time.Now())
			if err := createPod(ctx, admin, p); err != nil {
				return err
			}
		}
		return nil
	}
	if o.Kueue {
		create = func(ctx context.Context, i int, j Job) error {
			job := kueueJob(j, tenantOf(i), newBatchPod(j, 0))
			tk.jobSubmitted(job.Namespace, job.Name, int(*job.Spec.Parallelism), time.Now())
			if _, err := admin.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating Job %s/%s: %w", job.Namespace, job.Name, err)
			}
			return nil
		}
	}
	go func() { subErr <- submit(runCtx, jobs, create, time.Now()) }()
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case err := <-subErr:
		if err != nil {
			return res, err
		}
		return res, fmt.Errorf("all jobs submitted during the warm-up: %w", ErrBadOptions)
	case <-time.After(time.Until(warm.Add(o.Warmup))):
	}

	// The measured part.
	from := agents.measure(time.Now())
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(time.Until(from)):
	}
	apiGet := func(ctx context.Context) (io.ReadCloser, error) {
		return admin.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	}
	st0, mp0 := agents.statusPatches.Load(), agents.metricsPatches.Load()
	byReason0 := agents.metricsWrites()
	extCPU0, _ := proc.ReadCPU("/proc", ext.pid())
	extRun0, extWait0, _ := proc.ReadSchedWait("/proc", ext.pid())
	apiBefore, err := scrape(ctx, apiGet)
	if err != nil {
		return res, err
	}
	extBefore, err := scrape(ctx, httpGetter(extURL+"/metrics"))
	if err != nil {
		return res, err
	}
	admMeter, err := startAdmissionMeter(ctx, webhook)
	if err != nil {
		return res, err
	}
	var kMeter *kueueMeter
	if kq != nil {
		kMeter = startKueueMeter(kq, cp, tk, from)
	}
	var peakRSS uint64
	for end := from.Add(o.Duration); time.Now().Before(end); {
		if rss, _, err := proc.ReadRSS("/proc", ext.pid()); err == nil {
			peakRSS = max(peakRSS, rss)
		}
		admMeter.sample()
		if kMeter != nil {
			kMeter.sample(ctx)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-subErr:
			if err != nil {
				return res, err
			}
			subErr = nil
		case <-time.After(5 * time.Second):
		}
	}
	to := time.Now()
	secs := to.Sub(from).Seconds()
	extCPU1, _ := proc.ReadCPU("/proc", ext.pid())
	extRun1, extWait1, _ := proc.ReadSchedWait("/proc", ext.pid())
	if _, hwm, err := proc.ReadRSS("/proc", ext.pid()); err == nil {
		peakRSS = max(peakRSS, hwm)
	}
	apiAfter, err := scrape(ctx, apiGet)
	if err != nil {
		return res, err
	}
	extAfter, err := scrape(ctx, httpGetter(extURL+"/metrics"))
	if err != nil {
		return res, err
	}
	if err := admMeter.finish(ctx, &res, apiBefore, apiAfter, secs); err != nil {
		return res, err
	}
	res.MeasuredSecs = secs
	res.AgentStatusPatchesPerSec = float64(agents.statusPatches.Load()-st0) / secs
	res.AgentMetricsPatchesPerSec = float64(agents.metricsPatches.Load()-mp0) / secs
	res.AgentNodeWritesPerSec = res.AgentStatusPatchesPerSec + res.AgentMetricsPatchesPerSec
	res.AgentMetricsWritesByReason = map[string]float64{}
	for r, n := range agents.metricsWrites() {
		if d := n - byReason0[r]; d > 0 {
			res.AgentMetricsWritesByReason[r] = float64(d) / secs
		}
	}
	res.NodeMetricsMaxIntervalS, res.NodeMetricsChange = o.NodeMetricsReport.MaxInterval.Seconds(), o.NodeMetricsReport.Change
	res.ComponentNice = o.ComponentNice
	if o.Kueue {
		res.KueueWorkers = o.KueueWorkers
	}
	res.AgentPatchErrors = agents.patchErrors.Load()
	res.APIRequests = requestRates(apiBefore, apiAfter, secs)
	for _, r := range res.APIRequests {
		res.APIRequestsPerSec += r.PerSec
	}
	p99, n := histogramQuantile(extBefore, extAfter, "understory_extender_request_duration_seconds", "filter", 0.99)
	res.ExtenderFilterCalls = int64(n)
	if !math.IsNaN(p99) {
		res.ExtenderFilterP99Ms = p99 * 1000
	}
	if p50, _ := histogramQuantile(extBefore, extAfter, "understory_extender_request_duration_seconds", "filter", 0.5); !math.IsNaN(p50) {
		res.ExtenderFilterP50Ms = p50 * 1000
	}
	res.ExtenderCPUCores = (extCPU1 - extCPU0).Seconds() / secs
	if run, wait := extRun1-extRun0, extWait1-extWait0; run+wait > 0 && n > 0 {
		res.ExtenderRunqueueWaitShare = wait.Seconds() / (run + wait).Seconds()
		res.ExtenderRunqueueWaitMsPerFilter = 1000 * wait.Seconds() / float64(n)
	}
	if p99, _ := histogramQuantileBy(extBefore, extAfter, "understory_extender_index_lock_hold_seconds", "", "", 0.99); !math.IsNaN(p99) {
		res.ExtenderLockHoldP99Ms = p99 * 1000
	}
	res.ExtenderRSSMiB = float64(peakRSS) / (1 << 20)
	ps := tk.stats(from, to)
	res.BatchSubmitted, res.BatchBound, res.BatchCompleted, res.BatchPendingAtEnd = ps.Submitted, ps.Bound, ps.Completed, ps.StillPending
	res.BatchRunning, res.KwokBindToRunP50Secs, res.BatchUnconverted = ps.Running, ps.BindToRunP50, ps.Unconverted
	res.BatchCompletedPerHour = float64(ps.Completed) / secs * 3600
	res.QueueDelayP50Secs, res.QueueDelayP99Secs = ps.QueueP50, ps.QueueP99
	res.SchedulerPodsPerSec = float64(ps.Bound) / secs
	res.SchedulerPeakPodsPerSec = float64(ps.PeakBindsPer10s) / 10
	res.summarize(agents.snapshot(), o.AgentTick)
	if kMeter != nil {
		if err := kMeter.finish(ctx, &res, tk, from, to); err != nil {
			return res, err
		}
		o.logf("kueue: %d/%d/%d Workloads created/admitted/finished, admission wait p50 %.1fs p99 %.1fs, shares %v (error %.2f), "+
			"%d evicted %v, %d partial gangs", res.KueueWorkloadsCreated, res.KueueWorkloadsAdmitted, res.KueueWorkloadsFinished,
			res.KueueAdmissionWaitP50Secs, res.KueueAdmissionWaitP99Secs, res.KueueTenantCPUShares, res.KueueFairShareError,
			res.KueueWorkloadsEvicted, res.KueueEvictionsByReason, res.KueuePartialGangs)
	}
	res.WallSecs = time.Since(began).Seconds()
	res.LoadAvg = loadAvg()
	o.logf("%d nodes: CPU util %.1f%% → %.1f%% (+%.1f points), oversubscribed node-seconds %d, %d/%d/%d/%d batch pods submitted/bound/running/done, "+
		"filter p99 %.2f ms, admission %.1f calls/s p99 %.2f ms (%d pods unconverted), agents %.1f writes/s, API %.0f req/s",
		o.Nodes, 100*res.CPUUtilWithout, 100*res.CPUUtilWith, 100*(res.CPUUtilWith-res.CPUUtilWithout),
		res.LSOversubscribedCPUNodeSecs+res.LSOversubscribedMemNodeSecs, res.BatchSubmitted, res.BatchBound, res.BatchRunning, res.BatchCompleted,
		res.ExtenderFilterP99Ms, res.AdmissionCallsPerSec, res.AdmissionMutateP99Ms, res.BatchUnconverted, res.AgentNodeWritesPerSec, res.APIRequestsPerSec)
	return res, nil
}

// submitters is how many job creations run at once: one at a time, a loaded
// API server's create latency (tens of ms) capped the arrivals at 1 000 nodes
// far below the trace's rate.
const submitters = 16

// submit creates every job (create: its pods, or its Kueue Job; i is the job's
// index in jobs) at its arrival time after from, up to submitters at once, jobs in
// arrival order.
func submit(ctx context.Context, jobs []Job, create func(ctx context.Context, i int, j Job) error, from time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type item struct {
		i int
		j Job
	}
	work := make(chan item)
	errs := make(chan error, submitters)
	var wg sync.WaitGroup
	for range submitters {
		wg.Go(func() {
			for it := range work {
				if err := create(ctx, it.i, it.j); err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
			}
		})
	}
	dispatch := func() {
		defer close(work)
		for i, j := range jobs {
			if d := time.Until(from.Add(j.At)); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			select {
			case <-ctx.Done():
				return
			case work <- item{i, j}:
			}
		}
	}
	dispatch()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return string(b[:max(0, len(b)-1)])
}
