package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// GPU modes of GPUConfig.Mode.
const (
	// GPUModeAuto turns GPU features on when NVML can be used (a cgo build, the
	// driver's libnvidia-ml.so.1 present) and off otherwise, with one log line.
	GPUModeAuto = "auto"
	// GPUModeOff never touches NVML. (Not "off": YAML 1.1 reads a bare off as false.)
	GPUModeOff = "disabled"
)

// GPUConfig is the GPU part of the agent's configuration.
type GPUConfig struct {
	// Mode is auto (default) or disabled.
	Mode string `json:"mode,omitempty"`
	// LoopPeriod is how often the GPU loop reads the GPUs and decides the batch duties:
	// GPUs where batch pods run beside other processes are read in full every period,
	// those where that batch is frozen only probed with their own utilisation, the others
	// (and GPUs whose LS and batch run in MPS partitions) only probed (their process
	// lists).
	LoopPeriod metav1.Duration `json:"loopPeriod,omitempty"`
	// FullScrapePeriod is how often a GPU that needs no fast reaction (no batch pod
	// shares it with another process), or whose batch the loop holds frozen, is read in
	// full: its metrics, node-metrics and /status figures are this old at most. Equal to
	// LoopPeriod, every GPU is read in full every period.
	FullScrapePeriod metav1.Duration `json:"fullScrapePeriod,omitempty"`
	// Throttle is GPU-aware batch throttling: while LS pods need a GPU, the batch pods
	// on it are frozen solid (or run in their MPS partition), and thawed once LS has been
	// idle for throttle.hold.
	Throttle qos.GPUThrottlePolicy `json:"throttle"`
	// Suspend is the feature gate and settings of suspending starved batch through
	// cuda-checkpoint before eviction.
	Suspend duty.SuspendConfig `json:"suspend"`
	// Devices is how the NRI plugin hands shared GPUs to containers (CDI or
	// NVIDIA_VISIBLE_DEVICES).
	Devices devices.Config `json:"devices"`
	// PodResourcesSocket is kubelet's PodResources API, read for the real whole-GPU
	// allocation reported in node-metrics version 2; empty disables it.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// MPS is the node's MPS control daemon (found or run by the agent) and how the NRI
	// plugin makes MPS clients; mode disabled (the default) turns MPS off.
	MPS mps.Config `json:"mps"`
	// Timeslice is the feature gate and policy of the per-context GPU time slices (off
	// by default).
	Timeslice TimesliceConfig `json:"timeslice"`
}

// DefaultGPUConfig returns the GPU defaults.
func DefaultGPUConfig() GPUConfig {
	return GPUConfig{
		Mode:               GPUModeAuto,
		LoopPeriod:         metav1.Duration{Duration: gpu.DefaultLoopPeriod},
		FullScrapePeriod:   metav1.Duration{Duration: gpu.DefaultFullScrapePeriod},
		Throttle:           qos.DefaultGPUThrottlePolicy(),
		Suspend:            duty.DefaultSuspendConfig(),
		Devices:            devices.Config{}.WithDefaults(),
		PodResourcesSocket: podsource.DefaultPodResourcesSocket,
		MPS:                mps.Config{}.WithDefaults(),
		Timeslice:          DefaultTimesliceConfig(),
	}
}

// Validate checks every GPU field, also with GPU features off, so that a bad config
// shows before the node gets a GPU.
func (c GPUConfig) Validate() error {
	if c.Mode != GPUModeAuto && c.Mode != GPUModeOff {
		return fmt.Errorf("gpu.mode: %q must be %q or %q: %w", c.Mode, GPUModeAuto, GPUModeOff, ErrInvalidConfig)
	}
	if p := c.LoopPeriod.Duration; p < 10*time.Millisecond || p > 10*time.Second {
		return fmt.Errorf("gpu.loopPeriod: %v must be within [10ms, 10s]: %w", p, ErrInvalidConfig)
	}
	// node-metrics, /metrics and /status show a GPU's figures this old.
	if f, p := c.FullScrapePeriod.Duration, c.LoopPeriod.Duration; f < p || f > 10*time.Second {
		return fmt.Errorf("gpu.fullScrapePeriod: %v must be within [gpu.loopPeriod (%v), 10s]: %w", f, p,
			ErrInvalidConfig)
	}
	if err := c.Throttle.Validate(); err != nil {
		return fmt.Errorf("gpu.throttle: %w", err)
	}
	if err := c.Suspend.Validate(); err != nil {
		return fmt.Errorf("gpu.suspend: %w", err)
	}
	if err := c.Devices.Validate(); err != nil {
		return fmt.Errorf("gpu.devices: %w", err)
	}
	if err := c.MPS.Validate(); err != nil {
		return fmt.Errorf("gpu.mps: %w: %w", err, ErrInvalidConfig)
	}
	if err := c.Timeslice.Validate(); err != nil {
		return err
	}
	if c.PodResourcesSocket != "" && !strings.HasPrefix(c.PodResourcesSocket, "/") {
		return fmt.Errorf("gpu.podResourcesSocket: %q must be an absolute path: %w", c.PodResourcesSocket, ErrInvalidConfig)
	}
	return nil
}

// gpuBridge is the agent's side of the GPU loop (koordlet/gpu, its own goroutine): it
// builds the loop and its MPS and time-slice parts, hands the loop the pod snapshot the
// control loop publishes, and serves what the loop knows (the inventory, node metrics,
// status, the MPS and time-slice planners) to the NRI plugin, the node annotator and
// /status. It sees the pod table only through what the control loop passes it.
type gpuBridge struct {
	cfg      GPUConfig
	procRoot string
	log      *slog.Logger
	hier     *cgroups.Hierarchy
	layout   layout
	metrics  *metrics.GPU
	alloc    gpuAllocReader
	// batchSink takes understory.io/gpu-milli (nodestatus.Publisher); nil in static mode.
	batchSink batchResourceSink
	// mgr is the GPU loop; nil with GPU features off. pods is the pod snapshot the
	// control loop hands it, rebuilt on the next slow period once stale says the pod
	// table or a pod's cgroup changed.
	mgr   *gpu.Manager
	pods  atomic.Pointer[gpu.PodMap]
	stale bool
	// mps is the node's MPS control daemon and the MPS clients' planner (mps.go); tsg the
	// time-slice shim's planner (timeslice.go); nil when off.
	mps *gpuMPS
	tsg *gpu.Timeslices
}

// open builds the GPU loop on src (nil: GPU features off). pods are the pods the agent
// knows at start (the rediscovered in-place batch pods), whose cgroups a previous run's
// duty cycle may have left frozen; ev takes the loop's evictions.
func (b *gpuBridge) open(ctx context.Context, src gpu.Source, events eventRecorder, ev evictor, pods []*podState) error {
	if src == nil {
		return nil
	}
	c, err := duty.New(b.cfg.Throttle.Period.Duration, b.log.With("component", "gpu-duty"))
	if err != nil {
		return fmt.Errorf("gpu duty cycle: %w", err)
	}
	b.pinFreezer(c)
	o := gpu.Options{Source: src, Pods: b.podView, Groups: b.hier, Cycler: c, Policy: b.cfg.Throttle,
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
	b.thawStale(ctx, pods)
	return nil
}

// on reports whether GPU features are on (the loop was built).
func (b *gpuBridge) on() bool { return b != nil && b.mgr != nil }

// start runs the MPS daemon's watch and the GPU loop in their goroutines; stop stops the
// GPU loop (thawing what its duty cycle froze, resuming what it suspended), then the
// watch, and waits for both.
func (b *gpuBridge) start(ctx context.Context) (stop func()) {
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

// mpsPlanner is the NRI plugin's MPS client planner (the GPU loop's partitions); nil when
// the agent's MPS is off (gpu.mps.mode disabled, or GPU features off).
func (b *gpuBridge) mpsPlanner() devices.MPSPlanner {
	if b == nil || b.mps == nil {
		return nil
	}
	return b.mps.planner()
}

// MPSOptions are the NRI plugin's MPS client planner (the GPU loop's partitions; nil
// when the agent's MPS is off: gpu.mps.mode disabled, or GPU features off) and the
// clients' setup (gpu.mps).
func (a *Agent) MPSOptions() (devices.MPSPlanner, devices.MPSSetup) {
	return a.gpu.mpsPlanner(), mpsSetup(a.cfg.GPU.MPS)
}

// freezerPin is the empty cgroup the duty cycle keeps frozen while it cycles batch pods
// (duty.Cycler.SetPin), in kubelet's root cgroup (layout.freezerPin). It is left in
// place, empty and thawed, when the agent stops.
const freezerPin = "understory-freezer-pin"

// pinFreezer gives the duty cycle its pin on v1 and hybrid nodes (a v1 freezer turns a
// kernel static key on and off at the first freeze and the last thaw; cgroup v2 does
// not). Without it the duty cycle works, at more CPU.
func (b *gpuBridge) pinFreezer(c *duty.Cycler) {
	if b.hier.Layout() == cgroups.LayoutV2 {
		return
	}
	rel := b.layout.freezerPin()
	g, err := b.hier.Create(rel)
	if err != nil {
		b.log.Warn("no freezer pin; the GPU duty cycle costs more CPU", "cgroup", rel, "err", err)
		return
	}
	c.SetPin(g)
}

// thawStale thaws the batch pods' cgroups a previous run's duty cycle may have left
// frozen: the tier's children and the batch pods among pods.
func (b *gpuBridge) thawStale(ctx context.Context, pods []*podState) {
	paths := map[string]bool{}
	if kids, err := b.hier.ListChildren(b.layout.tier); err == nil {
		for _, k := range kids {
			paths[b.layout.tier+"/"+k] = true
		}
	}
	for _, st := range pods {
		if st.class == qos.ClassBatch && st.read.cgroup != "" {
			paths[st.read.cgroup] = true
		}
	}
	paths[b.layout.freezerPin()] = true // empty, but it keeps the kernel's key on
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

// podView is the GPU loop's view of the pods: the snapshot the control loop last
// published.
func (b *gpuBridge) podView() gpu.PodView {
	if m := b.pods.Load(); m != nil {
		return *m
	}
	return gpu.PodMap(nil)
}

// follow takes what the control loop saw change this period (a pod's cgroup, cgroup),
// and on a slow period hands the GPU loop a new snapshot of pods if anything changed
// since the last one; most periods change nothing, and the GPU loop keeps the snapshot it
// has.
func (b *gpuBridge) follow(cgroup, slow bool, pods []*podState) {
	b.stale = b.stale || cgroup
	if slow && b.stale {
		b.publish(pods)
		b.stale = false
	}
}

// podsChanged marks the snapshot stale: the pod table changed.
func (b *gpuBridge) podsChanged() { b.stale = true }

// publish replaces the GPU loop's pod snapshot with pods (none with GPU features off).
func (b *gpuBridge) publish(pods []*podState) {
	if b.mgr == nil {
		return
	}
	m := make(gpu.PodMap, len(pods))
	for _, st := range pods {
		m[st.uid] = gpu.PodInfo{UID: st.uid, Namespace: st.namespace, Name: st.name, Class: st.class,
			Cgroup: st.read.cgroup, Containers: st.spec.containers, Priority: st.spec.priority,
			StartTime: st.spec.started, Terminating: st.terminating}
	}
	b.pods.Store(&m)
}

// inventory is the node's GPUs for the NRI plugin (empty with GPU features off or before
// the first scrape).
func (b *gpuBridge) inventory() []devices.GPU {
	if !b.on() {
		return nil
	}
	inv := b.mgr.Inventory()
	out := make([]devices.GPU, len(inv))
	for i, d := range inv {
		out[i] = devices.GPU{Index: d.Index, UUID: d.UUID}
	}
	return out
}

// GPUs is the node's GPU inventory for the NRI plugin (empty with GPU features off or
// before the first scrape).
func (a *Agent) GPUs() []devices.GPU { return a.gpu.inventory() }

// status is the GPU loop's part of /status; ok false with GPU features off.
func (b *gpuBridge) status() (gpu.Status, bool) {
	if !b.on() {
		return gpu.Status{}, false
	}
	return b.mgr.Status(), true
}

// milliPerGPU is one GPU in understory.io/gpu-milli.
const milliPerGPU = 1000

// gpuAllocReader reads kubelet's device allocation (podsource.PodResources).
type gpuAllocReader interface {
	Devices(ctx context.Context, resource string) (podsource.DeviceAllocation, error)
}

var _ gpuAllocReader = (*podsource.PodResources)(nil)

// gpuMilliSink is the Node writer's gpu-milli part (nodestatus.Publisher).
type gpuMilliSink interface {
	SetGPUMilli(milli int64) (clamped bool)
}

var _ gpuMilliSink = (*nodestatus.Publisher)(nil)

// nodeMetrics is the GPU section of node-metrics version 2 (publisher goroutine): the
// GPU loop's window means plus kubelet's whole-GPU allocation. It also hands the Node
// writer understory.io/gpu-milli: 1000 per healthy GPU.
func (b *gpuBridge) nodeMetrics(ctx context.Context) *contract.GPUMetrics {
	g := b.mgr.NodeGPUs()
	if s, ok := b.batchSink.(gpuMilliSink); ok {
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
	g.Alloc = allocation(alloc, b.inventory(), b.podView())
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
