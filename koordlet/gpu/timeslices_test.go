package gpu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/qos"
)

func newTestTimeslices(t *testing.T, lib string, mpsOn func(string) bool) (*Timeslices, string) {
	t.Helper()
	dir := t.TempDir()
	ts, err := NewTimeslices(TimesliceOptions{Policy: qos.DefaultGPUTimeslicePolicy(), Directory: dir, Library: lib,
		MPSOn: mpsOn})
	if err != nil {
		t.Fatal(err)
	}
	return ts, dir
}

func tsReq(uid, ctr string, batch bool, milli int64, gpus ...devices.GPU) devices.TimesliceRequest {
	return devices.TimesliceRequest{GPUs: gpus, PodUID: types.UID(uid), Namespace: "ns", Name: "p-" + uid,
		Container: ctr, Batch: batch, RequestMilli: milli}
}

var (
	tsGPU0 = devices.GPU{Index: 0, UUID: "GPU-0"}
	tsGPU1 = devices.GPU{Index: 1, UUID: "GPU-1"}
)

// TestTimeslicesPlan: the slice of the container's class on its GPU as the choice gives
// it now (an unread GPU is LS's, batch the shortest; without LS batch the driver's
// default; LS's requests shorten batch's), no shim on MPS or MIG GPUs or without the
// library, invalid requests refused.
func TestTimeslicesPlan(t *testing.T) {
	t.Parallel()
	const lib = "/var/lib/understory/tsg/lib/libunderstory-tsg.so"
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name   string
		lib    string
		mps    bool
		obs    []timesliceGPUObs // what the loop saw first
		before []devices.TimesliceRequest
		req    devices.TimesliceRequest
		want   uint64
		why    string // substring of Why, for no shim
		err    error
	}{
		{name: "batch on a GPU not read: the shortest", lib: lib, req: tsReq("b1", "main", true, 300, tsGPU0), want: 100},
		{name: "LS on a GPU not read", lib: lib, req: tsReq("l1", "main", false, 500, tsGPU0), want: 10000},
		{name: "batch alone on an idle GPU: the driver's default", lib: lib,
			obs: []timesliceGPUObs{{index: 0, uuid: "GPU-0", read: true}}, req: tsReq("b1", "main", true, 300, tsGPU0),
			want: 2048},
		{name: "batch beside LS's request", lib: lib, obs: []timesliceGPUObs{{index: 0, uuid: "GPU-0", read: true}},
			before: []devices.TimesliceRequest{tsReq("l1", "main", false, 500, tsGPU0)},
			// share min(300, 1000 - 500) = 300: 100 + 145 × 0.3 = 143 → 140.
			req: tsReq("b1", "main", true, 300, tsGPU0), want: 140},
		{name: "batch beside LS's demand and process", lib: lib,
			obs: []timesliceGPUObs{{index: 0, uuid: "GPU-0", read: true, lsUtil: 90, lsProcs: true}},
			// share min(300, 1000 - 900) = 100: 100 + 14 = 114 → 110.
			req: tsReq("b1", "main", true, 300, tsGPU0), want: 110},
		{name: "two GPUs: the shorter", lib: lib, obs: []timesliceGPUObs{{index: 0, uuid: "GPU-0", read: true},
			{index: 1, uuid: "GPU-1", read: true, lsUtil: 50}}, req: tsReq("b1", "main", true, 300, tsGPU0, tsGPU1),
			want: 140},
		{name: "by index", lib: lib, obs: []timesliceGPUObs{{index: 1, uuid: "GPU-1", read: true}},
			req: tsReq("b1", "main", true, 300, devices.GPU{Index: 1}), want: 2048},
		{name: "MPS GPU: none", lib: lib, mps: true, req: tsReq("b1", "main", true, 300, tsGPU0), why: "runs MPS"},
		{name: "MIG GPU: none", lib: lib, obs: []timesliceGPUObs{{index: 0, uuid: "GPU-0", read: true, mig: true}},
			req: tsReq("b1", "main", true, 300, tsGPU0), why: "MIG"},
		{name: "no library: none", req: tsReq("b1", "main", true, 300, tsGPU0), why: "not installed"},
		{name: "UID unfit for a path", lib: lib, req: tsReq("../x", "main", true, 300, tsGPU0), err: ErrTimesliceRequest},
		{name: "container name invalid", lib: lib, req: tsReq("b1", "Main/..", true, 300, tsGPU0), err: ErrTimesliceRequest},
		{name: "no GPU", lib: lib, req: tsReq("b1", "main", true, 300), err: ErrTimesliceRequest},
		{name: "negative request", lib: lib, req: tsReq("b1", "main", true, -1, tsGPU0), err: ErrTimesliceRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts, dir := newTestTimeslices(t, tc.lib, func(string) bool { return tc.mps })
			ts.observe(now, tc.obs, time.Minute)
			for _, b := range tc.before {
				if _, ok, err := ts.TimesliceClient(b); !ok || err != nil {
					t.Fatalf("planning %+v: %v, %v", b, ok, err)
				}
			}
			c, ok, err := ts.TimesliceClient(tc.req)
			switch {
			case tc.err != nil:
				if !errors.Is(err, tc.err) || ok {
					t.Fatalf("= %+v, %v, %v; want %v", c, ok, err, tc.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			case tc.why != "":
				if ok || !strings.Contains(c.Why, tc.why) {
					t.Fatalf("= %+v, %v; want no shim because %q", c, ok, tc.why)
				}
				return
			}
			wantDir := filepath.Join(dir, TimesliceReportsDir, string(tc.req.PodUID), tc.req.Container)
			if !ok || c.SliceUS != tc.want || c.Library != tc.lib || c.ReportDir != wantDir {
				t.Fatalf("= %+v, %v; want %d µs, %s, %s", c, ok, tc.want, tc.lib, wantDir)
			}
			cl := ts.Clients()
			if len(cl) != 1+len(tc.before) {
				t.Fatalf("clients %+v", cl)
			}
		})
	}
}

// TestTimeslicesReportDirs: a container's report directory is 1733 below root-only
// parents, emptied when the container is created again; records of pods gone are
// dropped with their directories; the sweep removes old directories of pods nothing
// records.
func TestTimeslicesReportDirs(t *testing.T) {
	t.Parallel()
	ts, dir := newTestTimeslices(t, "/lib/x.so", nil)
	c, ok, err := ts.TimesliceClient(tsReq("b1", "main", true, 300, tsGPU0))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for p, want := range map[string]os.FileMode{filepath.Join(dir, TimesliceReportsDir): os.ModeDir | 0o700,
		filepath.Join(dir, TimesliceReportsDir, "b1"): os.ModeDir | 0o700,
		c.ReportDir: os.ModeDir | os.ModeSticky | 0o733} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != want {
			t.Fatalf("%s: %v, %v; want %v", p, fi.Mode(), err, want)
		}
	}
	old := filepath.Join(c.ReportDir, "tsg-1.log")
	if err := os.WriteFile(old, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(c.ReportDir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ts.TimesliceClient(tsReq("b1", "main", true, 300, tsGPU0)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ents, err := os.ReadDir(c.ReportDir); err != nil || len(ents) != 0 {
		t.Fatalf("report directory after the container's re-creation: %v, %v; want empty", ents, err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("emptying followed a link: %v", err)
	}

	// A stale directory of a pod the agent never recorded (a restart), and a fresh one.
	stale := filepath.Join(dir, TimesliceReportsDir, "gone", "main")
	fresh := filepath.Join(dir, TimesliceReportsDir, "new", "main")
	for _, d := range []string{stale, fresh} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Dir(stale), long, long); err != nil {
		t.Fatal(err)
	}
	alive := map[types.UID]bool{"b1": true}
	now := time.Now()
	if recs := ts.records(now, func(u types.UID) bool { return alive[u] }); len(recs) != 1 {
		t.Fatalf("records %v", recs)
	}
	if _, err := os.Stat(filepath.Dir(stale)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale pod directory: %v; want removed", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("fresh pod directory: %v; want kept (its pod may not be listed yet)", err)
	}
	// The pod leaves: its record and directory go.
	delete(alive, "b1")
	if recs := ts.records(now.Add(time.Second), func(u types.UID) bool { return alive[u] }); len(recs) != 0 {
		t.Fatalf("records %v after the pod left", recs)
	}
	if _, err := os.Stat(filepath.Join(dir, TimesliceReportsDir, "b1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod directory after the pod left: %v", err)
	}
	if len(ts.Clients()) != 0 {
		t.Fatalf("clients %+v", ts.Clients())
	}
}

func TestNewTimeslicesDirectory(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"", "relative", "/a/../b", "/"} {
		if _, err := NewTimeslices(TimesliceOptions{Directory: d}); !errors.Is(err, ErrOptions) {
			t.Errorf("directory %q: %v; want ErrOptions", d, err)
		}
	}
}
