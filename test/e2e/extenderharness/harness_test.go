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
)

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
