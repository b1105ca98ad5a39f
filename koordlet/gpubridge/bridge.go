package gpubridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// Options are what a Bridge is built from; the zero value of an optional one
// disables its part.
type Options struct {
	Config   config.GPU
	ProcRoot string
	Log      *slog.Logger
	// Hierarchy is the node's cgroup hierarchy; Tier the batch tier's cgroup and
	// FreezerPin the empty cgroup the duty cycle keeps frozen on v1 and hybrid nodes
	// (next to kubepods), both relative to its root.
	Hierarchy  *cgroups.Hierarchy
	Tier       string
	FreezerPin string
	Metrics    *metrics.GPU
	// Pods is the pod snapshot the control loop last handed over (the GPU loop's view
	// of the pods); nil: none.
	Pods func() gpu.PodView
	// Alloc reads kubelet's device allocation for node metrics; nil: not reported.
	Alloc AllocReader
	// MilliSink takes understory.io/gpu-milli (nodestatus.Publisher); nil in static mode.
	MilliSink MilliSink
}

// Bridge is the agent's side of the GPU loop (koordlet/gpu, its own goroutine): it
// builds the loop and its MPS and time-slice parts, hands the loop the pod snapshot the
// control loop publishes (Options.Pods), and serves what the loop knows (the inventory,
// node metrics, status, the MPS and time-slice planners) to the NRI plugin, the node
// annotator and /status. It sees the pod table only through that snapshot.
type Bridge struct {
	cfg        config.GPU
	procRoot   string
	log        *slog.Logger
	hier       *cgroups.Hierarchy
	tier       string
	freezerPin string
	metrics    *metrics.GPU
	pods       func() gpu.PodView
	alloc      AllocReader
	milli      MilliSink
	// mgr is the GPU loop; nil with GPU features off.
	mgr *gpu.Manager
	// mps is the node's MPS control daemon and the MPS clients' planner (gpuMPS); tsg the
	// time-slice shim's planner; nil when off.
	mps *gpuMPS
	tsg *gpu.Timeslices
}

// New returns a Bridge with GPU features off until Open.
func New(o Options) *Bridge {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Pods == nil {
		o.Pods = func() gpu.PodView { return gpu.PodMap(nil) }
	}
	return &Bridge{cfg: o.Config, procRoot: o.ProcRoot, log: o.Log, hier: o.Hierarchy, tier: o.Tier,
		freezerPin: o.FreezerPin, metrics: o.Metrics, pods: o.Pods, alloc: o.Alloc, milli: o.MilliSink}
}

// EventRecorder records Kubernetes events on pods (podsource.EventSink; nil: none).
type EventRecorder interface {
	Warn(pod *corev1.Pod, reason, message string)
}

// Evictor takes the GPU loop's eviction requests (koordlet/evict.Evictor).
type Evictor interface {
	Submit(req qos.EvictionRequest, candidates []qos.EvictionCandidate) error
}

// Open builds the GPU loop on src (nil: GPU features off). batch are the cgroups of the
// batch pods the agent knows at start (the rediscovered in-place pods), which a previous
// run's duty cycle may have left frozen; ev takes the loop's evictions.
func (b *Bridge) Open(ctx context.Context, src gpu.Source, events EventRecorder, ev Evictor, batch []string) error {
	if src == nil {
		return nil
	}
	c, err := duty.New(b.cfg.Throttle.Period.Duration, b.log.With("component", "gpu-duty"))
	if err != nil {
		return fmt.Errorf("gpu duty cycle: %w", err)
	}
	b.pinFreezer(c)
	o := gpu.Options{Source: src, Pods: b.pods, Groups: b.hier, Cycler: c, Policy: b.cfg.Throttle,
		Period: b.cfg.LoopPeriod.Duration, FullScrapePeriod: b.cfg.FullScrapePeriod.Duration,
		Metrics: b.metrics, Log: b.log.With("component", "gpu"),
		ProcRoot: b.procRoot, Evict: ev}
	m, err := newGPUMPS(b.cfg, events, b.log)
	if err != nil {
		return err
	}
	b.mps = m
	m.wire(&o)
	var mpsOn func(uuid string) bool
	if o.Partitions != nil {
		mpsOn = o.Partitions.MPSOn
	}
	ts, err := newTimeslices(b.cfg.Timeslice, b.log, mpsOn)
	if err != nil {
		return err
	}
	if ts != nil {
		b.tsg, o.Timeslices, o.OnSelfSet = ts, ts, m.selfSetEvent
	}
	if b.cfg.Suspend.Enabled {
		cp, err := duty.NewCheckpointer(ctx, b.cfg.Suspend)
		if err != nil {
			// The gate is on but the tool is missing or unusable: run without suspend.
			b.log.Warn("GPU suspend (cuda-checkpoint) unavailable; starved batch goes to eviction", "err", err)
		} else {
			o.Suspend = cp
		}
	}
	mgr, err := gpu.NewManager(o)
	if err != nil {
		return err
	}
	b.mgr = mgr
	// A crashed run may have left batch pods frozen by the duty cycle: thaw every batch
	// pod cgroup the agent can find now (the tier's children and the rediscovered
	// in-place pods), then decide again.
	b.thawStale(ctx, batch)
	return nil
}

// On reports whether GPU features are on (the loop was built).
func (b *Bridge) On() bool { return b != nil && b.mgr != nil }

// Start runs the MPS daemon's watch and the GPU loop in their goroutines; stop stops the
// GPU loop (thawing what its duty cycle froze, resuming what it suspended), then the
// watch, and waits for both.
func (b *Bridge) Start(ctx context.Context) (stop func()) {
	var stops []func()
	if b.mps != nil {
		if s := b.mps.run(ctx); s != nil {
			stops = append(stops, s)
		}
	}
	if b.mgr != nil {
		gpuCtx, stopGPU := context.WithCancel(ctx)
		gpuDone := make(chan struct{})
		go func() {
			defer close(gpuDone)
			_ = b.mgr.Run(gpuCtx)
		}()
		stops = append(stops, func() {
			stopGPU()
			<-gpuDone
		})
	}
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
}

// MPSPlanner is the NRI plugin's MPS client planner (the GPU loop's partitions); nil when
// the agent's MPS is off (gpu.mps.mode disabled, or GPU features off).
func (b *Bridge) MPSPlanner() devices.MPSPlanner {
	if b == nil || b.mps == nil {
		return nil
	}
	return b.mps.planner()
}

// pinFreezer gives the duty cycle its pin on v1 and hybrid nodes (a v1 freezer turns a
// kernel static key on and off at the first freeze and the last thaw; cgroup v2 does
// not). Without it the duty cycle works, at more CPU.
func (b *Bridge) pinFreezer(c *duty.Cycler) {
	if b.hier.Layout() == cgroups.LayoutV2 {
		return
	}
	rel := b.freezerPin
	g, err := b.hier.Create(rel)
	if err != nil {
		b.log.Warn("no freezer pin; the GPU duty cycle costs more CPU", "cgroup", rel, "err", err)
		return
	}
	c.SetPin(g)
}

// thawStale thaws the batch pods' cgroups a previous run's duty cycle may have left
// frozen: the tier's children and batch.
func (b *Bridge) thawStale(ctx context.Context, batch []string) {
	paths := map[string]bool{}
	if kids, err := b.hier.ListChildren(b.tier); err == nil {
		for _, k := range kids {
			paths[b.tier+"/"+k] = true
		}
	}
	for _, cg := range batch {
		paths[cg] = true
	}
	paths[b.freezerPin] = true // empty, but it keeps the kernel's key on
	var groups []*cgroups.Group
	for p := range paths {
		if g, err := b.hier.Load(p); err == nil {
			groups = append(groups, g)
		}
	}
	stale, err := duty.ThawStale(ctx, groups)
	if len(stale) > 0 {
		b.log.Warn("thawed batch cgroups a previous run left frozen", "cgroups", stale)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		b.log.Error("cannot thaw batch cgroups left frozen", "err", err)
	}
}

// Inventory is the node's GPUs for the NRI plugin (empty with GPU features off or before
// the first scrape).
func (b *Bridge) Inventory() []devices.GPU {
	if !b.On() {
		return nil
	}
	inv := b.mgr.Inventory()
	out := make([]devices.GPU, len(inv))
	for i, d := range inv {
		out[i] = devices.GPU{Index: d.Index, UUID: d.UUID}
	}
	return out
}

// Status is the GPU loop's part of /status; ok false with GPU features off.
func (b *Bridge) Status() (gpu.Status, bool) {
	if !b.On() {
		return gpu.Status{}, false
	}
	return b.mgr.Status(), true
}

// milliPerGPU is one GPU in understory.io/gpu-milli.
const milliPerGPU = 1000

// AllocReader reads kubelet's device allocation (podsource.PodResources).
type AllocReader interface {
	Devices(ctx context.Context, resource string) (podsource.DeviceAllocation, error)
}

var _ AllocReader = (*podsource.PodResources)(nil)

// MilliSink is the Node writer's gpu-milli part (nodestatus.Publisher).
type MilliSink interface {
	SetGPUMilli(milli int64) (clamped bool)
}

var _ MilliSink = (*nodestatus.Publisher)(nil)

// NodeMetrics is the GPU section of node-metrics version 2 (publisher goroutine): the
// GPU loop's window means plus kubelet's whole-GPU allocation. It also hands the Node
// writer understory.io/gpu-milli: 1000 per healthy GPU.
func (b *Bridge) NodeMetrics(ctx context.Context) *contract.GPUMetrics {
	g := b.mgr.NodeGPUs()
	if s := b.milli; s != nil {
		healthy := int64(0)
		for _, d := range g.Devices {
			if d.Healthy {
				healthy++
			}
		}
		s.SetGPUMilli(healthy * milliPerGPU)
	}
	if b.alloc == nil {
		return g
	}
	alloc, err := b.alloc.Devices(ctx, string(devices.ResourceGPU))
	if err != nil {
		b.log.Warn("kubelet's GPU allocation unknown in this window's node metrics", "err", err)
		return g
	}
	g.Alloc = allocation(alloc, b.Inventory(), b.pods())
	return g
}

// allocation maps kubelet's device IDs to GPU indices and its pods (namespace/name) to
// UIDs the agent knows. IDs no GPU of the inventory matches (MIG devices, another
// plugin's) are left out; a pod left with none is dropped.
func allocation(a podsource.DeviceAllocation, inv []devices.GPU, pods gpu.PodView) *contract.GPUAllocation {
	uids := map[string]string{}
	if m, ok := pods.(gpu.PodMap); ok {
		for uid, p := range m {
			uids[p.Namespace+"/"+p.Name] = string(uid)
		}
	}
	out := &contract.GPUAllocation{Pods: []contract.PodGPUs{}}
	for _, p := range a.Pods {
		var idx []int
		for _, id := range p.IDs {
			if d, ok := devices.ResolveID(inv, id); ok && !slices.Contains(idx, d.Index) {
				idx = append(idx, d.Index)
			}
		}
		if len(idx) == 0 {
			continue
		}
		slices.Sort(idx)
		out.Pods = append(out.Pods, contract.PodGPUs{Namespace: p.Namespace, Name: p.Name,
			UID: uids[p.Namespace+"/"+p.Name], Devices: idx})
	}
	return out
}
