package koordlet

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// fakeConditions records what the control loop hands the writer.
type fakeConditions struct {
	mu     sync.Mutex
	set    []string // "pod: reason: message"
	forgot []types.UID
}

func (f *fakeConditions) Set(pod *corev1.Pod, c corev1.PodCondition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = append(f.set, pod.Name+": "+c.Reason+": "+c.Message)
}

func (f *fakeConditions) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, uid)
}

var _ podConditionSink = (*fakeConditions)(nil)

// clientGoPods patches pods/status through client-go's typed client (the fake clientset).
type clientGoPods struct{ c corev1client.PodsGetter }

func (p clientGoPods) PatchPodStatus(ctx context.Context, ns, name string, pt types.PatchType, data []byte) error {
	_, err := p.c.Pods(ns).Patch(ctx, name, pt, data, metav1.PatchOptions{}, "status")
	return err
}

var _ PodStatusPatcher = clientGoPods{}

// Every statistics interval sets each batch pod's condition: Frozen before Throttled,
// Throttled for a group throttled hard, Running once free again (after the settle time);
// nothing for a pod that always ran free, nor for LS or terminating pods; a gone pod is
// forgotten.
func TestBatchConditions(t *testing.T) {
	t.Parallel()
	f := &fakeConditions{}
	e := newBatchEvents(&fakeEvents{}).withConditions(f)
	inPlace := batchPodState("inplace", false, 0.4)
	tier1, tier2 := batchPodState("tier1", true, 0), batchPodState("tier2", true, 0)
	free := batchPodState("free", false, 1)
	ls := batchPodState("ls", false, 0)
	ls.class = qos.ClassLS
	pods := []*podState{inPlace, tier1, tier2, free, ls}
	t0 := time.Unix(1000, 0)
	step := func(now time.Time, ts []throttling, tierFrozen bool) []string {
		f.mu.Lock()
		f.set = nil
		f.mu.Unlock()
		e.conditions(pods, ts, tierFrozen, 0.9, 1.2, 10*time.Second, now)
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.set
	}
	hard := []throttling{{st: inPlace, periods: 10, throttled: 8}, {st: free, periods: 10, throttled: 1},
		{periods: 10, throttled: 1}}
	got := step(t0, hard, false)
	if len(got) != 1 || !strings.HasPrefix(got[0], "inplace: Throttled: throttled by the node agent in 80%") {
		t.Fatalf("first interval: %q, want only inplace Throttled", got)
	}
	if got := step(t0.Add(10*time.Second), hard, false); len(got) != 0 {
		t.Fatalf("same state again: %q, want no write", got)
	}
	e.frozen(pods, qos.EscalationDecision{Froze: true, StarvedFor: metav1.Duration{Duration: 5 * time.Second}},
		qos.Budget{NodeCPUs: 2, LSUsage: 1.8, Min: 0.1}, t0.Add(15*time.Second))
	got = step(t0.Add(20*time.Second), nil, true)
	if len(got) != 2 || !strings.HasPrefix(got[0], "tier1: Frozen: frozen by the node agent: LS (1.80 cores)") ||
		!strings.HasPrefix(got[1], "tier2: Frozen") {
		t.Fatalf("tier frozen: %q, want tier1 and tier2 Frozen", got)
	}
	calm := []throttling{{st: inPlace, periods: 10, throttled: 0}, {periods: 10, throttled: 0}}
	if got := step(t0.Add(30*time.Second), calm, false); len(got) != 0 {
		t.Fatalf("free again within the settle time: %q, want nothing yet", got)
	}
	got = step(t0.Add(20*time.Second+qos.BatchConditionSettle), calm, false)
	if len(got) != 3 || !strings.Contains(strings.Join(got, "\n"), "inplace: Running: runs free") {
		t.Fatalf("after the settle time: %q, want the three held pods Running", got)
	}
	pods = []*podState{tier1, ls}
	step(t0.Add(time.Hour), nil, false)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.forgot) != 2 {
		t.Fatalf("forgot %q, want inplace and tier2", f.forgot)
	}
}

// The writer patches one condition into pods/status by strategic merge, with the pod's
// UID; a pod that is gone is dropped, a failing API server retried.
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

// A restarted agent takes the condition a pod carries from the earlier run: a stale True
// goes back to Running at once, a pod already Running is not written again.
func TestBatchConditionsSeeded(t *testing.T) {
	t.Parallel()
	f := &fakeConditions{}
	e := newBatchEvents(&fakeEvents{}).withConditions(f)
	t0 := time.Unix(1000, 0)
	carrying := func(name string, reason qos.BatchSlowReason, msg string) (*corev1.Pod, *podState) {
		st := batchPodState(name, false, 0.4)
		w := qos.WrittenBatchCondition{BatchCondition: qos.BatchCondition{Reason: reason, Message: msg}, At: t0, Since: t0}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: st.uid, Namespace: st.namespace, Name: st.name},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{w.PodCondition()}}}
		return pod, st
	}
	stalePod, stale := carrying("stale", qos.BatchFrozen, "frozen")
	freePod, free := carrying("free", qos.BatchRunning, runningMessage())
	e.seenPod(stalePod)
	e.seenPod(freePod)
	e.seenPod(&corev1.Pod{}) // no UID: ignored
	calm := []throttling{{st: stale, periods: 10}, {st: free, periods: 10}}
	e.conditions([]*podState{stale, free}, calm, false, 0, 1, 10*time.Second, t0.Add(time.Second))
	if len(f.set) != 1 || !strings.HasPrefix(f.set[0], "stale: Running") {
		t.Fatalf("after a restart: %q, want only the stale pod set Running", f.set)
	}
}
