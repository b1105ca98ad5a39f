package koordlet

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/qos"
)

// TestTimesliceConfig: gpu.timeslice is off by default, takes the policy's fields under
// it, and every bad value is refused naming its key.
func TestTimesliceConfig(t *testing.T) {
	t.Parallel()
	def := DefaultConfig().GPU.Timeslice
	if def.Enabled || def.Directory != DefaultTimesliceDirectory || def.Library != DefaultTimesliceLibrary ||
		def.GPUTimeslicePolicy != qos.DefaultGPUTimeslicePolicy() {
		t.Fatalf("defaults %+v", def)
	}
	cfg, err := LoadConfig([]byte("gpu:\n  timeslice:\n    enabled: true\n    batchSlice: 150us\n    lsSlice: 20ms\n" +
		"    directory: /srv/tsg\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.GPU.Timeslice; !c.Enabled || c.BatchSlice.Duration != 150*time.Microsecond ||
		c.LSSlice.Duration != 20*time.Millisecond || c.Directory != "/srv/tsg" || c.Library != DefaultTimesliceLibrary ||
		c.SwitchCost != qos.DefaultGPUTimeslicePolicy().SwitchCost {
		t.Fatalf("loaded %+v", c)
	}
	for yaml, want := range map[string]string{
		"batchSlice: 5us":           "gpu.timeslice.batchSlice: 5µs must be in [10µs, lsMaxWait − switchCost]",
		"lsSlice: 1ms":              "gpu.timeslice.lsSlice: 1ms must be in [2.048ms, 100ms]",
		"batchSlice: 100500ns":      "gpu.timeslice.batchSlice: 100.5µs must be whole microseconds",
		"freezeAbovePercent: 0":     "gpu.timeslice.freezeAbovePercent: 0 must be in (0, 100]",
		"lsMaxWait: 300us":          "gpu.timeslice.lsMaxWait: 300µs must be at least batchSlice + switchCost",
		"directory: relative/dir":   `gpu.timeslice.directory: "relative/dir" must be a clean absolute path`,
		"library: /usr/lib/../x.so": `gpu.timeslice.library: "/usr/lib/../x.so" must be a clean absolute path`,
		"enabled: maybe":            "gpu.timeslice.enabled",
		"slices: 3":                 "slices",
	} {
		_, err := LoadConfig([]byte("gpu:\n  timeslice:\n    " + yaml + "\n"))
		if !errors.Is(err, ErrInvalidConfig) && !errors.Is(err, qos.ErrInvalidConfig) {
			t.Errorf("%s: %v; want an invalid-config error", yaml, err)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q; want it to say %q", yaml, err, want)
		}
	}
}

// writeShim writes a stand-in for the shim the agent's image carries.
func writeShim(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), timeslice.LibraryName)
	if err := os.WriteFile(p, []byte("\x7fELF stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAgentTimesliceWiring: with the gate on the agent installs the shim under the
// directory and hands the planner to the NRI plugin; off, or without the shim, none or
// a planner that gives no container the shim.
func TestAgentTimesliceWiring(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := DefaultConfig()
	a := &Agent{cfg: cfg, log: log}
	if ts, err := newTimeslices(a.cfg.GPU.Timeslice, a.log, nil); ts != nil || err != nil || a.TimesliceOptions() != nil {
		t.Fatalf("gate off: %v, %v", ts, err)
	}
	cfg.GPU.Timeslice.Enabled = true
	cfg.GPU.Timeslice.Directory = t.TempDir()
	cfg.GPU.Timeslice.Library = writeShim(t)
	a = &Agent{cfg: cfg, log: log}
	ts, err := newTimeslices(a.cfg.GPU.Timeslice, a.log, nil)
	if err != nil || ts == nil {
		t.Fatal(ts, err)
	}
	want := filepath.Join(cfg.GPU.Timeslice.Directory, gpu.TimesliceLibDir, timeslice.LibraryName)
	if ts.Library() != want {
		t.Fatalf("library %q, want %q", ts.Library(), want)
	}
	if b, err := os.ReadFile(want); err != nil || string(b) != "\x7fELF stand-in" {
		t.Fatalf("installed shim: %q, %v", b, err)
	}
	// The image without the shim: the planner runs, gives no container the shim.
	cfg.GPU.Timeslice.Library = filepath.Join(t.TempDir(), "missing.so")
	a = &Agent{cfg: cfg, log: log}
	ts, err = newTimeslices(a.cfg.GPU.Timeslice, a.log, nil)
	if err != nil || ts == nil || ts.Library() != "" {
		t.Fatalf("without the shim: %v, %v", ts, err)
	}
	c, ok, err := ts.TimesliceClient(devices.TimesliceRequest{GPUs: []devices.GPU{{Index: 0, UUID: nriUUID0}},
		PodUID: "u1", Container: "main", Batch: true})
	if ok || err != nil || !strings.Contains(c.Why, "not installed") {
		t.Fatalf("planning without the shim: %+v, %v, %v", c, ok, err)
	}
}

// TestNRITimesliceShim drives the shim's injection through NRI's runtime adaptation: a
// shared-GPU container gets the library read-only (executable), its own report
// directory read-write, LD_PRELOAD with the shim first and its own list after, and
// its class's slice; a container without a shared GPU, and an MPS client, get nothing.
func TestNRITimesliceShim(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lib := filepath.Join(dir, gpu.TimesliceLibDir, timeslice.LibraryName)
	ts, err := gpu.NewTimeslices(gpu.TimesliceOptions{Policy: qos.DefaultGPUTimeslicePolicy(), Directory: dir,
		Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	pods, events := &nriPods{}, &nriEvents{}
	r := startNRI(t, NRIOptions{Pods: pods, GPUs: nriInventory, Events: events, PodWait: 100 * time.Millisecond,
		Timeslice: ts, MPS: mpsPlanner{}, MPSSetup: devices.MPSSetup{ShmDir: "/run/understory/mps-shm", ClientUID: 1000}})
	for _, tc := range []struct {
		name, uid, devs, ctr string
		batch                bool
		env                  []string
		slice, preload       string // "" : no shim
	}{
		// GPU 1 has no MPS partition (mpsPlanner): the shim, on a GPU the loop has not
		// read, batch's shortest slice.
		{name: "batch on GPU 1", uid: "t1", devs: "1", ctr: "main", batch: true,
			env:   []string{"PATH=/bin", "LD_PRELOAD=/usr/lib/libjemalloc.so.2", "UNDERSTORY_TSG_TIMESLICE_US=99999"},
			slice: "100", preload: devices.ShimContainerPath + " /usr/lib/libjemalloc.so.2"},
		{name: "LS on GPU 1", uid: "t2", devs: "1", ctr: "main", slice: "10000", preload: devices.ShimContainerPath},
		{name: "sidecar without a GPU share", uid: "t3", devs: "1", ctr: "sidecar", batch: true},
		{name: "MPS client on GPU 0", uid: "t4", devs: "0", ctr: "main", batch: true},
	} {
		pod, sb := nriGPUPod(tc.uid, tc.devs, tc.batch)
		pods.add(pod, 0)
		resp, err := r.createWith(sb, tc.ctr, func(c *api.Container) {
			c.Env = tc.env
			c.User = &api.User{Uid: 1000, Gid: 1000}
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		adj := resp.GetAdjust()
		env, m := envOf(adj), mountsOf(adj)
		if tc.slice == "" {
			if _, set := env[devices.EnvLDPreload]; set || m[devices.ShimContainerPath] != "" {
				t.Fatalf("%s: env %v, mounts %v; want no shim", tc.name, env, m)
			}
			continue
		}
		reportDir := filepath.Join(dir, gpu.TimesliceReportsDir, tc.uid, tc.ctr)
		if env[devices.EnvLDPreload] != tc.preload || env[timeslice.EnvTimesliceUS] != tc.slice ||
			env[timeslice.EnvReport] != devices.ShimContainerReportDir || env[timeslice.EnvReportMaxBytes] != "262144" {
			t.Fatalf("%s: env %v", tc.name, env)
		}
		if m[devices.ShimContainerPath] != lib+" bind,ro,nosuid,nodev" ||
			m[devices.ShimContainerReportDir] != reportDir+" bind,rw,nosuid,nodev,noexec" {
			t.Fatalf("%s: mounts %v", tc.name, m)
		}
		if fi, err := os.Stat(reportDir); err != nil || fi.Mode().Perm() != 0o733 {
			t.Fatalf("%s: report directory %v, %v", tc.name, fi, err)
		}
		evs := events.forPod(tc.uid)
		if !strings.Contains(evs[len(evs)-1].message, "time-slice shim") || evs[len(evs)-1].reason != "normal:GPUTimeslice" {
			t.Fatalf("%s: events %+v", tc.name, evs)
		}
	}
}
