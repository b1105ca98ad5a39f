package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/evict"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpubridge"
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
	GPUAlloc gpubridge.AllocReader
	// PodConditions sets the condition understory.io/BatchSlowed on batch pods
	// (Kubernetes mode: a PodConditionWriter, run by the caller); nil: none.
	PodConditions podConditionSink
	// Signals opens the LS harm signal source; nil: signals.Open, which picks the best of
	// eBPF, PSI and sampling from cfg.Signals.Mode.
	Signals SignalOpener
	// ThawedAtStart says the caller's ThawAtStart, on this configuration's cgroup
	// roots, thawed everything a previous run left frozen: New does not walk the
	// kubepods tree again.
	ThawedAtStart bool
}

// Agent is the node agent: every period it samples usage (sampler), decides the batch
// budget, the limits to write, the graded actions, the batch resources and what the
// batch pods are told (controller, over qos), writes the limits and the freezer on the
// batch tier (NRI mode) or on each batch pod (in-place mode) and submits the evictions
// (actuator), hands the rest to the API server's writers (handoff), and records.
type Agent struct {
	cfg        config.Config
	log        *slog.Logger
	source     podLister
	events     eventRecorder
	metrics    *metrics.Agent
	escMetrics *metrics.Escalation
	hier       *cgroups.Hierarchy
	layout     layout
	publish    *publisher
	// closeNodeCPU closes the /proc/stat reader New opened (nil: the caller's).
	closeNodeCPU func() error
	// batchSink writes the batch resources to the Node; nil in static mode.
	batchSink batchResourceSink
	// evictor performs the plan's evictions in Run's goroutine.
	evictor evictor

	// The control period's steps: measure, decide, apply (the cgroups, the API
	// writers, the restores of pods that left batch). Owned by the Run goroutine.
	sampler *sampler
	ctl     *controller
	act     *actuator
	out     *handoff
	restore *restorer
	// watch is the LS harm signal source and the pods it watches.
	watch *harmWatch
	// plans are the last plans that did something, for /debug/plans.
	plans *planLog

	// The pod table, owned by the Run goroutine: pods by UID, sorted by name, and what
	// they request (the batch resources' formula).
	pods     map[types.UID]*podState
	sorted   []*podState
	requests qos.Requests
	// nodeWrites and nodeFailures are the Node writer's counts at the last stats read.
	nodeWrites, nodeFailures int64

	// gpu is the agent's side of the GPU loop (koordlet/gpubridge; the loop is off
	// without Deps.GPU); gpuPods the pod snapshot the loop reads (pods.go).
	gpu     *gpubridge.Bridge
	gpuPods gpuPods

	// live takes a reloaded configuration (liveconfig.go): ApplyConfig offers
	// it from the Reloader's goroutine, Run applies it at the start of a period.
	live liveConfig

	status  atomic.Pointer[Status]
	healthy atomic.Int64 // unix nanos of the last completed period
	stopped sync.Once
}

// New opens the cgroup hierarchy, creates and configures the batch tier, and returns an
// agent ready to Run. It fails with a clear error when the agent cannot work on this
// machine (no cgroupfs, read-only cgroupfs, bad config).
func New(cfg config.Config, deps Deps) (*Agent, error) {
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
	var closeNodeCPU func() error
	if nodeCPU == nil {
		ps, err := collect.NewProcStat(cfg.ProcRoot)
		if err != nil {
			return nil, fmt.Errorf("opening %s/stat: %w", cfg.ProcRoot, err)
		}
		nodeCPU, closeNodeCPU = ps, ps.Close
	}
	events := deps.Events
	if events == nil {
		events = logEvents{log: log}
	}
	ev := evict.New(deps.Evictions, evict.Options{Escalation: cfg.Escalation, DryRun: deps.Evictions == nil,
		Events: events, Metrics: em, Logger: log})
	a := &Agent{
		cfg: cfg, log: log, source: deps.Pods, events: events, metrics: m, escMetrics: em, hier: hier, layout: lay,
		closeNodeCPU: closeNodeCPU, batchSink: deps.BatchResources,
		evictor: ev,
		sampler: newSampler(cfg, hier, lay, deps.Pods, nodeCPU, m, log),
		act:     newActuator(cfg, hier, lay.tier, ev, m, log),
		out: &handoff{metrics: m, log: log, batchSink: deps.BatchResources, events: newBatchEvents(events),
			conditions: deps.PodConditions},
		restore: &restorer{hier: hier, metrics: m, log: log},
		plans:   newPlanLog(planLogSize),
		pods:    map[types.UID]*podState{},
	}
	var milli gpubridge.MilliSink
	if s, ok := deps.BatchResources.(gpubridge.MilliSink); ok {
		milli = s
	}
	a.gpu = gpubridge.New(gpubridge.Options{Config: cfg.GPU, ProcRoot: cfg.ProcRoot, Log: log, Hierarchy: hier,
		Tier: lay.tier, FreezerPin: lay.freezerPin(), Metrics: gm, Pods: a.gpuPods.view, Alloc: deps.GPUAlloc,
		MilliSink: milli})
	if deps.Publisher != nil {
		a.publish = newPublisher(deps.Publisher, cfg.NodeMetricsPeriod.Duration, cfg.NodeMetricsReport,
			func() (contract.MemoryMetrics, error) { return a.sampler.memory(a.sorted) },
			func() *contract.BatchResources { return writtenBatch(a.batchSink) })
	}
	found, err := a.act.setUpTier(cfg.Policy.MinBatchCPU)
	if err != nil {
		a.closeFiles()
		return nil, err
	}
	// A crashed run may have left batch frozen: thaw first, then decide again, unless
	// the caller thawed already, before anything could fail. A tier still frozen is
	// thawed again by the next period that does not freeze.
	if !deps.ThawedAtStart {
		if _, err := thawLeftFrozen(context.Background(), hier, cfg.KubeletCgroupRoot, log); err != nil {
			a.act.assumeTierFrozen()
		}
	}
	a.rediscover()
	if err := a.gpu.Open(context.Background(), deps.GPU, events, a.evictor, batchCgroups(a.sorted)); err != nil {
		a.closeFiles()
		return nil, err
	}
	a.gpuPods.on = a.gpu.On()
	if a.publish != nil && a.gpu.On() {
		a.publish.gpu = a.gpu.NodeMetrics
	}
	watch, guard, err := openHarmWatch(cfg, hier, deps.Signals, reg, m, log)
	if err != nil {
		a.closeFiles()
		return nil, err
	}
	a.watch, a.ctl = watch, newController(cfg, guard, m, deps.PodConditions != nil)
	if guard != nil {
		// Continue from what a previous run left in force, not from the utilisation
		// target: this run has not seen LS's harm yet.
		guard.StartFrom(found)
	}
	a.status.Store(&Status{Node: cfg.NodeName, Layout: hier.Layout().String(), Tier: TierStatus{Cgroup: lay.tier},
		Signals: a.watch.status(cutRecord{})})
	return a, nil
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
	// The GPU loop stops first, then the MPS daemon's watch.
	defer a.gpu.Start(ctx)()
	// The signal source's goroutine (map reads, PSI triggers) stops before the shutdown,
	// which closes the source.
	sigCtx, stopSig := context.WithCancel(ctx)
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		if err := a.watch.sig.Run(sigCtx); err != nil && sigCtx.Err() == nil {
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
	wake := a.watch.sig.Wake()
	dirty := true
	for {
		if dirty && a.source.HasSynced() {
			a.syncPods(a.source.List())
			dirty = false
		}
		a.live.apply(a, time.Now())
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

// tick is one control period: sample (every read), plan (qos: attribution, budget,
// guard, every write and why, the graded action, the batch resources, what the batch
// pods are told), apply (the writes and the freezer in the plan's order, the evictions,
// the API writers' part), record (metrics, node metrics, /status, /debug/plans).
func (a *Agent) tick(ctx context.Context, now time.Time) {
	start := time.Now()
	a.restore.retry()
	s, err := a.sampler.sample(now, a.sorted, a.requests)
	if err != nil {
		a.log.Error("keeping the last budget", "err", err)
		return
	}
	a.housekeep(s)
	if !s.nodeOK {
		// First sample: rates need two. Show the pods already.
		a.storeStatus(now, Usage{CPUs: s.CPU.CPUs}, a.ctl.last, true)
		return
	}
	if a.ctl.signalled() {
		s.harm, s.Harm = a.watch.take()
	}
	p := a.ctl.plan(s, a.act.limits(a.sorted, s.tierDemand))
	written := a.act.apply(p, now)
	a.out.send(p, len(a.sorted), now)
	a.record(ctx, s, p, start, written)
}

// housekeep follows what the sample found: a tier removed under the agent is recreated
// (bounded), limits another writer changed are forgotten (the plan writes them again);
// on slow periods the LS pods are handed to the signal source and the GPU loop gets a new
// pod snapshot if a pod or its cgroup changed.
func (a *Agent) housekeep(s sample) {
	if s.tierGone {
		if _, err := a.act.setUpTier(a.cfg.Policy.MinBatchCPU); err != nil {
			a.log.Error("recreating the batch tier", "err", err)
		}
	} else if a.act.reconcileTier(s.tierHeld) {
		a.log.Warn("the batch tier lost SCHED_IDLE to another writer (systemd re-applying the slice's defaults?); setting it up again")
		if _, err := a.act.setUpTier(a.cfg.Policy.MinBatchCPU); err != nil {
			a.log.Error("setting the batch tier up again", "err", err)
		}
	}
	a.act.reopened(s.reopened)
	a.act.reconcilePods(s.podsHeld)
	if s.slow {
		a.watch.sync(s.Now, a.pods, a.sorted)
	}
	a.gpuPods.follow(s.cgroupChanged, s.slow, a.sorted)
}

// record keeps what follows the period's writes: the cut's reaction, metrics, node
// metrics, /status and /debug/plans. It decides nothing and writes nothing else. written
// is when the limits were written. A utilisation cut's reaction is from the start of the
// window in which the rise became visible (the previous sample; the load may have begun
// right after it, so this bounds LS's wait from above) to the write: s.Now is the
// sample's time (a fake clock in tests); start, this period's work, began just after it.
// A harm cut's is from when the signal was seen to written.
func (a *Agent) record(ctx context.Context, s sample, p qos.Plan, start, written time.Time) {
	now := s.Now
	a.ctl.recordBudget(p.Budget, p.Cause, s.harm, now, written, now.Sub(s.windowStart)+written.Sub(start), s.ticks > 2)
	u := a.ctl.lastUsage
	a.observe(u, s, p)
	if a.publish != nil {
		a.publish.add(ctx, now, u, p.Budget, a.log, a.metrics)
	}
	a.storeStatus(now, u, p.Budget, s.slow)
	a.plans.add(now, planKindPeriod, p, a.act)
	a.metrics.LoopDuration.Observe(time.Since(start).Seconds())
	a.metrics.LastTick.Set(float64(now.UnixNano()) / 1e9)
	a.healthy.Store(now.UnixNano())
}

// react answers a wake-up of the signal source between two periods: harm cuts batch at
// once, without waiting for the next utilisation sample (controller.react).
func (a *Agent) react(now time.Time) {
	h, hs := a.watch.take()
	p, ok := a.ctl.react(hs, now, a.act.limits(a.sorted, a.sampler.tierDemand))
	if !ok {
		return // a hold: the budget in force stays; the next period's status shows it
	}
	written := a.act.apply(p, now)
	a.ctl.recordBudget(p.Budget, p.Cause, h, now, written, 0, a.sampler.ticks > 2)
	a.storeStatus(now, a.ctl.lastUsage, p.Budget, false)
	a.plans.add(now, planKindHarm, p, a.act)
}

// observe exports the period's figures.
func (a *Agent) observe(u Usage, s sample, p qos.Plan) {
	m := a.metrics
	m.NodeCPU.Set(u.Node)
	m.NodeCPUs.Set(u.CPUs)
	m.LSCPU.Set(u.LS + u.UnknownPods)
	m.BECPU.Set(u.BE)
	m.SystemCPU.Set(u.System)
	m.BatchCPU.Set(u.Batch)
	m.BatchBudget.Set(a.ctl.last.Applied)
	m.Pods.WithLabelValues(string(qos.ClassLS)).Set(float64(s.counts.ls))
	m.Pods.WithLabelValues(string(qos.ClassBE)).Set(float64(s.counts.be))
	m.Pods.WithLabelValues(string(qos.ClassBatch)).Set(float64(s.counts.batch))
	if s.newMemory && s.Memory.OK {
		mu := s.memory
		for _, kv := range []struct {
			class string
			v     float64
		}{{"ls", mu.LS}, {"be", mu.BE}, {"batch", mu.Batch}, {"system", mu.System}, {"used", mu.Used},
			{"capacity", mu.Capacity}} {
			m.Memory.WithLabelValues(kv.class).Set(kv.v)
		}
	}
	if v := a.act.tierMem.Bytes; !math.IsNaN(v) {
		m.TierMemoryLimit.Set(v)
	}
	if p.Reclaim && s.slow { // every second: Prometheus scrapes every 15-30 s
		exportReclaim(m, "cpu", p.Reclaimed.CPU)
		exportReclaim(m, "memory", p.Reclaimed.Memory)
	}
	a.escMetrics.Level.Set(float64(p.Escalation.Level))
	if p.Escalation.Froze {
		a.escMetrics.Freezes.WithLabelValues(qos.EscalationReasonCPUContention).Inc()
	}
	if !s.Stats.Due {
		return
	}
	if s.pressure.tierOK {
		m.CPUPressure.WithLabelValues("batch_tier").Set(s.pressure.tier)
	}
	if s.pressure.nodeOK {
		m.CPUPressure.WithLabelValues("node").Set(s.pressure.node)
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

// shutdown leaves every batch limit bounded: a graceful stop applies the shutdown budget
// (the policy minimum unless configured), or the budget in force if that is lower, to
// the tier and the in-place pods together, every limit written exactly.
func (a *Agent) shutdown() {
	a.stopped.Do(func() {
		target := a.cfg.Policy.MinBatchCPU
		if a.cfg.ShutdownBudgetCPU != nil {
			target = *a.cfg.ShutdownBudgetCPU
		}
		if last := a.ctl.last.Applied; !math.IsNaN(last) && last > 0 && last < target {
			target = last
		}
		// A batch pod whose cgroup was closed after a failed read still holds its last
		// quota: reach it too.
		a.sampler.reopenBatch(a.sorted)
		now := time.Now()
		p := a.ctl.final(target, now, a.act.limits(a.sorted, a.sampler.tierDemand))
		a.act.apply(p, now)
		a.plans.add(now, planKindShutdown, p, a.act)
		// Freeze never outlives the agent: batch stays bounded by its quota instead.
		a.act.thawAll(a.sorted)
		a.log.Info("agent stopped; batch left bounded", "budget_cores", target)
		a.watch.close()
		a.closeFiles()
		if a.publish != nil {
			a.publish.wait()
		}
	})
}

// closeFiles closes the files the agent holds open between periods: each pod's
// readers, the sampler's and the node's /proc/stat.
func (a *Agent) closeFiles() {
	for _, st := range a.pods {
		a.sampler.drop(st)
	}
	a.sampler.close()
	if a.closeNodeCPU != nil {
		if err := a.closeNodeCPU(); err != nil {
			a.log.Warn("closing /proc/stat", "err", err)
		}
		a.closeNodeCPU = nil
	}
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

// logEvents records events in the log only (static mode, no API server).
type logEvents struct{ log *slog.Logger }

func (l logEvents) Warn(pod *corev1.Pod, reason, message string) {
	l.log.Warn(message, "reason", reason, "pod", pod.Namespace+"/"+pod.Name)
}
