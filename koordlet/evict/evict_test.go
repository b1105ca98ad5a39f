package evict

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/understory/understory/koordlet/internal/logtest"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// The agent's sinks and API client satisfy the consumer interfaces.
var (
	_ EventRecorder = (*podsource.EventSink)(nil)
	_ EventRecorder = (*podsource.LogSink)(nil)
	_ API           = (*podsource.CoreClient)(nil)
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type event struct{ ns, name, uid, reason, message string }

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Warn(pod *corev1.Pod, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{pod.Namespace, pod.Name, string(pod.UID), reason, message})
}

func (r *recorder) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.name+":"+e.reason)
	}
	return out
}

// fakeAPI is client-go's fake clientset whose eviction reactor answers with
// respond(pod name); it records the pods it was asked to evict.
type fakeAPI struct {
	cs    *fake.Clientset
	mu    sync.Mutex
	calls []string
}

func newFakeAPI(respond func(ev *policyv1.Eviction) error) *fakeAPI {
	f := &fakeAPI{cs: fake.NewClientset()}
	f.cs.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction)
		f.mu.Lock()
		f.calls = append(f.calls, a.GetNamespace()+"/"+ev.Name)
		f.mu.Unlock()
		return true, nil, respond(ev)
	})
	return f
}

func (f *fakeAPI) api() API {
	return PerNamespace(func(ns string) API { return f.cs.CoreV1().Pods(ns) })
}

func (f *fakeAPI) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

type harness struct {
	e       *Evictor
	clock   *clock
	events  *recorder
	logs    *logtest.Buffer
	metrics *metrics.Escalation
}

func newHarness(t *testing.T, api API, mutate func(*Options)) *harness {
	t.Helper()
	m, err := metrics.NewEscalation(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{clock: &clock{t: t0}, events: &recorder{}, logs: &logtest.Buffer{}, metrics: m}
	o := Options{
		Escalation: qos.DefaultEscalationConfig(),
		Events:     h.events,
		Metrics:    m,
		Logger:     slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Now:        h.clock.now,
	}
	if mutate != nil {
		mutate(&o)
	}
	h.e = New(api, o)
	return h
}

func (h *harness) count(reason, result string) float64 {
	return testutil.ToFloat64(h.metrics.Evictions.WithLabelValues(reason, result))
}

func batch(name string, prio int32, mem int64, started time.Time) qos.EvictionCandidate {
	return qos.EvictionCandidate{UID: types.UID("uid-" + name), Namespace: "ml", Name: name, Class: qos.ClassBatch,
		Priority: prio, MemoryBytes: mem, StartTime: started}
}

var starvation = qos.EvictionRequest{Reason: qos.EvictReasonCPUStarvation, StarvedFor: metav1.Duration{Duration: 6 * time.Minute},
	StarvationTimeout: metav1.Duration{Duration: 5 * time.Minute}}

const gib = int64(1) << 30

func TestReasonsMatchMetrics(t *testing.T) {
	t.Parallel()
	for _, p := range [][2]string{
		{qos.EvictReasonMemoryPressure, metrics.EvictReasonMemoryPressure},
		{qos.EvictReasonCPUStarvation, metrics.EvictReasonCPUStarvation},
		{qos.EvictReasonGPUStarvation, metrics.EvictReasonGPUStarvation},
		{qos.EscalationReasonCPUContention, metrics.FreezeReasonCPUContention},
	} {
		if p[0] != p[1] {
			t.Errorf("qos reason %q != metrics reason %q", p[0], p[1])
		}
	}
}

// TestResults checks how each API answer is classified and what follows:
// the next candidate is tried, the pod is backed off or not.
func TestResults(t *testing.T) {
	t.Parallel()
	podsGR := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name        string
		first       error // answer for pod "a"; "b" is always accepted
		wantResult  string
		wantCalls   []string
		wantBlocked bool
		wantEvents  []string
	}{
		{name: "accepted", first: nil, wantResult: metrics.EvictResultEvicted,
			wantCalls: []string{"ml/a"}, wantEvents: []string{"a:Evicted"}},
		{name: "PDB refuses", first: pdbError("a"), wantResult: metrics.EvictResultBlockedPDB,
			wantCalls: []string{"ml/a", "ml/b"}, wantBlocked: true, wantEvents: []string{"a:EvictionBlocked", "b:Evicted"}},
		{name: "pod gone", first: apierrors.NewNotFound(podsGR, "a"), wantResult: metrics.EvictResultNotFound,
			wantCalls: []string{"ml/a", "ml/b"}, wantEvents: []string{"b:Evicted"}},
		{name: "pod replaced (UID precondition)", first: apierrors.NewConflict(podsGR, "a", errors.New("uid differs")),
			wantResult: metrics.EvictResultNotFound, wantCalls: []string{"ml/a", "ml/b"}, wantEvents: []string{"b:Evicted"}},
		{name: "server error", first: apierrors.NewInternalError(errors.New("etcd down")), wantResult: metrics.EvictResultError,
			wantCalls: []string{"ml/a", "ml/b"}, wantBlocked: true, wantEvents: []string{"a:EvictionFailed", "b:Evicted"}},
		{name: "network error", first: errors.New("connection refused"), wantResult: metrics.EvictResultError,
			wantCalls: []string{"ml/a", "ml/b"}, wantBlocked: true, wantEvents: []string{"a:EvictionFailed", "b:Evicted"}},
		{name: "RBAC denies", first: apierrors.NewForbidden(schema.GroupResource{Resource: "pods/eviction"}, "a",
			errors.New("cannot create pods/eviction")), wantResult: metrics.EvictResultUnavailable,
			wantCalls: []string{"ml/a"}, wantEvents: []string{"a:EvictionFailed"}},
		{name: "no eviction endpoint", first: apierrors.NewGenericServerResponse(http.StatusNotFound, "POST", podsGR, "a",
			"404 page not found", 0, true), wantResult: metrics.EvictResultUnavailable,
			wantCalls: []string{"ml/a"}, wantEvents: []string{"a:EvictionFailed"}},
		{name: "no such resource kind", first: apierrors.NewNotFound(schema.GroupResource{Group: "policy", Resource: "evictions"}, ""),
			wantResult: metrics.EvictResultUnavailable, wantCalls: []string{"ml/a"}, wantEvents: []string{"a:EvictionFailed"}},
		{name: "method not supported", first: apierrors.NewMethodNotSupported(podsGR, "create"),
			wantResult: metrics.EvictResultUnavailable, wantCalls: []string{"ml/a"}, wantEvents: []string{"a:EvictionFailed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(func(ev *policyv1.Eviction) error {
				if ev.Name == "a" {
					return tt.first
				}
				return nil
			})
			h := newHarness(t, f.api(), nil)
			a, b := batch("a", 0, gib, t0.Add(-time.Hour)), batch("b", 0, gib/2, t0.Add(-time.Hour))
			if err := h.e.Submit(starvation, []qos.EvictionCandidate{b, a}); err != nil {
				t.Fatal(err)
			}
			if wait := h.e.process(context.Background()); wait != 0 {
				t.Fatalf("process waits %v, want 0", wait)
			}
			if got := f.called(); !slices.Equal(got, tt.wantCalls) {
				t.Errorf("API calls %v, want %v", got, tt.wantCalls)
			}
			if got := h.count(qos.EvictReasonCPUStarvation, tt.wantResult); got != 1 {
				t.Errorf("evictions_total{result=%q} = %v, want 1", tt.wantResult, got)
			}
			if got := h.events.reasons(); !slices.Equal(got, tt.wantEvents) {
				t.Errorf("events %v, want %v", got, tt.wantEvents)
			}
			st := h.e.Status()
			blocked := slices.ContainsFunc(st.Blocked, func(b Blocked) bool { return b.Name == "a" })
			if blocked != tt.wantBlocked {
				t.Errorf("a blocked = %v, want %v (%+v)", blocked, tt.wantBlocked, st.Blocked)
			}
			if tt.wantResult == metrics.EvictResultUnavailable {
				if st.Unavailable == nil || !st.UnavailableUntil.Equal(t0.Add(DefaultUnavailableRetry)) {
					t.Errorf("Status.Unavailable = %+v until %v, want set until %v", st.Unavailable, st.UnavailableUntil,
						t0.Add(DefaultUnavailableRetry))
				}
				if st.LastRequest == nil || st.LastRequest.Outcome != "unavailable" {
					t.Errorf("LastRequest = %+v, want outcome unavailable", st.LastRequest)
				}
			} else if st.LastEviction == nil || st.LastEviction.Result != metrics.EvictResultEvicted {
				t.Errorf("LastEviction = %+v, want an eviction", st.LastEviction)
			}
		})
	}
}

func pdbError(name string) error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	err.ErrStatus.Details.Name = name
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause, Message: "pdb needs 1"}}
	return err
}

func TestPDBBackoffDoublesAndCaps(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(ev *policyv1.Eviction) error { return pdbError(ev.Name) })
	h := newHarness(t, f.api(), func(o *Options) {
		o.Escalation.EvictionBackoff = metav1.Duration{Duration: 10 * time.Second}
		o.Escalation.MaxEvictionBackoff = metav1.Duration{Duration: 35 * time.Second}
	})
	a := batch("a", 0, gib, t0)
	for i, want := range []time.Duration{10 * time.Second, 20 * time.Second, 35 * time.Second, 35 * time.Second} {
		if err := h.e.Submit(starvation, []qos.EvictionCandidate{a}); err != nil {
			t.Fatal(err)
		}
		h.e.process(context.Background())
		st := h.e.Status()
		if len(st.Blocked) != 1 || st.Blocked[0].Backoff != want.String() || st.Blocked[0].Failures != i+1 ||
			!st.Blocked[0].Until.Equal(h.clock.now().Add(want)) {
			t.Fatalf("attempt %d: blocked %+v, want backoff %v", i+1, st.Blocked, want)
		}
		if st.LastRequest.Outcome != "unsatisfied" {
			t.Errorf("attempt %d: outcome %q, want unsatisfied", i+1, st.LastRequest.Outcome)
		}
		// Within the backoff the pod is not asked again.
		if err := h.e.Submit(starvation, []qos.EvictionCandidate{a}); err != nil {
			t.Fatal(err)
		}
		h.e.process(context.Background())
		if got := len(f.called()); got != i+1 {
			t.Fatalf("attempt %d: %d API calls, want %d (backed-off pod asked again)", i+1, got, i+1)
		}
		h.clock.advance(want)
	}
	// A quiet pod is forgotten after maxEvictionBackoff past its backoff.
	h.clock.advance(36 * time.Second)
	h.e.mu.Lock()
	h.e.sweep(h.clock.now())
	h.e.mu.Unlock()
	if st := h.e.Status(); len(st.Blocked) != 0 {
		t.Errorf("blocked %+v after a quiet maxEvictionBackoff, want none", st.Blocked)
	}
}

func TestMemoryPressureEvictsUntilCovered(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(*policyv1.Eviction) error { return nil })
	h := newHarness(t, f.api(), func(o *Options) { o.Escalation.MaxEvictionsPerMinute = 10 })
	req := qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: 3 * gib,
		MemoryUsed: 15 * gib, MemoryCapacity: 16 * gib, Threshold: 0.9, Target: 0.75}
	cands := []qos.EvictionCandidate{
		batch("small", 0, gib, t0),
		batch("big", 0, 2*gib, t0),
		batch("mid", 0, 3*gib/2, t0),
		batch("important", 10, 8*gib, t0),
		{UID: "ls", Namespace: "web", Name: "frontend", Class: qos.ClassLS, Priority: -5, MemoryBytes: 9 * gib},
		{UID: "be", Namespace: "web", Name: "cron", Class: qos.ClassBE, Priority: -5, MemoryBytes: 9 * gib},
	}
	if err := h.e.Submit(req, cands); err != nil {
		t.Fatal(err)
	}
	h.e.process(context.Background())
	if got, want := f.called(), []string{"ml/big", "ml/mid"}; !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want %v (largest first until 3 GiB are covered)", got, want)
	}
	st := h.e.Status().LastRequest
	if st.Outcome != "done" || st.Evicted != 2 || st.FreedBytes != 7*gib/2 || st.Candidates != 4 {
		t.Errorf("LastRequest %+v, want done, 2 evicted, 3.5 GiB, 4 batch candidates", st)
	}
	// The same pods are never evicted twice: the next request goes on.
	if err := h.e.Submit(req, cands); err != nil {
		t.Fatal(err)
	}
	h.e.process(context.Background())
	if got, want := f.called(), []string{"ml/big", "ml/mid", "ml/small", "ml/important"}; !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want %v; LS and BE never", got, want)
	}
}

func TestNeverEvictsLSOrBE(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(*policyv1.Eviction) error { return nil })
	h := newHarness(t, f.api(), nil)
	cands := []qos.EvictionCandidate{
		{UID: "ls", Namespace: "web", Name: "frontend", Class: qos.ClassLS},
		{UID: "be", Namespace: "web", Name: "cron", Class: qos.ClassBE},
		{UID: "x", Namespace: "web", Name: "unclassified"},
	}
	if err := h.e.Submit(starvation, cands); err != nil {
		t.Fatal(err)
	}
	h.e.process(context.Background())
	if got := f.called(); len(got) != 0 {
		t.Fatalf("evicted %v, want nothing", got)
	}
	if st := h.e.Status().LastRequest; st == nil || st.Outcome != "unsatisfied" || st.Candidates != 0 {
		t.Errorf("LastRequest %+v, want unsatisfied with 0 candidates", st)
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(*policyv1.Eviction) error { return nil })
	h := newHarness(t, f.api(), func(o *Options) { o.Escalation.MaxEvictionsPerMinute = 2 })
	var cands []qos.EvictionCandidate
	for i := range 5 {
		cands = append(cands, batch(fmt.Sprintf("p%d", i), 0, int64(10-i)*gib, t0))
	}
	req := qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: 100 * gib}
	if err := h.e.Submit(req, cands); err != nil {
		t.Fatal(err)
	}
	wait := h.e.process(context.Background())
	if got := len(f.called()); got != 2 {
		t.Fatalf("%d evictions at once, want the bucket of 2", got)
	}
	if wait <= 29*time.Second || wait > 30*time.Second {
		t.Fatalf("process waits %v, want ~30s (2 per minute)", wait)
	}
	// Nothing happens before the next token is back.
	h.clock.advance(10 * time.Second)
	if w := h.e.process(context.Background()); w <= 19*time.Second || len(f.called()) != 2 {
		t.Fatalf("after 10s: wait %v, %d calls; want ~20s and still 2", w, len(f.called()))
	}
	h.clock.advance(20 * time.Second)
	h.e.process(context.Background())
	if got := len(f.called()); got != 3 {
		t.Fatalf("after 30s: %d evictions, want 3", got)
	}
	// Over ten minutes at most 2 per minute (plus the initial bucket).
	for range 600 {
		h.clock.advance(time.Second)
		h.e.process(context.Background())
	}
	if got := len(f.called()); got != 5 {
		t.Fatalf("%d evictions, want all 5 candidates eventually", got)
	}
	if st := h.e.Status().LastRequest; st.Outcome != "unsatisfied" || st.Evicted != 5 {
		t.Errorf("LastRequest %+v, want unsatisfied after 5 (100 GiB not covered)", st)
	}
}

func TestRateLimitOverTime(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(*policyv1.Eviction) error { return nil })
	h := newHarness(t, f.api(), func(o *Options) { o.Escalation.MaxEvictionsPerMinute = 3 })
	var cands []qos.EvictionCandidate
	for i := range 100 {
		cands = append(cands, batch(fmt.Sprintf("p%03d", i), 0, gib, t0))
	}
	req := qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: 1000 * gib}
	if err := h.e.Submit(req, cands); err != nil {
		t.Fatal(err)
	}
	for range 10 * 60 { // ten minutes, one step a second
		h.e.process(context.Background())
		h.clock.advance(time.Second)
	}
	// A bucket of 3 plus 3 a minute for ten minutes.
	if got := len(f.called()); got > 3+30 || got < 30 {
		t.Fatalf("%d evictions in 10 minutes, want 30..33", got)
	}
}

func TestUnavailableReportedOnce(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(ev *policyv1.Eviction) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods/eviction"}, ev.Name,
			errors.New(`User "system:serviceaccount:understory:koordlet" cannot create resource "pods/eviction"`))
	})
	h := newHarness(t, f.api(), func(o *Options) { o.UnavailableRetry = time.Minute })
	cands := []qos.EvictionCandidate{batch("a", 0, gib, t0), batch("b", 0, gib, t0)}
	for range 50 { // the control loop keeps submitting
		if err := h.e.Submit(starvation, cands); err != nil {
			t.Fatal(err)
		}
		h.e.process(context.Background())
		h.clock.advance(100 * time.Millisecond)
	}
	if got := len(f.called()); got != 1 {
		t.Fatalf("%d API calls in 5s, want 1 (no tight loop)", got)
	}
	h.clock.advance(time.Minute)
	for range 3 {
		if err := h.e.Submit(starvation, cands); err != nil {
			t.Fatal(err)
		}
		h.e.process(context.Background())
	}
	if got := len(f.called()); got != 2 {
		t.Fatalf("%d API calls after the retry interval, want 2", got)
	}
	if n := strings.Count(h.logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error log lines, want 1:\n%s", n, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "pods/eviction") {
		t.Errorf("log does not say what is missing:\n%s", h.logs.String())
	}
	if got := h.events.reasons(); !slices.Equal(got, []string{"a:EvictionFailed"}) {
		t.Errorf("events %v, want one EvictionFailed", got)
	}
	if got := h.count(qos.EvictReasonCPUStarvation, metrics.EvictResultUnavailable); got != 2 {
		t.Errorf("unavailable count %v, want 2 (one per attempt)", got)
	}
	st := h.e.Status()
	if st.Unavailable == nil || st.LastError == nil || st.LastError.Result != metrics.EvictResultUnavailable {
		t.Errorf("status %+v, want Unavailable and LastError set", st)
	}

	// Once RBAC is fixed, evictions resume and the status clears.
	f2 := newFakeAPI(func(*policyv1.Eviction) error { return nil })
	h.e.api = f2.api()
	h.clock.advance(time.Minute)
	if err := h.e.Submit(starvation, cands); err != nil {
		t.Fatal(err)
	}
	h.e.process(context.Background())
	if st := h.e.Status(); st.Unavailable != nil || st.LastEviction == nil {
		t.Errorf("after recovery: %+v, want Unavailable cleared and an eviction", st)
	}
}

func TestDryRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		api  func() (API, func() int)
		opts func(*Options)
	}{
		{name: "static mode (no API)", api: func() (API, func() int) { return nil, func() int { return 0 } }},
		{name: "dry run with an API", api: func() (API, func() int) {
			f := newFakeAPI(func(*policyv1.Eviction) error { return nil })
			return f.api(), func() int { return len(f.called()) }
		}, opts: func(o *Options) { o.DryRun = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api, calls := tt.api()
			var logs logtest.Buffer
			// The static-mode event sink: podsource.LogSink.
			sink := podsource.NewLogSink(slog.New(slog.NewTextHandler(&logs, nil)))
			h := newHarness(t, api, func(o *Options) {
				o.Events = sink
				if tt.opts != nil {
					tt.opts(o)
				}
			})
			if !h.e.Status().DryRun {
				t.Fatal("Status().DryRun = false")
			}
			req := qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: gib, MemoryUsed: 15 * gib,
				MemoryCapacity: 16 * gib, Threshold: 0.9, Target: 0.8}
			if err := h.e.Submit(req, []qos.EvictionCandidate{batch("a", 0, gib/2, t0), batch("b", 0, gib/4, t0),
				batch("c", 0, gib, t0)}); err != nil {
				t.Fatal(err)
			}
			h.e.process(context.Background())
			if calls() != 0 {
				t.Fatalf("dry run called the API %d times", calls())
			}
			if got := h.count(qos.EvictReasonMemoryPressure, metrics.EvictResultDryRun); got != 1 {
				t.Errorf("dry_run count %v, want 1 (c alone covers 1 GiB)", got)
			}
			out := logs.String()
			if !strings.Contains(out, "reason="+EventEvictionDryRun) || !strings.Contains(out, "pod=ml/c") ||
				!strings.Contains(out, "would evict") {
				t.Errorf("log sink output lacks the dry-run event:\n%s", out)
			}
			st := h.e.Status()
			if !st.DryRun || st.LastEviction == nil || st.LastEviction.Result != metrics.EvictResultDryRun {
				t.Errorf("status %+v, want dry run with the last (dry-run) eviction", st)
			}
		})
	}
}

func TestSubmitRejectsBadRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil, nil)
	for _, req := range []qos.EvictionRequest{
		{Reason: "why-not"},
		{Reason: ""},
		{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: -1},
	} {
		if err := h.e.Submit(req, []qos.EvictionCandidate{batch("a", 0, 1, t0)}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Submit(%+v) = %v, want ErrInvalidRequest", req, err)
		}
	}
	if st := h.e.Status(); st.LastRequest != nil {
		t.Errorf("a rejected request became pending: %+v", st.LastRequest)
	}
}

// TestSubmitNeverBlocks runs the Evictor against an API server that hangs:
// the control loop's Submit and Status calls must still return at once.
func TestSubmitNeverBlocks(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	f := newFakeAPI(func(*policyv1.Eviction) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil
	})
	h := newHarness(t, f.api(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		close(release)
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})

	cands := []qos.EvictionCandidate{batch("a", 0, gib, t0), batch("b", 0, gib, t0)}
	if err := h.e.Submit(starvation, cands); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the evictor never called the API")
	}
	// The API call hangs; a thousand control periods' worth of calls must
	// not wait for it. A deadlock shows as a test timeout, not a duration.
	submitted := make(chan struct{})
	go func() {
		defer close(submitted)
		for range 1000 {
			if err := h.e.Submit(starvation, cands); err != nil {
				t.Error(err)
				return
			}
			_ = h.e.Status()
		}
	}()
	select {
	case <-submitted:
	case <-time.After(10 * time.Second):
		t.Fatal("Submit blocked while the API call hangs")
	}
	if st := h.e.Status(); st.LastRequest == nil || st.LastRequest.Outcome != "pending" {
		t.Errorf("LastRequest %+v, want the latest request pending", st.LastRequest)
	}
}

// TestRun drives the real goroutine end to end.
func TestRun(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(ev *policyv1.Eviction) error {
		if ev.Name == "a" {
			return pdbError("a")
		}
		return nil
	})
	h := newHarness(t, f.api(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.e.Run(ctx) }()
	if err := h.e.Submit(starvation, []qos.EvictionCandidate{batch("a", 0, 2*gib, t0), batch("b", 0, gib, t0)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := h.e.Status()
		if st.LastRequest != nil && st.LastRequest.Outcome == "done" {
			if st.LastEviction == nil || st.LastEviction.Name != "b" || len(st.Blocked) != 1 || st.Blocked[0].Name != "a" {
				t.Errorf("status %+v, want b evicted and a blocked", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request not done: %+v", st.LastRequest)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run() = %v", err)
	}
}

// TestRefusalsTakeNoToken: PDB refusals do not use up the node's eviction
// budget; the first pod that can go goes at once.
func TestRefusalsTakeNoToken(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(func(ev *policyv1.Eviction) error {
		if ev.Name != "d" {
			return pdbError(ev.Name)
		}
		return nil
	})
	h := newHarness(t, f.api(), func(o *Options) { o.Escalation.MaxEvictionsPerMinute = 1 })
	cands := []qos.EvictionCandidate{batch("a", 0, 4*gib, t0), batch("b", 0, 3*gib, t0), batch("c", 0, 2*gib, t0),
		batch("d", 0, gib, t0)}
	if err := h.e.Submit(starvation, cands); err != nil {
		t.Fatal(err)
	}
	if wait := h.e.process(context.Background()); wait != 0 {
		t.Fatalf("process waits %v, want 0", wait)
	}
	if got, want := f.called(), []string{"ml/a", "ml/b", "ml/c", "ml/d"}; !slices.Equal(got, want) {
		t.Fatalf("API calls %v, want %v", got, want)
	}
	if got := h.count(qos.EvictReasonCPUStarvation, metrics.EvictResultBlockedPDB); got != 3 {
		t.Errorf("blocked_pdb %v, want 3", got)
	}
	if st := h.e.Status(); st.LastRequest.Outcome != "done" || len(st.Blocked) != 3 {
		t.Errorf("status %+v, want done with a, b, c blocked", st)
	}
}
