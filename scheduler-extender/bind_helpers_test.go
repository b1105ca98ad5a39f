package extender

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeCluster is a fake clientset that performs bindings like kube-apiserver's
// BindingREST does (in one update of the pod: UID precondition, refusal of an
// assigned pod, spec.nodeName set and the Binding's annotations merged in) and
// logs patches and bindings in order.
type fakeCluster struct {
	*fake.Clientset
	mu       sync.Mutex
	log      []string
	failBind map[string]bool // pod name → binding fails
	// lostAnswer: pod name → the binding is applied but its answer is lost (an error).
	lostAnswer map[string]bool
	failGet    bool // every pod get fails
}

func newFakeCluster(t *testing.T, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{Clientset: fake.NewClientset(objs...), failBind: map[string]bool{}, lostAnswer: map[string]bool{}}
	fc.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		if fc.failGet {
			return true, nil, errors.New("injected get failure")
		}
		return false, nil, nil
	})
	fc.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || ca.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := ca.GetObject().(*corev1.Binding)
		fc.mu.Lock()
		fail, lost := fc.failBind[b.Name], fc.lostAnswer[b.Name]
		entry := fmt.Sprintf("bind %s/%s %s", b.Namespace, b.Name, b.Target.Name)
		for _, k := range slices.Sorted(maps.Keys(b.Annotations)) {
			entry += fmt.Sprintf(" %s=%s", k, b.Annotations[k])
		}
		fc.log = append(fc.log, entry)
		fc.mu.Unlock()
		if fail {
			return true, nil, errors.New("injected binding failure")
		}
		obj, err := fc.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name, metav1.GetOptions{})
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if pod.UID != b.UID {
			return true, nil, errors.New("uid precondition failed")
		}
		if pod.Spec.NodeName != "" {
			return true, nil, fmt.Errorf("pod %s is already assigned to node %q", pod.Name, pod.Spec.NodeName)
		}
		pod.Spec.NodeName = b.Target.Name
		if len(b.Annotations) > 0 && pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		maps.Copy(pod.Annotations, b.Annotations)
		err = fc.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, b.Namespace, metav1.UpdateOptions{})
		if err == nil && lost {
			return true, nil, context.DeadlineExceeded
		}
		return true, b, err
	})
	fc.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		fc.mu.Lock()
		fc.log = append(fc.log, fmt.Sprintf("patch %s/%s %s", pa.GetNamespace(), pa.GetName(), pa.GetPatch()))
		fc.mu.Unlock()
		return false, nil, nil // let the tracker apply it
	})
	return fc
}

func (fc *fakeCluster) actions() []string {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return append([]string(nil), fc.log...)
}

func (fc *fakeCluster) pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := fc.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
