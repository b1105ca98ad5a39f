package kueuequota

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/kueuequota/quota"
)

var _ eventRecorder = (*record.FakeRecorder)(nil) // the tests' recorder

// node is a Ready Node with a live agent: batch CPU allocatable and node-metrics
// stamped now (the fixture's clock is the real one).
func node(name string, cpu int64, unschedulable bool) *corev1.Node {
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: time.Now(), WindowMillis: 10_000,
		CPU: contract.CPUMetrics{Capacity: 8000}, Memory: contract.MemoryMetrics{Capacity: 32 << 30},
		Batch: &contract.BatchResources{CPU: cpu}}
	ann, err := m.EncodeAnnotations()
	if err != nil {
		panic(err) // a fixed, valid document
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				contract.ResourceBatchCPU: *resource.NewQuantity(cpu, resource.DecimalSI),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func clusterQueue(name, weight string, cpu int64, reservedCPU int64) *unstructured.Unstructured {
	obj := map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
		"metadata": map[string]any{
			"name": name, "labels": map[string]any{LabelFollow: "true"},
			"annotations": map[string]any{AnnotationWeight: weight},
		},
		"spec": map[string]any{"resourceGroups": []any{map[string]any{
			"coveredResources": []any{contract.ResourceBatchCPU, "other"},
			"flavors": []any{map[string]any{"name": DefaultFlavor, "resources": []any{
				map[string]any{"name": contract.ResourceBatchCPU, "nominalQuota": fmt.Sprint(cpu)},
				map[string]any{"name": "other", "nominalQuota": "7"},
			}}},
		}}},
		"status": map[string]any{"flavorsReservation": []any{map[string]any{"name": DefaultFlavor, "resources": []any{
			map[string]any{"name": contract.ResourceBatchCPU, "total": fmt.Sprint(reservedCPU)},
		}}}},
	}
	return &unstructured.Unstructured{Object: obj}
}

func workload(ns, name, queue string, cpu int64, prio int64, admittedAt time.Time, active bool) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"active": active, "priority": prio},
		"status": map[string]any{
			"conditions": []any{map[string]any{"type": "QuotaReserved", "status": "True", "lastTransitionTime": admittedAt.UTC().Format(time.RFC3339)}},
			"admission": map[string]any{"clusterQueue": queue, "podSetAssignments": []any{map[string]any{
				"name": "main", "flavors": map[string]any{contract.ResourceBatchCPU: DefaultFlavor},
				"resourceUsage": map[string]any{contract.ResourceBatchCPU: fmt.Sprint(cpu)},
			}}},
		},
	}}
}

type fixture struct {
	f   *Follower
	dyn *dynfake.FakeDynamicClient
	rec *record.FakeRecorder
	reg *prometheus.Registry
}

func newFixture(t *testing.T, nodes []runtime.Object, objs ...runtime.Object) fixture {
	t.Helper()
	client := fake.NewClientset(nodes...)
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		clusterQueuesGVR: "ClusterQueueList", workloadsGVR: "WorkloadList",
	}, objs...)
	cfg := DefaultConfig()
	cfg.Resources = []string{contract.ResourceBatchCPU}
	cfg.Params = quota.Params{RiseFraction: 1}
	cfg.EvictAfter = 0 // evictions from the first pass (TestFollowerDampsDeactivations sets the default)
	rec := record.NewFakeRecorder(100)
	reg := prometheus.NewRegistry()
	f, err := New(client, dyn, cfg, reg, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.factory.Start(ctx.Done())
	f.factory.WaitForCacheSync(ctx.Done())
	return fixture{f: f, dyn: dyn, rec: rec, reg: reg}
}

func (fx fixture) quota(t *testing.T, cq string) (cpu int64, other string) {
	t.Helper()
	obj, err := fx.dyn.Resource(clusterQueuesGVR).Get(context.Background(), cq, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forEachFlavorResource(obj.Object, DefaultFlavor, func(rm map[string]any) {
		switch rm["name"] {
		case contract.ResourceBatchCPU:
			q := resource.MustParse(fmt.Sprint(rm["nominalQuota"]))
			cpu = q.Value()
		case "other":
			other = fmt.Sprint(rm["nominalQuota"])
		}
	})
	return cpu, other
}

func TestStepFollowsPublishedCapacity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		nodes      []runtime.Object
		queues     []runtime.Object
		wantA      int64
		wantB      int64
		wantEvents int
	}{
		{
			name:   "split by weight, unschedulable nodes left out",
			nodes:  []runtime.Object{node("n1", 4000, false), node("n2", 8000, false), node("n3", 100000, true)},
			queues: []runtime.Object{clusterQueue("a", "1", 0, 0), clusterQueue("b", "2", 0, 0)},
			wantA:  4000, wantB: 8000, wantEvents: 2,
		},
		{
			name:   "a fall is written at once; an unchanged queue is not written",
			nodes:  []runtime.Object{node("n1", 4000, false)},
			queues: []runtime.Object{clusterQueue("a", "", 6000, 0), clusterQueue("b", "1", 2000, 0)},
			wantA:  2000, wantB: 2000, wantEvents: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newFixture(t, tc.nodes, tc.queues...)
			if err := fx.f.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			a, other := fx.quota(t, "a")
			b, _ := fx.quota(t, "b")
			if a != tc.wantA || b != tc.wantB {
				t.Errorf("quotas a=%d b=%d, want %d %d", a, b, tc.wantA, tc.wantB)
			}
			if other != "7" {
				t.Errorf("a resource the follower does not follow changed: %q", other)
			}
			if n := len(fx.rec.Events); n != tc.wantEvents {
				t.Errorf("%d events, want %d", n, tc.wantEvents)
			}
			if got := testutil.ToFloat64(fx.f.m.nominal.WithLabelValues("a", contract.ResourceBatchCPU)); got != float64(tc.wantA) {
				t.Errorf("nominal metric %v, want %d", got, tc.wantA)
			}
		})
	}
}

func TestStepSkipsBadWeight(t *testing.T) {
	t.Parallel()
	fx := newFixture(t, []runtime.Object{node("n1", 4000, false)}, clusterQueue("a", "-1", 123, 0), clusterQueue("b", "1", 0, 0))
	if err := fx.f.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a, _ := fx.quota(t, "a"); a != 123 {
		t.Errorf("queue with a bad weight was written: %d", a)
	}
	if b, _ := fx.quota(t, "b"); b != 4000 {
		t.Errorf("b = %d, want all 4000", b)
	}
	if got := testutil.ToFloat64(fx.f.m.errors); got != 1 {
		t.Errorf("errors metric %v, want 1", got)
	}
}

// TestStepEvictsOverQuotaThroughKueue: capacity falls under what is admitted; the
// follower deactivates the lowest-priority, latest Workload of the queue furthest
// over, and reactivates it once Kueue has evicted it.
func TestStepEvictsOverQuotaThroughKueue(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fx := newFixture(t, []runtime.Object{node("n1", 4000, false)},
		clusterQueue("a", "1", 4000, 4000), clusterQueue("b", "1", 4000, 2000),
		workload("ta", "a-old", "a", 2000, 0, t0, true),
		workload("ta", "a-new", "a", 2000, 0, t0.Add(time.Minute), true),
		workload("tb", "b-1", "b", 2000, 0, t0, true),
	)
	ctx := context.Background()
	if err := fx.f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	// Quotas 2000 + 2000 against 6000 reserved: a (2000 over) gives a-new.
	wls := fx.dyn.Resource(workloadsGVR)
	get := func(ns, name string) *unstructured.Unstructured {
		w, err := wls.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	active := func(w *unstructured.Unstructured) bool {
		a, _, _ := unstructured.NestedBool(w.Object, "spec", "active")
		return a
	}
	if w := get("ta", "a-new"); active(w) || w.GetLabels()[LabelEvicted] != "true" {
		t.Fatalf("a-new not deactivated: %v", w.Object)
	}
	for _, n := range [][2]string{{"ta", "a-old"}, {"tb", "b-1"}} {
		if !active(get(n[0], n[1])) {
			t.Errorf("%s deactivated too", n[1])
		}
	}
	// Not yet evicted by Kueue: stays inactive.
	if err := fx.f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if active(get("ta", "a-new")) {
		t.Fatal("reactivated before Kueue evicted it")
	}
	// Kueue evicts it: quota reservation released.
	w := get("ta", "a-new")
	_ = unstructured.SetNestedSlice(w.Object, []any{map[string]any{"type": "QuotaReserved", "status": "False", "lastTransitionTime": t0.Format(time.RFC3339)}}, "status", "conditions")
	if _, err := wls.Namespace("ta").Update(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := fx.f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if w := get("ta", "a-new"); !active(w) || w.GetLabels()[LabelEvicted] != "" {
		t.Fatalf("a-new not reactivated: %v", w.Object)
	}
	if got := testutil.ToFloat64(fx.f.m.requeues); got != 1 {
		t.Errorf("requeues %v, want 1", got)
	}
	if got := testutil.ToFloat64(fx.f.m.evictions.WithLabelValues("a")); got != 1 {
		t.Errorf("evictions %v, want 1", got)
	}
}

// TestStepToleratesSmallExcess: the published total dips by less than the
// eviction tolerance under what a full cohort has admitted; the quotas fall, but
// nothing is deactivated.
func TestStepToleratesSmallExcess(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// 3900 published, 2 × 2000 reserved: 100 over, within 5 % of 3900.
	fx := newFixture(t, []runtime.Object{node("n1", 3900, false)},
		clusterQueue("a", "1", 2000, 2000), clusterQueue("b", "1", 2000, 2000),
		workload("ta", "a-1", "a", 2000, 0, t0, true),
		workload("tb", "b-1", "b", 2000, 0, t0, true),
	)
	fx.f.cfg.Params.EvictTolerance = quota.DefaultParams().EvictTolerance
	ctx := context.Background()
	if err := fx.f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if a, _ := fx.quota(t, "a"); a != 1950 {
		t.Errorf("quota a = %d, want 1950 (falls at once)", a)
	}
	for _, n := range [][2]string{{"ta", "a-1"}, {"tb", "b-1"}} {
		w, err := fx.dyn.Resource(workloadsGVR).Namespace(n[0]).Get(ctx, n[1], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a, _, _ := unstructured.NestedBool(w.Object, "spec", "active"); !a {
			t.Errorf("%s deactivated within the tolerance", n[1])
		}
	}
	if got := testutil.ToFloat64(fx.f.m.evictions.WithLabelValues("a")) + testutil.ToFloat64(fx.f.m.evictions.WithLabelValues("b")); got != 0 {
		t.Errorf("evictions %v, want 0", got)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	bad := []func(*Config){
		func(c *Config) { c.Resources = nil },
		func(c *Config) { c.Resources = []string{" "} },
		func(c *Config) { c.Flavor = "" },
		func(c *Config) { c.Interval = 0 },
		func(c *Config) { c.Params.RiseFraction = 0 },
		func(c *Config) { c.Params.EvictTolerance = 1 },
		func(c *Config) { c.EvictAfter = -time.Second },
		func(c *Config) { c.MetricsMaxAge = 0 },
		func(c *Config) { c.MetricsMaxSkew = -time.Second },
	}
	for i, mut := range bad {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("case %d: err = %v, want ErrConfig", i, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseWeight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{{"", 1, true}, {"2.5", 2.5, true}, {"0", 0, true}, {"-1", 0, false}, {"NaN", 0, false}, {"Inf", 0, false}, {"x", 0, false}} {
		got, err := parseWeight(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseWeight(%q) = %v, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrWeight) {
			t.Errorf("parseWeight(%q): %v does not wrap ErrWeight", tc.in, err)
		}
	}
}

// FuzzParseWeight: the weight annotation is user input; any string gives a weight
// in [0, 1e9] or an error wrapping ErrWeight.
func FuzzParseWeight(f *testing.F) {
	for _, s := range []string{"", "1", "0.5", "-1", "NaN", "Inf", "1e10", " 2 ", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := parseWeight(s)
		if err != nil {
			if !errors.Is(err, ErrWeight) {
				t.Fatalf("parseWeight(%q): %v does not wrap ErrWeight", s, err)
			}
			return
		}
		if !(w >= 0 && w <= 1e9) {
			t.Fatalf("parseWeight(%q) = %v, outside [0, 1e9]", s, w)
		}
	})
}

func TestReservations(t *testing.T) {
	t.Parallel()
	obj := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"flavorsReservation": []any{
		map[string]any{"name": DefaultFlavor, "resources": []any{
			map[string]any{"name": contract.ResourceBatchCPU, "total": "12500"},
			map[string]any{"name": contract.ResourceBatchMemory, "total": "8Gi"},
			map[string]any{"name": contract.ResourceGPU, "total": "lots"},
			map[string]any{"name": "not-followed", "total": "3"},
		}},
		map[string]any{"name": "other", "resources": []any{map[string]any{"name": contract.ResourceBatchCPU, "total": "1k"}}},
	}}}}
	got := Reservations(obj, DefaultFlavor, []string{contract.ResourceBatchCPU, contract.ResourceBatchMemory, contract.ResourceGPU})
	want := map[string]int64{contract.ResourceBatchCPU: 12500, contract.ResourceBatchMemory: 8 << 30}
	if !maps.Equal(got, want) {
		t.Errorf("Reservations = %v, want %v (other flavors, bad totals and unlisted resources left out)", got, want)
	}
	if got := Reservations(&unstructured.Unstructured{Object: map[string]any{}}, DefaultFlavor, []string{contract.ResourceBatchCPU}); len(got) != 0 {
		t.Errorf("no status: %v", got)
	}
}
