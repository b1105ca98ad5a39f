package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/evict"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// podLister is the agent's view of a pod source (static manifests or the API server).
type podLister interface {
	List() []*corev1.Pod
	Changed() <-chan struct{}
	HasSynced() bool
}

// eventRecorder records Kubernetes events on pods (or only logs them, without a cluster).
type eventRecorder interface {
	Warn(pod *corev1.Pod, reason, message string)
}

// nodeCPUReader reads the node's cumulative CPU times.
type nodeCPUReader interface {
	Read() (collect.CPUTimes, error)
}

// Deps are the agent's collaborators; the zero value of an optional one disables it.
type Deps struct {
	Pods     podLister     // required
	Events   eventRecorder // optional: log only
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// NodeCPU overrides the /proc/stat reader (tests).
	NodeCPU nodeCPUReader
	// Publisher receives node metrics every NodeMetricsPeriod (Kubernetes mode).
	Publisher nodeMetricsPublisher
	// BatchResources writes understory.io/batch-cpu and batch-memory to the Node's
	// status (Kubernetes mode; nodestatus.Publisher, run by the caller).
	BatchResources batchResourceSink
	// Evictions is the Eviction API (Kubernetes mode: podsource.CoreClient). Without it
	// evictions are reported, not performed (static mode).
	Evictions evict.API
	// GPU is the node's GPUs (gpu.Open: NVML). Nil turns GPU features off.
	GPU gpu.Source
	// GPUAlloc is kubelet's PodResources API (podsource.PodResources): whole-GPU
	// allocations reported in node-metrics version 2. Optional.
	GPUAlloc gpuAllocReader
	// Signals opens the LS harm signal source; nil: signals.Open, which picks the best of
	// eBPF, PSI and sampling from cfg.Signals.Mode.
	Signals SignalOpener
}

// Agent is the node agent: it samples usage every period, computes the batch budget and
// enforces it on the batch tier (NRI mode) or on each batch pod (in-place mode).
type Agent struct {
	cfg     Config
	log     *slog.Logger
	source  podLister
	events  eventRecorder
	metrics *metrics.Agent
	hier    *cgroups.Hierarchy
	layout  layout
	nodeCPU nodeCPUReader
	budget  *qos.Budgeter
	publish *publisher
	// batchSink writes the batch resources to the Node; nil in static mode.
	batchSink batchResourceSink
	// escalator decides the graded actions; evictor performs evictions in Run's
	// goroutine.
	escalator      *qos.Escalator
	evictor        evictor
	escMetrics     *metrics.Escalation
	lastEscalation qos.EscalationDecision
	tierFrozen     bool
	// frozenPods counts the in-place batch pods the agent froze.
	frozenPods int

	// control-loop state, owned by the Run goroutine.
	pods        map[types.UID]*podState
	sorted      []*podState
	nodeRate    collect.Rate
	kubepods    aggregate
	besteffort  aggregate // kubelet's BestEffort QoS cgroup
	tierInBE    bool      // the tier is inside the BestEffort QoS cgroup
	tier        *cgroups.Group
	tierQuota   float64 // cores in force on the tier, NaN unknown
	tierWritten time.Time
	lastStats   time.Time
	tierStats   cpuStats
	splitBuf    []qos.PodDemand
	inPlaceBuf  []*podState
	inTierBuf   []*podState
	tierUsage   aggregate
	tierDemand  demand
	tierCores   float64 // the tier's usage this period
	tierOK      bool
	last        qos.Budget
	lastSample  time.Time // the previous node CPU sample's time: the current window's start
	ticks       uint64
	podsChanged bool // the pod set changed: read every pod this period
	// unattributed is the kubepods CPU no known pod accounts for, at the last period
	// that read every pod; it counts as LS.
	unattributed float64
	// restores are pods that left batch whose kubelet values could not be written yet.
	restores []restore
	// reclaim computes the batch resources published on the Node.
	reclaim     *qos.Reclaimer
	lastReclaim qos.Reclaimed
	mem         memoryReader
	tierMemory  memoryLimitState
	// lsCPURequests and lsMemRequests are the LS pods' requests (cores, bytes).
	lsCPURequests, lsMemRequests float64
	// batchCPURequests and batchMemRequests are what the node's pods request of
	// understory.io/batch-cpu (cores) and batch-memory (bytes): the floor of the
	// published values (qos.ResourceUsage.BatchRequest).
	batchCPURequests, batchMemRequests float64
	// sourceErrors is the pod source's error count at the last period.
	sourceErrors uint64
	// nodeWrites and nodeFailures are the Node writer's counts at the last stats read.
	nodeWrites, nodeFailures int64

	// gpu is the GPU loop (its own goroutine); nil with GPU features off. gpuPods is the
	// pod snapshot the control loop hands it, rebuilt on the next slow period once
	// gpuPodsStale says the pod table or a pod's cgroup changed.
	gpu          *gpu.Manager
	gpuPods      atomic.Pointer[gpu.PodMap]
	gpuPodsStale bool
	gpuMetrics   *metrics.GPU
	gpuAlloc     gpuAllocReader
	// mps is the agent's MPS room (koordlet/mps.go): the node's control daemon and the
	// MPS clients' planner; nil with GPU features off.
	mps *gpuMPS

	// sig is the LS harm signal source and sigState what Open picked and why; guard
	// decides the budget from harm (nil in sampling mode: utilisation decides).
	sig      signalSource
	sigState signals.State
	guard    *qos.Guard
	harmBuf  []signals.Harm
	sigErr   error        // the source's last read error, for /status
	lastHarm signals.Harm // the last harm seen
	lastCut  cutRecord
	// lastUtil is the last period's utilisation budget (the Budgeter's), lastUsage its
	// usage: a wake-up between periods decides from them.
	lastUtil  qos.Budget
	lastUsage Usage
	// watches are the LS pods handed to the signal source, watchedLS how many are watched.
	watches   map[types.UID]*watchState
	watchedLS int

	status  atomic.Pointer[Status]
	healthy atomic.Int64 // unix nanos of the last completed period
	stopped sync.Once
}

// New opens the cgroup hierarchy, creates and configures the batch tier, and returns an
// agent ready to Run. It fails with a clear error when the agent cannot work on this
// machine (no cgroupfs, read-only cgroupfs, bad config).
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Pods == nil {
		return nil, errors.New("koordlet: a pod source is required")
	}
	log := deps.Logger
	if log == nil {
		log = slog.Default()
	}
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := metrics.NewAgent(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	em, err := metrics.NewEscalation(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	gm, err := metrics.NewGPU(reg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	hier, err := cgroups.Open(cfg.CgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup root %s: %w", cfg.CgroupRoot, err)
	}
	lay, err := newLayout(cfg)
	if err != nil {
		return nil, err
	}
	nodeCPU := deps.NodeCPU
	if nodeCPU == nil {
		ps, err := collect.NewProcStat(cfg.ProcRoot)
		if err != nil {
			return nil, fmt.Errorf("opening %s/stat: %w", cfg.ProcRoot, err)
		}
		nodeCPU = ps
	}
	events := deps.Events
	if events == nil {
		events = logEvents{log: log}
	}
	a := &Agent{
		cfg: cfg, log: log, source: deps.Pods, events: events, metrics: m, hier: hier, layout: lay,
		nodeCPU: nodeCPU, budget: qos.NewBudgeter(cfg.Policy), reclaim: qos.NewReclaimer(cfg.BatchResources),
		tierMemory: memoryLimitState{bytes: nan()}, batchSink: deps.BatchResources,
		escalator: qos.NewEscalator(cfg.Escalation, cfg.Period.Duration), escMetrics: em,
		evictor: evict.New(deps.Evictions, evict.Options{Escalation: cfg.Escalation, DryRun: deps.Evictions == nil,
			Events: events, Metrics: em, Logger: log}),
		pods: map[types.UID]*podState{}, tierQuota: nan(),
		kubepods:   aggregate{path: lay.kubepods()},
		besteffort: aggregate{path: lay.join(cgroups.QOSPath(lay.driver, cgroups.QOSBestEffort))},
		tierUsage:  aggregate{path: lay.tier},
		gpuMetrics: gm,
		watches:    map[types.UID]*watchState{},
	}
	a.tierInBE = strings.HasPrefix(lay.tier, a.besteffort.path+"/")
	if deps.Publisher != nil {
		a.publish = newPublisher(deps.Publisher, cfg.NodeMetricsPeriod.Duration, a.memory, a.writtenBatch)
	}
	a.gpuAlloc = deps.GPUAlloc
	if err := a.setUpTier(); err != nil {
		return nil, err
	}
	// A crashed run may have left batch frozen: thaw first, then decide again.
	a.tierFrozen = true
	a.thawAll()
	a.rediscover()
	if err := a.newGPU(context.Background(), deps.GPU); err != nil {
		return nil, err
	}
	if a.publish != nil && a.gpu != nil {
		a.publish.gpu = a.gpuNodeMetrics
	}
	if err := a.openSignals(deps.Signals, reg); err != nil {
		return nil, err
	}
	a.status.Store(&Status{Node: cfg.NodeName, Layout: hier.Layout().String(), Tier: TierStatus{Cgroup: lay.tier},
		Signals: a.signalsStatus()})
	return a, nil
}

// setUpTier creates the agent-owned tier below BestEffort with minimum weight and
// SCHED_IDLE, and bounds it at the policy's minimum until the first period measured
// the node: a (re)starting agent never unleashes batch.
func (a *Agent) setUpTier() error {
	g, err := a.hier.Create(a.layout.tier)
	if err != nil {
		return fmt.Errorf("creating batch tier %s: %w", a.layout.tier, err)
	}
	// An idle group refuses weight writes (cgroups.ErrIdle): a tier a previous run left
	// idle already has the weight idle groups get, so that is fine.
	if err := g.SetCPUShares(minShares); err != nil && !errors.Is(err, cgroups.ErrIdle) {
		return fmt.Errorf("setting tier weight: %w", err)
	}
	if err := g.SetIdle(true); err != nil {
		if !errors.Is(err, cgroups.ErrUnsupported) {
			return fmt.Errorf("setting tier SCHED_IDLE: %w", err)
		}
		a.log.Warn("kernel has no cpu.idle; the batch tier relies on weight and quota only")
	}
	a.tier = g
	min := a.cfg.Policy.MinBatchCPU
	if err := a.applyTier(min, time.Now()); err != nil {
		return fmt.Errorf("bounding tier: %w", err)
	}
	return nil
}

// minShares is kubelet's BestEffort weight, the smallest cpu.shares.
const minShares = 2

// Run samples and enforces every period until ctx ends, then leaves the tier bounded.
func (a *Agent) Run(ctx context.Context) error {
	evictCtx, stopEvictor := context.WithCancel(ctx)
	evictorDone := make(chan struct{})
	go func() {
		defer close(evictorDone)
		_ = a.evictor.Run(evictCtx)
	}()
	defer func() {
		stopEvictor()
		<-evictorDone
	}()
	// Deferred calls run last first: the GPU loop stops (thawing what its duty cycle
	// froze, resuming what it suspended) before the control loop's shutdown, and the
	// evictor after it.
	defer a.shutdown()
	// The MPS daemon's watch stops after the GPU loop (deferred calls run last first).
	if a.mps != nil {
		if stop := a.mps.run(ctx); stop != nil {
			defer stop()
		}
	}
	if a.gpu != nil {
		gpuCtx, stopGPU := context.WithCancel(ctx)
		gpuDone := make(chan struct{})
		go func() {
			defer close(gpuDone)
			_ = a.gpu.Run(gpuCtx)
		}()
		defer func() {
			stopGPU()
			<-gpuDone
		}()
	}
	// The signal source's goroutine (map reads, PSI triggers) stops before the shutdown,
	// which closes the source.
	sigCtx, stopSig := context.WithCancel(ctx)
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		if err := a.sig.Run(sigCtx); err != nil && sigCtx.Err() == nil {
			a.log.Error("harm signal source stopped; utilisation decides from now", "err", err)
		}
	}()
	defer func() {
		stopSig()
		<-sigDone
	}()
	period := a.cfg.Period.Duration
	t := time.NewTicker(period)
	defer t.Stop()
	changed := a.source.Changed()
	wake := a.sig.Wake()
	dirty := true
	for {
		if dirty && a.source.HasSynced() {
			a.syncPods(a.source.List())
			dirty = false
		}
		a.tick(ctx, time.Now())
	wait:
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			dirty = true
		case <-t.C:
		case <-wake:
			// Harm between two periods: cut now, sample at the next tick as usual (a
			// utilisation sample over a few milliseconds would be noise: /proc/stat counts
			// in 10 ms ticks).
			a.react(time.Now())
			goto wait
		}
	}
}

// tick is one control period: sample, compute the budget, enforce, publish.
func (a *Agent) tick(ctx context.Context, now time.Time) {
	start := time.Now()
	a.ticks++
	a.countSourceErrors()
	if len(a.restores) > 0 {
		a.retryRestores()
	}
	times, err := a.nodeCPU.Read()
	if err != nil {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindProcRead).Inc()
		a.log.Error("reading node CPU; keeping the last budget", "err", err)
		return
	}
	windowStart := a.lastSample
	a.lastSample = now
	nodeCores, nodeOK := a.nodeRate.Update(now, times.Busy)
	kubepodsCores, kpOK, kpErr := a.kubepods.read(a.hier, now)
	beCores, beOK, _ := a.besteffort.read(a.hier, now)
	a.readTier(now)
	// The budget needs the LS usage every period. It is measured from aggregates:
	// kubepods minus kubelet's BestEffort cgroup minus the tier, corrected by the few
	// pods whose class does not match where kubelet put them (an LS-annotated
	// BestEffort pod, a batch- or BE-annotated Burstable one), which are read every
	// period. Whatever else runs in kubepods counts as LS: the safe side. Every other
	// pod is read every slowEvery periods: its last sample serves for metrics, status
	// and the demand the budget is split by (an average over a second anyway). With 110
	// pods, a pread per pod per period was most of the agent's cost. Without the
	// aggregates (first period, a read error), LS pods are read one by one as before.
	fastLS := kpOK && beOK && a.tierOK
	slow := a.ticks%slowEvery == 1 || a.podsChanged
	a.podsChanged = false
	var ls, be, inPlace, lsInBE, otherOutBE float64
	var counts podCounts
	hasBatch := false
	for _, st := range a.sorted {
		counts.add(st.class)
		hasBatch = hasBatch || st.class == qos.ClassBatch
		mismatched := !st.inTier && (st.class == qos.ClassLS) == (st.kubeQOS == cgroups.QOSBestEffort)
		if slow || (fastLS && mismatched) || (!fastLS && st.class == qos.ClassLS) {
			a.readPod(st, now)
		}
		if fastLS && mismatched && st.fresh {
			if st.class == qos.ClassLS {
				lsInBE += st.usage
			} else {
				otherOutBE += st.usage
			}
		}
		switch {
		case st.class == qos.ClassLS && (st.fresh || (fastLS && st.reader != nil)):
			ls += st.usage
		case st.class == qos.ClassBE && st.reader != nil:
			be += st.usage
		case st.class == qos.ClassBatch && !st.inTier && st.reader != nil:
			inPlace += st.usage
		}
	}
	if slow {
		a.syncWatches(now)
	}
	if slow && a.gpuPodsStale {
		a.publishGPUPods()
		a.gpuPodsStale = false
	}
	batch := inPlace
	if a.tierOK {
		batch += a.tierCores
	}
	if !nodeOK {
		// First sample: rates need two. Show the pods already.
		a.storeStatus(now, Usage{CPUs: float64(times.CPUs)}, a.last, true)
		return
	}
	// What runs in kubepods but not in a pod the agent knows (a pod it has not heard
	// of yet, a pod whose cgroup it cannot read) counts as LS: the safe side. It is
	// measured when every pod was read in the same period and held in between, so the
	// period-to-period swings of throttled batch pods never leak into the LS estimate.
	if slow && kpOK {
		a.unattributed = math.Max(0, kubepodsCores-(ls+be+batch))
	}
	unknown := a.unattributed
	lsEstimate := ls + unknown
	if fastLS {
		tier := a.tierCores
		if a.tierInBE {
			tier = 0 // already in BestEffort's usage
		}
		lsEstimate = math.Max(0, kubepodsCores-beCores-tier-otherOutBE+lsInBE)
		unknown = math.Max(0, lsEstimate-ls)
	}
	known := ls + be + batch
	system := nodeCores - kubepodsCores
	if !kpOK {
		system = nodeCores - known
	}
	system = math.Max(0, system)
	cpus := float64(times.CPUs)
	// In phase with the slow periods (ticks%slowEvery == 1, slowEvery a multiple of
	// memoryEvery): only a slow memory sample reads the per-pod memory and kubepods' limit.
	newMemory := a.ticks%memoryEvery == 1 || !a.mem.ok
	if newMemory {
		a.readMemory(slow, now)
	}
	mu := a.mem.last
	// The first period after kubepods' usage file was (re)opened has no rate yet: system
	// usage would then be the node's minus only the pods read this period, batch
	// included. The budget recovers the next period, but the reclaimer's averages would
	// carry it for tens of seconds, so it skips such a period (not a persistent error:
	// then the fallback is all there is), and the agent's first second, whose samples
	// were seen to count batch as system (`make demo`, in-place phase).
	if (kpOK || kpErr != nil) && a.ticks > reclaimAfter {
		a.lastReclaim = a.reclaim.Next(qos.ReclaimInput{Now: now,
			CPU: qos.ResourceUsage{Capacity: cpus, LSUsage: lsEstimate, LSRequest: a.lsCPURequests, BEUsage: be,
				SystemUsage: system, BatchRequest: a.batchCPURequests},
			Memory: qos.ResourceUsage{Capacity: mu.Capacity, LSUsage: mu.LS, LSRequest: a.lsMemRequests, BEUsage: mu.BE,
				SystemUsage: mu.System, BatchRequest: a.batchMemRequests}})
		a.publishBatchResources(a.lastReclaim, slow)
	}
	b := a.budget.Next(qos.BudgetInput{NodeCPUs: cpus, LSUsage: lsEstimate, SystemUsage: system})
	a.lastUtil = b
	// With a harm signal the guard decides: harm cuts, utilisation alone never does.
	cause, harm := qos.SignalNone, signals.Harm{}
	if a.signalled() {
		var d qos.GuardDecision
		b, d, harm = a.guarded(b, now)
		cause = d.Cause
	}
	a.enforce(b, now)
	// A utilisation cut's reaction: from the start of the window in which the rise
	// became visible (the previous sample; the load may have begun right after it, so
	// this bounds LS's wait from above) to now, the quota written. now is the sample's
	// time (a fake clock in tests); start, this period's work, began just after it. A
	// harm cut's is from when the signal was seen to written.
	written := time.Now()
	cutWritten := now.Sub(windowStart) + written.Sub(start)
	if a.mem.ok {
		a.enforceTierMemory(mu, a.cfg.BatchResources.Memory.Threshold, now)
	}
	a.escalate(a.lastUtil, hasBatch, now)
	a.recordBudget(b, cause, harm, now, written, cutWritten)
	u := Usage{Node: nodeCores, LS: ls, UnknownPods: unknown, BE: be, Batch: batch, System: system, CPUs: cpus}
	a.lastUsage = u
	a.observe(u, counts, newMemory, now)
	if a.publish != nil {
		a.publish.add(ctx, now, u, b, a.log, a.metrics)
	}
	a.storeStatus(now, u, b, slow)
	a.metrics.LoopDuration.Observe(time.Since(start).Seconds())
	a.metrics.LastTick.Set(float64(now.UnixNano()) / 1e9)
	a.healthy.Store(now.UnixNano())
}

// errorCounter is a pod source that counts its failures (list/watch errors, broken
// manifests).
type errorCounter interface{ ErrorCount() uint64 }

// countSourceErrors adds the pod source's new failures to errors_total{kind="pod_source"}.
func (a *Agent) countSourceErrors() {
	c, ok := a.source.(errorCounter)
	if !ok {
		return
	}
	if n := c.ErrorCount(); n > a.sourceErrors {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindPodSource).Add(float64(n - a.sourceErrors))
		a.sourceErrors = n
	}
}

// readTier samples the tier's usage, the demand of the pods below it.
func (a *Agent) readTier(now time.Time) {
	reopen := !a.tierUsage.opened()
	cores, ok, err := a.tierUsage.read(a.hier, now)
	a.tierCores, a.tierOK = cores, ok
	if err != nil {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupRead).Inc()
		if errors.Is(err, cgroups.ErrNotExist) {
			// Someone removed the tier: recreate it, bounded, next period.
			if err := a.setUpTier(); err != nil {
				a.log.Error("recreating the batch tier", "err", err)
			}
		}
		return
	}
	if reopen {
		a.tierDemand = demand{} // a new file: the demand starts over
	}
	if ok {
		a.tierDemand.add(cores, a.cfg.Period.Duration)
	}
}

// memory is the node's memory and the working sets of its LS and batch pods, read once
// per node-metrics window (per-pod memory changes slowly; the CPU loop does not read it).
func (a *Agent) memory() (metrics.MemoryMetrics, error) {
	info, err := collect.ReadMemInfo(a.cfg.ProcRoot)
	if err != nil {
		return metrics.MemoryMetrics{}, err
	}
	m := metrics.MemoryMetrics{Capacity: int64(info.Total), Used: int64(info.Total - min(info.Available, info.Total))}
	for _, st := range a.sorted {
		if st.group == nil || (st.class != qos.ClassLS && st.class != qos.ClassBatch) {
			continue
		}
		v, err := st.group.MemoryUsage()
		if err != nil {
			continue // no memory controller, or the pod just went: its share stays unknown
		}
		if st.class == qos.ClassLS {
			m.LS += int64(v)
		} else {
			m.Batch += int64(v)
		}
	}
	return m, nil
}

// observe exports the period's figures.
func (a *Agent) observe(u Usage, counts podCounts, newMemory bool, now time.Time) {
	m := a.metrics
	m.NodeCPU.Set(u.Node)
	m.NodeCPUs.Set(u.CPUs)
	m.LSCPU.Set(u.LS + u.UnknownPods)
	m.BECPU.Set(u.BE)
	m.SystemCPU.Set(u.System)
	m.BatchCPU.Set(u.Batch)
	m.BatchBudget.Set(a.last.Applied)
	m.Pods.WithLabelValues(string(qos.ClassLS)).Set(float64(counts.ls))
	m.Pods.WithLabelValues(string(qos.ClassBE)).Set(float64(counts.be))
	m.Pods.WithLabelValues(string(qos.ClassBatch)).Set(float64(counts.batch))
	if newMemory && a.mem.ok {
		mu := a.mem.last
		for _, kv := range []struct {
			class string
			v     float64
		}{{"ls", mu.LS}, {"be", mu.BE}, {"batch", mu.Batch}, {"system", mu.System}, {"used", mu.Used},
			{"capacity", mu.Capacity}} {
			m.Memory.WithLabelValues(kv.class).Set(kv.v)
		}
	}
	if v := a.tierMemory.bytes; !math.IsNaN(v) {
		m.TierMemoryLimit.Set(v)
	}
	// Throttling and pressure change slowly and are only exported (Prometheus scrapes
	// every 15-30 s): read them every statsInterval, not every period. Reading cpu.stat
	// of every in-place batch pod every second was a third of the agent's work.
	if now.Sub(a.lastStats) < statsInterval {
		return
	}
	a.lastStats = now
	a.readThrottling()
	if psi, err := a.tier.Pressure(); err == nil {
		m.CPUPressure.WithLabelValues("batch_tier").Set(psi.Some.Avg10 / 100)
	}
	if psi, err := collect.ReadPressure(a.cfg.ProcRoot, "cpu"); err == nil {
		m.CPUPressure.WithLabelValues("node").Set(psi.Some.Avg10 / 100)
	}
	if a.batchSink != nil {
		ns := a.batchSink.Status()
		if d := ns.Writes - a.nodeWrites; d > 0 {
			m.NodeStatusWrites.Add(float64(d))
		}
		if d := ns.Failures - a.nodeFailures; d > 0 {
			m.Errors.WithLabelValues(metrics.ErrKindNodeStatus).Add(float64(d))
		}
		a.nodeWrites, a.nodeFailures = ns.Writes, ns.Failures
	}
}

// reclaimAfter is how many periods the reclaimer waits after start (one slow period,
// which reads every pod).
const reclaimAfter = slowEvery + 1

// slowEvery is how many periods pass between reads of the pods the budget does not need
// every period (all but LS pods).
const slowEvery = 10

// podCounts counts pods by class.
type podCounts struct{ ls, be, batch int }

func (c *podCounts) add(class qos.Class) {
	switch class {
	case qos.ClassLS:
		c.ls++
	case qos.ClassBE:
		c.be++
	case qos.ClassBatch:
		c.batch++
	}
}

// statsInterval is how often throttling and pressure are read.
const statsInterval = 10 * time.Second

// readThrottling adds the batch cgroups' throttling since the last read to the counters.
func (a *Agent) readThrottling() {
	a.addThrottling(&a.tierStats, a.tier)
	for _, st := range a.sorted {
		if st.class == qos.ClassBatch && st.group != nil && !st.inTier {
			a.addThrottling(&st.stats, st.group)
		}
	}
}

// addThrottling counts what g was throttled since prev, the first read being the baseline.
func (a *Agent) addThrottling(prev *cpuStats, g *cgroups.Group) {
	s, err := g.Stats()
	if err != nil {
		return
	}
	if prev.valid && s.Throttled >= prev.Throttled && s.NrThrottled >= prev.NrThrottled {
		a.metrics.BatchThrottled.Add((s.Throttled - prev.Throttled).Seconds())
		a.metrics.BatchPeriods.Add(float64(s.NrThrottled - prev.NrThrottled))
	}
	*prev = cpuStats{CPUStats: s, valid: true}
}

// cpuStats is a cgroup's last read CPU statistics.
type cpuStats struct {
	cgroups.CPUStats
	valid bool
}

// shutdown leaves every batch limit bounded: a graceful stop applies the shutdown budget
// (the policy minimum unless configured) if it is lower than what is in force.
func (a *Agent) shutdown() {
	a.stopped.Do(func() {
		target := a.cfg.Policy.MinBatchCPU
		if a.cfg.ShutdownBudgetCPU != nil {
			target = *a.cfg.ShutdownBudgetCPU
		}
		if !math.IsNaN(a.last.Applied) && a.last.Applied > 0 && a.last.Applied < target {
			target = a.last.Applied
		}
		b := qos.Budget{Applied: target, Reason: "shutdown"}
		a.enforce(b, time.Now())
		// Freeze never outlives the agent: batch stays bounded by its quota instead.
		a.thawAll()
		a.log.Info("agent stopped; batch left bounded", "budget_cores", target)
		a.unwatchAll()
		if err := a.sig.Close(); err != nil {
			a.log.Warn("closing the harm signal source", "err", err)
		}
		for _, st := range a.pods {
			st.close()
		}
		a.kubepods.close()
		a.besteffort.close()
		a.tierUsage.close()
		a.mem.close()
		if a.publish != nil {
			a.publish.wait()
		}
	})
}

// Healthy reports whether a control period completed within the last few periods.
func (a *Agent) Healthy(now time.Time) error {
	last := a.healthy.Load()
	if last == 0 {
		return errors.New("no control period completed yet")
	}
	if age := now.Sub(time.Unix(0, last)); age > 5*a.cfg.Period.Duration+time.Second {
		return fmt.Errorf("last control period completed %v ago", age.Round(time.Millisecond))
	}
	return nil
}

func nan() float64 { return math.NaN() }

// logEvents records events in the log only (static mode, no API server).
type logEvents struct{ log *slog.Logger }

func (l logEvents) Warn(pod *corev1.Pod, reason, message string) {
	l.log.Warn(message, "reason", reason, "pod", pod.Namespace+"/"+pod.Name)
}
