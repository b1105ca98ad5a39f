package devices

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// fakeTimeslices answers one client, or no shim, or an error; it records the requests.
type fakeTimeslices struct {
	client TimesliceClient
	ok     bool
	err    error
	reqs   []TimesliceRequest
}

func (f *fakeTimeslices) TimesliceClient(req TimesliceRequest) (TimesliceClient, bool, error) {
	f.reqs = append(f.reqs, req)
	return f.client, f.ok, f.err
}

func TestDecideTimeslice(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", UID: "u1"}}
	good := TimesliceClient{SliceUS: 100, Library: "/var/lib/understory/tsg/lib/libunderstory-tsg.so",
		ReportDir: "/var/lib/understory/tsg/reports/u1/main"}
	gpus := []GPU{{Index: 0, UUID: "GPU-0"}}
	base := func(env ...string) TimesliceContainer {
		return TimesliceContainer{Pod: pod, Container: "main", Batch: true, GPUs: gpus, RequestMilli: 300, Env: env}
	}
	for _, tc := range []struct {
		name    string
		planner *fakeTimeslices // nil: no planner
		c       TimesliceContainer
		preload string // LD_PRELOAD wanted; "" no shim
		skipped string
		err     bool
	}{
		{name: "no planner", c: base()},
		{name: "no shared GPU", planner: &fakeTimeslices{client: good, ok: true},
			c: TimesliceContainer{Pod: pod, Container: "main"}},
		{name: "MPS client", planner: &fakeTimeslices{client: good, ok: true},
			c: func() TimesliceContainer { c := base(); c.MPSClient = true; return c }(), skipped: "MPS client"},
		{name: "shim, no preload of its own", planner: &fakeTimeslices{client: good, ok: true}, c: base("PATH=/bin"),
			preload: ShimContainerPath},
		{name: "its own preload after the shim", planner: &fakeTimeslices{client: good, ok: true},
			c:       base("LD_PRELOAD=/usr/lib/libjemalloc.so.2"),
			preload: ShimContainerPath + " /usr/lib/libjemalloc.so.2"},
		{name: "the last LD_PRELOAD counts, colons split, the shim not twice",
			planner: &fakeTimeslices{client: good, ok: true},
			c:       base("LD_PRELOAD=/old.so", "LD_PRELOAD=/a.so:"+ShimContainerPath+"  /b.so"),
			preload: ShimContainerPath + " /a.so /b.so"},
		{name: "planner says no", planner: &fakeTimeslices{client: TimesliceClient{Why: "GPU 0 runs MPS"}},
			c: base(), skipped: "GPU 0 runs MPS"},
		{name: "planner fails", planner: &fakeTimeslices{err: errors.New("boom")}, c: base(), skipped: "planning failed",
			err: true},
		{name: "slice out of range", planner: &fakeTimeslices{ok: true, client: TimesliceClient{SliceUS: 0,
			Library: good.Library, ReportDir: good.ReportDir}}, c: base(), skipped: "planning failed", err: true},
		{name: "relative library", planner: &fakeTimeslices{ok: true, client: TimesliceClient{SliceUS: 100,
			Library: "lib.so", ReportDir: good.ReportDir}}, c: base(), skipped: "planning failed", err: true},
		{name: "report directory with a colon", planner: &fakeTimeslices{ok: true, client: TimesliceClient{SliceUS: 100,
			Library: good.Library, ReportDir: "/x:y"}}, c: base(), skipped: "planning failed", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var p TimeslicePlanner
			if tc.planner != nil {
				p = tc.planner
			}
			d := DecideTimeslice(p, tc.c)
			if (d.Err != nil) != tc.err || (tc.err && !errors.Is(d.Err, ErrTimeslicePlanner)) {
				t.Fatalf("err %v, want %v", d.Err, tc.err)
			}
			if tc.skipped != "" && !strings.Contains(d.Skipped, tc.skipped) {
				t.Fatalf("skipped %q, want %q", d.Skipped, tc.skipped)
			}
			if tc.preload == "" {
				if d.OK || d.Env != nil || d.Mounts != nil {
					t.Fatalf("decision %+v; want no shim", d)
				}
				return
			}
			want := map[string]string{EnvLDPreload: tc.preload, timeslice.EnvTimesliceUS: "100",
				timeslice.EnvReport: ShimContainerReportDir, timeslice.EnvReportMaxBytes: "262144"}
			if !d.OK || !maps.Equal(d.Env, want) {
				t.Fatalf("env %v; want %v", d.Env, want)
			}
			wantMounts := []MPSMount{{Source: good.Library, Destination: ShimContainerPath, ReadOnly: true},
				{Source: good.ReportDir, Destination: ShimContainerReportDir}}
			if !slices.Equal(d.Mounts, wantMounts) {
				t.Fatalf("mounts %+v; want %+v", d.Mounts, wantMounts)
			}
			r := tc.planner.reqs[0]
			if r.PodUID != "u1" || r.Namespace != "ml" || r.Name != "train" || r.Container != "main" || !r.Batch ||
				r.RequestMilli != 300 || !slices.Equal(r.GPUs, gpus) {
				t.Fatalf("request %+v", r)
			}
		})
	}
}
