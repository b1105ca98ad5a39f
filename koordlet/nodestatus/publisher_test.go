package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/internal/logtest"
)

var _ NodeClient = (typedcorev1.NodeInterface)(nil)

const gpu corev1.ResourceName = "nvidia.com/gpu"

// kubeletNode is a registered Node as kubelet leaves it: capacity and allocatable with
// kubelet's own keys (allocatable below capacity by its reservations).
func kubeletNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"l": "v"},
			Annotations: map[string]string{"a": "kept"}},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"),
				corev1.ResourceMemory: resource.MustParse("16Gi"), corev1.ResourcePods: resource.MustParse("110"),
				gpu: resource.MustParse("1")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3900m"),
				corev1.ResourceMemory: resource.MustParse("15Gi"), corev1.ResourcePods: resource.MustParse("110"),
				gpu: resource.MustParse("1")},
		},
	}
}

// fastBackoff keeps retries quick; Factor 1 so tests never wait for growth.
func fastBackoff(d time.Duration) Option {
	return WithBackoff(wait.Backoff{Duration: d, Factor: 1, Steps: 1})
}

func testLogger(buf io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// start runs p until the test ends and checks that Run then returns nil.
func start(t *testing.T, p *Publisher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, what, cond)
}

func newPublisher(t *testing.T, c NodeClient, opts ...Option) *Publisher {
	t.Helper()
	p, err := New(c, "n1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func getNode(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// patches returns the bodies of the status patches the client received.
func patches(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		if pa, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, string(pa.GetPatch()))
		}
	}
	return out
}

func mustPatch(r Resources) string {
	b, err := PatchFor(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// checkPublished asserts the Node holds r in capacity and allocatable and kubelet's
// entries as they were.
func checkPublished(t *testing.T, n *corev1.Node, r Resources) {
	t.Helper()
	want := kubeletNode(n.Name)
	for _, l := range []struct {
		name      string
		got, orig corev1.ResourceList
	}{
		{"capacity", n.Status.Capacity, want.Status.Capacity},
		{"allocatable", n.Status.Allocatable, want.Status.Allocatable},
	} {
		if q := l.got[contract.ResourceBatchCPU]; q.Value() != r.CPUMilli {
			t.Errorf("%s %s = %s, want %d", l.name, contract.ResourceBatchCPU, q.String(), r.CPUMilli)
		}
		if q := l.got[contract.ResourceBatchMemory]; q.Value() != r.MemoryBytes {
			t.Errorf("%s %s = %s, want %d", l.name, contract.ResourceBatchMemory, q.String(), r.MemoryBytes)
		}
		if len(l.got) != len(l.orig)+2 {
			t.Errorf("%s has %d keys, want kubelet's %d + 2: %v", l.name, len(l.got), len(l.orig), l.got)
		}
		for k, v := range l.orig {
			if g, ok := l.got[k]; !ok || g.Cmp(v) != 0 {
				t.Errorf("%s[%s] = %v, want kubelet's %v untouched", l.name, k, g.String(), v.String())
			}
		}
	}
	if n.Labels["l"] != "v" || n.Annotations["a"] != "kept" {
		t.Errorf("metadata changed: %+v", n.ObjectMeta)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset().CoreV1().Nodes()
	for _, tc := range []struct {
		name  string
		nodes NodeClient
		node  string
	}{{"no client", nil, "n1"}, {"no node name", c, ""}} {
		if _, err := New(tc.nodes, tc.node); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", tc.name, err)
		}
	}
}

func TestPatchFor(t *testing.T) {
	t.Parallel()
	got := mustPatch(Resources{CPUMilli: 3500, MemoryBytes: 6 << 30})
	const want = `{"status":{"allocatable":{"understory.io/batch-cpu":"3500","understory.io/batch-memory":"6442450944"},` +
		`"capacity":{"understory.io/batch-cpu":"3500","understory.io/batch-memory":"6442450944"}}}`
	if got != want {
		t.Fatalf("patch:\n got %s\nwant %s", got, want)
	}
	// A JSON merge patch of a map merges keys: kubelet's entries survive.
	orig, err := json.Marshal(kubeletNode("n1"))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := jsonpatch.MergePatch(orig, []byte(got))
	if err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := json.Unmarshal(merged, &n); err != nil {
		t.Fatal(err)
	}
	checkPublished(t, &n, Resources{CPUMilli: 3500, MemoryBytes: 6 << 30})
}

// TestPublishes: the writer reads the Node, then patches only the two keys in both
// lists through the status subresource; a Node already holding the value is not patched.
func TestPublishes(t *testing.T) {
	t.Parallel()
	want := Resources{CPUMilli: 3500, MemoryBytes: 6 << 30}
	withBatch := func(cpu, mem string) *corev1.Node {
		n := kubeletNode("n1")
		for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
			l[contract.ResourceBatchCPU], l[contract.ResourceBatchMemory] = resource.MustParse(cpu), resource.MustParse(mem)
		}
		return n
	}
	for _, tc := range []struct {
		name    string
		node    *corev1.Node
		patched bool
	}{
		{"fresh node", kubeletNode("n1"), true},
		{"other values", withBatch("1", "1"), true},
		{"reset by kubelet", withBatch("0", "0"), true},
		{"already there", withBatch("3500", "6Gi"), false},
		{"allocatable only", func() *corev1.Node {
			n := kubeletNode("n1")
			n.Status.Allocatable[contract.ResourceBatchCPU] = resource.MustParse("3500")
			n.Status.Allocatable[contract.ResourceBatchMemory] = resource.MustParse("6Gi")
			return n
		}(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(tc.node)
			writes := prometheus.NewCounter(prometheus.CounterOpts{Name: "writes_total"})
			p := newPublisher(t, c.CoreV1().Nodes(), WithCounters(writes, nil), WithLogger(testLogger(io.Discard)))
			if s := p.Status(); s.Desired != nil || s.Synced || s.Node != "n1" {
				t.Fatalf("status before Set: %+v", s)
			}
			start(t, p)
			if p.Set(want) {
				t.Fatal("Set clamped a valid value")
			}
			waitFor(t, "synced", func() bool { return p.Status().Synced })
			s := p.Status()
			if *s.Written != want || s.WrittenAt.IsZero() || s.LastError != "" || s.Attempts != 1 {
				t.Fatalf("status %+v", s)
			}
			var wantPatches []string
			if tc.patched {
				wantPatches = []string{mustPatch(want)}
			}
			if got := patches(c); !slices.Equal(got, wantPatches) {
				t.Fatalf("patches %q, want %q", got, wantPatches)
			}
			if got := testutil.ToFloat64(writes); got != float64(len(wantPatches)) || s.Writes != int64(len(wantPatches)) {
				t.Fatalf("writes counter %v, status %d; want %d", got, s.Writes, len(wantPatches))
			}
			acts := c.Actions()
			if acts[0].GetVerb() != "get" {
				t.Fatalf("first request %v, want a get of the node", acts[0])
			}
			for _, a := range acts[1:] {
				pa := a.(k8stesting.PatchAction)
				if pa.GetSubresource() != "status" || pa.GetPatchType() != types.MergePatchType || pa.GetName() != "n1" {
					t.Fatalf("patch %s/%s type %s, want a merge patch of n1/status",
						pa.GetName(), pa.GetSubresource(), pa.GetPatchType())
				}
			}
			checkPublished(t, getNode(t, c), want)
			// The next value is patched without another read.
			before := len(c.Actions())
			next := Resources{CPUMilli: 1200, MemoryBytes: 1 << 30}
			p.Set(next)
			waitFor(t, "next value", func() bool { return p.Status().Synced && *p.Status().Written == next })
			if more := c.Actions()[before:]; len(more) != 1 || more[0].GetVerb() != "patch" {
				t.Fatalf("requests for the next value: %v, want 1 patch", more)
			}
			checkPublished(t, getNode(t, c), next)
		})
	}
}

// TestRetries: conflicts, 5xx, 429, timeouts and transport errors are retried (with a
// read of the Node before the retry) until the patch goes through.
func TestRetries(t *testing.T) {
	t.Parallel()
	gr := schema.GroupResource{Resource: "nodes"}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"conflict", apierrors.NewConflict(gr, "n1", errors.New("changed"))},
		{"internal", apierrors.NewInternalError(errors.New("etcd"))},
		{"503", apierrors.NewServiceUnavailable("starting")},
		{"429", apierrors.NewTooManyRequests("slow down", 1)},
		{"server timeout", apierrors.NewServerTimeout(gr, "patch", 1)},
		{"deadline", context.DeadlineExceeded},
		{"transport", errors.New("dial tcp: connection refused")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(kubeletNode("n1"))
			var failed atomic.Int32
			c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failed.Add(1) <= 2 {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "failures_total"})
			logs := &logtest.Buffer{}
			p := newPublisher(t, c.CoreV1().Nodes(), fastBackoff(time.Millisecond), WithCounters(nil, failures),
				WithLogger(testLogger(logs)))
			start(t, p)
			want := Resources{CPUMilli: 700, MemoryBytes: 1 << 20}
			p.Set(want)
			waitFor(t, "synced", func() bool { return p.Status().Synced })
			var gets int
			for _, a := range c.Actions() {
				if a.GetVerb() == "get" {
					gets++
				}
			}
			if gets != 3 { // before the first write and after each error
				t.Fatalf("%d reads of the node, want 3", gets)
			}
			checkPublished(t, getNode(t, c), want)
			s := p.Status()
			if s.Failures != 2 || s.Writes != 1 || s.Attempts != 3 || s.LastErrorAt.IsZero() ||
				!strings.Contains(s.LastError, "patching status of node n1") || testutil.ToFloat64(failures) != 2 {
				t.Fatalf("status %+v, failures counter %v", s, testutil.ToFloat64(failures))
			}
			if n := logs.Lines("publishing batch resources failed"); n != 1 {
				t.Fatalf("%d failure log lines for one kind of error, want 1:\n%s", n, logs)
			}
			waitFor(t, "recovery log line", func() bool { return logs.Lines("after failures") == 1 })
		})
	}
}

func TestBackoffGrowsAndCaps(t *testing.T) {
	t.Parallel()
	b := DefaultBackoff()
	b.Jitter = 0
	d := b.DelayFunc()
	var got []time.Duration
	for range 12 {
		got = append(got, d())
	}
	if got[0] != 200*time.Millisecond || got[1] != 400*time.Millisecond || got[len(got)-1] != 30*time.Second {
		t.Fatalf("back-off %v: want 200ms doubling, capped at 30s", got)
	}
	var c config
	WithBackoff(wait.Backoff{Duration: 0, Factor: 2})(&c)
	WithBackoff(wait.Backoff{Duration: time.Second, Factor: 0.5})(&c)
	if c.backoff.Duration != 0 {
		t.Fatalf("invalid back-off accepted: %+v", c.backoff)
	}
}

// TestLatestWinsDuringBackoff: values Set while a failed write waits for its retry
// replace it; only the newest is written.
func TestLatestWinsDuringBackoff(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(kubeletNode("n1"))
	var failed atomic.Bool
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !failed.Swap(true) {
			return true, nil, apierrors.NewInternalError(errors.New("boom"))
		}
		return false, nil, nil
	})
	p := newPublisher(t, c.CoreV1().Nodes(), fastBackoff(300*time.Millisecond), WithLogger(testLogger(io.Discard)))
	start(t, p)
	a, b, last := Resources{CPUMilli: 1}, Resources{CPUMilli: 2}, Resources{CPUMilli: 3, MemoryBytes: 3}
	p.Set(a)
	waitFor(t, "first failure", func() bool { return p.Status().Failures == 1 })
	p.Set(b)
	p.Set(last)
	if s := p.Status(); *s.Desired != last || s.Synced {
		t.Fatalf("status during back-off %+v", s)
	}
	waitFor(t, "synced", func() bool { return p.Status().Synced })
	if got, want := patches(c), []string{mustPatch(a), mustPatch(last)}; !slices.Equal(got, want) {
		t.Fatalf("patches %q, want %q (the superseded value never written)", got, want)
	}
	checkPublished(t, getNode(t, c), last)
}

// TestSetNeverBlocks: with the API server hanging, Set and Status return at once and
// Run still ends when its context does.
func TestSetNeverBlocks(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(kubeletNode("n1"))
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	// The fake ignores contexts: the reactor hangs until the test releases it.
	c.PrependReactor("*", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return true, nil, errors.New("released")
	})
	p := newPublisher(t, c.CoreV1().Nodes(), WithLogger(testLogger(io.Discard)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	p.Set(Resources{CPUMilli: 1})
	<-entered
	setDone := make(chan struct{})
	go func() {
		defer close(setDone)
		for i := range 10000 {
			p.Set(Resources{CPUMilli: int64(i)})
			_ = p.Status()
		}
	}()
	select {
	case <-setDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Set blocked while the API server hung")
	}
	if s := p.Status(); s.Desired.CPUMilli != 9999 || s.Synced {
		t.Fatalf("status %+v", s)
	}
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
	if s := p.Status(); s.Failures != 0 {
		t.Fatalf("a request ended by shutdown counted as a failure: %+v", s)
	}
}

// TestNodeNotReady: a Node without allocatable, or none at all, gets no patch and one
// log line however many retries; once kubelet registers it, the value is published.
func TestNodeNotReady(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		waiting string
	}{
		{"no allocatable", []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
			Labels: map[string]string{"l": "v"}, Annotations: map[string]string{"a": "kept"}}}}, "no allocatable"},
		{"not found", nil, "node not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(tc.objs...)
			logs := &logtest.Buffer{}
			p := newPublisher(t, c.CoreV1().Nodes(), fastBackoff(time.Millisecond), WithLogger(testLogger(logs)))
			start(t, p)
			want := Resources{CPUMilli: 2500, MemoryBytes: 4 << 30}
			p.Set(want)
			waitFor(t, "retries", func() bool { return p.Status().Failures >= 20 })
			s := p.Status()
			if s.Synced || s.Written != nil || !strings.Contains(s.Waiting, tc.waiting) || s.LastError == "" {
				t.Fatalf("status %+v", s)
			}
			if got := patches(c); len(got) != 0 {
				t.Fatalf("patched a node that is not ready: %q", got)
			}
			if n := logs.Lines(tc.waiting); n != 1 {
				t.Fatalf("%d log lines mentioning %q after %d retries, want 1:\n%s", n, tc.waiting, s.Failures, logs)
			}
			// kubelet registers the node.
			ctx := context.Background()
			if tc.objs == nil {
				if _, err := c.CoreV1().Nodes().Create(ctx, kubeletNode("n1"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, kubeletNode("n1"),
				metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "synced", func() bool { return p.Status().Synced })
			checkPublished(t, getNode(t, c), want)
			if p.Status().Waiting != "" {
				t.Fatalf("still waiting: %+v", p.Status())
			}
		})
	}
}

func TestClampsNegative(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(kubeletNode("n1"))
	p := newPublisher(t, c.CoreV1().Nodes(), WithLogger(testLogger(io.Discard)))
	for _, tc := range []struct {
		in      Resources
		clamped bool
	}{
		{Resources{CPUMilli: -5, MemoryBytes: 10}, true},
		{Resources{CPUMilli: 5, MemoryBytes: -10}, true},
		{Resources{CPUMilli: 0, MemoryBytes: 0}, false},
	} {
		if got := p.Set(tc.in); got != tc.clamped {
			t.Errorf("Set(%+v) clamped = %v, want %v", tc.in, got, tc.clamped)
		}
	}
	if s := p.Status(); s.Clamped != 2 || *s.Desired != (Resources{}) {
		t.Fatalf("status %+v", s)
	}
	start(t, p)
	p.Set(Resources{CPUMilli: -1, MemoryBytes: -1})
	waitFor(t, "synced", func() bool { return p.Status().Synced })
	checkPublished(t, getNode(t, c), Resources{})
}

// TestResyncRepairsReset: kubelet zeroing the values on re-registration is repaired at
// the next resync.
func TestResyncRepairsReset(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(kubeletNode("n1"))
	p := newPublisher(t, c.CoreV1().Nodes(), WithResync(5*time.Millisecond), WithLogger(testLogger(io.Discard)))
	start(t, p)
	want := Resources{CPUMilli: 800, MemoryBytes: 1 << 30}
	p.Set(want)
	waitFor(t, "synced", func() bool { return p.Status().Synced })
	n := getNode(t, c)
	for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		l[contract.ResourceBatchCPU], l[contract.ResourceBatchMemory] = resource.MustParse("0"), resource.MustParse("0")
	}
	if _, err := c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "repaired", func() bool {
		q := getNode(t, c).Status.Allocatable[contract.ResourceBatchCPU]
		return q.Value() == want.CPUMilli
	})
	checkPublished(t, getNode(t, c), want)
	if got := len(patches(c)); got != 2 {
		t.Fatalf("%d patches, want 2 (the write and the repair)", got)
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, fake.NewClientset().CoreV1().Nodes())
	start(t, p)
	waitFor(t, "running", p.running.Load)
	if err := p.Run(context.Background()); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

// TestHTTPRoundTrip drives client-go's real REST client against an httptest API server:
// the request goes to /api/v1/nodes/n1/status as a JSON merge patch, a hanging request
// is cut by the per-request timeout and retried.
func TestHTTPRoundTrip(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	node, err := json.Marshal(kubeletNode("n1"))
	if err != nil {
		t.Fatal(err)
	}
	var patchCalls atomic.Int32
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/n1":
			if rv := r.URL.Query().Get("resourceVersion"); rv != "0" {
				t.Errorf("GET with resourceVersion %q, want 0 (watch cache)", rv)
			}
			_, _ = w.Write(node)
		case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/n1/status":
			if ct := r.Header.Get("Content-Type"); ct != string(types.MergePatchType) {
				t.Errorf("patch content type %q", ct)
			}
			// Read the body first: the server notices a client hanging up only after it.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Error(err)
			}
			if patchCalls.Add(1) == 1 { // hang until the client gives up
				mu.Unlock()
				select {
				case <-r.Context().Done():
				case <-stop:
					t.Error("the client never gave up on a hanging request")
				}
				mu.Lock()
				return
			}
			merged, err := jsonpatch.MergePatch(node, body)
			if err != nil {
				w.WriteHeader(http.StatusUnprocessableEntity)
				return
			}
			node = merged
			_, _ = w.Write(node)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs before srv.Close
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	p := newPublisher(t, cs.CoreV1().Nodes(), WithRequestTimeout(100*time.Millisecond), fastBackoff(time.Millisecond),
		WithLogger(testLogger(logs)))
	start(t, p)
	want := Resources{CPUMilli: 3500, MemoryBytes: 6 << 30}
	p.Set(want)
	waitFor(t, "synced", func() bool { return p.Status().Synced })
	s := p.Status()
	if s.Failures != 1 || !strings.Contains(s.LastError, "deadline") {
		t.Fatalf("status %+v: want one timed-out attempt", s)
	}
	mu.Lock()
	var n corev1.Node
	err = json.Unmarshal(node, &n)
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	checkPublished(t, &n, want)
}
