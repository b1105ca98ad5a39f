package admission

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

const (
	kcpu = contract.ResourceKoordinatorBatchCPU
	kmem = contract.ResourceKoordinatorBatchMemory
)

// A pod written for Koordinator asks for kubernetes.io/batch-cpu and -memory: the
// webhook renames them, keeping the values, whatever the pod's class (Koordinator's BE
// label, Understory's annotation, or none), and in init containers too.
func TestMutateRenamesKoordinatorResources(t *testing.T) {
	t.Parallel()
	koordBE := func(p *corev1.Pod) *corev1.Pod {
		p.Labels[qos.LabelKoordinatorQOS] = "BE"
		return p
	}
	tests := []struct {
		name     string
		pod      *corev1.Pod
		wantCtrs []corev1.ResourceRequirements
		wantInit []corev1.ResourceRequirements
		class    qos.Class
	}{
		{"Koordinator BE pod",
			koordBE(pod(nil, nil, ctr("main", rl(kcpu, "1500", kmem, "2Gi"), rl(kcpu, "1500", kmem, "2Gi")))),
			[]corev1.ResourceRequirements{{Requests: rl(bcpu, "1500", bmem, "2Gi"), Limits: rl(bcpu, "1500", bmem, "2Gi")}},
			nil, qos.ClassBatch},
		{"limits only, no class key",
			pod(nil, nil, ctr("main", nil, rl(kcpu, "500"))),
			[]corev1.ResourceRequirements{{Limits: rl(bcpu, "500")}}, nil, qos.ClassBatch},
		{"init container and Understory's annotation",
			pod(batchAnn, []corev1.Container{ctr("init", rl(kmem, "1Gi"), rl(kmem, "1Gi"))},
				ctr("main", rl(bcpu, "200"), rl(bcpu, "200"))),
			[]corev1.ResourceRequirements{{Requests: rl(bcpu, "200"), Limits: rl(bcpu, "200")}},
			[]corev1.ResourceRequirements{{Requests: rl(bmem, "1Gi"), Limits: rl(bmem, "1Gi")}}, qos.ClassBatch},
		{"other resources untouched",
			koordBE(pod(nil, nil, ctr("main", rl(kcpu, "100", "nvidia.com/gpu", "1"), rl(kcpu, "100", "nvidia.com/gpu", "1")))),
			[]corev1.ResourceRequirements{{Requests: rl(bcpu, "100", "nvidia.com/gpu", "1"),
				Limits: rl(bcpu, "100", "nvidia.com/gpu", "1")}}, nil, qos.ClassBatch},
	}
	m, _ := NewMutator(Profiles{}, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := m.Mutate(context.Background(), "ns", tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Warnings) == 0 || !strings.Contains(res.Warnings[0], "renamed") {
				t.Fatalf("warnings %q: want one saying what was renamed", res.Warnings)
			}
			got := applyPatch(t, tc.pod, res.Patch)
			for i, want := range tc.wantCtrs {
				checkResources(t, "container", got.Spec.Containers[i].Resources, want)
			}
			for i, want := range tc.wantInit {
				checkResources(t, "init container", got.Spec.InitContainers[i].Resources, want)
			}
			if c, _ := qos.Classify(got); c != tc.class {
				t.Fatalf("class after the webhook %s, want %s", c, tc.class)
			}
			// Run again on the result (reinvocation): nothing left to change.
			again, err := m.Mutate(context.Background(), "ns", got)
			if err != nil {
				t.Fatal(err)
			}
			if out := applyPatch(t, got, again.Patch); !equalResources(out, got) {
				t.Fatalf("reinvocation changed the pod's resources: %v", again.Patch)
			}
		})
	}
}

func checkResources(t *testing.T, what string, got, want corev1.ResourceRequirements) {
	t.Helper()
	for _, l := range []struct {
		name      string
		got, want corev1.ResourceList
	}{{"requests", got.Requests, want.Requests}, {"limits", got.Limits, want.Limits}} {
		if len(l.got) != len(l.want) {
			t.Fatalf("%s %s = %v, want %v", what, l.name, l.got, l.want)
		}
		for k, w := range l.want {
			if g, ok := l.got[k]; !ok || !quantityEq(g, w) {
				t.Fatalf("%s %s[%s] = %v, want %v (all: %v)", what, l.name, k, g.String(), w.String(), l.got)
			}
		}
	}
}

func equalResources(a, b *corev1.Pod) bool {
	for i := range a.Spec.Containers {
		ra, rb := a.Spec.Containers[i].Resources, b.Spec.Containers[i].Resources
		if len(ra.Requests) != len(rb.Requests) || len(ra.Limits) != len(rb.Limits) {
			return false
		}
	}
	return true
}

// Both names of one resource in one container: which one was meant is a guess.
func TestMutateRefusesBothBatchNames(t *testing.T) {
	t.Parallel()
	m, _ := NewMutator(Profiles{}, nil)
	p := pod(nil, nil, ctr("main", rl(kcpu, "100", bcpu, "200"), nil))
	_, err := m.Mutate(context.Background(), "ns", p)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), `spec.containers[0] ("main").resources.requests`) {
		t.Fatalf("err = %v, want ErrRejected naming the container", err)
	}
}

// A batch pod whose cpu cannot move (request above limit) keeps its cpu, but its
// Koordinator names are still renamed.
func TestMutateRenamesWhenCPUStays(t *testing.T) {
	t.Parallel()
	m, _ := NewMutator(Profiles{}, nil)
	p := pod(batchAnn, nil, ctr("main", rl("cpu", "2", kmem, "1Gi"), rl("cpu", "1", kmem, "1Gi")))
	res, err := m.Mutate(context.Background(), "ns", p)
	if err != nil {
		t.Fatal(err)
	}
	got := applyPatch(t, p, res.Patch)
	checkResources(t, "container", got.Spec.Containers[0].Resources,
		corev1.ResourceRequirements{Requests: rl("cpu", "2", bmem, "1Gi"), Limits: rl("cpu", "1", bmem, "1Gi")})
}
