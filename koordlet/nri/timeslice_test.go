package nri

import (
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
	r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, Events: events, PodWait: 100 * time.Millisecond,
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
