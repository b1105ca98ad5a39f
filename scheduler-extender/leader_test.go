package extender

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func TestLeaderConfigValidate(t *testing.T) {
	t.Parallel()
	ok := DefaultLeaderConfig("ns", "pod-a")
	tests := []struct {
		name string
		mut  func(*LeaderConfig)
		ok   bool
	}{
		{name: "default", mut: func(*LeaderConfig) {}, ok: true},
		// The Lease's own rules are internal/election's (tested there); one of them
		// shows they apply, wrapped in errBadLeaderConfig.
		{name: "no identity", mut: func(c *LeaderConfig) { c.Identity = "" }},
		{name: "no catch-up timeout", mut: func(c *LeaderConfig) { c.CatchUpTimeout = 0 }},
		{name: "service with pod IP and port", mut: func(c *LeaderConfig) {
			c.Service, c.PodIP, c.Port, c.PortName = "s", "10.1.2.3", 8888, "https"
		}, ok: true},
		{name: "service without pod IP", mut: func(c *LeaderConfig) { c.Service, c.Port, c.PortName = "s", 8888, "https" }},
		{name: "own pod", mut: func(c *LeaderConfig) { c.Pod.Namespace, c.Pod.Name = "ns", "pod-a" }, ok: true},
		{name: "own pod without namespace", mut: func(c *LeaderConfig) { c.Pod.Name = "pod-a" }},
		{name: "own pod without name", mut: func(c *LeaderConfig) { c.Pod.Namespace = "ns" }},
		{name: "service without port", mut: func(c *LeaderConfig) { c.Service, c.PodIP, c.PortName = "s", "10.1.2.3", "https" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tc.mut(&c)
			err := c.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, errBadLeaderConfig) {
				t.Fatalf("error %v is not errBadLeaderConfig", err)
			}
		})
	}
	if d := ok.LeaseDuration + ok.RetryPeriod + ok.CatchUpTimeout; d > 15*time.Second {
		t.Fatalf("default worst-case failover %v exceeds 15 s", d)
	}
}

// fastLeader is a LeaderConfig with short durations for tests.
func fastLeader(id string) *LeaderConfig {
	c := DefaultLeaderConfig("understory-system", id)
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*time.Second, time.Second, 100*time.Millisecond
	c.Service, c.PortName, c.Port = "ext", "https", 8888
	c.PodIP = map[string]string{"pod-a": "10.0.0.1", "pod-b": "fd00::2"}[id]
	if c.PodIP == "" {
		c.PodIP = "10.0.0.9"
	}
	return &c
}

// replica is one extender replica of a test: its server, HTTP front and Run.
type replica struct {
	srv  *Server
	http *httptest.Server
	reg  *prometheus.Registry
	stop func() error
	done chan error
}

func startReplica(t *testing.T, client kubernetes.Interface, id string) *replica {
	t.Helper()
	r := &replica{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	cfg := DefaultConfig()
	cfg.Seed = 1
	var err error
	r.srv, err = NewServer(cfg, Deps{Client: client, Leader: fastLeader(id), Registry: r.reg,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r.http = httptest.NewServer(r.srv.Handler())
	t.Cleanup(r.http.Close)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { r.done <- r.srv.Run(ctx) }()
	var res error
	stopped := false
	r.stop = func() error {
		if !stopped {
			cancel()
			res, stopped = <-r.done, true
		}
		return res
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// get answers GET path: code and body.
func (r *replica) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(r.http.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *replica) post(t *testing.T, path, body string) int {
	t.Helper()
	resp, err := http.Post(r.http.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func (r *replica) leaderGauge() float64 {
	return testutil.ToFloat64(r.srv.lead.met.Leading)
}

// TestStandbyRefusesThenTakesOver: of two replicas on one Lease, the one that
// leads is Ready and serves; the other is synced but answers 503 on /readyz
// (naming the leader) and on filter, prioritize and bind. When the leader
// stops, it releases the lease and the standby takes over, Ready.
func TestStandbyRefusesThenTakesOver(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(testNode("n1", "A100", 2, 8, 32))
	a := startReplica(t, client, "pod-a")
	testenv.WaitFor(t, 10*time.Second, "pod-a leading", a.srv.Ready)
	b := startReplica(t, client, "pod-b")
	testenv.WaitFor(t, 10*time.Second, "pod-b synced and seeing pod-a lead", func() bool {
		st := b.srv.Status()
		return st.Synced && st.Leader == "pod-a"
	})
	if code, body := b.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "standby: leader is pod-a") {
		t.Fatalf("standby /readyz = %d %q, want 503 naming pod-a", code, body)
	}
	filter := `{"Pod":{"metadata":{"name":"p","namespace":"ns","uid":"u1"}},"NodeNames":["n1"]}`
	bind := `{"PodName":"p","PodNamespace":"ns","PodUID":"u1","Node":"n1"}`
	for _, tc := range []struct{ path, body string }{{"/filter", filter}, {"/prioritize", filter}, {"/bind", bind}} {
		if code := b.post(t, tc.path, tc.body); code != http.StatusServiceUnavailable {
			t.Errorf("standby %s = %d, want 503", tc.path, code)
		}
		if code := a.post(t, tc.path, tc.body); code == http.StatusServiceUnavailable {
			t.Errorf("leader %s = 503", tc.path)
		}
	}
	if code, _ := a.get(t, "/readyz"); code != http.StatusOK {
		t.Fatalf("leader /readyz = %d", code)
	}
	for _, r := range []*replica{a, b} {
		if code, body := r.get(t, "/syncz"); code != http.StatusOK {
			t.Fatalf("/syncz of a synced replica = %d %q", code, body)
		}
	}
	wantSlice(t, client, "10.0.0.1", discoveryv1.AddressTypeIPv4)
	if g := a.leaderGauge(); g != 1 {
		t.Fatalf("leader gauge of the leader = %v", g)
	}
	if g := b.leaderGauge(); g != 0 {
		t.Fatalf("leader gauge of the standby = %v", g)
	}
	if st := b.srv.Status(); st.Leading || !st.LeaderElection || !strings.Contains(st.Refused, "standby") {
		t.Fatalf("standby status leading=%v election=%v refused=%q", st.Leading, st.LeaderElection, st.Refused)
	}

	start := time.Now()
	if err := a.stop(); err != nil { // graceful: the lease is released
		t.Fatalf("leader Run: %v", err)
	}
	if a.srv.Ready() {
		t.Fatal("stopped leader still Ready")
	}
	testenv.WaitFor(t, 5*time.Second, "pod-b leading", b.srv.Ready)
	t.Logf("handover after a release took %v", time.Since(start).Round(time.Millisecond))
	if st := b.srv.Status(); !st.Leading || st.Leader != "pod-b" {
		t.Fatalf("new leader status leading=%v leader=%q", st.Leading, st.Leader)
	}
	if g := b.leaderGauge(); g != 1 {
		t.Fatalf("leader gauge of the new leader = %v", g)
	}
	wantSlice(t, client, "fd00::2", discoveryv1.AddressTypeIPv6)
	testenv.WaitFor(t, 5*time.Second, "two leaders observed (pod-a, then itself)", func() bool {
		return testutil.ToFloat64(b.srv.lead.met.Transitions) >= 2
	})
	if code := b.post(t, "/bind", bind); code == http.StatusServiceUnavailable {
		t.Fatal("new leader refuses bind")
	}
}

var errPartition = errors.New("partitioned")

// TestLostLeaseRefusesAndRunReturns: a leader that cannot renew its lease
// stops serving and Run returns ErrLeadershipLost (the process exits).
func TestLostLeaseRefusesAndRunReturns(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(testNode("n1", "A100", 2, 8, 32))
	var cut atomic.Bool
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if cut.Load() {
			return true, nil, errPartition
		}
		return false, nil, nil
	})
	a := startReplica(t, client, "pod-a")
	testenv.WaitFor(t, 10*time.Second, "pod-a leading", a.srv.Ready)
	// The API stops taking pod-a's renewals (a partition, say).
	cut.Store(true)
	var err error
	select {
	case err = <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the lease was lost")
	}
	a.done <- err // for the cleanup's stop
	if !errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("Run = %v, want ErrLeadershipLost", err)
	}
	if code, body := a.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "lost the lease") {
		t.Fatalf("/readyz after the loss = %d %q", code, body)
	}
	if code := a.post(t, "/bind", `{"PodName":"p","PodNamespace":"ns","PodUID":"u1","Node":"n1"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("bind after the loss = %d, want 503", code)
	}
	if g := a.leaderGauge(); g != 0 {
		t.Fatalf("leader gauge after the loss = %v", g)
	}
}

// TestCatchUp: a new leader serves only once its index shows every pod the
// API shows bound; a bound pod its informer has not delivered holds it back,
// a pod deleted meanwhile does not.
func TestCatchUp(t *testing.T) {
	t.Parallel()
	bound := func(name string) *corev1.Pod { return podtest.Pod("ns", name, podtest.GPUs(1), podtest.OnNode("n1")) }
	tests := []struct {
		name     string
		api      []runtime.Object // what the API holds
		index    []*corev1.Pod    // what the index was fed
		deliver  *corev1.Pod      // fed to the index while catching up
		deleteIt string           // deleted from the API while catching up
		wantErr  bool
	}{
		{name: "index up to date", api: []runtime.Object{bound("a")}, index: []*corev1.Pod{bound("a")}},
		{name: "pending pods do not count", api: []runtime.Object{podtest.Pod("ns", "pending", podtest.GPUs(1))}},
		{name: "terminated pods do not count", api: []runtime.Object{func() *corev1.Pod {
			p := bound("done")
			p.Status.Phase = corev1.PodSucceeded
			return p
		}()}},
		{name: "bound pod not delivered", api: []runtime.Object{bound("a")}, wantErr: true},
		{name: "delivered while waiting", api: []runtime.Object{bound("a")}, deliver: bound("a")},
		{name: "deleted while waiting", api: []runtime.Object{bound("a")}, deleteIt: "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset(tc.api...)
			st, err := NewState(DefaultConfig(), time.Now)
			if err != nil {
				t.Fatal(err)
			}
			st.UpsertNode(testNode("n1", "A100", 2, 8, 32))
			for _, p := range tc.index {
				st.upsertRecord(podRecordOf(p))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { _, err := catchUp(ctx, client, st, 10*time.Millisecond); errc <- err }()
			if tc.deliver != nil {
				st.upsertRecord(podRecordOf(tc.deliver))
			}
			if tc.deleteIt != "" {
				if err := client.CoreV1().Pods("ns").Delete(context.Background(), tc.deleteIt, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			err = <-errc
			if tc.wantErr != (err != nil) {
				t.Fatalf("catchUp = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("catchUp = %v, want the deadline", err)
			}
		})
	}
}

// wantSlice checks that the Service's leader EndpointSlice names ip alone.
func wantSlice(t *testing.T, client kubernetes.Interface, ip string, family discoveryv1.AddressType) {
	t.Helper()
	es, err := client.DiscoveryV1().EndpointSlices("understory-system").Get(context.Background(), "ext"+LeaderSliceSuffix,
		metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if es.Labels[discoveryv1.LabelServiceName] != "ext" || es.AddressType != family || len(es.Endpoints) != 1 ||
		len(es.Endpoints[0].Addresses) != 1 || es.Endpoints[0].Addresses[0] != ip || len(es.Ports) != 1 ||
		*es.Ports[0].Name != "https" || *es.Ports[0].Port != 8888 {
		t.Fatalf("leader EndpointSlice %+v, want %s on https 8888", es, ip)
	}
}

func TestReached(t *testing.T) {
	t.Parallel()
	tests := []struct {
		seen, want string
		ok         bool
	}{
		{"", "5", false},
		{"4", "5", false},
		{"5", "5", true},
		{"10", "9", true}, // numeric, not lexical
		{"9", "10", false},
		{"abc", "abc", true}, // opaque: equal only
		{"abd", "abc", false},
		{"7", "x", false},
	}
	for _, tc := range tests {
		if got := reached(tc.seen, tc.want); got != tc.ok {
			t.Errorf("reached(%q, %q) = %v, want %v", tc.seen, tc.want, got, tc.ok)
		}
	}
}

// TestPodBarrierWait: wait returns once the informer delivered the barrier's
// pod at the written resourceVersion or later, whenever that came; other pods
// and older versions do not release it.
func TestPodBarrierWait(t *testing.T) {
	t.Parallel()
	own := types.NamespacedName{Namespace: "understory-system", Name: "ext-b"}
	rec := func(ns, name, rv string) *podRecord {
		return &podRecord{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
	}
	tests := []struct {
		name   string
		before []*podRecord // delivered before wait starts
		during []*podRecord // delivered while it waits
		ok     bool
	}{
		{name: "delivered while waiting", during: []*podRecord{rec(own.Namespace, own.Name, "100")}, ok: true},
		{name: "delivered before the wait", before: []*podRecord{rec(own.Namespace, own.Name, "100")}, ok: true},
		{name: "a later version (relist)", during: []*podRecord{rec(own.Namespace, own.Name, "250")}, ok: true},
		{name: "an older version", before: []*podRecord{rec(own.Namespace, own.Name, "99")}},
		{name: "another pod of that version", during: []*podRecord{rec(own.Namespace, "ext-a", "100"),
			rec("other", own.Name, "100")}},
		{name: "older, then the write", during: []*podRecord{rec(own.Namespace, own.Name, "60"),
			rec(own.Namespace, own.Name, "100")}, ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newPodBarrier(own)
			for _, r := range tc.before {
				b.observe(r)
			}
			timeout := 5 * time.Second
			if !tc.ok {
				timeout = 100 * time.Millisecond // how long "not released" is watched
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- b.wait(ctx, "100") }()
			for _, r := range tc.during {
				b.observe(r)
			}
			err := <-errc
			if tc.ok && err != nil {
				t.Fatalf("wait = %v, want released", err)
			}
			if !tc.ok && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait = %v, want the deadline", err)
			}
		})
	}
}

// TestPodBarrierCross: cross writes the annotation on its own pod and waits
// for that write's resourceVersion; a refused write is errNoBarrier (the
// caller lists instead), and the nil barrier observes nothing.
func TestPodBarrierCross(t *testing.T) {
	t.Parallel()
	own := types.NamespacedName{Namespace: "understory-system", Name: "ext-b"}
	t.Run("written and delivered", func(t *testing.T) {
		t.Parallel()
		client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name}})
		b := newPodBarrier(own)
		client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			pa := a.(k8stesting.PatchAction)
			var patch struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil || pa.GetPatchType() != types.MergePatchType {
				t.Errorf("patch %s (%s): %v", pa.GetPatch(), pa.GetPatchType(), err)
			}
			if v := patch.Metadata.Annotations[AnnotationCatchUp]; v != "ext-b 2026-11-28T04:00:00Z" {
				t.Errorf("barrier annotation %q", v)
			}
			out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name, ResourceVersion: "42"}}
			// The informer delivers the write after the API answered.
			go b.observe(&podRecord{ObjectMeta: out.ObjectMeta})
			return true, out, nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := b.cross(ctx, client, "ext-b", time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		client := fake.NewClientset()
		client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, own.Name, errors.New("policy"))
		})
		err := newPodBarrier(own).cross(context.Background(), client, "ext-b", time.Now())
		if !errors.Is(err, errNoBarrier) || !apierrors.IsForbidden(err) {
			t.Fatalf("cross = %v, want errNoBarrier wrapping Forbidden", err)
		}
	})
	t.Run("nil", func(t *testing.T) {
		t.Parallel()
		var b *podBarrier
		b.observe(&podRecord{ObjectMeta: metav1.ObjectMeta{Namespace: own.Namespace, Name: own.Name}})
		if (*informers)(nil).barrierOrNil() != nil {
			t.Fatal("nil informers have a barrier")
		}
	})
}
