package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testNode is a node with cpu cores, memGi GiB, gpus GPUs of model.
func testNode(name, model string, gpus, cpu, memGi int) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	n.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(cpu), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(memGi)<<30, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	if gpus > 0 {
		n.Status.Allocatable[contract.ResourceGPU] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
		n.Labels[LabelGPUProduct] = model
	}
	return n
}

// testServer is a server without a client; cfg mutators adjust DefaultConfig.
func testServer(t *testing.T, clock *fakeClock, deps Deps, mut ...func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Seed = 1
	for _, m := range mut {
		m(&cfg)
	}
	if clock != nil {
		deps.Now = clock.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := NewServer(cfg, deps)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	return s
}

func names(ns ...string) *[]string { return &ns }

func nodeNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// postJSON posts v (or raw bytes) to url+path and returns status and body.
func postJSON(t *testing.T, client *http.Client, url string, v any) (int, []byte) {
	t.Helper()
	var body []byte
	switch b := v.(type) {
	case []byte:
		body = b
	case string:
		body = []byte(b)
	default:
		var err error
		if body, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// filter calls /filter over HTTP and decodes the result.
func filter(t *testing.T, url string, pod *corev1.Pod, nodes ...string) extenderv1.ExtenderFilterResult {
	t.Helper()
	code, body := postJSON(t, http.DefaultClient, url+"/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &nodes})
	if code != http.StatusOK {
		t.Fatalf("filter: %d %s", code, body)
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("decoding filter result %s: %v", body, err)
	}
	return res
}

func bindArgs(pod *corev1.Pod, node string) extenderv1.ExtenderBindingArgs {
	return extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}
}

func bind(t *testing.T, url string, pod *corev1.Pod, node string) string {
	t.Helper()
	code, body := postJSON(t, http.DefaultClient, url+"/bind", bindArgs(pod, node))
	if code != http.StatusOK {
		t.Fatalf("bind: %d %s", code, body)
	}
	var res extenderv1.ExtenderBindingResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("decoding bind result %s: %v", body, err)
	}
	return res.Error
}

func startHTTP(t *testing.T, s *Server) string {
	t.Helper()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

func passedOne(t *testing.T, res extenderv1.ExtenderFilterResult) string {
	t.Helper()
	if res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Fatalf("want exactly one passing node, got %+v", res)
	}
	return (*res.NodeNames)[0]
}

func gpuFree(s *Server, node string) []int {
	s.state.mu.RLock()
	defer s.state.mu.RUnlock()
	e := s.state.led.nodes[node]
	if e == nil {
		return nil
	}
	return append([]int(nil), e.n.GPUFree...)
}

func phaseOf(s *Server, uid types.UID) string {
	s.state.mu.RLock()
	defer s.state.mu.RUnlock()
	if p := s.state.pods[uid]; p != nil {
		return fmt.Sprintf("%s@%s", p.phase, p.node)
	}
	return "unknown"
}

// runServer runs s (its informers) in the background until stop or the end of
// the test; stop cancels Run, waits for it and returns its error (the cleanup
// reports it).
func runServer(t *testing.T, s *Server) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stop
}

// fedServer is testServer for a test that feeds the index itself (State().Upsert*)
// while handing the server a fake Client for its API writes: it is marked synced,
// as Run would once its informers had fed it.
func fedServer(t *testing.T, clock *fakeClock, deps Deps, mut ...func(*Config)) *Server {
	t.Helper()
	s := testServer(t, clock, deps, mut...)
	if s.feed != nil {
		s.feed.synced.Store(true)
	}
	return s
}
