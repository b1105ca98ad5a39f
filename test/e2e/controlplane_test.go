package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/understory/understory/internal/controlplane"
)

// TestControlPlaneSmoke runs the real kube-apiserver and kube-scheduler
// (default profile) on three fake nodes. It is skipped when the binaries
// are missing, unless CI=true (see package controlplane).
func TestControlPlaneSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	t.Parallel()
	// ctx ends with the test (its cleanups), whatever ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)

	began := time.Now()
	cp := controlplane.Start(ctx, t, controlplane.Options{})
	cp.StartScheduler(t, "")
	t.Logf("control plane + scheduler up in %v", time.Since(began).Round(time.Millisecond))

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
	}
	nodes, err := cp.CreateNodes(ctx, "smoke", 3, capacity, map[string]string{"understory.io/e2e": "smoke"})
	if err != nil {
		t.Fatal(err)
	}

	// Subtests share the control plane and run in turn, inside this test's
	// parallel slot: as parallel subtests they waited for a free slot behind the
	// package's other control-plane tests while ctx's 3 minutes ran out (CI, 11-28).
	t.Run("pod is bound to a fake node", func(t *testing.T) {
		const ns = "smoke-bind"
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		pod := controlplane.NewPod(ns, "fits", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")})
		if err := cp.CreatePods(ctx, []*corev1.Pod{pod}); err != nil {
			t.Fatal(err)
		}
		if err := cp.WaitForPodsBound(ctx, ns, metav1.ListOptions{}, 1); err != nil {
			t.Fatal(err)
		}
		got, err := cp.Client().CoreV1().Pods(ns).Get(ctx, "fits", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(nodes, got.Spec.NodeName) {
			t.Errorf("pod bound to %q, want one of %v", got.Spec.NodeName, nodes)
		}
		if c := podCondition(got, corev1.PodScheduled); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("PodScheduled condition = %+v, want True", c)
		}
		if got.Spec.ServiceAccountName != "default" {
			t.Errorf("serviceAccountName = %q, want default (ServiceAccount admission)", got.Spec.ServiceAccountName)
		}
	})

	t.Run("pod larger than any node stays unschedulable", func(t *testing.T) {
		const ns = "smoke-unschedulable"
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		pod := controlplane.NewPod(ns, "too-big", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5")})
		if err := cp.CreatePods(ctx, []*corev1.Pod{pod}); err != nil {
			t.Fatal(err)
		}
		var got *corev1.Pod
		for {
			var err error
			got, err = cp.Client().CoreV1().Pods(ns).Get(ctx, "too-big", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c := podCondition(got, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse {
				if c.Reason != corev1.PodReasonUnschedulable {
					t.Errorf("PodScheduled reason = %q, want %q", c.Reason, corev1.PodReasonUnschedulable)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no PodScheduled=False condition on %s: %v", pod.Name, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
		if got.Spec.NodeName != "" {
			t.Errorf("pod bound to %q, want unbound", got.Spec.NodeName)
		}
	})

	t.Run("PodGroup CRD serves objects and status", func(t *testing.T) {
		gvrs, err := cp.InstallCRD(ctx, controlplane.PodGroupCRD())
		if err != nil {
			t.Fatal(err)
		}
		if len(gvrs) != 1 || gvrs[0] != controlplane.PodGroupGVR() {
			t.Fatalf("InstallCRD = %v, want [%v]", gvrs, controlplane.PodGroupGVR())
		}
		pgs := cp.Dynamic().Resource(controlplane.PodGroupGVR()).Namespace(metav1.NamespaceDefault)
		pg := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.x-k8s.io/v1alpha1",
			"kind":       "PodGroup",
			"metadata":   map[string]any{"name": "gang"},
			"spec":       map[string]any{"minMember": int64(3), "scheduleTimeoutSeconds": int64(10)},
		}}
		created, err := pgs.Create(ctx, pg, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(created.Object, "Scheduling", "status", "phase"); err != nil {
			t.Fatal(err)
		}
		if _, err := pgs.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := pgs.Get(ctx, "gang", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if m, _, _ := unstructured.NestedInt64(got.Object, "spec", "minMember"); m != 3 {
			t.Errorf("spec.minMember = %d, want 3", m)
		}
		if p, _, _ := unstructured.NestedString(got.Object, "status", "phase"); p != "Scheduling" {
			t.Errorf("status.phase = %q, want Scheduling", p)
		}
		// The schema rejects a negative minMember.
		bad := pg.DeepCopy()
		bad.SetName("bad")
		if err := unstructured.SetNestedField(bad.Object, int64(-1), "spec", "minMember"); err != nil {
			t.Fatal(err)
		}
		if _, err := pgs.Create(ctx, bad, metav1.CreateOptions{}); err == nil {
			t.Error("creating a PodGroup with minMember -1 succeeded, want a validation error")
		}
	})
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
