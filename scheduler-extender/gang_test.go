package extender

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func gangPod(name, group string, minMember, gpuCount, createdSec int) *corev1.Pod {
	opts := append(podtest.Volcano(group, minMember), podtest.GPUs(gpuCount), podtest.Created(createdSec))
	return podtest.Pod("ns", name, opts...)
}

// twoNodes is a cluster of two 4-GPU nodes.
func twoNodes(t *testing.T, s *Server) {
	t.Helper()
	s.state.UpsertNode(testNode("n0", "A100", 4, 64, 256))
	s.state.UpsertNode(testNode("n1", "A100", 4, 64, 256))
}

func TestGangWaitsUntilAllMembersFitThenBindsTogether(t *testing.T) {
	t.Parallel()
	var members []*corev1.Pod
	var objs []runtime.Object
	for i := range 4 {
		p := gangPod(fmt.Sprintf("m%d", i), "g", 4, 2, i)
		members = append(members, p)
		objs = append(objs, p)
	}
	fc := newFakeCluster(t, objs...)
	reg := prometheus.NewRegistry()
	s := fedServer(t, newFakeClock(), Deps{Client: fc, Registry: reg})
	twoNodes(t, s)
	url := startHTTP(t, s)
	for _, p := range members[:3] {
		s.state.UpsertPod(p)
	}
	res := filter(t, url, members[0], "n0", "n1")
	want := "gang ns/g: 3/4 members fit (3 of 4 members exist)"
	if res.FailedNodes["n0"] != want || res.FailedNodes["n1"] != want || len(res.FailedAndUnresolvableNodes) != 0 {
		t.Fatalf("want FailedNodes %q, got %+v", want, res)
	}
	s.state.UpsertPod(members[3])
	planned := map[string]string{}
	for _, i := range []int{3, 0, 1, 2} {
		planned[members[i].Name] = passedOne(t, filter(t, url, members[i], "n0", "n1"))
	}
	perNode := map[string]int{}
	for _, n := range planned {
		perNode[n]++
	}
	if perNode["n0"] != 2 || perNode["n1"] != 2 {
		t.Fatalf("plan %v should put two 2-GPU members on each node", planned)
	}
	// A planned member filtered again gets the same node.
	if again := passedOne(t, filter(t, url, members[1], "n0", "n1")); again != planned["m1"] {
		t.Fatalf("member m1 moved from %s to %s", planned["m1"], again)
	}
	// Every member records the plan (which nudges the three the trigger did not cover).
	waitFor(t, func() bool {
		n := 0
		for _, p := range members {
			if strings.HasPrefix(fc.pod(t, "ns", p.Name).Annotations[contract.AnnotationGangState], "planned:") {
				n++
			}
		}
		return n == 4
	})

	var wg sync.WaitGroup
	errs := make([]string, 4)
	for i, p := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = bind(t, url, p, planned[p.Name])
		}()
		if i < 3 {
			waitFor(t, func() bool { return strings.HasPrefix(phaseOf(s, p.UID), "binding") })
			if acts := bindsOnly(fc.actions()); len(acts) != 0 {
				t.Fatalf("a binding was created before every member arrived: %q", acts)
			}
		}
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("member %d bind: %s", i, e)
		}
	}
	// Each member's devices travel in its Binding: no separate annotation write.
	acts := fc.actions()
	binds := bindsOnly(acts)
	for _, a := range acts {
		if strings.HasPrefix(a, "patch") && strings.Contains(a, contract.AnnotationGPUDevices) {
			t.Errorf("devices written apart from the Binding: %q", a)
		}
	}
	for _, a := range binds {
		if !strings.Contains(a, " "+contract.AnnotationGPUDevices+"=") {
			t.Errorf("binding without devices: %q", a)
		}
	}
	if len(binds) != 4 {
		t.Fatalf("want 4 bindings, got %q", acts)
	}
	st := s.Status()
	if len(st.Gangs) != 1 || st.Gangs[0].State != GangAdmitted || st.Gangs[0].Bound != 4 {
		t.Fatalf("gang status %+v", st.Gangs)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP understory_extender_gang_transitions_total Gang events: planned, resumed (a plan recorded before a restart reserved again), bound, plan_expired, bind_timeout, bind_failed, plan_broken, unschedulable.
# TYPE understory_extender_gang_transitions_total counter
understory_extender_gang_transitions_total{event="bind_failed"} 0
understory_extender_gang_transitions_total{event="bind_timeout"} 0
understory_extender_gang_transitions_total{event="bound"} 1
understory_extender_gang_transitions_total{event="plan_broken"} 0
understory_extender_gang_transitions_total{event="plan_expired"} 0
understory_extender_gang_transitions_total{event="planned"} 1
understory_extender_gang_transitions_total{event="resumed"} 0
understory_extender_gang_transitions_total{event="unschedulable"} 0
`), "understory_extender_gang_transitions_total"); err != nil {
		t.Fatal(err)
	}
}

func bindsOnly(acts []string) []string {
	var out []string
	for _, a := range acts {
		if strings.HasPrefix(a, "bind") {
			out = append(out, a)
		}
	}
	return out
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCompetingGangsOneWinsWhole(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	twoNodes(t, s)
	url := startHTTP(t, s)
	// Each gang needs the whole cluster: 2 members × 4 GPUs.
	var pods []*corev1.Pod
	for _, g := range []string{"a", "b"} {
		for i := range 2 {
			p := gangPod(fmt.Sprintf("%s%d", g, i), g, 2, 4, i)
			pods = append(pods, p)
			s.state.UpsertPod(p)
		}
	}
	// Every member filters concurrently, several times: exactly one gang may win.
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := map[string]string{}
	for round := range 5 {
		for _, p := range pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := filter(t, url, p, "n0", "n1")
				if res.NodeNames != nil && len(*res.NodeNames) == 1 {
					mu.Lock()
					if prev, ok := passed[p.Name]; ok && prev != (*res.NodeNames)[0] {
						t.Errorf("round %d: %s moved from %s to %s", round, p.Name, prev, (*res.NodeNames)[0])
					}
					passed[p.Name] = (*res.NodeNames)[0]
					mu.Unlock()
				} else if len(res.FailedAndUnresolvableNodes) > 0 {
					t.Errorf("gang waiting must not be unresolvable: %+v", res)
				}
			}()
		}
	}
	wg.Wait()
	gangsWon := map[byte]int{}
	for name := range passed {
		gangsWon[name[0]]++
	}
	if len(gangsWon) != 1 || (gangsWon['a'] != 2 && gangsWon['b'] != 2) {
		t.Fatalf("want exactly one whole gang planned, passed=%v", passed)
	}
	var winner, loser byte = 'a', 'b'
	if gangsWon['b'] == 2 {
		winner, loser = 'b', 'a'
	}
	loserPod := pods[0]
	if loser == 'b' {
		loserPod = pods[2]
	}
	res := filter(t, url, loserPod, "n0", "n1")
	if !strings.Contains(res.FailedNodes["n0"], fmt.Sprintf("gang ns/%c: 0/2 members fit", loser)) {
		t.Fatalf("loser should wait with a reason: %+v", res)
	}
	// The winner finishes and leaves: the loser is admitted whole.
	for _, p := range pods {
		if p.Name[0] == winner {
			s.state.DeletePod(p.UID)
		}
	}
	passedOne(t, filter(t, url, loserPod, "n0", "n1"))
	st := s.Status()
	for _, g := range st.Gangs {
		if g.Gang == fmt.Sprintf("ns/%c", loser) && (g.State != GangPlanned || len(g.Plan) != 2) {
			t.Fatalf("loser gang after capacity freed: %+v", g)
		}
	}
}

func TestGangPlanExpiryReleasesCapacity(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	s := testServer(t, clock, Deps{Registry: reg})
	twoNodes(t, s)
	url := startHTTP(t, s)
	a, b := gangPod("a", "g", 2, 4, 0), gangPod("b", "g", 2, 4, 1)
	s.state.UpsertPod(a)
	s.state.UpsertPod(b)
	node := passedOne(t, filter(t, url, a, "n0", "n1"))
	done := make(chan string)
	go func() { done <- bind(t, url, a, node) }()
	waitFor(t, func() bool { return strings.HasPrefix(phaseOf(s, a.UID), "binding") })
	clock.Advance(DefaultConfig().GangPlanTTL + time.Second)
	s.Housekeep()
	if e := <-done; !strings.Contains(e, "plan expired with 1/2 members at bind") {
		t.Fatalf("waiting bind should fail with the expiry, got %q", e)
	}
	for _, n := range []string{"n0", "n1"} {
		for _, f := range gpuFree(s, n) {
			if f != contract.MilliPerGPU {
				t.Fatalf("%s not released: %v", n, gpuFree(s, n))
			}
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP understory_extender_gangs Gangs by state.
# TYPE understory_extender_gangs gauge
understory_extender_gangs{state="waiting"} 1
`), "understory_extender_gangs"); err != nil {
		t.Fatal(err)
	}
	// The gang plans again on the next filter.
	passedOne(t, filter(t, url, b, "n0", "n1"))
}

func TestGangBindTimeoutReleasesPlan(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{}, func(c *Config) { c.GangBindTimeout = 100 * time.Millisecond })
	twoNodes(t, s)
	url := startHTTP(t, s)
	a, b := gangPod("a", "g", 2, 1, 0), gangPod("b", "g", 2, 1, 1)
	s.state.UpsertPod(a)
	s.state.UpsertPod(b)
	node := passedOne(t, filter(t, url, a, "n0", "n1"))
	if e := bind(t, url, a, node); !strings.Contains(e, "bind timeout with 1/2 members at bind") {
		t.Fatalf("got %q", e)
	}
	if ph := phaseOf(s, b.UID); ph != "pending@" {
		t.Fatalf("b should be released, is %s", ph)
	}
}

func TestGangThatCanNeverFitIsUnresolvable(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	twoNodes(t, s)
	url := startHTTP(t, s)
	p := gangPod("a", "big", 3, 4, 0) // 3 × 4 GPUs on 2 × 4 GPUs
	s.state.UpsertPod(p)
	res := filter(t, url, p, "n0", "n1")
	want := "gang ns/big: minMember 3 can never fit the cluster (at most 2 fit on empty nodes)"
	if res.FailedAndUnresolvableNodes["n0"] != want {
		t.Fatalf("want unresolvable %q, got %+v", want, res)
	}
	if st := s.Status(); st.Gangs[0].State != gang.GangUnschedulable || len(st.AssumedPods) != 0 {
		t.Fatalf("state %+v, held %+v: want unschedulable, nothing held", st.Gangs, st.AssumedPods)
	}
	for _, n := range []string{"n0", "n1"} {
		if free := gpuFree(s, n); fmt.Sprint(free) != "[1000 1000 1000 1000]" {
			t.Errorf("node %s holds capacity for a gang that can never fit: %v", n, free)
		}
	}
}

func TestGangInvalidSpecIsUnresolvable(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	twoNodes(t, s)
	url := startHTTP(t, s)
	p := podtest.Pod("ns", "a", podtest.GPUs(1), podtest.Annotate(contract.AnnotationKoordinatorName, "k"), podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "many"))
	res := filter(t, url, p, "n0")
	if !strings.Contains(res.FailedAndUnresolvableNodes["n0"], "min member \"many\"") {
		t.Fatalf("got %+v", res)
	}
	// A PodGroup gang whose PodGroup is not known waits (retryable), it is not unresolvable.
	q := podtest.Pod("ns", "q", podtest.GPUs(1), podtest.Label(contract.LabelPodGroup, "pg"))
	res = filter(t, url, q, "n0")
	if !strings.Contains(res.FailedNodes["n0"], "PodGroup not found") {
		t.Fatalf("got %+v", res)
	}
}

func TestGangRestartMidGangRebuildsFromAnnotations(t *testing.T) {
	t.Parallel()
	// m0, m1 were bound by a previous extender; m2, m3 still pending.
	m0 := podtest.Pod("ns", "m0", append(podtest.Volcano("g", 4), podtest.GPUs(2), podtest.OnNode("n0"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1"))...)
	m1 := podtest.Pod("ns", "m1", append(podtest.Volcano("g", 4), podtest.GPUs(2), podtest.OnNode("n0"), podtest.Annotate(contract.AnnotationGPUDevices, "2,3"))...)
	m2, m3 := gangPod("m2", "g", 4, 2, 2), gangPod("m3", "g", 4, 2, 3)
	fc := newFakeCluster(t, testNode("n0", "A100", 4, 64, 256), testNode("n1", "A100", 4, 64, 256), m0, m1, m2, m3)
	s := testServer(t, newFakeClock(), Deps{Client: fc})
	runServer(t, s)
	waitFor(t, func() bool { return s.Status().Synced })
	if free := gpuFree(s, "n0"); fmt.Sprint(free) != "[0 0 0 0]" {
		t.Fatalf("n0 should be rebuilt as full from annotations: %v", free)
	}
	url := startHTTP(t, s)
	if n := passedOne(t, filter(t, url, m2, "n0", "n1")); n != "n1" {
		t.Fatalf("m2 planned on %s", n)
	}
	if n := passedOne(t, filter(t, url, m3, "n0", "n1")); n != "n1" {
		t.Fatalf("m3 planned on %s", n)
	}
	var wg sync.WaitGroup
	for _, p := range []*corev1.Pod{m2, m3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if e := bind(t, url, p, "n1"); e != "" {
				t.Errorf("bind %s: %s", p.Name, e)
			}
		}()
	}
	wg.Wait()
	waitFor(t, func() bool { return phaseOf(s, m2.UID) == "bound@n1" && phaseOf(s, m3.UID) == "bound@n1" })
	if st := s.Status(); st.Gangs[0].State != GangAdmitted || st.Gangs[0].Bound != 4 {
		t.Fatalf("gang %+v", st.Gangs)
	}
}

func TestGangPartialBindFailureIsReported(t *testing.T) {
	t.Parallel()
	a, b := gangPod("a", "g", 2, 1, 0), gangPod("b", "g", 2, 1, 1)
	fc := newFakeCluster(t, a, b)
	fc.failBind["b"] = true
	s := fedServer(t, newFakeClock(), Deps{Client: fc})
	twoNodes(t, s)
	s.state.UpsertPod(a)
	s.state.UpsertPod(b)
	url := startHTTP(t, s)
	na := passedOne(t, filter(t, url, a, "n0", "n1"))
	nb := passedOne(t, filter(t, url, b, "n0", "n1"))
	var wg sync.WaitGroup
	var ea, eb string
	wg.Add(2)
	go func() { defer wg.Done(); ea = bind(t, url, a, na) }()
	go func() { defer wg.Done(); eb = bind(t, url, b, nb) }()
	wg.Wait()
	if ea != "" || !strings.Contains(eb, "injected binding failure") {
		t.Fatalf("a: %q, b: %q", ea, eb)
	}
	st := s.Status()
	if st.Gangs[0].State != GangWaiting || !strings.Contains(st.Gangs[0].Reason, "1 members bound, 1 failed") {
		t.Fatalf("gang %+v", st.Gangs[0])
	}
	// b retries alone: one member bound, so only one more is needed.
	if n := passedOne(t, filter(t, url, b, "n0", "n1")); n == "" {
		t.Fatal("b should be planned again")
	}
}

func TestPodGroupFromDynamicInformer(t *testing.T) {
	t.Parallel()
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"namespace": "ns", "name": "pg"},
		"spec":     map[string]any{"minMember": int64(2), "scheduleTimeoutSeconds": int64(90)},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PodGroupGVR: "PodGroupList", VolcanoPodGroupGVR: "PodGroupList"}, pg)
	a := podtest.Pod("ns", "a", podtest.GPUs(1), podtest.Label(contract.LabelPodGroup, "pg"))
	b := podtest.Pod("ns", "b", podtest.GPUs(1), podtest.Label(contract.LabelPodGroup, "pg"))
	fc := newFakeCluster(t, testNode("n0", "A100", 4, 64, 256), a, b)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	s := testServer(t, clock, Deps{Client: fc, Dynamic: dyn, Registry: reg})
	stop := runServer(t, s)
	waitFor(t, s.Ready)
	url := startHTTP(t, s)
	waitFor(t, func() bool { // until the PodGroup reaches the gangs, a waits ("PodGroup not found")
		res := filter(t, url, a, "n0")
		return res.NodeNames != nil && len(*res.NodeNames) == 1
	})
	st := s.Status()
	if st.Gangs[0].MinMember != 2 || st.Gangs[0].State != GangPlanned || st.Gangs[0].PlanExpiry == nil ||
		!st.Gangs[0].PlanExpiry.Equal(clock.Now().Add(90*time.Second)) {
		t.Fatalf("gang %+v", st.Gangs[0])
	}
	// Stop the informers first: a watch that opens late would touch the
	// state at the advanced clock and reset the staleness.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { // every watch stream has ended (its end is the last contact)
		for _, is := range s.Status().Informers {
			if is.Watching {
				return false
			}
		}
		return true
	})
	clock.Advance(7 * time.Second)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP understory_extender_cache_staleness_seconds Per informer: 0 while its watch is open, else seconds since it last heard from the API server.
# TYPE understory_extender_cache_staleness_seconds gauge
understory_extender_cache_staleness_seconds{informer="nodes"} 7
understory_extender_cache_staleness_seconds{informer="podgroups"} 7
understory_extender_cache_staleness_seconds{informer="pods"} 7
understory_extender_cache_staleness_seconds{informer="volcano-podgroups"} 7
`), "understory_extender_cache_staleness_seconds"); err != nil {
		t.Fatal(err)
	}
}

// A restarted extender learns a gang whose members a previous one bound from the
// informer alone (no filter call sizes it): /status shows it admitted with its
// minMember, in each dialect, whatever order its pods and PodGroup arrive in.
func TestGangBoundBeforeRestartIsAdmitted(t *testing.T) {
	t.Parallel()
	koord := func(name string) *corev1.Pod {
		return podtest.Pod("ns", name, podtest.Annotate(contract.AnnotationKoordinatorName, "g"), podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "2"),
			podtest.OnNode("n0"))
	}
	vol := func(name string) *corev1.Pod {
		return podtest.Pod("ns", name, append(podtest.Volcano("g", 2), podtest.OnNode("n0"))...)
	}
	pg := func(name string) *corev1.Pod {
		return podtest.Pod("ns", name, podtest.Label(contract.LabelPodGroup, "g"), podtest.OnNode("n0"))
	}
	tests := []struct {
		name     string
		pods     []*corev1.Pod
		group    bool // a scheduler-plugins PodGroup of minMember 2, upserted after the pods
		wantMin  int
		wantSt   string
		wantNote string
	}{
		{"koordinator", []*corev1.Pod{koord("a"), koord("b")}, false, 2, GangAdmitted, ""},
		{"volcano annotation", []*corev1.Pod{vol("a"), vol("b")}, false, 2, GangAdmitted, ""},
		{"podgroup after its pods", []*corev1.Pod{pg("a"), pg("b")}, true, 2, GangAdmitted, ""},
		{"podgroup not seen", []*corev1.Pod{pg("a"), pg("b")}, false, 0, GangWaiting, "no PodGroup: minMember unknown"},
		{"one of two bound", []*corev1.Pod{koord("a"), podtest.Pod("ns", "b", podtest.Annotate(contract.AnnotationKoordinatorName, "g"),
			podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "2"))}, false, 2, GangWaiting, "one member is not bound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := fedServer(t, newFakeClock(), Deps{Client: newFakeCluster(t)})
			twoNodes(t, s)
			for _, p := range tc.pods {
				s.state.UpsertPod(p)
			}
			if tc.group {
				s.gangs.UpsertPodGroup(&unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
					"metadata": map[string]any{"namespace": "ns", "name": "g"},
					"spec":     map[string]any{"minMember": int64(2)}}})
			}
			st := s.Status()
			if len(st.Gangs) != 1 || st.Gangs[0].MinMember != tc.wantMin || st.Gangs[0].State != tc.wantSt {
				t.Fatalf("gangs %+v, want one of minMember %d, %s (%s)", st.Gangs, tc.wantMin, tc.wantSt, tc.wantNote)
			}
		})
	}
}
