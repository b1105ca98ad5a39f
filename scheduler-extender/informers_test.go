package extender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

// TestRunSyncedMeansIndexed: once the server reports synced, its index holds
// every node and pod of the initial lists (the informers' handlers have run,
// not only their stores been filled), so a filter right after start never
// sees "node unknown to the extender".
func TestRunSyncedMeansIndexed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		nodes, pods  int
		wantGPUNodes int
	}{
		{name: "empty cluster"},
		{name: "large cluster", nodes: 3000, pods: 1000, wantGPUNodes: 3000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var objs []runtime.Object
			for i := range tc.nodes {
				objs = append(objs, &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%d", i), Labels: map[string]string{LabelGPUProduct: "A100"}},
					Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
						corev1.ResourcePods: resource.MustParse("110"), contract.ResourceGPU: resource.MustParse("4"),
					}},
				})
			}
			for i := range tc.pods {
				objs = append(objs, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", i))},
					Spec:       corev1.PodSpec{NodeName: fmt.Sprintf("n-%d", i%max(tc.nodes, 1)), Containers: []corev1.Container{{Name: "c"}}},
				})
			}
			srv, err := NewServer(DefaultConfig(), Deps{Client: fake.NewClientset(objs...)})
			if err != nil {
				t.Fatal(err)
			}
			runServer(t, srv)
			deadline := time.Now().Add(time.Minute)
			var st Status
			for st = srv.Status(); !st.Synced; st = srv.Status() {
				if time.Now().After(deadline) {
					t.Fatal("never synced")
				}
				time.Sleep(time.Millisecond)
			}
			pods := 0
			for _, n := range st.Counts {
				pods += n
			}
			gpuNodes := 0
			for _, n := range st.Nodes {
				if len(n.GPUs) > 0 {
					gpuNodes++
				}
			}
			if len(st.Nodes) != tc.nodes || pods != tc.pods || gpuNodes != tc.wantGPUNodes {
				t.Errorf("synced with %d nodes (%d with GPUs) and %d pods indexed, want %d, %d and %d",
					len(st.Nodes), gpuNodes, pods, tc.nodes, tc.wantGPUNodes, tc.pods)
			}
		})
	}
}

// TestNotReadyRefuses: after a (re)start, until the informers have synced, the
// extender refuses filter, prioritize and bind with 503 (kube-scheduler retries
// the pod) and /readyz says so; /healthz stays ok. Before, a filter right after
// a restart placed a pod on a GPU a bound pod already held.
func TestNotReadyRefuses(t *testing.T) {
	t.Parallel()
	node := testNode("n1", "A100", 1, 8, 32)
	holder := podtest.Pod("ns", "holder", podtest.GPUs(1))
	holder.Spec.NodeName = "n1"
	holder.Annotations[contract.AnnotationGPUDevices] = "0"
	srv := testServer(t, nil, Deps{Client: fake.NewClientset(node, holder)})
	url := startHTTP(t, srv)
	pod := podtest.Pod("ns", "new", podtest.GPUs(1))
	nodes := []string{"n1"}
	get := func(path string) int {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before sync: %d", code)
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before sync: %d", code)
	}
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &nodes}},
		{"/prioritize", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &nodes}},
		{"/bind", bindArgs(pod, "n1")},
	} {
		code, body := postJSON(t, http.DefaultClient, url+tc.path, tc.body)
		if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "not ready") {
			t.Fatalf("%s before sync: %d %s", tc.path, code, body)
		}
	}
	if got := phaseOf(srv, pod.UID); got != "unknown" {
		t.Fatalf("a refused filter changed the index: %s", got)
	}

	runServer(t, srv)
	deadline := time.Now().Add(30 * time.Second)
	for get("/readyz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(time.Millisecond)
	}
	res := filter(t, url, pod, "n1")
	if res.NodeNames != nil && len(*res.NodeNames) > 0 {
		t.Fatalf("after sync the only GPU is held, yet the filter passed %v", *res.NodeNames)
	}
}

// TestStaleCacheRefusesBinds: each informer's staleness is its own (0 while
// its watch is open, else the time since its last contact), /status and the
// metrics report it per informer, and once the pod (or node) informer has
// been out of contact beyond -max-cache-staleness, binds are refused with 503
// (kube-scheduler retries them) while filters are still served from the
// cache. Contact restored, binds go through again.
func TestStaleCacheRefusesBinds(t *testing.T) {
	t.Parallel()
	pod := podtest.Pod("ns", "a", podtest.GPUs(1))
	fc := newFakeCluster(t, pod)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	s := fedServer(t, clock, Deps{Client: fc, Registry: reg})
	s.state.UpsertNode(testNode("n1", "A100", 2, 8, 32))
	url := startHTTP(t, s)
	ctx := context.Background()

	// Two informers, fed by fake list/watch functions.
	open := func(name string) (*cache.ListWatch, *watch.FakeWatcher) {
		fw := watch.NewFake()
		lw := touchingListWatch(s.contact.informer(name), s.log,
			func(context.Context, metav1.ListOptions) (runtime.Object, error) { return &corev1.PodList{}, nil },
			func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fw, nil })
		if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		return lw, fw
	}
	nodesLW, _ := open(InformerNodes)
	podsLW, podsFW := open(InformerPods)
	if _, err := nodesLW.WatchWithContext(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := podsLW.WatchWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	staleness := func() map[string]float64 {
		out := map[string]float64{}
		for _, is := range s.Status().Informers {
			out[is.Name] = is.StalenessSeconds
		}
		return out
	}
	clock.Advance(time.Minute)
	if got := staleness(); got[InformerNodes] != 0 || got[InformerPods] != 0 {
		t.Fatalf("with both watches open: staleness %v, want 0", got)
	}
	go podsFW.Add(pod)
	<-w.ResultChan() // an event: contact
	podsFW.Stop()    // the pod watch ends (the API server went away)
	for range w.ResultChan() {
	}
	waitFor(t, func() bool { return !s.Status().Informers[1].Watching })
	clock.Advance(31 * time.Second)
	if got := staleness(); got[InformerNodes] != 0 || got[InformerPods] != 31 {
		t.Fatalf("pod watch down for 31 s: staleness %v, want nodes 0, pods 31", got)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP understory_extender_cache_staleness_seconds Per informer: 0 while its watch is open, else seconds since it last heard from the API server.
# TYPE understory_extender_cache_staleness_seconds gauge
understory_extender_cache_staleness_seconds{informer="nodes"} 0
understory_extender_cache_staleness_seconds{informer="pods"} 31
`), "understory_extender_cache_staleness_seconds"); err != nil {
		t.Fatal(err)
	}

	node := passedOne(t, filter(t, url, pod, "n1")) // filters are still served
	code, body := postJSON(t, http.DefaultClient, url+"/bind", bindArgs(pod, node))
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "pods informer has not heard from the API server for 31s (limit 30s") {
		t.Fatalf("bind with a stale pod cache: %d %s, want 503 naming the pods informer", code, body)
	}
	if st := s.Status(); !strings.Contains(st.BindsRefused, "pods informer") {
		t.Fatalf("status bindsRefused %q", st.BindsRefused)
	}
	if acts := fc.actions(); len(acts) != 0 {
		t.Fatalf("API writes while stale: %v", acts)
	}

	if _, err := podsLW.WatchWithContext(ctx, metav1.ListOptions{}); err != nil { // contact is back
		t.Fatal(err)
	}
	if msg := bind(t, url, pod, node); msg != "" {
		t.Fatalf("bind once the watch is back: %q", msg)
	}
	if st := s.Status(); st.BindsRefused != "" {
		t.Fatalf("status bindsRefused %q after contact came back", st.BindsRefused)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	gr := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", &net.OpError{Op: "dial", Err: &osSyscallErr{syscall.ECONNREFUSED}}, true},
		{"connection reset", fmt.Errorf("list: %w", syscall.ECONNRESET), true},
		{"EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		{"network timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, true},
		{"503", apierrors.NewServiceUnavailable("starting"), true},
		{"500", apierrors.NewInternalError(errors.New("etcd")), true},
		{"504", apierrors.NewServerTimeout(gr, "list", 1), true},
		{"429 (client-go retries it)", apierrors.NewTooManyRequests("slow down", 1), false},
		{"403", apierrors.NewForbidden(gr, "", errors.New("rbac")), false},
		{"404 (no CRD)", apierrors.NewNotFound(gr, ""), false},
		{"410", apierrors.NewResourceExpired("too old"), false},
		{"other", errors.New("decoding"), false},
	}
	for _, tc := range tests {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("%s: unreachable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

type osSyscallErr struct{ errno syscall.Errno }

func (e *osSyscallErr) Error() string { return e.errno.Error() }
func (e *osSyscallErr) Unwrap() error { return e.errno }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestRetryUnreachable: unreachable errors are retried (reported once), any
// other result returned at once, and a cancelled context ends the retries.
func TestRetryUnreachable(t *testing.T) {
	t.Parallel()
	down := apierrors.NewServiceUnavailable("down")
	tests := []struct {
		name     string
		results  []error // the calls' errors in turn; past the end: success
		cancel   bool
		wantErr  error
		calls    int
		reported int
	}{
		{name: "at once", calls: 1},
		{name: "after an outage", results: []error{down, down, down}, calls: 4, reported: 1},
		{name: "forbidden at once", results: []error{apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("x"))},
			calls: 1, wantErr: errors.New("forbidden")},
		{name: "down, then forbidden", results: []error{down, apierrors.NewForbidden(schema.GroupResource{}, "",
			errors.New("x"))}, calls: 2, reported: 1, wantErr: errors.New("forbidden")},
		{name: "cancelled while down", results: []error{down, down, down, down, down, down, down, down}, cancel: true,
			wantErr: down, reported: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			calls, reported := 0, 0
			_, err := retryUnreachable(ctx, time.Millisecond, func(context.Context) (int, error) {
				calls++
				if tc.cancel && calls == 3 {
					cancel()
				}
				if calls <= len(tc.results) {
					return 0, tc.results[calls-1]
				}
				return 1, nil
			}, func(error) { reported++ })
			if (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if tc.cancel {
				if calls != 3 {
					t.Fatalf("%d calls after the cancel at the third", calls)
				}
			} else if calls != tc.calls {
				t.Fatalf("%d calls, want %d", calls, tc.calls)
			}
			if reported != tc.reported {
				t.Fatalf("reported %d times, want %d", reported, tc.reported)
			}
		})
	}
}

// TestInformerListRetriesOutage: against an API server that answers 503 for
// a while, the informer's list (touchingListWatch) keeps trying every
// unreachableRetry and returns the list as soon as the server answers,
// instead of failing into the reflector's backoff.
func TestInformerListRetriesOutage(t *testing.T) {
	t.Parallel()
	var calls, downFor atomic.Int32
	downFor.Store(1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) <= downFor.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`)
			return
		}
		fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
	}))
	t.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL,
		ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	contact := newAPIContact(time.Now)
	lw := touchingListWatch(contact.informer(InformerPods), slog.New(slog.DiscardHandler),
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		}, nil)
	start := time.Now()
	obj, err := lw.ListWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list through a 503: %v", err)
	}
	if l, ok := obj.(*corev1.PodList); !ok || l.ResourceVersion != "7" {
		t.Fatalf("listed %#v", obj)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2 (one 503, one answer)", n)
	}
	if took := time.Since(start); took < unreachableRetry {
		t.Fatalf("answered after %v: retried before %v", took, unreachableRetry)
	}
	if last := contact.informer(InformerPods).LastContact(); last.Before(start) {
		t.Fatalf("the list's contact not recorded (last %v)", last)
	}
}
