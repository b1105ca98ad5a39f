package extender

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func TestFilterVerdicts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		pod              *corev1.Pod
		wantPass         []string // any of these
		wantUnresolvable []string
		wantFailed       []string
	}{
		{
			name:             "whole gpus: too few devices ever is unresolvable, cpu node has none",
			pod:              podtest.Pod("ns", "p", podtest.GPUs(4)),
			wantPass:         []string{"a8"},
			wantUnresolvable: []string{"a2", "cpu", "t4"},
		},
		{
			name:             "model not accepted is unresolvable",
			pod:              podtest.Pod("ns", "p", podtest.GPUs(1), podtest.Annotate(AnnotationGPUModel, "Tesla-T4")),
			wantPass:         []string{"t4"},
			wantUnresolvable: []string{"a2", "a8", "cpu"},
		},
		{
			name:       "busy node fails but may pass later",
			pod:        podtest.Pod("ns", "p", podtest.GPUs(2)),
			wantPass:   []string{"a8"},
			wantFailed: []string{"a2"},
		},
		{
			name:     "cpu only pod passes anywhere",
			pod:      podtest.Pod("ns", "p", podtest.CPU(500)),
			wantPass: []string{"a2", "a8", "cpu", "t4"},
		},
		{
			name:             "invalid request is unresolvable everywhere",
			pod:              podtest.Pod("ns", "p", podtest.GPUs(1), podtest.Milli(500)),
			wantUnresolvable: []string{"a2", "a8", "cpu", "t4"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := testServer(t, newFakeClock(), Deps{})
			for _, n := range []*corev1.Node{testNode("a2", "A100", 2, 32, 128), testNode("a8", "A100", 8, 64, 512),
				testNode("t4", "Tesla-T4", 1, 16, 64), testNode("cpu", "", 0, 16, 64)} {
				s.state.UpsertNode(n)
			}
			// a2 is half busy: one GPU taken by a bound pod.
			s.state.UpsertPod(podtest.Pod("ns", "busy", podtest.GPUs(1), podtest.OnNode("a2"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			url := startHTTP(t, s)
			res := filter(t, url, tc.pod, "a2", "a8", "t4", "cpu")
			if len(tc.wantPass) > 0 {
				got := passedOne(t, res)
				if !containsStr(tc.wantPass, got) {
					t.Errorf("passed %s, want one of %v", got, tc.wantPass)
				}
			} else if res.NodeNames != nil && len(*res.NodeNames) > 0 {
				t.Errorf("passed %v, want none", *res.NodeNames)
			}
			for _, n := range tc.wantUnresolvable {
				if _, ok := res.FailedAndUnresolvableNodes[n]; !ok {
					t.Errorf("%s not unresolvable: %+v", n, res)
				}
			}
			for _, n := range tc.wantFailed {
				if _, ok := res.FailedNodes[n]; !ok {
					t.Errorf("%s not failed: %+v", n, res)
				}
			}
		})
	}
}

func containsStr(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// TestFilterNodesModeLearnsNodes: with -node-cache-capable=false a filter's full
// Node objects teach the index nodes it does not know, and such nodes expire
// once calls stop carrying them; with it set (the default, as the shipped
// scheduler config) nodes are never learned from request bodies.
func TestFilterNodesModeLearnsNodes(t *testing.T) {
	t.Parallel()
	for _, nodeCacheCapable := range []bool{false, true} {
		t.Run(fmt.Sprintf("nodeCacheCapable=%v", nodeCacheCapable), func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			s := testServer(t, clock, Deps{}, func(c *Config) { c.NodeCacheCapable = nodeCacheCapable })
			url := startHTTP(t, s)
			args := extenderv1.ExtenderArgs{Pod: podtest.Pod("ns", "p", podtest.GPUs(1)), Nodes: &corev1.NodeList{Items: []corev1.Node{
				*testNode("g1", "A100", 1, 8, 32), *testNode("c1", "", 0, 8, 32)}}}
			code, body := postJSON(t, http.DefaultClient, url+"/filter", args)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, body)
			}
			var res extenderv1.ExtenderFilterResult
			if err := json.Unmarshal(body, &res); err != nil {
				t.Fatal(err)
			}
			if nodeCacheCapable {
				if res.Nodes != nil && len(res.Nodes.Items) > 0 || gpuFree(s, "g1") != nil || gpuFree(s, "c1") != nil {
					t.Fatalf("nodes learned from a request body: %s", body)
				}
				return
			}
			if res.Nodes == nil || len(res.Nodes.Items) != 1 || res.Nodes.Items[0].Name != "g1" {
				t.Fatalf("want Nodes=[g1], got %s", body)
			}
			if _, ok := res.FailedAndUnresolvableNodes["c1"]; !ok {
				t.Fatalf("c1 should be unresolvable: %s", body)
			}
			if got := gpuFree(s, "g1"); len(got) != 1 || got[0] != 0 {
				t.Fatalf("g1 should hold the reservation, free=%v", got)
			}
			clock.Advance(argsLifetime*DefaultConfig().AssumedTTL + time.Second)
			s.Housekeep()
			if gpuFree(s, "g1") != nil || gpuFree(s, "c1") != nil {
				t.Fatal("nodes only request bodies showed should expire")
			}
		})
	}
}

// TestArgsPodClaimingANodeHoldsNothing: a pod that appears only in a request
// body, carrying spec.nodeName, is not taken as bound. Before, it was charged on
// that node as bound and held its GPU forever.
func TestArgsPodClaimingANodeHoldsNothing(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s := testServer(t, clock, Deps{})
	s.state.UpsertNode(testNode("n", "A100", 1, 8, 32))
	url := startHTTP(t, s)
	pod := podtest.Pod("ns", "ghost", podtest.GPUs(1), podtest.OnNode("n"))
	filter(t, url, pod, "n")
	ttl := DefaultConfig().AssumedTTL
	clock.Advance(ttl + time.Second)
	s.Housekeep()
	if ph := phaseOf(s, pod.UID); ph != "pending@" {
		t.Fatalf("phase %s: a body's spec.nodeName was taken as a binding", ph)
	}
	if got := gpuFree(s, "n"); got[0] != 1000 {
		t.Fatalf("GPU still held: free=%v", got)
	}
	clock.Advance(argsLifetime * ttl)
	s.Housekeep()
	if ph := phaseOf(s, pod.UID); ph != "unknown" {
		t.Fatalf("a pod only request bodies showed should be forgotten, phase %s", ph)
	}
}

func TestPrioritizeScoresInRange(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	for _, n := range []*corev1.Node{testNode("n0", "A100", 8, 64, 256), testNode("n1", "A100", 8, 64, 256),
		testNode("n2", "A100", 2, 64, 256), testNode("cpu", "", 0, 8, 32)} {
		s.state.UpsertNode(n)
	}
	s.state.UpsertPod(podtest.Pod("ns", "busy", podtest.GPUs(6), podtest.OnNode("n1"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1,2,3,4,5")))
	url := startHTTP(t, s)
	pod := podtest.Pod("ns", "p", podtest.Milli(500))
	all := []string{"n0", "n1", "n2", "cpu", "ghost"}
	score := func() map[string]int64 {
		code, body := postJSON(t, http.DefaultClient, url+"/prioritize", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &all})
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		var hp extenderv1.HostPriorityList
		if err := json.Unmarshal(body, &hp); err != nil {
			t.Fatal(err)
		}
		if len(hp) != len(all) {
			t.Fatalf("want %d scores, got %s", len(all), body)
		}
		out := map[string]int64{}
		for _, h := range hp {
			if h.Score < extenderv1.MinExtenderPriority || h.Score > extenderv1.MaxExtenderPriority {
				t.Errorf("score %d of %s out of range", h.Score, h.Host)
			}
			out[h.Host] = h.Score
		}
		return out
	}
	before := score()
	if before["cpu"] != 0 || before["ghost"] != 0 {
		t.Errorf("nodes that cannot host the pod must score 0: %v", before)
	}
	var hi int64
	for _, n := range []string{"n0", "n1", "n2"} {
		hi = max(hi, before[n])
	}
	if hi != extenderv1.MaxExtenderPriority {
		t.Errorf("best node should score %d: %v", extenderv1.MaxExtenderPriority, before)
	}
	reserved := passedOne(t, filter(t, url, pod, all...))
	if after := score(); after[reserved] != extenderv1.MaxExtenderPriority {
		t.Errorf("reserved node %s should score max: %v", reserved, after)
	}
}

func TestBindWritesDevicesInTheBinding(t *testing.T) {
	t.Parallel()
	pod := podtest.Pod("ns", "p", podtest.GPUs(2))
	fc := newFakeCluster(t, pod)
	s := fedServer(t, newFakeClock(), Deps{Client: fc})
	s.state.UpsertNode(testNode("n", "A100", 4, 32, 128))
	s.state.UpsertPod(pod)
	url := startHTTP(t, s)
	node := passedOne(t, filter(t, url, pod, "n"))
	if e := bind(t, url, pod, node); e != "" {
		t.Fatalf("bind: %s", e)
	}
	// One write: the Binding, carrying the devices annotation.
	acts := fc.actions()
	if len(acts) != 1 || !strings.HasPrefix(acts[0], "bind ns/p n "+contract.AnnotationGPUDevices+"=") {
		t.Fatalf("want one binding carrying %s, got %q", contract.AnnotationGPUDevices, acts)
	}
	got := fc.pod(t, "ns", "p")
	devs, err := contract.ParseGPUDevices(got.Annotations[contract.AnnotationGPUDevices])
	if err != nil || len(devs) != 2 {
		t.Fatalf("annotation %q: %v", got.Annotations[contract.AnnotationGPUDevices], err)
	}
	if got.Spec.NodeName != "n" {
		t.Fatalf("pod not bound: %q", got.Spec.NodeName)
	}
	if ph := phaseOf(s, pod.UID); ph != "assumed@n" {
		t.Fatalf("phase %s, want assumed@n", ph)
	}
	// The informer shows the bound pod: the assumption is confirmed, nothing double counted.
	s.state.UpsertPod(got)
	if ph := phaseOf(s, pod.UID); ph != "bound@n" {
		t.Fatalf("phase %s, want bound@n", ph)
	}
	free := 0
	for _, f := range gpuFree(s, "n") {
		free += f
	}
	if free != 2000 {
		t.Fatalf("free milli %d, want 2000", free)
	}
	// Binding twice is idempotent.
	if e := bind(t, url, pod, "n"); e != "" {
		t.Fatalf("second bind: %s", e)
	}
}

func TestBindFetchesUnknownPodAndReportsFailures(t *testing.T) {
	t.Parallel()
	pod := podtest.Pod("ns", "p", podtest.GPUs(1))
	fc := newFakeCluster(t, pod)
	fc.failBind["p"] = true
	s := fedServer(t, newFakeClock(), Deps{Client: fc})
	s.state.UpsertNode(testNode("n", "A100", 1, 8, 32))
	url := startHTTP(t, s)
	if e := bind(t, url, pod, "n"); !strings.Contains(e, "injected binding failure") {
		t.Fatalf("want the binding error, got %q", e)
	}
	if got := gpuFree(s, "n"); got[0] != contract.MilliPerGPU {
		t.Fatalf("failed bind must release the device: %v", got)
	}
	ghost := podtest.Pod("ns", "ghost", podtest.GPUs(1))
	if e := bind(t, url, ghost, "n"); !strings.Contains(e, "unknown") {
		t.Fatalf("want unknown pod error, got %q", e)
	}
}

func TestMalformedBodies(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{}, func(c *Config) { c.MaxBodyBytes = 4096 })
	url := startHTTP(t, s)
	huge := `{"NodeNames":["` + strings.Repeat("x", 5000) + `"]}`
	tests := []struct {
		verb, body string
		code       int
		reason     string
	}{
		{"filter", `{`, 400, "ExtenderArgs"},
		{"filter", `[]`, 400, "ExtenderArgs"},
		{"filter", `{"NodeNames":["a"]}`, 400, "Pod is missing"},
		{"filter", `{"Pod":{"metadata":{"name":"p","uid":"u"}}}`, 400, "neither NodeNames nor Nodes"},
		{"filter", `{"Pod":{"metadata":{"name":"p"}},"NodeNames":[]}`, 400, "no name or uid"},
		{"filter", `{"Pod":{"spec":5},"NodeNames":["a"]}`, 400, "ExtenderArgs"},
		{"filter", `{"Pod":{},"NodeNames":["a"]} trailing`, 400, "ExtenderArgs"},
		{"filter", huge, 413, "exceeds 4096 bytes"},
		{"prioritize", `{"Pod":null,"NodeNames":["a"]}`, 400, "Pod is missing"},
		{"prioritize", `nope`, 400, "ExtenderArgs"},
		{"prioritize", huge, 413, "exceeds"},
		{"bind", `{"PodName":1}`, 400, "ExtenderBindingArgs"},
		{"bind", `{"PodName":"p"}`, 400, "needs PodName"},
		{"bind", huge, 413, "exceeds"},
	}
	for _, tc := range tests {
		code, body := postJSON(t, http.DefaultClient, url+"/"+tc.verb, tc.body)
		if code != tc.code || !strings.Contains(string(body), tc.reason) {
			t.Errorf("%s %.40q: got %d %s, want %d with %q", tc.verb, tc.body, code, body, tc.code, tc.reason)
		}
	}
	resp, err := http.Get(url + "/filter")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /filter: %d, want 405", resp.StatusCode)
	}
}

func TestConcurrentFiltersNeverDoubleBook(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	const nodes = 4 // 4 nodes × 2 GPUs = 8 devices
	for i := range nodes {
		s.state.UpsertNode(testNode(fmt.Sprintf("n%d", i), "A100", 2, 64, 256))
	}
	url := startHTTP(t, s)
	all := nodeNames("n", nodes)
	const pods = 20
	passed := make([]string, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := podtest.Pod("ns", fmt.Sprintf("p%d", i), podtest.Milli(600))
			code, body := postJSON(t, http.DefaultClient, url+"/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &all})
			if code != http.StatusOK {
				t.Errorf("%d %s", code, body)
				return
			}
			var res extenderv1.ExtenderFilterResult
			if err := json.Unmarshal(body, &res); err != nil {
				t.Error(err)
				return
			}
			if res.NodeNames != nil && len(*res.NodeNames) == 1 {
				passed[i] = (*res.NodeNames)[0]
			}
		}()
	}
	wg.Wait()
	n := 0
	for _, p := range passed {
		if p != "" {
			n++
		}
	}
	// 600-milli shares: one per device, 8 devices.
	if n != 2*nodes {
		t.Fatalf("%d pods passed, want exactly %d (one 600m share per device): %v", n, 2*nodes, passed)
	}
	for i := range nodes {
		for d, f := range gpuFree(s, fmt.Sprintf("n%d", i)) {
			if f != 400 {
				t.Errorf("n%d device %d has %d free, want 400", i, d, f)
			}
		}
	}
}

func TestReservationExpires(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	s := testServer(t, clock, Deps{Registry: reg})
	s.state.UpsertNode(testNode("n", "A100", 1, 8, 32))
	url := startHTTP(t, s)
	a, b := podtest.Pod("ns", "a", podtest.GPUs(1)), podtest.Pod("ns", "b", podtest.GPUs(1))
	passedOne(t, filter(t, url, a, "n"))
	if res := filter(t, url, b, "n"); res.FailedNodes["n"] == "" {
		t.Fatalf("b must wait while a holds the GPU: %+v", res)
	}
	clock.Advance(DefaultConfig().AssumedTTL + time.Second)
	s.Housekeep()
	passedOne(t, filter(t, url, b, "n"))
	if err := testutil.CollectAndCompare(s.met.ReservationsExpired, strings.NewReader(`
# HELP understory_extender_reservations_expired_total Filter reservations released because their bind never came.
# TYPE understory_extender_reservations_expired_total counter
understory_extender_reservations_expired_total 1
`)); err != nil {
		t.Fatal(err)
	}
}

func TestHealthzStatusMetrics(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s := testServer(t, clock, Deps{})
	s.state.UpsertNode(testNode("n", "A100", 2, 8, 32))
	url := startHTTP(t, s)
	pod := podtest.Pod("ns", "p", podtest.Milli(250))
	passedOne(t, filter(t, url, pod, "n", "missing"))

	get := func(path string) (int, []byte) {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := get("/healthz"); code != 200 || string(body) != "ok\n" {
		t.Errorf("healthz: %d %q", code, body)
	}
	code, body := get("/status")
	if code != 200 {
		t.Fatalf("status: %d", code)
	}
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 1 || len(st.Nodes[0].GPUs) != 2 || len(st.AssumedPods) != 1 ||
		st.AssumedPods[0].Phase != "reserved" || st.AssumedPods[0].Pod != "ns/p" || st.AssumedPods[0].Expires == nil {
		t.Fatalf("status: %s", body)
	}
	alloc := st.Nodes[0].GPUs[0].AllocatedMilli + st.Nodes[0].GPUs[1].AllocatedMilli
	if alloc != 250 {
		t.Fatalf("allocated %d, want 250: %s", alloc, body)
	}
	code, body = get("/metrics")
	if code != 200 || !bytes.Contains(body, []byte(`understory_extender_filter_nodes_total{result="passed"} 1`)) ||
		!bytes.Contains(body, []byte(`understory_extender_pods{phase="reserved"} 1`)) {
		t.Fatalf("metrics: %d %s", code, body)
	}
	if err := testutil.CollectAndCompare(s.met.FilterNodes, strings.NewReader(`
# HELP understory_extender_filter_nodes_total Per-node filter verdicts: passed, failed (may pass later), unresolvable.
# TYPE understory_extender_filter_nodes_total counter
understory_extender_filter_nodes_total{result="failed"} 1
understory_extender_filter_nodes_total{result="passed"} 1
understory_extender_filter_nodes_total{result="unresolvable"} 0
`)); err != nil {
		t.Fatal(err)
	}
}

func TestArgsOnlyPodsAreForgotten(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s := testServer(t, clock, Deps{})
	s.state.UpsertNode(testNode("n", "A100", 1, 8, 32))
	url := startHTTP(t, s)
	pod := podtest.Pod("ns", "gone", podtest.GPUs(1))
	passedOne(t, filter(t, url, pod, "n"))
	ttl := DefaultConfig().AssumedTTL
	clock.Advance(ttl + time.Second)
	s.Housekeep()
	if ph := phaseOf(s, pod.UID); ph != "pending@" {
		t.Fatalf("reservation should have expired, phase %s", ph)
	}
	clock.Advance(argsLifetime * ttl)
	s.Housekeep()
	if ph := phaseOf(s, pod.UID); ph != "unknown" {
		t.Fatalf("a pod only extender args ever showed should be forgotten, phase %s", ph)
	}
}

// TestLargeRequestsLimited: at most MaxLargeRequests requests with a body over
// LargeBodyBytes (or of unknown length) are handled at once; another is
// refused with 429 at once (kube-scheduler retries the pod), small requests
// are never held up, and the slot frees when the large request ends.
func TestLargeRequestsLimited(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{}, func(c *Config) { c.LargeBodyBytes, c.MaxLargeRequests = 2048, 1 })
	s.state.UpsertNode(testNode("n1", "A100", 4, 8, 32))
	url := startHTTP(t, s)
	// A large filter body: valid ExtenderArgs padded with spaces past the limit.
	large := func(name string) []byte {
		b, err := json.Marshal(extenderv1.ExtenderArgs{Pod: podtest.Pod("ns", name, podtest.GPUs(1)), NodeNames: names("n1")})
		if err != nil {
			t.Fatal(err)
		}
		return append(b, bytes.Repeat([]byte(" "), 4096)...)
	}

	// The first large request is held in flight: its body arrives slowly.
	body := large("slow")
	pr, pw := io.Pipe()
	// Ends the held request if the test fails first: the server's Close (a cleanup
	// registered earlier, so run later) would otherwise wait for it forever.
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
	req, err := http.NewRequest(http.MethodPost, url+"/filter", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	first := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- -1
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	if _, err := pw.Write(body[:100]); err != nil {
		t.Fatal(err)
	}
	// The client has sent the headers; wait until the handler holds the slot (the
	// write above returns once the transport read it, maybe before the handler ran).
	for deadline := time.Now().Add(10 * time.Second); len(s.large) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow large request never took a slot")
		}
	}

	code, out := postJSON(t, http.DefaultClient, url+"/filter", large("second"))
	if code != http.StatusTooManyRequests || !strings.Contains(string(out), ErrTooManyLarge.Error()) {
		t.Fatalf("second large request: %d %s, want 429", code, out)
	}
	passedOne(t, filter(t, url, podtest.Pod("ns", "small", podtest.GPUs(1)), "n1")) // small ones pass

	if _, err := pw.Write(body[100:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if c := <-first; c != http.StatusOK {
		t.Fatalf("the held large request ended with %d", c)
	}
	if code, out := postJSON(t, http.DefaultClient, url+"/filter", large("third")); code != http.StatusOK {
		t.Fatalf("a large request after the slot freed: %d %s", code, out)
	}
}

// TestLockHoldMetric: with Config.LockHoldMetric every write-lock hold is
// observed in understory_extender_index_lock_hold_seconds (and Deps.LockHold
// sees the same holds); without it the metric does not exist.
func TestLockHoldMetric(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		var seen atomic.Int64
		s := testServer(t, newFakeClock(), Deps{Registry: reg,
			LockHold: prometheus.ObserverFunc(func(float64) { seen.Add(1) })}, func(c *Config) { c.LockHoldMetric = on })
		s.state.UpsertNode(testNode("n1", "A100", 4, 8, 32))
		s.state.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n1")))
		s.state.DeletePod("uid-ns-a")
		n, err := testutil.GatherAndCount(reg, "understory_extender_index_lock_hold_seconds")
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 0, true: 1}[on]; n != want {
			t.Errorf("LockHoldMetric %v: %d lock hold histograms, want %d", on, n, want)
		}
		if seen.Load() != 3 {
			t.Errorf("LockHoldMetric %v: Deps.LockHold saw %d holds, want 3", on, seen.Load())
		}
	}
}

// FuzzHandlers posts arbitrary bodies to every verb: the server answers 200,
// 400 or 413 and never panics.
func FuzzHandlers(f *testing.F) {
	pod, _ := json.Marshal(podtest.Pod("ns", "p", podtest.GPUs(1)))
	f.Add(uint8(0), []byte(`{"Pod":`+string(pod)+`,"NodeNames":["n0","x"]}`))
	f.Add(uint8(1), []byte(`{"Pod":`+string(pod)+`,"NodeNames":["n0"]}`))
	f.Add(uint8(2), []byte(`{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n0"}`))
	f.Add(uint8(0), []byte(`{"Pod":{"metadata":{"name":"p","uid":"u","annotations":{"understory.io/gpu-model":",,"}}},"NodeNames":["n0"]}`))
	s, err := NewServer(DefaultConfig(), Deps{})
	if err != nil {
		f.Fatal(err)
	}
	s.state.UpsertNode(testNode("n0", "A100", 2, 8, 32))
	h := s.Handler()
	verbs := []string{"/filter", "/prioritize", "/bind"}
	f.Fuzz(func(t *testing.T, verb uint8, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, verbs[int(verb)%3], bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if rec.Code == http.StatusOK && verb%3 != 1 && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("invalid JSON answer %s", rec.Body)
		}
	})
}

// TestNewServerServesGivenState: a Server given Deps.State serves that index (a node
// fed to it after NewServer takes a pod's filter); an index that holds a node already,
// was made with another Config or serves another Server is refused.
func TestNewServerServesGivenState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// state returns the State to give NewServer with cfg.
		state   func(t *testing.T, cfg Config, clock *fakeClock) *State
		wantErr error
	}{
		{"an empty index of the config", func(t *testing.T, cfg Config, clock *fakeClock) *State {
			return newTestState(t, cfg, clock)
		}, nil},
		{"an index fed before", func(t *testing.T, cfg Config, clock *fakeClock) *State {
			st := newTestState(t, cfg, clock)
			st.UpsertNode(testNode("early", "A100", 1, 8, 32))
			return st
		}, ErrInvalidConfig},
		{"an index of another config", func(t *testing.T, cfg Config, clock *fakeClock) *State {
			cfg.Seed++
			return newTestState(t, cfg, clock)
		}, ErrInvalidConfig},
		{"an index another Server serves", func(t *testing.T, cfg Config, clock *fakeClock) *State {
			st := newTestState(t, cfg, clock)
			if _, err := NewServer(cfg, Deps{State: st, Now: clock.Now, Logger: slog.New(slog.DiscardHandler)}); err != nil {
				t.Fatalf("the first NewServer: %v", err)
			}
			return st
		}, ErrInvalidConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock, cfg := newFakeClock(), DefaultConfig()
			st := tc.state(t, cfg, clock)
			s, err := NewServer(cfg, Deps{State: st, Now: clock.Now, Logger: slog.New(slog.DiscardHandler)})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("NewServer = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			st.UpsertNode(testNode("n", "A100", 1, 8, 32))
			res := filter(t, startHTTP(t, s), podtest.Pod("ns", "p", podtest.GPUs(1)), "n")
			if got := passedOne(t, res); got != "n" {
				t.Fatalf("filter passed %q, want n, the node fed to the given State", got)
			}
		})
	}
}

// newTestState is NewState on the test's clock.
func newTestState(t *testing.T, cfg Config, clock *fakeClock) *State {
	t.Helper()
	st, err := NewState(cfg, clock.Now)
	if err != nil {
		t.Fatalf("NewState: %v", err)
	}
	return st
}
