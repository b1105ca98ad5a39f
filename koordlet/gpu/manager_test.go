package gpu

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// scriptSource replays one Sample (or error) per Collect; the last one repeats.
type scriptSource struct {
	steps []func() (Sample, error)
	n     int
}

func (s *scriptSource) Collect(_ context.Context, now time.Time, _ []Scrape) (Sample, error) {
	i := min(s.n, len(s.steps)-1)
	s.n++
	smp, err := s.steps[i]()
	smp.Time = now
	return smp, err
}

func (s *scriptSource) Close() error { return nil }

// fakeCycler records the last Set of each key.
type fakeCycler struct {
	mu       sync.Mutex
	duty     map[string]float64
	groups   map[string][]string
	released []string
}

func newFakeCycler() *fakeCycler {
	return &fakeCycler{duty: map[string]float64{}, groups: map[string][]string{}}
}

func (c *fakeCycler) Set(key string, groups []*cgroups.Group, d float64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d == 0 || len(groups) == 0 {
		delete(c.duty, key)
		delete(c.groups, key)
		return nil
	}
	c.duty[key] = d
	c.groups[key] = nil
	for _, g := range groups {
		c.groups[key] = append(c.groups[key], g.Path())
	}
	return nil
}

func (c *fakeCycler) Release(_ context.Context, g *cgroups.Group) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, g.Path())
	return nil
}
func (c *fakeCycler) ThawAll(context.Context) error { return nil }

// NextPeriod: 100 ms periods from the Unix epoch.
func (c *fakeCycler) NextPeriod(t time.Time) time.Time {
	return t.Truncate(100 * time.Millisecond).Add(100 * time.Millisecond)
}
func (c *fakeCycler) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (c *fakeCycler) Status() []duty.KeyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []duty.KeyStatus
	for k, d := range c.duty {
		out = append(out, duty.KeyStatus{Key: k, Duty: d})
	}
	return out
}

func (c *fakeCycler) get(key string) (float64, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.duty[key], c.groups[key]
}

type fakeSuspender struct {
	suspended map[int]bool
	failPID   int
}

func (s *fakeSuspender) Suspend(_ context.Context, pid int) error {
	if pid == s.failPID {
		return errors.New("cuda-checkpoint: driver too old")
	}
	s.suspended[pid] = true
	return nil
}

func (s *fakeSuspender) Resume(_ context.Context, pid int) error {
	delete(s.suspended, pid)
	return nil
}

type fakeEvictor struct {
	reqs  []qos.EvictionRequest
	cands [][]qos.EvictionCandidate
}

func (e *fakeEvictor) Submit(r qos.EvictionRequest, c []qos.EvictionCandidate) error {
	e.reqs = append(e.reqs, r)
	e.cands = append(e.cands, c)
	return nil
}

const (
	mgrLSUID    = types.UID("ls-1")
	mgrBatchUID = types.UID("batch-1")
	lsCg        = "kubepods/burstable/podls-1"
	batchCg     = "kubepods/understory-batch/podbatch-1"
)

type rig struct {
	m      *Manager
	cyc    *fakeCycler
	ev     *fakeEvictor
	sus    *fakeSuspender
	reg    *prometheus.Registry
	policy qos.GPUThrottlePolicy
}

func newRig(t *testing.T, src Source, suspend bool) *rig {
	t.Helper()
	root := cgroupstest.NewRoot(t, cgroupstest.Hybrid)
	cgroupstest.AddGroup(t, root, cgroupstest.Hybrid, batchCg)
	h := cgroups.OpenLayout(root, cgroups.LayoutHybrid)
	pods := PodMap{
		mgrLSUID: {UID: mgrLSUID, Namespace: "web", Name: "infer", Class: qos.ClassLS, Cgroup: lsCg,
			Containers: map[string]string{"c1": "server"}},
		mgrBatchUID: {UID: mgrBatchUID, Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: batchCg,
			Containers: map[string]string{"c2": "trainer"}},
	}
	r := &rig{cyc: newFakeCycler(), ev: &fakeEvictor{}, reg: prometheus.NewRegistry(),
		sus: &fakeSuspender{suspended: map[int]bool{}}}
	r.policy = qos.DefaultGPUThrottlePolicy()
	r.policy.StarveAfter.Duration = time.Second
	r.policy.Hold.Duration = 200 * time.Millisecond
	gm, err := metrics.NewGPU(r.reg)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Source: src, Pods: func() PodView { return pods }, Groups: h, Cycler: r.cyc, Policy: r.policy,
		Period: 50 * time.Millisecond, Evict: r.ev, Metrics: gm, ProcRoot: t.TempDir()}
	if suspend {
		o.Suspend = r.sus
	}
	if r.m, err = NewManager(o); err != nil {
		t.Fatal(err)
	}
	return r
}

func device(procs ...Process) Device {
	return Device{Index: 0, UUID: "GPU-0", Model: "NVIDIA A100", MemTotal: 40 << 30, MemUsed: 8 << 30,
		Util: 50, Healthy: true, Processes: procs}
}

var (
	lsProc = func(util float64) Process {
		return Process{PID: 100, SMUtil: util, Pod: PodRef{UID: mgrLSUID, ContainerID: "c1"}}
	}
	batchProc = Process{PID: 200, SMUtil: 60, MemUsed: 4 << 30, Pod: PodRef{UID: mgrBatchUID, ContainerID: "c2"}}
	strayProc = func(util float64) Process { return Process{PID: 300, SMUtil: util} }
	sample    = func(d ...Device) func() (Sample, error) {
		return func() (Sample, error) { return Sample{Devices: d}, nil }
	}
)

func TestManagerTraces(t *testing.T) {
	t.Parallel()
	idle := sample(device(batchProc))
	burst := sample(device(lsProc(80), batchProc))
	lsIdle := sample(device(lsProc(0), batchProc))
	lost := func() (Sample, error) {
		d := device()
		d.Healthy, d.Err, d.Fault = false, "GPU is lost", ErrDeviceLost
		return Sample{Devices: []Device{d}}, nil
	}
	nvmlGone := func() (Sample, error) { return Sample{}, ErrNoNVML }
	stray := sample(device(strayProc(40), batchProc))
	type step struct {
		src      func() (Sample, error)
		wantDuty float64 // the cycler's duty for gpu0 after the step: 1 frozen solid, 0 not
		wantWhy  string
	}
	const frozen = 1.0
	tests := []struct {
		name  string
		steps []step
	}{
		{"batch alone runs free", []step{{idle, 0, qos.GPUReasonIdle}, {idle, 0, qos.GPUReasonIdle}}},
		{"LS burst freezes at once", []step{{idle, 0, qos.GPUReasonIdle}, {burst, frozen, qos.GPUReasonLSUtil}}},
		// The driver's sample lags the arrival: frozen on the process alone.
		{"LS arrival freezes at once", []step{{idle, 0, qos.GPUReasonIdle}, {lsIdle, frozen, qos.GPUReasonLSArrived}}},
		// Hold 200 ms: frozen at 0, 50, 100, 150 ms, thawed at 200 ms, and stays thawed.
		{"LS holding its context but idle thaws within hold", []step{{lsIdle, frozen, qos.GPUReasonLSArrived},
			{lsIdle, frozen, qos.GPUReasonHold}, {lsIdle, frozen, qos.GPUReasonHold}, {lsIdle, frozen, qos.GPUReasonHold},
			{lsIdle, 0, qos.GPUReasonIdle}, {lsIdle, 0, qos.GPUReasonIdle}}},
		{"flapping LS holds the freeze", []step{{burst, frozen, qos.GPUReasonLSUtil}, {idle, frozen, qos.GPUReasonHold},
			{burst, frozen, qos.GPUReasonLSUtil}, {idle, frozen, qos.GPUReasonHold}}},
		{"a lost GPU keeps its freeze", []step{{burst, frozen, qos.GPUReasonLSUtil}, {lost, frozen, ""}}},
		{"NVML failing holds every freeze", []step{{burst, frozen, qos.GPUReasonLSUtil}, {nvmlGone, frozen, ""}}},
		{"an unattributed process counts as LS", []step{{stray, frozen, qos.GPUReasonLSUtil}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := &scriptSource{}
			for _, s := range tt.steps {
				src.steps = append(src.steps, s.src)
			}
			r := newRig(t, src, false)
			now := time.Unix(1_700_000_000, 0)
			for i, s := range tt.steps {
				r.m.step(context.Background(), now)
				now = now.Add(50 * time.Millisecond)
				d, groups := r.cyc.get("gpu0")
				if d != s.wantDuty {
					t.Fatalf("step %d: duty %v, want %v (status %+v)", i, d, s.wantDuty, r.m.Status().GPUs)
				}
				if d > 0 && (len(groups) != 1 || groups[0] != batchCg) {
					t.Fatalf("step %d: frozen groups %v, want only the batch pod's %s", i, groups, batchCg)
				}
				st := r.m.Status()
				if s.wantWhy != "" && (len(st.GPUs) != 1 || st.GPUs[0].Decision.Reason != s.wantWhy ||
					st.GPUs[0].Decision.Lever != qos.GPULeverFreeze || st.GPUs[0].MPS || st.MPS != nil) {
					t.Fatalf("step %d: status %+v, want reason %s with the freeze lever, no MPS", i, st.GPUs, s.wantWhy)
				}
			}
		})
	}
}

// TestManagerRestores: after LS leaves, batch is thawed once the hold has passed.
func TestManagerRestores(t *testing.T) {
	t.Parallel()
	src := &scriptSource{steps: []func() (Sample, error){sample(device(lsProc(90), batchProc)), sample(device(batchProc))}}
	r := newRig(t, src, false)
	now := time.Unix(1_700_000_000, 0)
	for i := 0; i < 20; i++ {
		r.m.step(context.Background(), now)
		now = now.Add(50 * time.Millisecond)
	}
	if d, _ := r.cyc.get("gpu0"); d != 0 {
		t.Fatalf("duty %v one second after LS left, want 0 (thawed)", d)
	}
}

// TestManagerEscalates: batch frozen past starveAfter is suspended when suspend is on
// (and resumed once LS leaves), else evicted through the evictor.
func TestManagerEscalates(t *testing.T) {
	t.Parallel()
	burst := sample(device(lsProc(90), batchProc))
	gone := sample(device(batchProc))
	t.Run("evict", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, &scriptSource{steps: []func() (Sample, error){burst}}, false)
		now := time.Unix(1_700_000_000, 0)
		for i := 0; i < 30; i++ {
			r.m.step(context.Background(), now)
			now = now.Add(50 * time.Millisecond)
		}
		if len(r.ev.reqs) != 1 {
			t.Fatalf("%d eviction requests, want 1 (rate-limited per GPU)", len(r.ev.reqs))
		}
		req, c := r.ev.reqs[0], r.ev.cands[0]
		if req.Reason != qos.EvictReasonGPUStarvation || req.GPU != 0 || len(c) != 1 || c[0].UID != mgrBatchUID {
			t.Fatalf("request %+v candidates %+v", req, c)
		}
		if got := r.m.Status().GPUs[0].Escalation; got != EscalationEvict {
			t.Fatalf("escalation %q", got)
		}
	})
	t.Run("suspend then resume", func(t *testing.T) {
		t.Parallel()
		src := &scriptSource{}
		for i := 0; i < 30; i++ {
			src.steps = append(src.steps, burst)
		}
		src.steps = append(src.steps, gone)
		r := newRig(t, src, true)
		now := time.Unix(1_700_000_000, 0)
		for i := 0; i < 30; i++ {
			r.m.step(context.Background(), now)
			now = now.Add(50 * time.Millisecond)
		}
		if !r.sus.suspended[200] || len(r.ev.reqs) != 0 {
			t.Fatalf("suspended %v, evictions %d: want pid 200 suspended and no eviction", r.sus.suspended, len(r.ev.reqs))
		}
		if len(r.cyc.released) == 0 || r.cyc.released[0] != batchCg {
			t.Fatalf("released %v: the pod must be thawed before cuda-checkpoint", r.cyc.released)
		}
		if d, _ := r.cyc.get("gpu0"); d != 0 {
			t.Fatalf("a suspended pod stays out of the duty cycle; duty %v", d)
		}
		for i := 0; i < 40 && len(r.sus.suspended) > 0; i++ {
			r.m.step(context.Background(), now)
			now = now.Add(50 * time.Millisecond)
		}
		if len(r.sus.suspended) != 0 || len(r.m.Status().Suspended) != 0 {
			t.Fatalf("still suspended after LS left: %v", r.sus.suspended)
		}
	})
	t.Run("suspend failing falls back to eviction", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, &scriptSource{steps: []func() (Sample, error){burst}}, true)
		r.sus.failPID = 200
		now := time.Unix(1_700_000_000, 0)
		for i := 0; i < 30; i++ {
			r.m.step(context.Background(), now)
			now = now.Add(50 * time.Millisecond)
		}
		if len(r.ev.reqs) != 1 {
			t.Fatalf("%d eviction requests, want 1", len(r.ev.reqs))
		}
	})
}

func TestNewManagerRejects(t *testing.T) {
	t.Parallel()
	bad := qos.DefaultGPUThrottlePolicy()
	bad.LSUtilOnPercent = 200
	old := qos.DefaultGPUThrottlePolicy()
	old.RemovedMaxDuty = new(float64)
	ok := Options{Source: &scriptSource{}, Pods: func() PodView { return PodMap(nil) },
		Groups: cgroups.OpenLayout(t.TempDir(), cgroups.LayoutHybrid), Cycler: newFakeCycler(),
		Policy: qos.DefaultGPUThrottlePolicy()}
	with := func(f func(*Options)) Options {
		o := ok
		f(&o)
		return o
	}
	if _, err := NewManager(ok); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for name, o := range map[string]Options{
		"no source":                      {},
		"bad policy":                     with(func(o *Options) { o.Policy = bad }),
		"a removed duty-cycle key":       with(func(o *Options) { o.Policy = old }),
		"an MPS server without planning": with(func(o *Options) { o.MPS = &fakeMPS{} }),
	} {
		if _, err := NewManager(o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestManagerForgetsGone: a GPU that leaves the scrape loses its cycler key, and a batch
// cgroup no GPU shows any more is dropped (and loaded again when it comes back).
func TestManagerForgetsGone(t *testing.T) {
	t.Parallel()
	gpu1 := func(procs ...Process) Device {
		d := device(procs...)
		d.Index, d.UUID = 1, "GPU-1"
		return d
	}
	both := sample(device(lsProc(80), batchProc), gpu1(lsProc(80), batchProc))
	only0 := sample(device(lsProc(80), batchProc))
	noBatch := sample(device(lsProc(80)))
	src := &scriptSource{steps: []func() (Sample, error){both, only0, noBatch, only0}}
	r := newRig(t, src, false)
	now := time.Unix(1_700_000_000, 0)
	step := func() {
		r.m.step(context.Background(), now)
		now = now.Add(50 * time.Millisecond)
	}

	step()
	for _, key := range []string{"gpu0", "gpu1"} {
		if d, groups := r.cyc.get(key); d == 0 || len(groups) != 1 || groups[0] != batchCg {
			t.Fatalf("%s: duty %v groups %v, want the batch pod cut", key, d, groups)
		}
	}
	st := r.m.Status()
	if len(st.GPUs) != 2 || !slices.Equal(st.GPUs[1].LSPods, []string{"web/infer"}) ||
		!slices.Equal(st.GPUs[1].BatchPods, []string{"ml/train"}) {
		t.Fatalf("status GPUs %+v, want web/infer and ml/train on both", st.GPUs)
	}
	if got := r.m.Inventory(); len(got) != 2 || got[1] != (DeviceID{Index: 1, UUID: "GPU-1", Model: "NVIDIA A100"}) {
		t.Fatalf("inventory %+v", got)
	}

	step() // GPU 1 vanished
	if d, groups := r.cyc.get("gpu1"); d != 0 || groups != nil {
		t.Fatalf("gpu1 gone: duty %v groups %v, want its key removed", d, groups)
	}
	if d, _ := r.cyc.get("gpu0"); d == 0 {
		t.Fatal("gpu0 lost its cut with gpu1")
	}
	if _, held := r.m.groups[batchCg]; !held || len(r.m.Inventory()) != 1 {
		t.Fatalf("handles %v inventory %v: gpu0 still shows the batch pod", r.m.groups, r.m.Inventory())
	}

	step() // the batch pod left every GPU
	if len(r.m.groups) != 0 {
		t.Fatalf("handles %v kept after the batch pod left every GPU", r.m.groups)
	}
	if st := r.m.Status(); len(st.GPUs) != 1 || st.GPUs[0].BatchPods != nil {
		t.Fatalf("status %+v, want no batch pod", st.GPUs)
	}

	step() // and came back
	if d, groups := r.cyc.get("gpu0"); d == 0 || len(groups) != 1 || groups[0] != batchCg {
		t.Fatalf("batch pod back: duty %v groups %v", d, groups)
	}
}

// TestNextStep: the loop steps on a grid of its period anchored at the duty cycle's
// period starts, about one period apart, and keeps its pace from when a step began.
func TestNextStep(t *testing.T) {
	t.Parallel()
	a := time.Unix(1_700_000_000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		now  time.Duration // after a
		wait time.Duration
		want time.Duration // after a
	}{
		{0, 50 * ms, 50 * ms},
		{3 * ms, 50 * ms, 50 * ms},          // a step a little late: the grid holds
		{24 * ms, 50 * ms, 50 * ms},         // 26 ms on: more than half a period
		{26 * ms, 50 * ms, 100 * ms},        // 74 ms on, back on the grid
		{-10 * ms, 50 * ms, 50 * ms},        // now before the anchor
		{-40 * ms, 50 * ms, 0},              // floor, not truncation
		{-50 * ms, 50 * ms, 0},              // exactly on the grid before the anchor
		{10 * ms, time.Second, time.Second}, // the slow loop: on the same grid
		{700 * ms, time.Second, 2 * time.Second},
	} {
		if got := nextStep(a.Add(tc.now), tc.wait, a).Sub(a); got != tc.want {
			t.Errorf("nextStep(a%+v, %v) = a%+v, want a%+v", tc.now, tc.wait, got, tc.want)
		}
	}
	for i := range 1000 {
		now := a.Add(time.Duration(i*7919) * time.Microsecond)
		wait := []time.Duration{10 * ms, 50 * ms, 70 * ms, time.Second}[i%4]
		next := nextStep(now, wait, a)
		if d := next.Sub(now); d <= wait/2 || d > wait+wait/2 || next.Sub(a)%wait != 0 {
			t.Fatalf("nextStep(%v after a, %v) = %v after now, off the grid by %v", now.Sub(a), wait, d,
				next.Sub(a)%wait)
		}
	}
}
