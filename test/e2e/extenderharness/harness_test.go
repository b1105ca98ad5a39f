package extenderharness

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/yaml"
)

const testURL = "http://127.0.0.1:4242"

func TestSchedulerConfig(t *testing.T) {
	t.Parallel()
	repo, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		manifest string
		wantErr  bool
	}{
		{name: "repository manifest", manifest: string(repo)},
		{name: "minimal", manifest: "extenders:\n- urlPrefix: http://x\n  filterVerb: filter\n"},
		{name: "tls dropped", manifest: "extenders:\n- urlPrefix: https://x\n  enableHTTPS: true\n  tlsConfig: {caFile: /nope}\n"},
		{name: "no extenders", manifest: "kind: KubeSchedulerConfiguration\n", wantErr: true},
		{name: "two extenders", manifest: "extenders:\n- urlPrefix: http://a\n- urlPrefix: http://b\n", wantErr: true},
		{name: "extender not a mapping", manifest: "extenders:\n- http://a\n", wantErr: true},
		{name: "no urlPrefix", manifest: "extenders:\n- filterVerb: filter\n", wantErr: true},
		{name: "not yaml", manifest: "extenders: [", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := SchedulerConfig([]byte(tc.manifest), testURL)
			if tc.wantErr {
				if !errors.Is(err, ErrManifest) {
					t.Fatalf("err = %v, want ErrManifest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var before, after map[string]any
			if err := yaml.Unmarshal([]byte(tc.manifest), &before); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(out), &after); err != nil {
				t.Fatal(err)
			}
			ext := after["extenders"].([]any)[0].(map[string]any)
			if ext["urlPrefix"] != testURL {
				t.Errorf("urlPrefix = %v, want %s", ext["urlPrefix"], testURL)
			}
			// Only the URL changes, and the TLS settings go with a plain http URL.
			if _, ok := ext["tlsConfig"]; ok {
				t.Errorf("tlsConfig kept for the plain http URL %s", testURL)
			}
			be := before["extenders"].([]any)[0].(map[string]any)
			be["urlPrefix"] = testURL
			delete(be, "tlsConfig")
			delete(be, "enableHTTPS")
			b1, _ := json.Marshal(before)
			b2, _ := json.Marshal(after)
			if string(b1) != string(b2) {
				t.Errorf("configuration changed beyond urlPrefix:\n%s\n%s", b1, b2)
			}
		})
	}
}

func TestManifestExtender(t *testing.T) {
	t.Parallel()
	repo, err := ReadManifest()
	if err != nil {
		t.Fatal(err)
	}
	ext, err := ManifestExtender(repo, testURL)
	if err != nil {
		t.Fatal(err)
	}
	if ext.URLPrefix != testURL || ext.FilterVerb != "filter" || ext.PrioritizeVerb != "prioritize" || ext.BindVerb != "bind" ||
		ext.Weight <= 0 || !ext.NodeCacheCapable || ext.Ignorable || ext.HTTPTimeout == "" {
		t.Errorf("extender entry %+v does not match the manifest", ext)
	}
	managed := map[string]bool{}
	for _, m := range ext.ManagedResources {
		managed[m.Name] = m.IgnoredByScheduler
	}
	if ignored, ok := managed["nvidia.com/gpu"]; !ok || ignored {
		t.Errorf("nvidia.com/gpu managed=%v ignoredByScheduler=%v, want managed and counted", ok, ignored)
	}
	if ignored, ok := managed["understory.io/gpu-milli"]; !ok || !ignored {
		t.Errorf("understory.io/gpu-milli managed=%v ignoredByScheduler=%v, want managed and ignored", ok, ignored)
	}
	if _, err := ManifestExtender([]byte("extenders:\n- urlPrefix: http://x\n"), testURL); !errors.Is(err, ErrManifest) {
		t.Errorf("entry without verbs: err = %v, want ErrManifest", err)
	}
}

func FuzzSchedulerConfig(f *testing.F) {
	f.Add("extenders:\n- urlPrefix: http://x\n")
	f.Add("extenders:\n- {urlPrefix: 1}\n")
	f.Add("extenders: {}\n")
	f.Add("- a\n- b\n")
	f.Fuzz(func(t *testing.T, manifest string) {
		out, err := SchedulerConfig([]byte(manifest), testURL)
		if err != nil {
			return
		}
		if !strings.Contains(out, testURL) {
			t.Fatalf("output without the URL: %q", out)
		}
		if _, err := SchedulerConfig([]byte(out), testURL); err != nil {
			t.Fatalf("output does not parse again: %v", err)
		}
	})
}

func argsBody(t *testing.T, ns, name string) string {
	t.Helper()
	names := []string{"n1"}
	b, err := json.Marshal(extenderv1.ExtenderArgs{
		Pod:       &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		NodeNames: &names,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSpy(t *testing.T) {
	t.Parallel()
	var got []string // bodies the wrapped handler read
	e := &Extender{track: true, pods: map[string]*PodCalls{}, inner: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.URL.Path+" "+string(b))
	})}
	bind, err := json.Marshal(extenderv1.ExtenderBindingArgs{PodNamespace: "ns", PodName: "a", Node: "n1", PodUID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []struct{ method, path, body string }{
		{http.MethodPost, "/filter", argsBody(t, "ns", "a")},
		{http.MethodPost, "/filter", argsBody(t, "ns", "b")},
		{http.MethodPost, "/prioritize", argsBody(t, "ns", "a")},
		{http.MethodPost, "/bind", string(bind)},
		{http.MethodPost, "/filter", "{not json"},
		{http.MethodGet, "/status", ""},
	}
	for _, r := range reqs {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(r.method, r.path, strings.NewReader(r.body)))
	}
	if c := e.Calls(); c != (Calls{Filter: 3, Prioritize: 1, Bind: 1}) || c.Total() != 5 {
		t.Errorf("calls %+v, want 3 filter, 1 prioritize, 1 bind", c)
	}
	a := e.PodCalls("ns", "a")
	if a.Filter != 1 || a.Prioritize != 1 || a.Bind != 1 || a.BindNode != "n1" || a.FirstBind.IsZero() || a.LastBind.Before(a.FirstBind) {
		t.Errorf("pod a: %+v", a)
	}
	if b := e.PodCalls("ns", "b"); b.Filter != 1 || b.Bind != 0 {
		t.Errorf("pod b: %+v", b)
	}
	if n := len(e.SeenPods()); n != 2 {
		t.Errorf("seen %v, want 2 pods", e.SeenPods())
	}
	// The wrapped handler gets every request with its body intact.
	if len(got) != len(reqs) {
		t.Fatalf("handler saw %d requests, want %d", len(got), len(reqs))
	}
	for i, r := range reqs {
		if want := r.path + " " + r.body; got[i] != want {
			t.Errorf("request %d reached the handler as %q, want %q", i, got[i], want)
		}
	}
}

func TestMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"verb", "code"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "y", Help: "y"})
	reg.MustRegister(c, g)
	c.WithLabelValues("filter", "200").Add(3)
	c.WithLabelValues("filter", "400").Add(1)
	c.WithLabelValues("bind", "200").Add(2)
	g.Set(7)
	e := &Extender{reg: reg}
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"all samples", "x_total", nil, 6},
		{"one label", "x_total", []string{"verb", "filter"}, 4},
		{"two labels", "x_total", []string{"verb", "filter", "code", "200"}, 3},
		{"no match", "x_total", []string{"verb", "prioritize"}, 0},
		{"gauge", "y", nil, 7},
		{"unknown family", "z", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := e.Metric(tc.metric, tc.labels...)
			if err != nil || got != tc.want {
				t.Errorf("Metric = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := e.Metric("x_total", "verb"); !errors.Is(err, ErrBadArgument) {
		t.Errorf("odd labels: err = %v, want ErrBadArgument", err)
	}
}
