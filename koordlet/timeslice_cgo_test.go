//go:build cgo

package koordlet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/koordlet/gpubridge"
	"github.com/understory/understory/koordlet/nri"
	"github.com/understory/understory/qos"
)

// TestTimesliceTenantPath is the path a tenant takes with gpu.timeslice on, through the
// agent on a fake cgroup root and gpumock's GPU node: its batch pod's container, created
// through the NRI plugin, gets the shim's mount and environment; the report its shim
// writes into the container's directory shows in /status with the unconfirmed verdict
// (no outside observer) and the GPU on the freeze; a report of the application's own
// 10 ms slice becomes a GPUSliceSelfSet Event on the pod.
func TestTimesliceTenantPath(t *testing.T) {
	t.Parallel()
	const (
		lsPID, batchPID = 4101, 4202
		batchNSPID      = 7 // the batch process in its container's PID namespace
	)
	lsCtr, batchCtr := fmt.Sprintf("%064x", 0x15), fmt.Sprintf("%064x", 0xba7c4)
	node := gpumock.New()
	procRoot := t.TempDir()
	src, err := node.Collector(procRoot)
	if err != nil {
		t.Fatal(err)
	}
	tsgDir := t.TempDir()
	shim := filepath.Join(t.TempDir(), timeslice.LibraryName) // a stand-in for the image's shim
	if err := os.WriteFile(shim, []byte("\x7fELF stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRigOpts(t, cgroupstest.V2, rigOptions{gpu: src,
		mutate: func(c *config.Config) {
			c.ProcRoot = procRoot
			c.GPU.Timeslice.Enabled = true
			c.GPU.Timeslice.Directory = tsgDir
			c.GPU.Timeslice.Library = shim
		},
		pods: func(pods []*corev1.Pod) {
			for _, p := range pods {
				switch p.UID {
				case lsUID:
					p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", ContainerID: "containerd://" + lsCtr}}
				case batchUID2:
					p.Annotations[devices.AnnotationDevices] = "0"
					p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
						devices.ResourceGPUMilli: resource.MustParse("300")}
					p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c",
						ContainerID: "containerd://" + batchCtr}}
				}
			}
		}})
	a := r.agent
	if ts, ok := a.TimesliceOptions().(*gpu.Timeslices); !a.gpu.On() || !ok || ts.Library() == "" {
		t.Fatalf("GPU loop on %t, time slices %v: want both, with the shim installed", a.gpu.On(), a.TimesliceOptions())
	}
	for i := 0; i < 2*slowEvery; i++ { // the GPU loop's pod snapshot
		r.step(0.5, nil)
	}
	// LS serves on GPU 0 (40 %); the batch pod has no process there yet.
	writeProc := func(pid uint32, cgroup string, nsPID int) {
		t.Helper()
		if err := gpumock.WriteProc(procRoot, pid, gpumock.HybridProcCgroup(cgroup)); err != nil {
			t.Fatal(err)
		}
		status := fmt.Sprintf("Name:\tpython3\nPid:\t%d\nNSpid:\t%d\t%d\n", pid, pid, nsPID)
		if err := os.WriteFile(filepath.Join(procRoot, fmt.Sprint(pid), "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeProc(lsPID, "/kubepods/burstable/pod"+string(lsUID)+"/"+lsCtr, 1)
	writeProc(batchPID, "/kubepods/besteffort/pod"+string(batchUID2)+"/"+batchCtr, batchNSPID)
	lsProc := gpumock.Proc{PID: lsPID, SMUtil: 40, MemUsed: 1 << 30}
	node.Set(0, lsProc)
	now := time.Now()
	if !a.gpu.StepForTest(t, context.Background(), now) {
		t.Fatal("GPU features off")
	}

	// The runtime creates the batch pod's container: the NRI plugin gives it the shim.
	plugin, err := nri.New(a.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nri.Options{
		Pods: r.pods, GPUs: a, Events: r.events, Timeslice: a.TimesliceOptions(), PodWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sb := &api.PodSandbox{Id: "sb", Name: "batch-tier", Namespace: "default", Uid: string(batchUID2),
		Annotations: map[string]string{"understory.io/qos-class": "Batch", devices.AnnotationDevices: "0"},
		Linux:       &api.LinuxPodSandbox{CgroupParent: "/kubepods/besteffort/pod" + string(batchUID2)}}
	adj, _, err := plugin.CreateContainer(context.Background(), sb, &api.Container{Id: batchCtr, Name: "c",
		Env:   []string{"PATH=/usr/bin", "LD_PRELOAD=/opt/lib/libtcmalloc.so"},
		Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/pod" + string(batchUID2) + "/" + batchCtr}})
	if err != nil {
		t.Fatal(err)
	}
	env, mounts := map[string]string{}, map[string]string{}
	for _, kv := range adj.GetEnv() {
		env[kv.Key] = kv.Value
	}
	for _, m := range adj.GetMounts() {
		mounts[m.Destination] = m.Source + " " + strings.Join(m.Options, ",")
	}
	lib := filepath.Join(tsgDir, gpu.TimesliceLibDir, timeslice.LibraryName)
	reportDir := filepath.Join(tsgDir, gpu.TimesliceReportsDir, string(batchUID2), "c")
	// LS at 40 % leaves batch 600 milli; its request 300: 100 + 145 × 0.3 = 143 → 140 µs.
	if env[devices.EnvLDPreload] != devices.ShimContainerPath+" /opt/lib/libtcmalloc.so" ||
		env[timeslice.EnvTimesliceUS] != "140" || env[timeslice.EnvReport] != devices.ShimContainerReportDir {
		t.Fatalf("env %v", env)
	}
	if mounts[devices.ShimContainerPath] != lib+" bind,ro,nosuid,nodev" ||
		mounts[devices.ShimContainerReportDir] != reportDir+" bind,rw,nosuid,nodev,noexec" {
		t.Fatalf("mounts %v", mounts)
	}
	if b, err := os.ReadFile(lib); err != nil || string(b) != "\x7fELF stand-in" {
		t.Fatalf("the shim at %s: %q, %v", lib, b, err)
	}

	// Its process starts on GPU 0; its shim reports the group it set and read back.
	node.Set(0, lsProc, gpumock.Proc{PID: batchPID, SMUtil: 50, MemUsed: 2 << 30, Batch: true})
	alloc := timeslice.Event{UnixNano: now.UnixNano(), PID: batchNSPID, Kind: timeslice.KindAlloc,
		Mode: timeslice.ModeSet, Driver: "550.54.15", Client: 0xc1d00001, Object: 0x5c000002, AskedUS: 140,
		HasAsked: true, Set: timeslice.Result{Done: true}, Readback: timeslice.Result{Done: true, ValueUS: 140}}
	writeReport(t, reportDir, batchNSPID, alloc)
	now = now.Add(1100 * time.Millisecond) // the reports are read every full-scrape period
	if !a.gpu.StepForTest(t, context.Background(), now) {
		t.Fatal("GPU features off")
	}

	st := getStatus(t, a, r)
	g := st.GPU.GPUs[0]
	if g.Decision.Lever != qos.GPULeverFreeze || !g.Decision.Frozen {
		t.Fatalf("GPU 0 decision %+v; want the freeze lever, frozen (LS at 40 %%)", g.Decision)
	}
	ts := g.Timeslice
	if ts == nil || ts.Lever != qos.GPULeverFreeze || ts.Reason != qos.GPUTimesliceReasonUnconfirmed ||
		!strings.Contains(ts.Detail, "no outside observation") {
		t.Fatalf("GPU 0 time slices %+v; want freeze, slice-unconfirmed: no outside observer", ts)
	}
	var bc *gpu.TimesliceContext
	for i := range ts.Contexts {
		if ts.Contexts[i].Pod == "default/batch-tier" {
			bc = &ts.Contexts[i]
		}
	}
	if bc == nil || bc.Container != "c" || bc.PID != batchPID || bc.ContainerPID != batchNSPID || bc.AskedUs != 140 ||
		bc.Verdict != qos.GPUTimesliceUnconfirmed || bc.Shim == nil || bc.Shim.Mode != "set" ||
		bc.Shim.ReadBackUs != 140 || bc.Shim.Status != "ok" {
		t.Fatalf("batch context %+v in %+v", bc, ts.Contexts)
	}
	if n := st.GPU.Timeslice; n == nil || n.Observer != gpu.TimesliceObserver || n.Driver != "550.54.15" ||
		!n.DriverSupported || len(n.Clients) != 1 {
		t.Fatalf("node time slices %+v", n)
	}
	if r.events.has("batch-tier: " + gpubridge.EventGPUSliceSelfSet) {
		t.Fatal("a self-set event before any self-set")
	}

	// The application asks 10 ms itself (the shim sent 140 µs instead): an Event.
	app := alloc
	app.Kind, app.AppUS, app.HasApp, app.UnixNano = timeslice.KindAppSet, 10000, true, alloc.UnixNano+1
	writeReport(t, reportDir, batchNSPID, alloc, app)
	now = now.Add(1100 * time.Millisecond)
	if !a.gpu.StepForTest(t, context.Background(), now) {
		t.Fatal("GPU features off")
	}
	ts = getStatus(t, a, r).GPU.GPUs[0].Timeslice
	if ts.Reason != qos.GPUTimesliceReasonSelfSet || ts.Lever != qos.GPULeverFreeze {
		t.Fatalf("after the application's own slice: %+v", ts)
	}
	if !r.events.has("batch-tier: " + gpubridge.EventGPUSliceSelfSet + ": GPU 0: container c") {
		t.Fatalf("events %v; want %s on the batch pod", r.events.all(), gpubridge.EventGPUSliceSelfSet)
	}
}

// writeReport writes a process's report file as the shim does (one line per event).
func writeReport(t *testing.T, dir string, pid int, events ...timeslice.Event) {
	t.Helper()
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e.String() + "\n")
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("tsg-%d.log", pid)), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// getStatus reads /status as a client does.
func getStatus(t *testing.T, a *Agent, r *rig) Status {
	t.Helper()
	rec := httptest.NewRecorder()
	a.Handler(r.reg).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var s Status
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.GPU == nil {
		t.Fatalf("/status: %v\n%s", err, rec.Body.String())
	}
	return s
}
