package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// DefaultLoopPeriod is how often the GPU loop scrapes NVML and decides the duties: with
// the cycler freezing at once on a cut, an LS step reaches frozen batch within about one
// loop period (the target is 100 ms at p99).
const DefaultLoopPeriod = 50 * time.Millisecond

// groupLoader opens existing cgroups (cgroups.Hierarchy).
type groupLoader interface {
	Load(rel string) (*cgroups.Group, error)
}

// cycler is the freezer duty cycle (duty.Cycler).
type cycler interface {
	Set(key string, groups []*cgroups.Group, duty float64) error
	Release(ctx context.Context, g *cgroups.Group) error
	ThawAll(ctx context.Context) error
	Run(ctx context.Context) error
	Status() []duty.KeyStatus
}

// suspender suspends and resumes CUDA processes (duty.Checkpointer).
type suspender interface {
	Suspend(ctx context.Context, pid int) error
	Resume(ctx context.Context, pid int) error
}

// evictor takes eviction requests (koordlet/evict.Evictor).
type evictor interface {
	Submit(req qos.EvictionRequest, candidates []qos.EvictionCandidate) error
}

var (
	_ cycler      = (*duty.Cycler)(nil)
	_ suspender   = (*duty.Checkpointer)(nil)
	_ groupLoader = (*cgroups.Hierarchy)(nil)
)

// Options are the Manager's collaborators. Source, Pods, Groups and Cycler are required.
type Options struct {
	Source Source
	Pods   func() PodView
	Groups groupLoader
	Cycler cycler
	Policy qos.GPUThrottlePolicy
	// Period is the loop period (DefaultLoopPeriod when 0).
	Period time.Duration
	// Suspend, when set, suspends a starved GPU's batch processes (cuda-checkpoint)
	// before any eviction; they resume once LS leaves the GPU.
	Suspend suspender
	// Evict, when set, evicts a starved GPU's batch pods (when Suspend is not set, or
	// failed). Nil: starvation is only reported.
	Evict   evictor
	Metrics *metrics.GPU
	Log     *slog.Logger
	// ProcRoot is the host's /proc (to tell an exited process from a failed resume).
	ProcRoot string
}

// Manager is the agent's GPU loop: every period it scrapes the GPUs, attributes their
// processes to pods, decides each GPU's batch duty (qos.GPUThrottle) and hands it to the
// freezer duty cycle; it escalates starved batch to suspend or eviction, and keeps the
// snapshot that /status, /metrics, node-metrics and the NRI plugin read.
type Manager struct {
	o        Options
	throttle *qos.GPUThrottle
	log      *slog.Logger

	// Run goroutine's state.
	groups    map[string]*cgroups.Group // cgroup path → handle
	suspended map[int]suspendedProc     // pid → what was suspended
	evictedAt map[int]time.Time         // gpu → last eviction request

	status atomic.Pointer[Status]
	mu     sync.Mutex
	inv    []DeviceID
	// win accumulates each GPU's figures since the last NodeGPUs call (node-metrics
	// are means over their window).
	win map[int]*gpuWindow
}

// gpuWindow is one GPU's sums over a node-metrics window.
type gpuWindow struct {
	dev               DeviceID
	n                 float64
	util, lsUtil      float64
	memUsed, memTotal uint64
	duty              float64 // the last duty
	unhealthy         bool    // a query failed in the window
}

// suspendedProc is a batch process the loop suspended.
type suspendedProc struct {
	gpu int
	pod types.UID
	at  time.Time
}

// DeviceID names one GPU of the node.
type DeviceID struct {
	Index int
	UUID  string
	Model string
}

// Status is the GPU loop's state for /status.
type Status struct {
	Time      time.Time   `json:"time"`
	Available bool        `json:"available"`
	Error     string      `json:"error,omitempty"`
	GPUs      []GPUStatus `json:"gpus"`
	// Suspended are the batch processes suspended through cuda-checkpoint.
	Suspended []SuspendedStatus `json:"suspended,omitempty"`
	Cycler    []duty.KeyStatus  `json:"dutyCycle,omitempty"`
}

// GPUStatus is one GPU's decision with the figures behind it.
type GPUStatus struct {
	Index    int     `json:"index"`
	UUID     string  `json:"uuid"`
	Model    string  `json:"model"`
	Healthy  bool    `json:"healthy"`
	Error    string  `json:"error,omitempty"`
	Util     float64 `json:"utilPercent"`
	MemUsed  uint64  `json:"memoryUsedBytes"`
	MemTotal uint64  `json:"memoryTotalBytes"`
	// LSPods and BatchPods are the pods with processes on the GPU.
	LSPods    []string                `json:"lsPods,omitempty"`
	BatchPods []string                `json:"batchPods,omitempty"`
	Decision  qos.GPUThrottleDecision `json:"decision"`
	// Escalation is what the loop did about starvation: "", "suspended", "evict-requested",
	// "reported" (no suspend, no eviction configured).
	Escalation string `json:"escalation,omitempty"`
}

// SuspendedStatus is one suspended process.
type SuspendedStatus struct {
	PID   int       `json:"pid"`
	GPU   int       `json:"gpu"`
	PodID types.UID `json:"podUID"`
	Since time.Time `json:"since"`
}

// ErrOptions is wrapped by NewManager for a missing collaborator.
var ErrOptions = errors.New("gpu: invalid manager options")

// NewManager returns a Manager; it validates the policy.
func NewManager(o Options) (*Manager, error) {
	switch {
	case o.Source == nil:
		return nil, fmt.Errorf("no source: %w", ErrOptions)
	case o.Pods == nil:
		return nil, fmt.Errorf("no pod view: %w", ErrOptions)
	case o.Groups == nil:
		return nil, fmt.Errorf("no cgroup loader: %w", ErrOptions)
	case o.Cycler == nil:
		return nil, fmt.Errorf("no duty cycler: %w", ErrOptions)
	}
	if err := o.Policy.Validate(); err != nil {
		return nil, err
	}
	if o.Period <= 0 {
		o.Period = DefaultLoopPeriod
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{o: o, throttle: qos.NewGPUThrottle(o.Policy, o.Period), log: o.Log,
		groups: map[string]*cgroups.Group{}, suspended: map[int]suspendedProc{}, evictedAt: map[int]time.Time{},
		win: map[int]*gpuWindow{}}
	m.status.Store(&Status{})
	return m, nil
}

// Status returns the last step's state.
func (m *Manager) Status() Status {
	s := *m.status.Load()
	s.Cycler = m.o.Cycler.Status()
	return s
}

// Inventory returns the GPUs of the last successful scrape (healthy or not), by index.
func (m *Manager) Inventory() []DeviceID {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.inv)
}

// Run drives the loop and the cycler until ctx ends; then it thaws everything it froze,
// resumes what it suspended, and closes the source.
func (m *Manager) Run(ctx context.Context) error {
	cctx, stopCycler := context.WithCancel(context.WithoutCancel(ctx))
	cyclerDone := make(chan error, 1)
	go func() { cyclerDone <- m.o.Cycler.Run(cctx) }()
	defer func() {
		stopCycler() // Run thaws every group it froze on its way out
		if err := <-cyclerDone; err != nil && !errors.Is(err, context.Canceled) {
			m.log.Error("GPU duty cycle ended with an error", "err", err)
		}
		m.resumeAll(context.WithoutCancel(ctx))
		if err := m.o.Source.Close(); err != nil {
			m.log.Warn("closing NVML", "err", err)
		}
	}()
	t := time.NewTicker(m.o.Period)
	defer t.Stop()
	for {
		m.Step(ctx, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Step is one loop period (exported for tests and benchmarks that drive the clock).
func (m *Manager) Step(ctx context.Context, now time.Time) {
	start := time.Now()
	s, err := m.o.Source.Collect(ctx, now)
	took := time.Since(start)
	pods := m.o.Pods()
	st := &Status{Time: now, Available: err == nil}
	if err != nil {
		st.Error = err.Error()
		// Hold every known GPU's duty: a failed scrape is no evidence either way.
		in := make([]qos.GPUThrottleInput, 0, len(m.inv))
		for _, d := range m.Inventory() {
			in = append(in, qos.GPUThrottleInput{Index: d.Index, Unknown: true})
		}
		m.throttle.Step(now, in)
		m.status.Store(st)
		if m.o.Metrics != nil {
			_ = m.o.Metrics.Update(metrics.GPUSnapshot{Available: false})
		}
		return
	}
	views := make([]deviceView, len(s.Devices))
	in := make([]qos.GPUThrottleInput, len(s.Devices))
	inv := make([]DeviceID, len(s.Devices))
	for i, d := range s.Devices {
		views[i] = viewDevice(d, pods)
		in[i] = views[i].input()
		inv[i] = DeviceID{Index: d.Index, UUID: d.UUID, Model: d.Model}
	}
	m.mu.Lock()
	m.inv = inv
	m.mu.Unlock()
	decisions := m.throttle.Step(now, in)
	byGPU := make(map[int]qos.GPUThrottleDecision, len(decisions))
	for _, d := range decisions {
		byGPU[d.GPU] = d
	}
	st.GPUs = make([]GPUStatus, len(views))
	for i, v := range views {
		d := byGPU[v.dev.Index]
		gs := GPUStatus{Index: v.dev.Index, UUID: v.dev.UUID, Model: v.dev.Model, Healthy: v.dev.Healthy,
			Error: v.dev.Err, Util: v.dev.Util, MemUsed: v.dev.MemUsed, MemTotal: v.dev.MemTotal,
			LSPods: v.lsNames, BatchPods: v.batchNames(), Decision: d}
		m.apply(ctx, v, d)
		gs.Escalation = m.escalate(ctx, now, v, d)
		st.GPUs[i] = gs
	}
	m.account(views, byGPU)
	m.forgetGone(ctx, views)
	m.resumeReleased(ctx, byGPU)
	st.Suspended = m.suspendedStatus()
	m.status.Store(st)
	if m.o.Metrics != nil {
		if err := m.o.Metrics.Update(snapshot(views, byGPU, took)); err != nil {
			m.log.Debug("GPU metrics snapshot repaired", "err", err)
		}
	}
}

// cyclerKey is the cycler's key of one GPU.
func cyclerKey(gpu int) string { return "gpu" + strconv.Itoa(gpu) }

// apply hands one GPU's duty and its batch pods' cgroups to the cycler. Terminating
// pods and pods whose cgroup is unknown are left out; a GPU the throttle could not read
// keeps its last groups (Set is not called).
func (m *Manager) apply(_ context.Context, v deviceView, d qos.GPUThrottleDecision) {
	if !v.dev.Healthy && d.Reason == qos.GPUReasonUnknown {
		return
	}
	var groups []*cgroups.Group
	for _, p := range v.batch {
		if p.Terminating || p.Cgroup == "" || m.podSuspended(p.UID) {
			continue
		}
		g := m.groups[p.Cgroup]
		if g == nil {
			var err error
			if g, err = m.o.Groups.Load(p.Cgroup); err != nil {
				m.log.Debug("batch pod cgroup not loadable; not duty-cycled", "pod", p.Namespace+"/"+p.Name,
					"cgroup", p.Cgroup, "err", err)
				continue
			}
			m.groups[p.Cgroup] = g
		}
		groups = append(groups, g)
	}
	if err := m.o.Cycler.Set(cyclerKey(v.dev.Index), groups, d.Duty); err != nil {
		m.log.Error("setting GPU duty", "gpu", v.dev.Index, "duty", d.Duty, "err", err)
	}
}

// forgetGone drops cgroup handles no GPU uses any more (the cycler thawed them when
// they left their keys) and the keys of GPUs that vanished from the scrape.
func (m *Manager) forgetGone(_ context.Context, views []deviceView) {
	used := map[string]bool{}
	present := map[string]bool{}
	for _, v := range views {
		present[cyclerKey(v.dev.Index)] = true
		for _, p := range v.batch {
			used[p.Cgroup] = true
		}
	}
	for path := range m.groups {
		if !used[path] {
			delete(m.groups, path)
		}
	}
	for _, ks := range m.o.Cycler.Status() {
		if ks.Key != duty.ReleasedKey && !present[ks.Key] {
			_ = m.o.Cycler.Set(ks.Key, nil, 0)
		}
	}
}

// account adds the step's figures to the node-metrics window.
func (m *Manager) account(views []deviceView, byGPU map[int]qos.GPUThrottleDecision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range views {
		w := m.win[v.dev.Index]
		if w == nil || w.dev.UUID != v.dev.UUID {
			w = &gpuWindow{}
			m.win[v.dev.Index] = w
		}
		w.dev = DeviceID{Index: v.dev.Index, UUID: v.dev.UUID, Model: v.dev.Model}
		w.duty = byGPU[v.dev.Index].Duty
		if !v.dev.Healthy {
			w.unhealthy = true
			continue
		}
		w.n++
		w.util += v.dev.Util
		w.lsUtil += min(v.lsUtil, 100)
		w.memUsed, w.memTotal = v.dev.MemUsed, v.dev.MemTotal
	}
}

// NodeGPUs returns each GPU's means since the last call (and starts a new window), for
// node-metrics version 2: utilisation, LS utilisation, memory, and the share reclaimable
// for batch, (1 − duty) × (1 − LS utilisation). A GPU unreadable at any step of the
// window is reported unhealthy. Alloc is left to the caller.
func (m *Manager) NodeGPUs() *metrics.GPUMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	present := map[int]bool{}
	for _, d := range m.inv {
		present[d.Index] = true
	}
	out := &metrics.GPUMetrics{Devices: []metrics.GPUDevice{}}
	for idx, w := range m.win {
		if !present[idx] {
			delete(m.win, idx)
			continue
		}
		d := metrics.GPUDevice{Index: idx, UUID: w.dev.UUID, Model: w.dev.Model, Healthy: !w.unhealthy && w.n > 0}
		if d.Healthy {
			d.Util, d.LSUtil = w.util/w.n, w.lsUtil/w.n
			d.MemUsed, d.MemTotal = int64(w.memUsed), int64(w.memTotal)
			d.Reclaimable = (1 - w.duty) * max(0, 1-d.LSUtil/100)
		}
		out.Devices = append(out.Devices, d)
		*w = gpuWindow{dev: w.dev, duty: w.duty}
	}
	slices.SortFunc(out.Devices, func(a, b metrics.GPUDevice) int { return a.Index - b.Index })
	return out
}
