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
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// DefaultLoopPeriod is how often the GPU loop reads NVML (in full, or a probe of the
// process lists: see scrapeFor) and decides the duties: with the cycler freezing at once
// on a cut, an LS step reaches frozen batch within about one loop period (the target is
// 100 ms at p99).
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
	// NextPeriod is the start of the duty-cycle period after t: the loop steps on the
	// same clock (see nextStep).
	NextPeriod(t time.Time) time.Time
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
	// FullScrapePeriod is how often a GPU that needs no fast reaction is read in full;
	// in between only its process list is probed (DefaultFullScrapePeriod when 0; at
	// least Period).
	FullScrapePeriod time.Duration
	// Suspend, when set, suspends a starved GPU's batch processes (cuda-checkpoint)
	// before any eviction; they resume once LS leaves the GPU.
	Suspend suspender
	// Evict, when set, evicts a starved GPU's batch pods (when Suspend is not set, or
	// failed). Nil: starvation is only reported.
	Evict   evictor
	Metrics *metrics.GPU
	Log     *slog.Logger
	// ProcRoot is the host's /proc (to tell an exited process from a failed resume, and
	// the MPS server from LS by its argv[0]).
	ProcRoot string
	// MPS is the node's MPS control daemon (mps.Daemon); nil: no MPS on this node, every
	// GPU uses the freeze lever.
	MPS mpsServer
	// Partitions plans and records the MPS clients (the NRI plugin's devices.MPSPlanner);
	// the loop updates it every step and reads back which pods are clients with which
	// caps. Nil: no MPS client is ever planned.
	Partitions *Partitions
	// OnLever, when set, is called from the loop's goroutine when a GPU's batch is frozen
	// because LS outgrew its MPS partition (qos.GPUReasonMPSCapStale), once per freeze:
	// the agent turns it into a Kubernetes Event on the batch pods. It must not block.
	OnLever func(LeverEvent)
	// Timeslices, when set (gpu.timeslice.enabled), is the time-slice shim's planner and
	// records: each step the loop reads the shim's reports of the containers it records,
	// chooses each GPU's lever with qos.ChooseGPUTimeslice (timesliceloop.go) and shows
	// it in /status and the metrics; only a timeslice lever changes the throttle's input.
	// Nil: none of it runs.
	Timeslices *Timeslices
	// OnSelfSet, when set, is called from the loop's goroutine for a context found
	// setting itself a slice longer than the agent's, once per context and at most once
	// per pod every 5 minutes: the agent turns it into a Kubernetes Event on the pod. It
	// must not block.
	OnSelfSet func(SelfSetEvent)
}

// Manager is the agent's GPU loop: every period it scrapes the GPUs, attributes their
// processes to pods, chooses each GPU's lever (MPS partition or freeze) and decides
// whether its batch is frozen (qos.GPUThrottle), which the freezer cycler applies at
// duty 1 or 0; it escalates starved batch to suspend or eviction, updates the MPS
// partitions, and keeps the snapshot that /status, /metrics, node-metrics and the NRI
// plugin read.
type Manager struct {
	o        Options
	throttle *qos.GPUThrottle
	log      *slog.Logger

	// Run goroutine's state.
	groups    map[string]*heldGroup // cgroup path → handle
	keyed     map[int]bool          // GPUs whose cycler key the loop has set (and not removed)
	suspended map[int]suspendedProc // pid → what was suspended
	evictedAt map[int]time.Time     // gpu → last eviction request
	steps     uint64                // step count, stamps heldGroup.seen
	in        []qos.GPUThrottleInput
	scratch   []*cgroups.Group // apply's groups of one GPU (Set keeps no reference)
	// cad is, by GPU index, what the last step knew of each GPU; plan the scrape plan
	// built from it; fast whether the next step comes after Period (else after
	// FullScrapePeriod).
	cad  []gpuCadence
	plan []Scrape
	fast bool
	rec  stepRecovery   // recover.go: panicking steps
	lev  *leverState    // levers.go: LS arrivals, the MPS lever, lever events
	wake *wakeWatch     // wake.go: LS processes' CPU (nil: no ProcRoot, or the wake rule is off)
	tsl  *timesliceLoop // timesliceloop.go: per-context time slices (nil: gpu.timeslice off)

	// status is the last step; Status builds the /status view of it when asked (the
	// loop runs every 50 ms, /status is read far less often).
	status atomic.Pointer[stepState]
	mu     sync.Mutex
	// inv is written by step (under mu) and read by step without mu: it is the Run
	// goroutine's own.
	inv []DeviceID
	// win accumulates each GPU's figures since the last NodeGPUs call (node-metrics
	// are means over their window).
	win map[int]*gpuWindow
}

// gpuWindow is one GPU's sums over a node-metrics window.
type gpuWindow struct {
	dev               DeviceID
	n                 float64
	util, lsUtil      float64
	lsPeak            float64 // LS's largest utilisation at a step (publish.go)
	memUsed, memTotal uint64
	duty              float64 // the last duty
	unhealthy         bool    // a query failed in the window
}

// heldGroup is a batch pod's cgroup handle, seen in the scrape of step seen.
type heldGroup struct {
	g    *cgroups.Group
	seen uint64
}

// stepState is what one step leaves for Status; it is never written after it is stored.
type stepState struct {
	time      time.Time
	available bool
	fast      bool // the loop's pace after the step (loopFast)
	err       string
	views     []deviceView
	decisions []qos.GPUThrottleDecision // sorted by GPU
	// escalations are the views' GPUStatus.Escalation, and cads what the next step's
	// plan knew of them, by view.
	escalations []string
	cads        []gpuCadence
	suspended   []SuspendedStatus
	// timeslice is each view's time-slice decision (nil without Options.Timeslices);
	// tsDriver and tsSupported the driver's version and whether the shim supports it.
	timeslice   []*TimesliceStatus
	tsDriver    string
	tsSupported bool
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
	// MPS is the MPS partitions' state; nil without Options.Partitions.
	MPS *MPSStatus `json:"mps,omitempty"`
	// Timeslice is the per-context time slices' node state; nil without
	// Options.Timeslices (gpu.timeslice.enabled false).
	Timeslice *TimesliceNodeStatus `json:"timeslice,omitempty"`
}

// MPSStatus is the MPS side of /status.
type MPSStatus struct {
	// Ready: the MPS control daemon answers (new clients may start).
	Ready bool `json:"ready"`
	// Clients are the MPS clients handed out to containers, with their caps.
	Clients []PartitionClient `json:"clients"`
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
	LSPods    []string `json:"lsPods,omitempty"`
	BatchPods []string `json:"batchPods,omitempty"`
	// Decision is the lever in force ("freeze", "mps" or "timeslice"), whether batch is
	// frozen, the MPS caps and the reason.
	Decision qos.GPUThrottleDecision `json:"decision"`
	// Timeslice is the per-context time-slice choice for the GPU and every context on
	// it (gpu.timeslice.enabled; absent otherwise). Its lever feeds Decision only where
	// it is "timeslice".
	Timeslice *TimesliceStatus `json:"timeslice,omitempty"`
	// MPS: new containers on the GPU start as clients of the agent's MPS server.
	MPS bool `json:"mps"`
	// Cadence is how the loop reads the GPU: CadenceFast (in full every loop period),
	// CadenceFrozen (batch shares it and is frozen: its process list and utilisation
	// every period, in full on a change of the list and every gpu.fullScrapePeriod),
	// CadenceMPS (LS and batch in MPS partitions: probed as CadenceProbe),
	// CadenceProbe (its process list every period, in full on a change and every
	// gpu.fullScrapePeriod) or CadenceSlow (no GPU runs batch: in full every
	// gpu.fullScrapePeriod). ScrapedAt is when the figures above were read in full
	// (utilPercent of a frozen GPU is read every period).
	Cadence   string    `json:"cadence"`
	ScrapedAt time.Time `json:"scrapedAt"`
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
	case o.MPS != nil && o.Partitions == nil:
		return nil, fmt.Errorf("an MPS server without partitions to plan its clients: %w", ErrOptions)
	}
	if err := o.Policy.Validate(); err != nil {
		return nil, err
	}
	if o.Period <= 0 {
		o.Period = DefaultLoopPeriod
	}
	if o.FullScrapePeriod == 0 {
		o.FullScrapePeriod = max(DefaultFullScrapePeriod, o.Period)
	}
	if o.FullScrapePeriod < o.Period {
		return nil, fmt.Errorf("full-scrape period %v shorter than the loop period %v: %w", o.FullScrapePeriod,
			o.Period, ErrOptions)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{o: o, throttle: qos.NewGPUThrottle(o.Policy, o.Period), log: o.Log,
		groups: map[string]*heldGroup{}, keyed: map[int]bool{}, suspended: map[int]suspendedProc{},
		evictedAt: map[int]time.Time{}, win: map[int]*gpuWindow{}, lev: newLeverState(o)}
	if o.ProcRoot != "" && o.Policy.LSWakeCPUPercent > 0 {
		m.wake = newWakeWatch(o.ProcRoot)
	}
	if o.Timeslices != nil {
		m.tsl = newTimesliceLoop(m.o)
	}
	m.status.Store(&stepState{})
	m.fast = true
	return m, nil
}

// Status returns the last step's state.
func (m *Manager) Status() Status {
	r := m.status.Load()
	s := Status{Time: r.time, Available: r.available, Error: r.err, Suspended: r.suspended,
		Cycler: m.o.Cycler.Status()}
	if p := m.o.Partitions; p != nil {
		s.MPS = &MPSStatus{Ready: m.o.MPS != nil && m.o.MPS.Ready(), Clients: p.Clients()}
	}
	if m.tsl != nil {
		s.Timeslice = m.tsl.nodeStatus()
		s.Timeslice.Driver, s.Timeslice.DriverSupported = r.tsDriver, r.tsSupported
	}
	if !r.available {
		return s
	}
	s.GPUs = make([]GPUStatus, len(r.views))
	for i, v := range r.views {
		d, _ := decisionFor(r.decisions, v.dev.Index)
		s.GPUs[i] = GPUStatus{Index: v.dev.Index, UUID: v.dev.UUID, Model: v.dev.Model, Healthy: v.dev.Healthy,
			Error: v.dev.Err, Util: v.dev.Util, MemUsed: v.dev.MemUsed, MemTotal: v.dev.MemTotal,
			LSPods: podNames(v.ls), BatchPods: podNames(v.batch), Decision: d, Escalation: r.escalations[i],
			Cadence: cadenceOf(r.cads[i], r.fast, m.o.Period, m.o.FullScrapePeriod), ScrapedAt: v.dev.ScrapedAt,
			MPS: m.o.Partitions != nil && m.o.Partitions.MPSOn(v.dev.UUID)}
		if i < len(r.timeslice) {
			s.GPUs[i].Timeslice = r.timeslice[i]
		}
	}
	return s
}

// decisionFor returns gpu's decision in ds (sorted by GPU, as GPUThrottle.Step returns them).
func decisionFor(ds []qos.GPUThrottleDecision, gpu int) (qos.GPUThrottleDecision, bool) {
	i, ok := slices.BinarySearchFunc(ds, gpu, func(d qos.GPUThrottleDecision, gpu int) int { return d.GPU - gpu })
	if !ok {
		return qos.GPUThrottleDecision{}, false
	}
	return ds[i], true
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
	t := time.NewTimer(m.o.Period)
	defer t.Stop()
	for {
		now := time.Now()
		m.step(ctx, now)
		wait := m.o.FullScrapePeriod
		if m.fast {
			wait = m.o.Period
		}
		t.Reset(max(time.Until(nextStep(now, wait, m.o.Cycler.NextPeriod(now))), 0))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// nextStep is when the step after one begun at now is due: on the grid of wait anchored
// at anchor (a start of a duty-cycle period), the first point more than wait/2 after now,
// so about wait after now (wait/2 to 1.5 wait when the loop's pace changes) and wait after
// the last step while steps stay on the grid: the pace is kept from when a step began,
// not from when it ended. The grid puts every other step of the default 50 ms loop at the
// start of a 100 ms duty-cycle period, where the cycler freezes: one wake-up of the
// process does both. Each wake-up of an idle agent costs more CPU (a thread switched in
// and out, the Go scheduler's spinning, its sysmon) than a probing step itself.
func nextStep(now time.Time, wait time.Duration, anchor time.Time) time.Time {
	d := now.Add(wait / 2).Sub(anchor)
	k := d / wait
	if d < 0 && d%wait != 0 {
		k-- // floor, not truncation towards zero
	}
	return anchor.Add((k + 1) * wait)
}

// step is one loop period: Run calls it on its clock; tests call it with theirs
// (StepForTest from other packages).
func (m *Manager) step(ctx context.Context, now time.Time) {
	defer m.recoverStep(ctx, now) // recover.go
	m.steps++
	m.plan = m.plan[:0]
	for _, g := range m.cad {
		m.plan = append(m.plan, scrapeFor(g, now, m.o.Period, m.o.FullScrapePeriod))
	}
	start := time.Now()
	s, err := m.o.Source.Collect(ctx, now, m.plan)
	took := time.Since(start)
	if err != nil {
		m.cad = m.cad[:0] // read every GPU in full next time
		m.fast = true
		// Hold every known GPU's duty: a failed scrape is no evidence either way.
		m.in = m.in[:0]
		for _, d := range m.inv {
			m.in = append(m.in, qos.GPUThrottleInput{Index: d.Index, Unknown: true})
		}
		m.throttle.Step(now, m.in)
		m.status.Store(&stepState{time: now, err: err.Error()})
		if m.o.Metrics != nil {
			_ = m.o.Metrics.Update(metrics.GPUSnapshot{Available: false})
		}
		return
	}
	pods := m.o.Pods()
	views := make([]deviceView, len(s.Devices))
	m.in = m.in[:0]
	for i, d := range s.Devices {
		views[i] = viewDevice(d, pods)
		m.in = append(m.in, views[i].input())
	}
	m.noteInventory(s.Devices)
	m.lev.step = m.steps
	m.lev.complete(now, views, pods, m.in)
	if m.wake != nil {
		m.wake.observe(now, views, m.lev.lsPIDs, m.in)
	}
	var tss []*TimesliceStatus
	if m.tsl != nil {
		tss = m.tsl.step(now, views, pods, m.in, m.lev)
	}
	decisions := m.throttle.Step(now, m.in)
	st := &stepState{time: now, available: true, views: views, decisions: decisions,
		escalations: make([]string, len(views)), cads: make([]gpuCadence, len(views)), timeslice: tss}
	if m.tsl != nil {
		st.tsDriver, st.tsSupported = m.tsl.driver, m.tsl.supported
	}
	m.cad = m.cad[:0]
	for i, v := range views {
		d, _ := decisionFor(decisions, v.dev.Index)
		whole := m.apply(v, d)
		st.escalations[i] = m.escalate(ctx, now, v, d)
		// The next step's plan: from what the GPU runs and whether all of its batch is
		// frozen now (a pod left out computes on, and the GPU's utilisation counts it).
		st.cads[i] = v.cadence(d, whole)
		if idx := v.dev.Index; idx >= 0 && idx < maxCadenceIndex {
			for len(m.cad) <= idx {
				m.cad = append(m.cad, gpuCadence{})
			}
			m.cad[idx] = st.cads[i]
		}
	}
	m.fast = loopFast(true, m.cad)
	st.fast = m.fast
	m.lev.events(now, views, decisions)
	m.account(views, decisions)
	m.forgetGone(views)
	m.lev.forget(views)
	m.resumeReleased(ctx, decisions)
	if len(m.suspended) > 0 {
		st.suspended = m.suspendedStatus()
	}
	m.status.Store(st)
	if m.o.Metrics != nil {
		if err := m.o.Metrics.Update(snapshot(views, decisions, tss, took)); err != nil {
			m.log.Debug("GPU metrics snapshot repaired", "err", err)
		}
	}
}

// maxCadenceIndex bounds the GPU indices the scrape plan covers (a source's index past
// it is read in full every period).
const maxCadenceIndex = 1024

// noteInventory replaces the inventory when the scrape's GPUs differ from it (they
// rarely do: most steps allocate nothing here).
func (m *Manager) noteInventory(devs []Device) {
	if slices.EqualFunc(m.inv, devs, func(id DeviceID, d Device) bool {
		return id == DeviceID{Index: d.Index, UUID: d.UUID, Model: d.Model}
	}) {
		return
	}
	inv := make([]DeviceID, len(devs))
	for i, d := range devs {
		inv[i] = DeviceID{Index: d.Index, UUID: d.UUID, Model: d.Model}
	}
	m.mu.Lock()
	m.inv = inv
	m.mu.Unlock()
}

// cyclerKey is the cycler's key of one GPU.
func cyclerKey(gpu int) string { return "gpu" + strconv.Itoa(gpu) }

// apply hands one GPU's duty and its batch pods' cgroups to the cycler. Terminating
// pods and pods whose cgroup is unknown or not loadable are left out; a GPU the throttle
// could not read keeps its last groups (Set is not called). whole: every batch pod of the
// GPU was handed over (or is suspended) and the cycler took the duty, so at duty 1 none
// of them computes.
func (m *Manager) apply(v deviceView, d qos.GPUThrottleDecision) (whole bool) {
	if !v.dev.Healthy && d.Reason == qos.GPUReasonUnknown {
		return false
	}
	whole = true
	groups := m.scratch[:0]
	for _, p := range v.batch {
		if m.podSuspended(p.UID) {
			continue
		}
		if p.Terminating || p.Cgroup == "" {
			whole = false
			continue
		}
		h := m.groups[p.Cgroup]
		if h == nil {
			// Loaded once per pod cgroup and kept while a GPU shows the pod.
			g, err := m.o.Groups.Load(p.Cgroup)
			if err != nil {
				m.log.Debug("batch pod cgroup not loadable; not duty-cycled", "pod", p.Namespace+"/"+p.Name,
					"cgroup", p.Cgroup, "err", err)
				whole = false
				continue
			}
			h = &heldGroup{g: g}
			m.groups[p.Cgroup] = h
		}
		groups = append(groups, h.g)
	}
	m.scratch = groups
	if err := m.o.Cycler.Set(cyclerKey(v.dev.Index), groups, d.Duty); err != nil {
		m.log.Error("setting GPU duty", "gpu", v.dev.Index, "duty", d.Duty, "err", err)
		whole = false
	}
	m.keyed[v.dev.Index] = true
	clear(groups) // no handle outlives its heldGroup through the scratch slice
	return whole
}

// forgetGone drops cgroup handles no GPU uses any more (the cycler thawed them when
// they left their keys) and the keys of GPUs that vanished from the scrape.
func (m *Manager) forgetGone(views []deviceView) {
	for _, v := range views {
		for _, p := range v.batch {
			if h := m.groups[p.Cgroup]; h != nil {
				h.seen = m.steps
			}
		}
	}
	for path, h := range m.groups {
		if h.seen != m.steps {
			delete(m.groups, path)
		}
	}
	for gpu := range m.keyed {
		if !slices.ContainsFunc(views, func(v deviceView) bool { return v.dev.Index == gpu }) {
			_ = m.o.Cycler.Set(cyclerKey(gpu), nil, 0)
			delete(m.keyed, gpu)
		}
	}
}

// account adds the step's figures to the node-metrics window.
func (m *Manager) account(views []deviceView, decisions []qos.GPUThrottleDecision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range views {
		w := m.win[v.dev.Index]
		if w == nil || w.dev.UUID != v.dev.UUID {
			w = &gpuWindow{}
			m.win[v.dev.Index] = w
		}
		w.dev = DeviceID{Index: v.dev.Index, UUID: v.dev.UUID, Model: v.dev.Model}
		d, _ := decisionFor(decisions, v.dev.Index)
		w.duty = d.Duty
		if !v.dev.Healthy {
			w.unhealthy = true
			continue
		}
		w.n++
		w.util += v.dev.Util
		w.lsUtil += min(v.lsUtil, 100)
		w.lsPeak = max(w.lsPeak, min(v.lsUtil, 100))
		w.memUsed, w.memTotal = v.dev.MemUsed, v.dev.MemTotal
	}
}

// NodeGPUs returns each GPU's means since the last call (and starts a new window), for
// node-metrics version 2: utilisation, LS utilisation, memory, and the share reclaimable
// for batch, (1 − duty) × (1 − LS utilisation), the SM share LS leaves free and the MPS
// flag (publish.go). A GPU unreadable at any step of the
// window is reported unhealthy. Alloc is left to the caller.
func (m *Manager) NodeGPUs() *contract.GPUMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	present := map[int]bool{}
	for _, d := range m.inv {
		present[d.Index] = true
	}
	out := &contract.GPUMetrics{Devices: []contract.GPUDevice{}}
	for idx, w := range m.win {
		if !present[idx] {
			delete(m.win, idx)
			continue
		}
		d := contract.GPUDevice{Index: idx, UUID: w.dev.UUID, Model: w.dev.Model, Healthy: !w.unhealthy && w.n > 0}
		if d.Healthy {
			d.Util, d.LSUtil = w.util/w.n, w.lsUtil/w.n
			d.MemUsed, d.MemTotal = int64(w.memUsed), int64(w.memTotal)
			d.Reclaimable = (1 - w.duty) * max(0, 1-d.LSUtil/100)
		}
		m.publishGPU(&d, w.lsPeak) // LS-free share and MPS flag: publish.go
		out.Devices = append(out.Devices, d)
		*w = gpuWindow{dev: w.dev, duty: w.duty}
	}
	slices.SortFunc(out.Devices, func(a, b contract.GPUDevice) int { return a.Index - b.Index })
	return out
}
