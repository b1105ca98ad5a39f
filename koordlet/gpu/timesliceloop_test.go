package gpu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// driverSource is a scriptSource that tells the driver's version, as the collector does.
type driverSource struct {
	*scriptSource
	version string
}

func (s driverSource) DriverVersion() string { return s.version }

// tsRig is a Manager with the time slices on, over a scripted source, with the shim's
// records and reports in a temporary directory and a fake /proc.
type tsRig struct {
	m        *Manager
	ts       *Timeslices
	reg      *prometheus.Registry
	procRoot string
	now      time.Time

	mu     sync.Mutex
	events []SelfSetEvent
}

func newTSRig(t *testing.T, src Source) *tsRig {
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
	r := &tsRig{reg: prometheus.NewRegistry(), procRoot: t.TempDir(), now: time.Unix(1_700_000_000, 0)}
	var err error
	r.ts, err = NewTimeslices(TimesliceOptions{Policy: qos.DefaultGPUTimeslicePolicy(), Directory: t.TempDir(),
		Library: "/var/lib/understory/tsg/lib/libunderstory-tsg.so"})
	if err != nil {
		t.Fatal(err)
	}
	gm, err := metrics.NewGPU(r.reg)
	if err != nil {
		t.Fatal(err)
	}
	r.m, err = NewManager(Options{Source: src, Pods: func() PodView { return pods }, Groups: h, Cycler: newFakeCycler(),
		Policy: qos.DefaultGPUThrottlePolicy(), Period: 50 * time.Millisecond, Metrics: gm, ProcRoot: r.procRoot,
		Timeslices: r.ts, OnSelfSet: func(ev SelfSetEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	// The processes' own PID namespaces: NVML's 100 and 200 are 1 and 7 there.
	for pid, ns := range map[string]string{"100": "1", "200": "7"} {
		dir := filepath.Join(r.procRoot, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		status := "Name:\tpython3\nTgid:\t" + pid + "\nPid:\t" + pid + "\nNSpid:\t" + pid + "\t" + ns + "\n"
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *tsRig) step(d time.Duration) Status {
	r.now = r.now.Add(d)
	r.m.step(context.Background(), r.now)
	return r.m.Status()
}

// plan asks the planner for the rig's containers on GPU 0, as the NRI plugin would.
func (r *tsRig) plan(t *testing.T, batch bool) devices.TimesliceClient {
	t.Helper()
	req := devices.TimesliceRequest{GPUs: []devices.GPU{{Index: 0, UUID: "GPU-0"}}, PodUID: mgrLSUID,
		Namespace: "web", Name: "infer", Container: "server", RequestMilli: 500}
	if batch {
		req = devices.TimesliceRequest{GPUs: []devices.GPU{{Index: 0, UUID: "GPU-0"}}, PodUID: mgrBatchUID,
			Namespace: "ml", Name: "train", Container: "trainer", Batch: true, RequestMilli: 300}
	}
	c, ok, err := r.ts.TimesliceClient(req)
	if err != nil || !ok {
		t.Fatalf("planning %+v: %+v, %v, %v", req, c, ok, err)
	}
	return c
}

func (r *tsRig) selfSets() []SelfSetEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]SelfSetEvent(nil), r.events...)
}

// appendReport appends shim report lines to a file of a report directory.
func appendReport(t *testing.T, dir, name string, events ...timeslice.Event) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, e := range events {
		if _, err := f.WriteString(e.String() + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// allocSet is the shim's line for a group it set to us and read back as rb.
func allocSet(pid int, us, rb uint64) timeslice.Event {
	return timeslice.Event{UnixNano: 1_700_000_000_000_000_000, PID: pid, Kind: timeslice.KindAlloc,
		Mode: timeslice.ModeSet, Driver: "580.95.05", Client: 0xc1d00001, Object: 0x5c000002, AskedUS: us, HasAsked: true,
		Set:      timeslice.Result{Done: true},
		Readback: timeslice.Result{Done: true, ValueUS: rb}}
}

// appSet is the shim's line for the application's own SET_TIMESLICE of app µs, which
// it rewrote to us.
func appSet(pid int, us, app uint64) timeslice.Event {
	e := allocSet(pid, us, us)
	e.Kind, e.AppUS, e.HasApp, e.UnixNano = timeslice.KindAppSet, app, true, e.UnixNano+1
	return e
}

// TestTimesliceLoopUnconfirmed is a tenant's path through the loop: the planner's slices
// (an unread GPU is LS's: batch the shortest), a report written into the batch
// container's directory shown in /status per context, every context unconfirmed for
// want of an outside observer and the GPU on the freeze, the metrics; then an
// application's own 10 ms slice: the self-set verdict and one Event.
func TestTimesliceLoopUnconfirmed(t *testing.T) {
	t.Parallel()
	src := driverSource{&scriptSource{steps: []func() (Sample, error){sample(device(lsProc(80), batchProc))}},
		"580.95.05"}
	r := newTSRig(t, src)
	batch, ls := r.plan(t, true), r.plan(t, false)
	if batch.SliceUS != 100 || ls.SliceUS != 10000 {
		t.Fatalf("slices: batch %d µs, LS %d µs; want 100 and 10000 on a GPU not read yet", batch.SliceUS, ls.SliceUS)
	}
	if fi, err := os.Stat(batch.ReportDir); err != nil || fi.Mode().Perm() != 0o733 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("report directory %s: %v, %v; want 1733", batch.ReportDir, fi.Mode(), err)
	}
	appendReport(t, batch.ReportDir, "tsg-7.log", allocSet(7, 100, 100))
	// A line of a process not on the GPU (it exited) and a malformed one: ignored.
	appendReport(t, batch.ReportDir, "tsg-9.log", appSet(9, 100, 50000))
	if err := os.WriteFile(filepath.Join(batch.ReportDir, "tsg-8.log"), []byte("tsg/1 garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	s := r.step(0)
	g := s.GPUs[0]
	if g.Decision.Lever != qos.GPULeverFreeze || !g.Decision.Frozen {
		t.Fatalf("decision %+v; want the freeze lever, frozen (LS at 80 %%)", g.Decision)
	}
	ts := g.Timeslice
	if ts == nil || ts.Lever != qos.GPULeverFreeze || ts.Reason != qos.GPUTimesliceReasonUnconfirmed ||
		!strings.Contains(ts.Detail, "no outside observation") || ts.BatchSliceUs != 120 || ts.LSSliceUs != 10000 {
		t.Fatalf("time-slice status %+v; want freeze, slice-unconfirmed for want of an outside observer", ts)
	}
	if len(ts.Contexts) != 2 {
		t.Fatalf("contexts %+v; want the LS process's and the batch group's", ts.Contexts)
	}
	lsCtx, bc := ts.Contexts[0], ts.Contexts[1]
	if lsCtx.Pod != "web/infer" || lsCtx.Container != "server" || lsCtx.PID != 100 || lsCtx.AskedUs != 10000 ||
		lsCtx.Shim != nil || lsCtx.Verdict != qos.GPUTimesliceUnconfirmed {
		t.Fatalf("LS context %+v", lsCtx)
	}
	if bc.Pod != "ml/train" || bc.Container != "trainer" || bc.PID != 200 || bc.ContainerPID != 7 ||
		bc.Context != "client 0xc1d00001 group 0x5c000002" || bc.Class != qos.ClassBatch || bc.AskedUs != 100 ||
		// LS's demand read now (80 %) and the requests leave batch 200 milli: 120 µs.
		bc.WantUs != 120 || !bc.Reask ||
		bc.Verdict != qos.GPUTimesliceUnconfirmed || !strings.Contains(bc.Why, "no outside observation") ||
		bc.Shim == nil || *bc.Shim != (ShimReport{Mode: "set", Driver: "580.95.05", AskedUs: 100, Status: "ok",
		ReadBack: "ok", ReadBackUs: 100}) {
		t.Fatalf("batch context %+v (shim %+v)", bc, bc.Shim)
	}
	if n := s.Timeslice; n == nil || n.Observer != TimesliceObserver || n.Driver != "580.95.05" || !n.DriverSupported ||
		len(n.Clients) != 2 || n.Library == "" {
		t.Fatalf("node time-slice status %+v", n)
	}
	if b, err := json.Marshal(s); err != nil || !strings.Contains(string(b), `"reason":"slice-unconfirmed"`) {
		t.Fatalf("/status JSON: %v\n%s", err, b)
	}
	const want = `
# HELP understory_gpu_timeslice_seconds A pod's GPU time slice on the GPU, the longest over its contexts: kind="asked" the slice the agent asked of its shim, kind="readback" the slice its shim read back from the driver (the tenant's word); only with gpu.timeslice.enabled.
# TYPE understory_gpu_timeslice_seconds gauge
understory_gpu_timeslice_seconds{UUID="GPU-0",gpu="0",kind="asked",modelName="NVIDIA A100",namespace="ml",pod="train"} 0.0001
understory_gpu_timeslice_seconds{UUID="GPU-0",gpu="0",kind="readback",modelName="NVIDIA A100",namespace="ml",pod="train"} 0.0001
understory_gpu_timeslice_seconds{UUID="GPU-0",gpu="0",kind="asked",modelName="NVIDIA A100",namespace="web",pod="infer"} 0.01
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "understory_gpu_timeslice_seconds"); err != nil {
		t.Fatal(err)
	}
	if len(r.selfSets()) != 0 {
		t.Fatalf("self-set events %+v before any", r.selfSets())
	}

	// The application sets itself 10 ms (the shim rewrote it to 100 µs): the next read of
	// the reports, a full-scrape period later, finds it.
	appendReport(t, batch.ReportDir, "tsg-7.log", appSet(7, 100, 10000))
	s = r.step(50 * time.Millisecond)
	if ts := s.GPUs[0].Timeslice; ts.Reason != qos.GPUTimesliceReasonUnconfirmed {
		t.Fatalf("reports read again before a full-scrape period: %+v", ts)
	}
	s = r.step(time.Second)
	ts = s.GPUs[0].Timeslice
	if ts.Lever != qos.GPULeverFreeze || ts.Reason != qos.GPUTimesliceReasonSelfSet ||
		!strings.Contains(ts.Detail, "set itself a slice of 10000 µs") {
		t.Fatalf("after the application's set: %+v", ts)
	}
	bc = ts.Contexts[1]
	if bc.Verdict != qos.GPUTimesliceSelfSet || bc.Shim.AppSets != 1 || bc.Shim.AppAskedUs != 10000 ||
		bc.Shim.AppStatus != "ok" {
		t.Fatalf("batch context %+v (shim %+v)", bc, bc.Shim)
	}
	evs := r.selfSets()
	if len(evs) != 1 || evs[0].Pod != (EventPod{UID: mgrBatchUID, Namespace: "ml", Name: "train"}) ||
		evs[0].Container != "trainer" || evs[0].AppUs != 10000 || evs[0].AgentUs != 120 || evs[0].PID != 200 ||
		evs[0].ContainerPID != 7 || !strings.Contains(evs[0].Message, "set its own GPU time slice to 10000 µs") {
		t.Fatalf("self-set events %+v; want one for ml/train", evs)
	}
	// Once per context: the next reads report it no more.
	r.step(time.Second)
	r.step(time.Second)
	if n := len(r.selfSets()); n != 1 {
		t.Fatalf("%d self-set events after more reads; want 1", n)
	}
}

// TestTimesliceLoopLevers: the driver's version decides before any context, an MPS GPU
// keeps the MPS lever's reason, and where the choice says timeslice (a batch container
// given the shim that has no context yet) the throttle's decision takes that lever.
func TestTimesliceLoopLevers(t *testing.T) {
	t.Parallel()
	t.Run("driver unknown", func(t *testing.T) {
		t.Parallel()
		r := newTSRig(t, &scriptSource{steps: []func() (Sample, error){sample(device(lsProc(80), batchProc))}})
		r.plan(t, true)
		ts := r.step(0).GPUs[0].Timeslice
		if ts.Lever != qos.GPULeverFreeze || ts.Reason != qos.GPUTimesliceReasonUnconfirmed ||
			!strings.Contains(ts.Detail, "driver's version is unknown") {
			t.Fatalf("status %+v", ts)
		}
	})
	t.Run("batch given the shim, no context yet: the timeslice lever", func(t *testing.T) {
		t.Parallel()
		r := newTSRig(t, driverSource{&scriptSource{steps: []func() (Sample, error){sample(device(lsProc(10)))}},
			"580.95.05"})
		r.plan(t, true)
		g := r.step(0).GPUs[0]
		if g.Timeslice.Lever != qos.GPULeverTimeslice || g.Timeslice.Reason != qos.GPUTimesliceReasonNoBatchContext ||
			g.Decision.Lever != qos.GPULeverTimeslice || g.Decision.Frozen || g.Decision.Reason != qos.GPUReasonNoBatch {
			t.Fatalf("GPU %+v, time slices %+v", g.Decision, g.Timeslice)
		}
	})
	t.Run("no batch: none, the freeze lever in force", func(t *testing.T) {
		t.Parallel()
		r := newTSRig(t, driverSource{&scriptSource{steps: []func() (Sample, error){sample(device(lsProc(10)))}},
			"580.95.05"})
		g := r.step(0).GPUs[0]
		if g.Timeslice.Lever != qos.GPULeverNone || g.Decision.Lever != qos.GPULeverFreeze {
			t.Fatalf("GPU %+v, time slices %+v", g.Decision, g.Timeslice)
		}
	})
	t.Run("lost GPU: unknown", func(t *testing.T) {
		t.Parallel()
		r := newTSRig(t, driverSource{&scriptSource{steps: []func() (Sample, error){func() (Sample, error) {
			d := device()
			d.Healthy = false
			return Sample{Devices: []Device{d}}, nil
		}}}, "580.95.05"})
		ts := r.step(0).GPUs[0].Timeslice
		if ts.Lever != qos.GPULeverFreeze || ts.Reason != qos.GPUTimesliceReasonUnknown || len(ts.Contexts) != 0 {
			t.Fatalf("status %+v", ts)
		}
	})
}
