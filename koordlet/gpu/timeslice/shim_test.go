package timeslice_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/koordlet/gpu/timeslice/timeslicetest"
)

// shimRun is what one run of the driving program left: what the application saw
// (stdout's "app" lines by call), the shim's report, and what the fake driver saw.
type shimRun struct {
	app    map[string]map[string]string
	events []timeslice.Event
	bad    int
	report []byte
	fake   []map[string]string
}

func fields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// runShim runs the program under LD_PRELOAD=preload with env (and nothing of the
// test's own environment but PATH), the report in a file of a fresh directory (or in
// the directory itself with reportDir).
func runShim(t *testing.T, preload, program string, env, args []string, reportDir bool) shimRun {
	t.Helper()
	dir := t.TempDir()
	report := filepath.Join(dir, "report")
	if reportDir {
		report = filepath.Join(dir, "reports")
		if err := os.Mkdir(report, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fakeLog := filepath.Join(dir, "fake.log")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, program, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LD_PRELOAD=" + preload,
		timeslice.EnvReport + "=" + report, "FAKE_RM_LOG=" + fakeLog}, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", program, args, err, stderr.String())
	}
	r := shimRun{app: map[string]map[string]string{}}
	for _, l := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(l, "app "); ok {
			f := fields(rest)
			if _, seen := r.app[f["call"]]; !seen {
				r.app[f["call"]] = f
			}
		}
	}
	if reportDir {
		names, err := filepath.Glob(filepath.Join(report, "tsg-*.log"))
		if err != nil || len(names) > 1 {
			t.Fatalf("report directory holds %v (%v), want one tsg-<pid>.log", names, err)
		}
		if len(names) == 1 {
			report = names[0]
		}
	}
	if b, err := os.ReadFile(report); err == nil {
		r.report = b
		if r.events, r.bad, err = timeslice.ParseReport(bytes.NewReader(b), 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(fakeLog); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			r.fake = append(r.fake, fields(sc.Text()))
		}
	}
	return r
}

// fakeSaw returns the fake driver's log entries with key k equal to v.
func (r shimRun) fakeSaw(k, v string) []map[string]string {
	var out []map[string]string
	for _, e := range r.fake {
		if e[k] == v {
			out = append(out, e)
		}
	}
	return out
}

// setValues are the SET_TIMESLICE values that reached the fake driver, in order.
func (r shimRun) setValues() []string {
	var out []string
	for _, e := range r.fakeSaw("cmd", hex(timeslice.CtrlCmdSetTimeslice)) {
		out = append(out, e["value"])
	}
	return out
}

func hex(v uint32) string { return fmt.Sprintf("0x%x", v) }

const (
	tsgObject = 0xcaf00002 // the fake's third handle: client, device, then the group
	client    = 0xc1d00001
)

// TestShimOverFakeDriver runs the shim (built as the Makefile builds it) over the fake
// driver in each scenario and checks the report, the values and request words the
// driver saw, and what the application saw.
func TestShimOverFakeDriver(t *testing.T) {
	t.Parallel()
	b := timeslicetest.Build(t, t.TempDir())
	set := func(asked, rb uint64, drv string) timeslice.Event {
		return timeslice.Event{Kind: timeslice.KindAlloc, Mode: timeslice.ModeSet, Driver: drv, Client: client,
			Object: tsgObject, AskedUS: asked, HasAsked: true, Set: timeslice.Result{Done: true},
			Readback: timeslice.Result{Done: true, ValueUS: rb}}
	}
	appSet := func(e timeslice.Event, app uint64) timeslice.Event {
		e.Kind, e.AppUS, e.HasApp = timeslice.KindAppSet, app, true
		return e
	}
	passed := func(kind timeslice.Kind, mode timeslice.Mode, drv string, app int64) timeslice.Event {
		e := timeslice.Event{Kind: kind, Mode: mode, Driver: drv, Client: client, Object: tsgObject}
		if kind == timeslice.KindAppSet {
			e.Set.Done = true
			if app >= 0 {
				e.AppUS, e.HasApp = uint64(app), true
			}
		}
		return e
	}
	withSet := func(e timeslice.Event, r timeslice.Result) timeslice.Event { e.Set = r; return e }
	withRB := func(e timeslice.Event, r timeslice.Result) timeslice.Event { e.Readback = r; return e }

	for _, tc := range []struct {
		name      string
		noShim    bool
		env, args []string
		want      []timeslice.Event
		applied   int      // events that claim the slice applied
		sets      []string // SET_TIMESLICE values the driver saw, in order
		queries   int      // version queries the driver saw
		appGet    string   // the slice the application's own GET read
		appGetRC  string
	}{
		{name: "without the shim the application's value stands", noShim: true, args: []string{"-set", "2048"},
			sets: []string{"2048"}, appGet: "2048"},
		{name: "NVOS21 alloc: set and read back", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"},
			want: []timeslice.Event{set(100, 100, "580.142")}, applied: 1, sets: []string{"100"}, queries: 1,
			appGet: "100"},
		{name: "NVOS64 alloc", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"}, args: []string{"-64"},
			want: []timeslice.Event{set(100, 100, "580.142")}, applied: 1, sets: []string{"100"}, queries: 1,
			appGet: "100"},
		{name: "through the size indirection", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"},
			args: []string{"-xfer", "-64", "-set", "2048"},
			want: []timeslice.Event{set(100, 100, "580.142"), appSet(set(100, 100, "580.142"), 2048)}, applied: 2,
			sets: []string{"100", "100"}, queries: 1, appGet: "100"},
		{name: "the application's own set is rewritten", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=10000"},
			args:    []string{"-set", "2048"},
			want:    []timeslice.Event{set(10000, 10000, "580.142"), appSet(set(10000, 10000, "580.142"), 2048)},
			applied: 2, sets: []string{"10000", "10000"}, queries: 1, appGet: "10000"},
		{name: "no slice configured: report only", args: []string{"-set", "2048"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeReport, "", -1),
				passed(timeslice.KindAppSet, timeslice.ModeReport, "", 2048)},
			sets: []string{"2048"}, appGet: "2048"},
		{name: "a slice that is no number", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=1e3"}, args: []string{"-set", "7"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeBadConfig, "", -1),
				passed(timeslice.KindAppSet, timeslice.ModeBadConfig, "", 7)},
			sets: []string{"7"}, appGet: "7"},
		{name: "a slice of 0", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=0"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeBadConfig, "", -1)}, appGet: "1024"},
		{name: "a slice past the bound", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100000001"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeBadConfig, "", -1)}, appGet: "1024"},
		{name: "the driver refuses the value", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100", "FAKE_RM_SET_STATUS=56"},
			want: []timeslice.Event{withSet(set(100, 1024, "580.142"), timeslice.Result{Done: true, Status: 0x56})},
			sets: []string{"100"}, queries: 1, appGet: "1024"},
		{name: "the firmware clamps the value", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100",
			"FAKE_RM_FIRMWARE=clamp:500"},
			want: []timeslice.Event{set(100, 500, "580.142")}, sets: []string{"100"}, queries: 1, appGet: "500"},
		{name: "the firmware ignores the value", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100", "FAKE_RM_FIRMWARE=ignore"},
			want: []timeslice.Event{set(100, 1024, "580.142")}, sets: []string{"100"}, queries: 1, appGet: "1024"},
		{name: "the sandbox refuses the read-back", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100",
			"FAKE_RM_GET_ERRNO=22"},
			want: []timeslice.Event{withRB(set(100, 0, "580.142"), timeslice.Result{Done: true, Errno: 22})},
			sets: []string{"100"}, queries: 1, appGetRC: "-1"},
		{name: "an unsupported driver: nothing changed", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100",
			"FAKE_RM_VERSION=470.256.02"}, args: []string{"-set", "2048"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeUnsupported, "470.256.02", -1),
				passed(timeslice.KindAppSet, timeslice.ModeUnsupported, "470.256.02", 2048)},
			sets: []string{"2048"}, queries: 1, appGet: "2048"},
		{name: "a branch whose headers were not read", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100",
			"FAKE_RM_VERSION=600.10"},
			want:    []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeUnsupported, "600.10", -1)},
			queries: 1, appGet: "1024"},
		{name: "the version query fails", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100", "FAKE_RM_VERSION=!fail"},
			args: []string{"-set", "2048"},
			want: []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeUnsupported, "", -1),
				passed(timeslice.KindAppSet, timeslice.ModeUnsupported, "", 2048)},
			sets: []string{"2048"}, queries: 1, appGet: "2048"},
		{name: "an old driver answers the query empty", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100",
			"FAKE_RM_VERSION="},
			want:    []timeslice.Event{passed(timeslice.KindAlloc, timeslice.ModeUnsupported, "", -1)},
			queries: 1, appGet: "1024"},
		{name: "a serialized set passes untouched", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"},
			args: []string{"-set", "2048", "-serialized"},
			want: []timeslice.Event{set(100, 100, "580.142"),
				passed(timeslice.KindAppSet, timeslice.ModeSkip, "", -1)},
			applied: 1, sets: []string{"100", "0"}, queries: 1, appGet: "100"},
		{name: "a failed alloc is no group", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100", "FAKE_RM_ALLOC_STATUS=1f"},
			appGet: "", appGetRC: "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			preload := b.Preload
			if tc.noShim {
				preload = b.Fake
			}
			r := runShim(t, preload, b.Program, tc.env, tc.args, false)
			if r.bad != 0 {
				t.Fatalf("%d report lines did not parse:\n%s", r.bad, r.report)
			}
			if len(r.events) != len(tc.want) {
				t.Fatalf("%d events, want %d:\n%s", len(r.events), len(tc.want), r.report)
			}
			applied := 0
			for i, e := range r.events {
				if e.PID <= 0 || e.UnixNano <= 0 {
					t.Errorf("event %d: pid %d, time %d", i, e.PID, e.UnixNano)
				}
				e.PID, e.UnixNano = 0, 0
				if e != tc.want[i] {
					t.Errorf("event %d:\n   %+v\nwant %+v", i, e, tc.want[i])
				}
				if e.ClaimsApplied() {
					applied++
				}
			}
			if applied != tc.applied {
				t.Errorf("%d events claim the slice applied, want %d", applied, tc.applied)
			}
			if got := r.setValues(); !slices.Equal(got, tc.sets) {
				t.Errorf("the driver saw SET_TIMESLICE values %v, want %v", got, tc.sets)
			}
			if got := len(r.fakeSaw("nr", hex(timeslice.EscCheckVersionStr))); got != tc.queries {
				t.Errorf("%d version queries, want %d", got, tc.queries)
			}
			// The shim's own calls: the request words, the query command, the layouts.
			for _, e := range r.fakeSaw("nr", hex(timeslice.EscCheckVersionStr)) {
				if e["req"] != hex(timeslice.IOWR(timeslice.EscCheckVersionStr, timeslice.SizeRMAPIVersion)) ||
					e["vcmd"] != hex(timeslice.RMAPIVersionCmdQuery) {
					t.Errorf("version query %v", e)
				}
			}
			for _, e := range r.fakeSaw("cmd", hex(timeslice.CtrlCmdGetTimeslice)) {
				if e["via"] == "xfer" { // the application's own
					continue
				}
				if e["req"] != hex(timeslice.IOWR(timeslice.EscRMControl, timeslice.SizeRMControl)) ||
					e["client"] != fmt.Sprintf("0x%08x", client) || e["object"] != fmt.Sprintf("0x%08x", tsgObject) ||
					e["psize"] != "8" || e["flags"] != "0x0" {
					t.Errorf("read-back %v", e)
				}
			}

			// What the application saw.
			alloc := r.app["alloc"]
			if tc.name == "a failed alloc is no group" {
				if alloc["status"] != "0x1f" {
					t.Errorf("the application's failed alloc: %v", alloc)
				}
			} else if alloc["rc"] != "0" || alloc["errno"] != "777" || alloc["status"] != "0x0" {
				t.Errorf("the application's alloc: %v (errno must stay as it was)", alloc)
			}
			if s, ok := r.app["set"]; ok {
				if s["rc"] != "0" || s["errno"] != "777" || s["params"] != tc.args[slices.Index(tc.args, "-set")+1] {
					t.Errorf("the application's set: %v (its parameters and errno must stay its own)", s)
				}
			}
			get := r.app["get"]
			if tc.appGetRC != "" {
				if get["rc"] != tc.appGetRC {
					t.Errorf("the application's get: %v, want rc %s", get, tc.appGetRC)
				}
			} else if get["rc"] != "0" || get["value"] != tc.appGet {
				t.Errorf("the application's get: %v, want %s", get, tc.appGet)
			}
			for call, want := range map[string]string{
				"other-control": "rc=0 status=0x0",
				"fionread":      "rc=0 errno=777 avail=3",
				"tcgets":        "rc=-1 errno=25",
			} {
				for k, v := range fields(want) {
					if r.app[call][k] != v {
						t.Errorf("the application's %s: %v, want %s", call, r.app[call], want)
						break
					}
				}
			}
			// Ioctls the shim leaves alone reach the driver unchanged.
			other := r.fakeSaw("cmd", "0x20800101")
			wantReq := timeslice.IOWR(timeslice.EscRMControl, timeslice.SizeRMControl)
			if slices.Contains(tc.args, "-xfer") {
				wantReq = timeslice.IOWR(timeslice.EscIoctlXferCmd, timeslice.SizeXfer)
			}
			if len(other) != 1 || other[0]["req"] != hex(wantReq) || other[0]["value"] != "0" {
				t.Errorf("the other control reached the driver as %v, want once as request %#x", other, wantReq)
			}
		})
	}
}

// TestShimThreads: groups allocated by many threads at once are each set, and every
// report line is whole.
func TestShimThreads(t *testing.T) {
	t.Parallel()
	b := timeslicetest.Build(t, t.TempDir())
	const threads, allocs = 8, 25
	r := runShim(t, b.Preload, b.Program, []string{"UNDERSTORY_TSG_TIMESLICE_US=200"},
		[]string{"-threads", strconv.Itoa(threads), "-allocs", strconv.Itoa(allocs)}, false)
	if r.bad != 0 || len(r.events) != threads*allocs {
		t.Fatalf("%d events, %d bad, want %d whole lines", len(r.events), r.bad, threads*allocs)
	}
	objects := map[uint32]bool{}
	for _, e := range r.events {
		if !e.ClaimsApplied() || e.AskedUS != 200 || objects[e.Object] {
			t.Fatalf("event %+v: want every group set once to 200", e)
		}
		objects[e.Object] = true
	}
	if q := len(r.fakeSaw("nr", hex(timeslice.EscCheckVersionStr))); q < 1 || q > threads {
		t.Errorf("%d version queries: want one per process, a few more only when threads race to the first", q)
	}
}

// TestShimReportBounds: a report file stops growing at its bound; a report directory
// gets one file per process.
func TestShimReportBounds(t *testing.T) {
	t.Parallel()
	b := timeslicetest.Build(t, t.TempDir())
	for _, tc := range []struct {
		name       string
		env        []string
		dir        bool
		wantEvents int
		maxBytes   int
	}{
		{name: "bounded file", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100", "UNDERSTORY_TSG_REPORT_MAX_BYTES=300"},
			wantEvents: 1, maxBytes: 300},
		{name: "default bound", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"}, wantEvents: 5,
			maxBytes: timeslice.DefaultReportMaxBytes},
		{name: "directory", env: []string{"UNDERSTORY_TSG_TIMESLICE_US=100"}, dir: true, wantEvents: 5,
			maxBytes: timeslice.DefaultReportMaxBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runShim(t, b.Preload, b.Program, tc.env, []string{"-threads", "1", "-allocs", "5"}, tc.dir)
			if r.bad != 0 || len(r.events) != tc.wantEvents || len(r.report) > tc.maxBytes {
				t.Fatalf("%d events (%d bad) in %d bytes; want %d within %d:\n%s", len(r.events), r.bad, len(r.report),
					tc.wantEvents, tc.maxBytes, r.report)
			}
			if len(r.setValues()) != 5 {
				t.Errorf("the driver saw %d sets, want 5: the bound limits the report, not the shim", len(r.setValues()))
			}
		})
	}
}
