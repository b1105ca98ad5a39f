package schedbench

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func argsJSON(t testing.TB, args extenderv1.ExtenderArgs) string {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNoopExtender(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	names := []string{"a", "b", "c"}
	nodeList := &corev1.NodeList{Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, {ObjectMeta: metav1.ObjectMeta{Name: "y"}}}}
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantCode   int
		wantFilter []string // node names kept by /filter
		wantHosts  []string // hosts scored by /prioritize
	}{
		{name: "filter keeps node names", method: "POST", path: "/filter", body: argsJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}), wantCode: 200, wantFilter: names},
		{name: "filter keeps node list", method: "POST", path: "/filter", body: argsJSON(t, extenderv1.ExtenderArgs{Pod: pod, Nodes: nodeList}), wantCode: 200, wantFilter: []string{"x", "y"}},
		{name: "prioritize scores names zero", method: "POST", path: "/prioritize", body: argsJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}), wantCode: 200, wantHosts: names},
		{name: "prioritize scores node list zero", method: "POST", path: "/prioritize", body: argsJSON(t, extenderv1.ExtenderArgs{Pod: pod, Nodes: nodeList}), wantCode: 200, wantHosts: []string{"x", "y"}},
		{name: "no pod", method: "POST", path: "/filter", body: argsJSON(t, extenderv1.ExtenderArgs{NodeNames: &names}), wantCode: 400},
		{name: "no nodes", method: "POST", path: "/prioritize", body: argsJSON(t, extenderv1.ExtenderArgs{Pod: pod}), wantCode: 400},
		{name: "bad json", method: "POST", path: "/filter", body: "{", wantCode: 400},
		{name: "GET", method: "GET", path: "/filter", wantCode: 405},
		{name: "unknown verb", method: "POST", path: "/bind", body: "{}", wantCode: 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &NoopExtender{}
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantCode, rec.Body)
			}
			f, p := e.Calls()
			switch {
			case tc.wantFilter != nil:
				var res extenderv1.ExtenderFilterResult
				if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
					t.Fatal(err)
				}
				var got []string
				if res.NodeNames != nil {
					got = *res.NodeNames
				} else if res.Nodes != nil {
					for _, n := range res.Nodes.Items {
						got = append(got, n.Name)
					}
				}
				if !slices.Equal(got, tc.wantFilter) || len(res.FailedNodes) != 0 || res.Error != "" {
					t.Errorf("filter result %+v, want nodes %v and no failures", res, tc.wantFilter)
				}
				if f != 1 || p != 0 {
					t.Errorf("calls = %d/%d, want 1/0", f, p)
				}
			case tc.wantHosts != nil:
				var res extenderv1.HostPriorityList
				if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
					t.Fatal(err)
				}
				var hosts []string
				for _, h := range res {
					hosts = append(hosts, h.Host)
					if h.Score != 0 {
						t.Errorf("host %s scored %d, want 0", h.Host, h.Score)
					}
				}
				if !slices.Equal(hosts, tc.wantHosts) {
					t.Errorf("hosts %v, want %v", hosts, tc.wantHosts)
				}
				if f != 0 || p != 1 {
					t.Errorf("calls = %d/%d, want 0/1", f, p)
				}
			default:
				if f != 0 || p != 0 {
					t.Errorf("rejected request counted: %d/%d", f, p)
				}
			}
		})
	}
}

func FuzzNoopExtender(f *testing.F) {
	names := []string{"a"}
	f.Add("/filter", argsJSON(f, extenderv1.ExtenderArgs{Pod: &corev1.Pod{}, NodeNames: &names}))
	f.Add("/prioritize", `{"pod":{},"nodes":{"items":[{"metadata":{"name":"n"}}]}}`)
	f.Add("/filter", `{"pod":null}`)
	f.Fuzz(func(t *testing.T, path, body string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequest(http.MethodPost, "http://x"+path, strings.NewReader(body))
		if err != nil {
			return
		}
		rec := httptest.NewRecorder()
		(&NoopExtender{}).ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
	})
}

func TestProcField(t *testing.T) {
	t.Parallel()
	if got := procField("/proc/meminfo", "MemTotal"); !strings.HasSuffix(got, "kB") {
		t.Errorf("MemTotal = %q, want a kB value", got)
	}
	if got := procField("/proc/meminfo", "NoSuchField"); got != "" {
		t.Errorf("missing field = %q, want empty", got)
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	runs := func(v ...float64) []Result {
		var rs []Result
		for _, x := range v {
			rs = append(rs, Result{PodsPerSec: x})
		}
		return rs
	}
	tests := []struct {
		name string
		in   []Result
		want Summary
	}{
		{name: "none", want: Summary{Name: "s"}},
		{name: "one", in: runs(5), want: Summary{Name: "s", Runs: 1, MedianPodsPerSec: 5, MinPodsPerSec: 5, MaxPodsPerSec: 5}},
		{name: "odd", in: runs(9, 1, 5), want: Summary{Name: "s", Runs: 3, MedianPodsPerSec: 5, MinPodsPerSec: 1, MaxPodsPerSec: 9}},
		{name: "even takes lower middle", in: runs(4, 1, 3, 2), want: Summary{Name: "s", Runs: 4, MedianPodsPerSec: 2, MinPodsPerSec: 1, MaxPodsPerSec: 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := summarize("s", tc.in); got != tc.want {
				t.Errorf("summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReportSetReplacesScenario(t *testing.T) {
	t.Parallel()
	var r Report
	r.set(Summary{Name: "a", Runs: 1}, []Result{{Name: "a", PodsPerSec: 1}})
	r.set(Summary{Name: "b", Runs: 1}, []Result{{Name: "b", PodsPerSec: 2}})
	r.set(Summary{Name: "a", Runs: 2}, []Result{{Name: "a", PodsPerSec: 3}, {Name: "a", PodsPerSec: 4}})
	if len(r.Summary) != 2 || r.Summary[1].Name != "a" || r.Summary[1].Runs != 2 {
		t.Errorf("summary = %+v, want b then a with 2 runs", r.Summary)
	}
	var got []float64
	for _, x := range r.Results {
		got = append(got, x.PodsPerSec)
	}
	if !slices.Equal(got, []float64{2, 3, 4}) {
		t.Errorf("results pods/s = %v, want [2 3 4]", got)
	}
}
