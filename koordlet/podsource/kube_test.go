package podsource

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

const testNode = "node-a"

func kubePod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(ns + "-" + name),
			ResourceVersion: "1",
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "test"}},
		},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// runKube runs k until the test ends and waits for the first sync.
func runKube(t *testing.T, k *Kube) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Error("Run did not return after cancel")
		}
	})
	waitFor(t, k.Changed(), "informer sync", k.HasSynced)
}

// watchStarted makes the fake clientset's pod watch observable. The fake
// tracker ignores resourceVersion, so an object created between the
// informer's LIST and WATCH would be lost; tests wait for the WATCH first.
func watchStarted(client *fake.Clientset) (started <-chan struct{}, fieldSelector func() string) {
	ch := make(chan struct{})
	var once sync.Once
	var sel atomic.Value
	sel.Store("")
	client.PrependWatchReactor("pods", func(a clienttesting.Action) (bool, watch.Interface, error) {
		wa := a.(clienttesting.WatchActionImpl)
		sel.Store(wa.ListOptions.FieldSelector)
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), wa.ListOptions)
		once.Do(func() { close(ch) })
		return true, w, err
	})
	return ch, func() string { return sel.Load().(string) }
}

func TestKubeFollowsNodePods(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(
		kubePod("ns1", "p1", testNode),
		kubePod("ns1", "other", "node-b"),
		kubePod("ns2", "p0", testNode),
		kubePod("ns1", "pending", ""),
	)
	started, watchSelector := watchStarted(client)
	k := NewKube(client.CoreV1().Pods(""), testNode, nil, 0)
	runKube(t, k)
	<-started

	// The selector is sent to the API server (the fake ignores it).
	if got := watchSelector(); got != "spec.nodeName=node-a" {
		t.Errorf("watch field selector = %q", got)
	}
	for _, a := range client.Actions() {
		if l, ok := a.(clienttesting.ListActionImpl); ok && l.ListOptions.FieldSelector != "spec.nodeName=node-a" {
			t.Errorf("list field selector = %q", l.ListOptions.FieldSelector)
		}
	}
	if got, want := podNames(k.List()), []string{"ns1/p1", "ns2/p0"}; !slices.Equal(got, want) {
		t.Fatalf("initial pods = %v, want %v (own nodeName filter)", got, want)
	}
	if mf := k.List()[0].ManagedFields; mf != nil {
		t.Errorf("managedFields kept in cache: %v", mf)
	}

	ctx := t.Context()
	pods := client.CoreV1().Pods("ns1")
	steps := []struct {
		name string
		do   func() error
		want []string
		ok   func([]*corev1.Pod) bool // extra condition on the listed pods
	}{
		{
			name: "add on other node, then on this node",
			do: func() error {
				if _, err := pods.Create(ctx, kubePod("ns1", "elsewhere", "node-b"), metav1.CreateOptions{}); err != nil {
					return err
				}
				_, err := pods.Create(ctx, kubePod("ns1", "p2", testNode), metav1.CreateOptions{})
				return err
			},
			want: []string{"ns1/p1", "ns1/p2", "ns2/p0"},
		},
		{
			name: "update annotation",
			do: func() error {
				p := kubePod("ns1", "p2", testNode)
				p.ResourceVersion = "2"
				p.Annotations = map[string]string{"understory.io/qos": "BE"}
				_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
				return err
			},
			want: []string{"ns1/p1", "ns1/p2", "ns2/p0"},
			ok: func(ps []*corev1.Pod) bool {
				return ps[1].Annotations["understory.io/qos"] == "BE"
			},
		},
		{
			name: "pod finishes: kept, not active",
			do: func() error {
				p := kubePod("ns1", "p1", testNode)
				p.ResourceVersion = "3"
				p.Status.Phase = corev1.PodSucceeded
				_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
				return err
			},
			want: []string{"ns1/p1", "ns1/p2", "ns2/p0"},
			ok: func(ps []*corev1.Pod) bool {
				return !Active(ps[0]) && Active(ps[1])
			},
		},
		{
			name: "delete",
			do: func() error {
				return pods.Delete(ctx, "p1", metav1.DeleteOptions{})
			},
			want: []string{"ns1/p2", "ns2/p0"},
		},
	}
	for _, st := range steps {
		drain(k.Changed())
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		waitFor(t, k.Changed(), st.name, func() bool {
			ps := k.List()
			return slices.Equal(podNames(ps), st.want) && (st.ok == nil || st.ok(ps))
		})
	}
}

func TestKubeKeepsPodsWhileAPIServerDown(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(kubePod("ns", "a", testNode), kubePod("ns", "b", testNode))
	var (
		down        atomic.Bool
		failedLists atomic.Int32
		mu          sync.Mutex
		watchers    []*watch.RaceFreeFakeWatcher
	)
	unreachable := errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
	client.PrependReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			failedLists.Add(1)
			return true, nil, unreachable
		}
		return false, nil, nil // fall through to the tracker
	})
	client.PrependWatchReactor("pods", func(clienttesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, unreachable
		}
		w := watch.NewRaceFreeFake()
		mu.Lock()
		watchers = append(watchers, w)
		mu.Unlock()
		return true, w, nil
	})

	k := NewKube(client.CoreV1().Pods(""), testNode, nil, 0)
	runKube(t, k)
	want := []string{"ns/a", "ns/b"}
	if got := podNames(k.List()); !slices.Equal(got, want) {
		t.Fatalf("pods = %v, want %v", got, want)
	}

	// Cut the connection: the open watch ends and every re-list fails.
	down.Store(true)
	mu.Lock()
	for _, w := range watchers {
		w.Stop()
	}
	mu.Unlock()
	deadline := time.Now().Add(waitTimeout)
	for failedLists.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("informer never tried to re-list")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := podNames(k.List()); !slices.Equal(got, want) {
		t.Fatalf("pods while API server is down = %v, want %v", got, want)
	}
	if !k.HasSynced() {
		t.Error("HasSynced went false during the outage")
	}
	// The failures are counted (the agent exports them as errors_total{kind="pod_source"}).
	for k.ErrorCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("failed lists not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// While down, pod b is deleted; after recovery the re-list drops it.
	if err := client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "ns", "b"); err != nil {
		t.Fatal(err)
	}
	drain(k.Changed())
	down.Store(false)
	waitFor(t, k.Changed(), "re-list after recovery", func() bool {
		return slices.Equal(podNames(k.List()), []string{"ns/a"})
	})
}

func TestKubeRunErrors(t *testing.T) {
	t.Parallel()
	if err := NewKube(fake.NewClientset().CoreV1().Pods(""), "", nil, 0).Run(t.Context()); !errors.Is(err, ErrNoNodeName) {
		t.Errorf("empty node: Run = %v, want ErrNoNodeName", err)
	}
	k := NewKube(fake.NewClientset().CoreV1().Pods(""), testNode, nil, time.Minute)
	runKube(t, k)
	if err := k.Run(t.Context()); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

func TestKubeRunReturnsOnCancelBeforeSync(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("unreachable")
	})
	k := NewKube(client.CoreV1().Pods(""), testNode, nil, 0)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := k.Run(ctx); err != nil {
		t.Errorf("Run = %v, want nil on cancel", err)
	}
	if k.HasSynced() {
		t.Error("synced without a successful list")
	}
	if n := len(k.List()); n != 0 {
		t.Errorf("List = %d pods", n)
	}
}

func TestActive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		phase corev1.PodPhase
		want  bool
	}{
		{corev1.PodPending, true},
		{corev1.PodRunning, true},
		{corev1.PodUnknown, true},
		{"", true},
		{corev1.PodSucceeded, false},
		{corev1.PodFailed, false},
	}
	for _, tc := range tests {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: tc.phase}}
		if got := Active(p); got != tc.want {
			t.Errorf("Active(%q) = %v, want %v", tc.phase, got, tc.want)
		}
	}
	if Active(nil) {
		t.Error("Active(nil) = true")
	}
}
