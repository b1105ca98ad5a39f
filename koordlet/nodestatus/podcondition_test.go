package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/qos"
)

// clientGoPods patches pods/status through client-go's typed client (the fake clientset).
type clientGoPods struct{ c corev1client.PodsGetter }

func (p clientGoPods) PatchPodStatus(ctx context.Context, ns, name string, pt types.PatchType, data []byte) error {
	_, err := p.c.Pods(ns).Patch(ctx, name, pt, data, metav1.PatchOptions{}, "status")
	return err
}

// The writer patches one condition into pods/status by strategic merge, with the pod's
// UID; a pod that is gone is dropped, a failing API server retried.
var _ PodStatusPatcher = clientGoPods{}

func TestPodConditionWriter(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "p", UID: "uid-p"},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	client := fake.NewClientset(pod)
	var mu sync.Mutex
	var patches []k8stesting.PatchAction
	fail := 1
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		p := a.(k8stesting.PatchAction)
		if p.GetName() == "gone" {
			return true, nil, apierrors.NewNotFound(corev1.Resource("pods"), "gone")
		}
		if fail > 0 {
			fail--
			return true, nil, errors.New("API server down")
		}
		patches = append(patches, p)
		return false, nil, nil
	})
	w := NewPodConditionWriter(clientGoPods{client.CoreV1()}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	since := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	w.Set(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "gone", UID: "uid-gone"}},
		corev1.PodCondition{Type: qos.ConditionBatchSlowed, Status: corev1.ConditionTrue, Reason: "Frozen"})
	w.Set(pod, corev1.PodCondition{Type: qos.ConditionBatchSlowed, Status: corev1.ConditionTrue,
		Reason: string(qos.BatchThrottled), Message: "80%", LastTransitionTime: metav1.NewTime(since)})
	testenv.WaitFor(t, 10*time.Second, "the condition written after one failure", func() bool { return w.Writes() == 1 })
	if w.Failures() != 1 {
		t.Errorf("failures = %d, want 1", w.Failures())
	}
	mu.Lock()
	p := patches[0]
	mu.Unlock()
	if p.GetSubresource() != "status" || p.GetPatchType() != types.StrategicMergePatchType {
		t.Errorf("patch of %q as %s, want a strategic merge of status", p.GetSubresource(), p.GetPatchType())
	}
	var body map[string]any
	if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	if uid := body["metadata"].(map[string]any)["uid"]; uid != "uid-p" {
		t.Errorf("patch uid %v, want uid-p", uid)
	}
	got, err := client.CoreV1().Pods("jobs").Get(t.Context(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cond *corev1.PodCondition
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == qos.ConditionBatchSlowed {
			cond = &got.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Reason != "Throttled" || cond.Message != "80%" || !cond.LastTransitionTime.Time.Equal(since) ||
		len(got.Status.Conditions) != 2 {
		t.Fatalf("conditions %+v: want Ready kept and BatchSlowed Throttled", got.Status.Conditions)
	}
}
