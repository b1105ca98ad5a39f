package kueuequota

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/testenv"
)

// liveNode is node with its node-metrics stamped at ts.
func liveNode(t *testing.T, name string, cpu int64, ts time.Time) *corev1.Node {
	t.Helper()
	n := node(name, cpu, false)
	restamp(t, n, ts)
	return n
}

// TestFollowerCountsOnlyReadyNodes: only a Ready node whose agent published fresh
// node-metrics counts towards the quotas; a NotReady, Unknown, unreachable or
// not-ready-tainted node, and one whose metrics are stale, future-stamped or missing,
// counts 0, whatever batch allocatable it last carried.
func TestFollowerCountsOnlyReadyNodes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const good, dead = 4000, 100_000
	tests := []struct {
		name   string
		mutate func(n *corev1.Node)
		counts bool
	}{
		{"ready, fresh metrics", func(*corev1.Node) {}, true},
		{"not ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, false},
		{"ready unknown (kubelet silent)", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, false},
		{"no ready condition", func(n *corev1.Node) { n.Status.Conditions = nil }, false},
		{"unreachable taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		}, false},
		{"not-ready taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}
		}, false},
		{"stale metrics", func(n *corev1.Node) { restamp(t, n, now.Add(-DefaultConfig().MetricsMaxAge-time.Second)) }, false},
		{"metrics a year ahead", func(n *corev1.Node) { restamp(t, n, now.AddDate(1, 0, 0)) }, false},
		{"no metrics", func(n *corev1.Node) { n.Annotations = nil }, false},
		{"metrics just within the bound", func(n *corev1.Node) { restamp(t, n, now.Add(-DefaultConfig().MetricsMaxAge+time.Second)) }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			probe := liveNode(t, "probe", dead, now.Add(-10*time.Second))
			tc.mutate(probe)
			fx := newFixture(t, []runtime.Object{liveNode(t, "live", good, now.Add(-10*time.Second)), probe},
				clusterQueue("a", "1", 0, 0))
			fx.f.now = func() time.Time { return now }
			if err := fx.f.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			want := int64(good)
			if tc.counts {
				want += dead
			}
			if a, _ := fx.quota(t, "a"); a != want {
				t.Errorf("quota %d m, want %d m (the probe node counts: %v)", a, want, tc.counts)
			}
		})
	}
}

// restamp rewrites n's node-metrics documents with timestamp ts.
func restamp(t *testing.T, n *corev1.Node, ts time.Time) {
	t.Helper()
	m, err := contract.DecodeNodeAnnotations(n.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	m.Timestamp = ts
	if n.Annotations, err = m.EncodeAnnotations(); err != nil {
		t.Fatal(err)
	}
}

// TestFollowerDampsDeactivations: a cordon of 2 of 4 nodes for one pass halves the
// quotas at once but deactivates nothing; an excess that persists for
// Config.EvictAfter is then worked off one Workload per pass, each pass recounting
// what is still admitted.
func TestFollowerDampsDeactivations(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := t0
	var nodes []runtime.Object
	for i := range 4 {
		nodes = append(nodes, liveNode(t, fmt.Sprintf("n%d", i), 2000, t0))
	}
	// 8000 published, quotas 4000 + 4000, each tenant running 4 one-CPU Workloads.
	objs := []runtime.Object{clusterQueue("a", "1", 4000, 4000), clusterQueue("b", "1", 4000, 4000)}
	for i := range 4 {
		objs = append(objs,
			workload("ta", fmt.Sprintf("a-%d", i), "a", 1000, 0, t0.Add(time.Duration(i)*time.Second), true),
			workload("tb", fmt.Sprintf("b-%d", i), "b", 1000, 0, t0.Add(time.Duration(i)*time.Second), true))
	}
	fx := newFixture(t, nodes, objs...)
	fx.f.now = func() time.Time { return clock }
	fx.f.cfg.EvictAfter = DefaultConfig().EvictAfter
	ctx := context.Background()
	// publish is the nodes' state at clock: n0 and n1 cordoned or not, and every
	// agent alive (its node-metrics restamped), seen by the informer (the first pass
	// restamps the same time, so the cordon is waited for too).
	cordoned := false
	publish := func() {
		t.Helper()
		for i := range 4 {
			name := fmt.Sprintf("n%d", i)
			n, err := fx.f.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Spec.Unschedulable = cordoned && i < 2
			restamp(t, n, clock)
			if _, err := fx.f.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 4 {
			name := fmt.Sprintf("n%d", i)
			testenv.WaitFor(t, 10*time.Second, "the informer to see "+name+" published at "+clock.String(), func() bool {
				n, err := fx.f.nodes.Get(name)
				if err != nil || n.Spec.Unschedulable != (cordoned && i < 2) {
					return false
				}
				m, err := contract.DecodeNodeAnnotations(n.Annotations)
				return err == nil && m.Timestamp.Equal(clock)
			})
		}
	}
	inactive := func() int {
		t.Helper()
		l, err := fx.dyn.Resource(workloadsGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, w := range l.Items {
			if a, _, _ := unstructured.NestedBool(w.Object, "spec", "active"); !a {
				n++
			}
		}
		return n
	}
	pass := func(at time.Duration) {
		t.Helper()
		clock = t0.Add(at)
		publish()
		if err := fx.f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// One pass with half the nodes cordoned: quotas halve, nobody is deactivated.
	cordoned = true
	pass(0)
	if a, _ := fx.quota(t, "a"); a != 2000 {
		t.Fatalf("quota a = %d, want 2000 (a fall is written at once)", a)
	}
	if n := inactive(); n != 0 {
		t.Fatalf("one pass of a cordon deactivated %d Workloads, want 0", n)
	}
	// Uncordoned by the next pass: the excess is gone; nothing is deactivated later.
	cordoned = false
	for i := 1; i <= 10; i++ {
		pass(time.Duration(i) * time.Minute)
	}
	if n := inactive(); n != 0 {
		t.Fatalf("a cordon lifted after one pass deactivated %d Workloads, want 0", n)
	}

	// A cordon that stays: nothing before EvictAfter, then one Workload a pass until
	// the cohort fits (4 over: 4 passes), and no more after.
	base := 20 * time.Minute
	cordoned = true
	pass(base)
	pass(base + DefaultConfig().EvictAfter/2)
	if n := inactive(); n != 0 {
		t.Fatalf("%d Workloads deactivated before the excess lasted EvictAfter, want 0", n)
	}
	for i := 1; i <= 6; i++ {
		pass(base + DefaultConfig().EvictAfter + time.Duration(i)*time.Second)
		if want := min(i, 4); inactive() != want {
			t.Fatalf("after %d passes past EvictAfter: %d deactivated, want %d", i, inactive(), want)
		}
	}
}
