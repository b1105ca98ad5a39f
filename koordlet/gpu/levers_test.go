package gpu

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// fakeMPS is an MPS control daemon that is ready when told, with the servers and
// clients it lists (none until setServers).
type fakeMPS struct {
	ready   atomic.Bool
	servers atomic.Pointer[mps.ServerList]
}

func (f *fakeMPS) Ready() bool     { return f.ready.Load() }
func (f *fakeMPS) PipeDir() string { return "/run/nvidia-mps" }

func (f *fakeMPS) Servers() mps.ServerList {
	if l := f.servers.Load(); l != nil {
		return *l
	}
	return mps.ServerList{}
}

// setServers makes the daemon list servers (a new list, as a check reads one).
func (f *fakeMPS) setServers(s []mps.Server) {
	f.servers.Store(&mps.ServerList{Servers: s, Gen: f.Servers().Gen + 1})
}

// mpsRig is a Manager with an MPS server, partitions and a lever-event recorder, over a
// scripted source whose next sample the test sets.
type mpsRig struct {
	m      *Manager
	cyc    *fakeCycler
	srv    *fakeMPS
	parts  *Partitions
	mu     sync.Mutex
	events []LeverEvent
	next   Sample
	now    time.Time
	// procRoot is the rig's fake /proc.
	procRoot string
}

const mpsServerPID = 400

func newMPSRig(t *testing.T) *mpsRig {
	t.Helper()
	root := cgroupstest.NewRoot(t, cgroupstest.Hybrid)
	cgroupstest.AddGroup(t, root, cgroupstest.Hybrid, batchCg)
	procRoot := t.TempDir()
	// The MPS server: a process of no pod, known by its command name.
	if err := os.MkdirAll(filepath.Join(procRoot, "400"), 0o755); err != nil {
		t.Fatal(err)
	}
	// As the kernel shows it: comm truncated to 15 bytes, the full name in cmdline.
	if err := os.WriteFile(filepath.Join(procRoot, "400", "comm"), []byte(mpsServerComm+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(procRoot, "400", "cmdline"), []byte(mpsServerName+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	pods := PodMap{
		mgrLSUID: {UID: mgrLSUID, Namespace: "web", Name: "infer", Class: qos.ClassLS, Cgroup: lsCg,
			Containers: map[string]string{"c1": "server"}},
		mgrBatchUID: {UID: mgrBatchUID, Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: batchCg,
			Containers: map[string]string{"c2": "trainer"}},
	}
	r := &mpsRig{cyc: newFakeCycler(), srv: &fakeMPS{}, now: time.Unix(1_700_000_000, 0), procRoot: procRoot}
	r.srv.ready.Store(true)
	policy := qos.DefaultGPUThrottlePolicy()
	policy.Hold.Duration = 200 * time.Millisecond
	r.parts = NewPartitions(policy.MPS)
	src := &scriptSource{steps: []func() (Sample, error){func() (Sample, error) { return r.next, nil }}}
	var err error
	r.m, err = NewManager(Options{Source: src, Pods: func() PodView { return pods },
		Groups: cgroups.OpenLayout(root, cgroups.LayoutHybrid), Cycler: r.cyc, Policy: policy,
		Period: 50 * time.Millisecond, ProcRoot: procRoot, MPS: r.srv, Partitions: r.parts,
		OnLever: func(e LeverEvent) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, e)
		}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// step runs one loop step over procs on GPU 0 and returns its decision.
func (r *mpsRig) step(t *testing.T, procs ...Process) qos.GPUThrottleDecision {
	t.Helper()
	r.next = Sample{Devices: []Device{device(procs...)}}
	r.m.step(context.Background(), r.now)
	r.now = r.now.Add(50 * time.Millisecond)
	st := r.m.Status()
	if len(st.GPUs) != 1 {
		t.Fatalf("status %+v", st)
	}
	d, _ := r.cyc.get("gpu0")
	if want := st.GPUs[0].Decision.Duty; d != want {
		t.Fatalf("cycler duty %v, decision %v", d, want)
	}
	return st.GPUs[0].Decision
}

func (r *mpsRig) nEvents() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *mpsRig) plan(t *testing.T, batch bool) devices.MPSClient {
	t.Helper()
	req := devices.MPSRequest{GPU: devices.GPU{Index: 0, UUID: "GPU-0"}, PodUID: mgrLSUID, Namespace: "web",
		Name: "infer", Container: "server"}
	if batch {
		req = devices.MPSRequest{GPU: devices.GPU{Index: 0, UUID: "GPU-0"}, PodUID: mgrBatchUID, Namespace: "ml",
			Name: "train", Container: "trainer", Batch: true, RequestMilli: 200}
	}
	c, ok, err := r.parts.MPSClient(req)
	if err != nil || !ok {
		t.Fatalf("MPSClient(%+v) = %+v, %v, %v", req, c, ok, err)
	}
	return c
}

// TestManagerMPSLever: where LS and batch are both clients of the agent's MPS server, LS
// within its partition never freezes batch, not even when it arrives; LS outgrowing the
// partition (caps are fixed) freezes batch, fires the lever hook once, and thaws after
// the hold; a process that is not a client turns the GPU back to the freeze lever. The
// MPS server's own process is neither LS nor batch.
func TestManagerMPSLever(t *testing.T) {
	t.Parallel()
	r := newMPSRig(t)
	server := Process{PID: mpsServerPID}
	// Before the loop has seen the GPU, no client is planned.
	if _, ok, err := r.parts.MPSClient(devices.MPSRequest{GPU: devices.GPU{UUID: "GPU-0"}, PodUID: "x",
		Container: "c"}); ok || err != nil {
		t.Fatalf("a client before the first step: %v %v", ok, err)
	}
	if d := r.step(t, server); d.Frozen || d.Lever != qos.GPULeverFreeze {
		t.Fatalf("the MPS server alone: %+v", d)
	}
	ls, batch := r.plan(t, false), r.plan(t, true)
	if ls != (devices.MPSClient{PipeDir: "/run/nvidia-mps", ActiveThreadPercent: 75, Priority: 0}) ||
		batch != (devices.MPSClient{PipeDir: "/run/nvidia-mps", ActiveThreadPercent: 25, Priority: 1,
			PinnedMemLimitMiB: 8192}) {
		t.Fatalf("clients LS %+v batch %+v, want 75 %% at priority 0 and 25 %% at priority 1 with 8192 MiB", ls, batch)
	}

	// LS arrives and works within its cap: batch runs beside it.
	for i := range 10 {
		d := r.step(t, server, lsProc(45), batchProc)
		if d.Frozen || d.Lever != qos.GPULeverMPS || d.Reason != qos.GPUReasonMPSWithinCap || d.LSCapPercent != 75 ||
			d.BatchCapPercent != 25 || d.BatchMemLimitMiB != 8192 || (i == 0 && !d.LSArrived) {
			t.Fatalf("step %d, LS within its cap: %+v", i, d)
		}
	}
	st := r.m.Status()
	if !st.GPUs[0].MPS || st.MPS == nil || !st.MPS.Ready || len(st.MPS.Clients) != 2 {
		t.Fatalf("status: GPU MPS %v, MPS %+v", st.GPUs[0].MPS, st.MPS)
	}
	// /status shows each client's memory limit: batch's share, none for LS.
	for _, c := range st.MPS.Clients {
		if want := map[bool]uint64{true: 8192}[c.Batch]; c.MemLimitMiB != want || c.MemReason == "" {
			t.Fatalf("status client %+v, want a memory limit of %d MiB with its reason", c, want)
		}
	}
	// The partitions protect LS: the GPU is probed, not read in full every period.
	if c := st.GPUs[0].Cadence; c != CadenceMPS {
		t.Fatalf("cadence %q within the partitions, want %q", c, CadenceMPS)
	}

	// LS outgrows the partition: frozen, one event naming the batch pod.
	for i := range 3 {
		d := r.step(t, server, lsProc(72), batchProc)
		if !d.Frozen || d.Reason != qos.GPUReasonMPSCapStale || d.ProtectedPercent != 75 {
			t.Fatalf("step %d, LS above its partition: %+v", i, d)
		}
	}
	if n := r.nEvents(); n != 1 {
		t.Fatalf("%d lever events, want 1 per freeze", n)
	}
	if c := r.m.Status().GPUs[0].Cadence; c != CadenceFast {
		t.Fatalf("cadence %q with batch frozen out of its partition, want %q", c, CadenceFast)
	}
	r.mu.Lock()
	e := r.events[0]
	r.mu.Unlock()
	if e.Reason != qos.GPUReasonMPSCapStale || e.GPU != 0 || e.UUID != "GPU-0" || len(e.BatchPods) != 1 ||
		e.BatchPods[0] != (EventPod{UID: mgrBatchUID, Namespace: "ml", Name: "train"}) || e.Message == "" {
		t.Fatalf("event %+v", e)
	}
	// LS back within its cap: thawed once the hold (200 ms) has passed.
	thawed := 0
	for i := range 6 {
		if d := r.step(t, server, lsProc(30), batchProc); !d.Frozen {
			thawed = i
			break
		}
	}
	if thawed != 3 {
		t.Fatalf("thawed at step %d after LS fell back, want 3 (200 ms after the last step above, at 50 ms steps)", thawed)
	}
	// A second freeze is a second event.
	r.step(t, server, lsProc(90), batchProc)
	if n := r.nEvents(); n != 2 {
		t.Fatalf("%d lever events after a second freeze, want 2", n)
	}
	for range 5 {
		r.step(t, server, lsProc(30), batchProc)
	}

	// A process of no pod (not a client) arrives: the freeze lever, frozen at once.
	d := r.step(t, server, lsProc(30), batchProc, strayProc(0))
	if !d.Frozen || d.Lever != qos.GPULeverFreeze || d.Reason != qos.GPUReasonLSUtil {
		t.Fatalf("a non-client arrived: %+v", d)
	}
	// The server goes away: no MPS for new clients, the freeze lever for the GPU.
	r.srv.ready.Store(false)
	d = r.step(t, server, lsProc(30), batchProc)
	if d.Lever != qos.GPULeverFreeze || r.parts.MPSOn("GPU-0") || r.m.Status().GPUs[0].MPS {
		t.Fatalf("server not ready: %+v, MPSOn %v", d, r.parts.MPSOn("GPU-0"))
	}
	if _, ok, _ := r.parts.MPSClient(devices.MPSRequest{GPU: devices.GPU{UUID: "GPU-0"}, PodUID: "x", Container: "c"}); ok {
		t.Fatal("a client planned while the server is not ready")
	}
}

// TestManagerMPSServerNotLS: the MPS server's process (and its utilisation, where the
// driver reports clients' work under it) is neither LS nor an LS arrival.
func TestManagerMPSServerNotLS(t *testing.T) {
	t.Parallel()
	r := newMPSRig(t)
	for i := range 3 {
		d := r.step(t, Process{PID: mpsServerPID, SMUtil: 60}, batchProc)
		if d.Frozen || d.LSActive || d.LSArrived || d.LSUtil != 0 {
			t.Fatalf("step %d: the MPS server counted as LS: %+v", i, d)
		}
	}
	// An LS process outside MPS beside it: the freeze lever. Once batch is frozen the loop
	// reads only the GPU's utilisation (Device.UtilNow), which counts the server's work
	// once: it is LS's whole, nothing is taken out of it.
	server, ls := Process{PID: mpsServerPID, SMUtil: 60}, lsProc(20)
	if d := r.step(t, server, ls, batchProc); !d.Frozen || d.Lever != qos.GPULeverFreeze || d.LSUtil != 20 {
		t.Fatalf("LS outside MPS: %+v", d)
	}
	probed := device(server, ls, batchProc)
	probed.Probed, probed.UtilNow, probed.Util = true, true, 30
	r.next = Sample{Devices: []Device{probed}}
	r.m.step(context.Background(), r.now)
	if d := r.m.Status().GPUs[0].Decision; !d.Frozen || d.LSUtil != 30 {
		t.Fatalf("utilisation probe of the frozen GPU: %+v, want LS at the GPU's 30 %%", d)
	}
	// Without an MPS server configured, the same process is LS (the safe side).
	rig := newRig(t, &scriptSource{steps: []func() (Sample, error){sample(device(Process{PID: mpsServerPID, SMUtil: 60},
		batchProc))}}, false)
	rig.m.step(context.Background(), time.Unix(1_700_000_000, 0))
	if d := rig.m.Status().GPUs[0].Decision; !d.Frozen || d.LSUtil != 60 {
		t.Fatalf("no MPS configured: %+v", d)
	}
}

// TestIsMPSServerProc: the server is told by argv[0] (the kernel truncates comm to 15
// bytes, which the control daemon shares); comm only where cmdline is unreadable.
func TestIsMPSServerProc(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		comm, cmdline *string
		want          bool
	}{
		{name: "server as the kernel shows it", comm: ptr("nvidia-cuda-mps\n"),
			cmdline: ptr("/usr/bin/nvidia-cuda-mps-server\x00"), want: true},
		{name: "server by bare argv0", comm: ptr("nvidia-cuda-mps\n"), cmdline: ptr("nvidia-cuda-mps-server\x00-x\x00"), want: true},
		{name: "control daemon shares the truncated comm", comm: ptr("nvidia-cuda-mps\n"),
			cmdline: ptr("nvidia-cuda-mps-control\x00-d\x00"), want: false},
		{name: "a CUDA app", comm: ptr("python3\n"), cmdline: ptr("python3\x00ls.py\x00"), want: false},
		{name: "no cmdline (kernel thread or gone): truncated comm", comm: ptr("nvidia-cuda-mps\n"), want: true},
		{name: "empty cmdline (zombie): comm", comm: ptr("nvidia-cuda-mps\n"), cmdline: ptr(""), want: true},
		{name: "full name in comm is not what a kernel writes", comm: ptr("nvidia-cuda-mps-server\n"), want: false},
		{name: "nothing readable", want: false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			pid := uint32(100 + i)
			dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, v := range map[string]*string{"comm": tc.comm, "cmdline": tc.cmdline} {
				if v == nil {
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(*v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := isMPSServerProc(root, pid); got != tc.want {
				t.Fatalf("isMPSServerProc = %v, want %v", got, tc.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
