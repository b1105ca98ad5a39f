package extender

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func batchCPU(millicores int64) podtest.Opt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits[contract.ResourceBatchCPU] = *resource.NewQuantity(millicores, resource.DecimalSI)
	}
}

// podSighting is what one watch event showed of a pod.
type podSighting struct {
	node, devices string
	hasDevices    bool
}

// TestBoundPodNeverSeenWithoutDevices watches the pods while single pods and a
// gang are bound and checks, event by event, that a GPU pod is never seen bound
// without its devices annotation nor annotated before it is bound: both land in
// the one write of its Binding. A pod without GPU gets no annotation.
func TestBoundPodNeverSeenWithoutDevices(t *testing.T) {
	t.Parallel()
	type bindCase struct {
		pods    []*corev1.Pod // bound together (a gang) when more than one
		numGPUs []int         // devices each pod must get (0: no annotation)
	}
	cases := []bindCase{
		{[]*corev1.Pod{podtest.Pod("ns", "whole", podtest.GPUs(2))}, []int{2}},
		{[]*corev1.Pod{podtest.Pod("ns", "share", podtest.Milli(300))}, []int{1}},
		{[]*corev1.Pod{podtest.Pod("ns", "batch", batchCPU(500))}, []int{0}},
		{[]*corev1.Pod{gangPod("g0", "g", 3, 1, 0), gangPod("g1", "g", 3, 1, 1), gangPod("g2", "g", 3, 2, 2)}, []int{1, 1, 2}},
	}
	var objs []runtime.Object
	want := map[string]int{}
	for _, c := range cases {
		for i, p := range c.pods {
			objs = append(objs, p)
			want[p.Name] = c.numGPUs[i]
		}
	}
	fc := newFakeCluster(t, objs...)
	s := fedServer(t, newFakeClock(), Deps{Client: fc})
	for _, name := range []string{"n0", "n1"} {
		n := testNode(name, "A100", 4, 64, 256)
		n.Status.Allocatable[contract.ResourceBatchCPU] = *resource.NewQuantity(8000, resource.DecimalSI)
		s.state.UpsertNode(n)
	}
	for _, o := range objs {
		s.state.UpsertPod(o.(*corev1.Pod))
	}
	url := startHTTP(t, s)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := fc.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string][]podSighting{}
	boundSeen := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			v, has := p.Annotations[contract.AnnotationGPUDevices]
			mu.Lock()
			if p.Spec.NodeName != "" && (len(seen[p.Name]) == 0 || seen[p.Name][len(seen[p.Name])-1].node == "") {
				boundSeen++
			}
			seen[p.Name] = append(seen[p.Name], podSighting{p.Spec.NodeName, v, has})
			mu.Unlock()
		}
	}()

	for _, c := range cases {
		nodes := make([]string, len(c.pods))
		for i, p := range c.pods {
			nodes[i] = passedOne(t, filter(t, url, p, "n0", "n1"))
		}
		var wg sync.WaitGroup
		for i, p := range c.pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if e := bind(t, url, p, nodes[i]); e != "" {
					t.Errorf("bind %s: %s", p.Name, e)
				}
			}()
		}
		wg.Wait()
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return boundSeen == len(want)
	})
	w.Stop()
	<-done

	for name, n := range want {
		var bound *podSighting
		for i, sg := range seen[name] {
			switch {
			case sg.node == "" && sg.hasDevices:
				t.Errorf("pod %s: event %d shows devices %q before the pod is bound", name, i, sg.devices)
			case sg.node != "" && bound == nil:
				bound = &seen[name][i]
			}
		}
		if bound == nil {
			t.Errorf("pod %s: no event shows it bound (events %+v)", name, seen[name])
			continue
		}
		if n == 0 {
			if bound.hasDevices {
				t.Errorf("pod %s without GPU bound with devices %q", name, bound.devices)
			}
			continue
		}
		if !bound.hasDevices {
			t.Errorf("pod %s: first event showing it bound to %s has no %s", name, bound.node, contract.AnnotationGPUDevices)
			continue
		}
		if d, err := contract.ParseGPUDevices(bound.devices); err != nil || len(d) != n {
			t.Errorf("pod %s bound with devices %q (%v), want %d devices", name, bound.devices, err, n)
		}
	}
	// One API write per pod: its Binding. Gang nudges are the only patches.
	binds := 0
	for _, a := range fc.actions() {
		switch {
		case strings.HasPrefix(a, "bind "):
			binds++
		case strings.Contains(a, contract.AnnotationGPUDevices):
			t.Errorf("devices written apart from the Binding: %q", a)
		}
	}
	if binds != len(want) {
		t.Errorf("%d bindings for %d pods: %q", binds, len(want), fc.actions())
	}
}

// TestLostBindingAnswerIsConfirmed: a Binding the API server applied but whose
// answer was lost is read back before anything is released. Before, the pod's
// devices were freed and a second pod booked the same GPU.
func TestLostBindingAnswerIsConfirmed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		failGet   bool
		wantErr   bool
		wantPhase string
	}{
		{"read back: bound", false, false, "assumed@n1"},
		{"cannot read back: held until the informer or the TTL", true, true, "reserved@n1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := podtest.Pod("ns", "a", podtest.GPUs(1)), podtest.Pod("ns", "b", podtest.GPUs(1))
			fc := newFakeCluster(t, a, b)
			fc.lostAnswer["a"] = true
			clock := newFakeClock()
			s := fedServer(t, clock, Deps{Client: fc})
			s.state.UpsertNode(testNode("n1", "A100", 1, 8, 32))
			url := startHTTP(t, s)
			if got := passedOne(t, filter(t, url, a, "n1")); got != "n1" {
				t.Fatalf("filter passed %s", got)
			}
			fc.mu.Lock()
			fc.failGet = tc.failGet
			fc.mu.Unlock()
			if msg := bind(t, url, a, "n1"); (msg != "") != tc.wantErr {
				t.Fatalf("bind error %q, want error %v", msg, tc.wantErr)
			}
			if got := phaseOf(s, a.UID); got != tc.wantPhase {
				t.Fatalf("pod a is %s, want %s", got, tc.wantPhase)
			}
			if free := gpuFree(s, "n1"); free[0] != 0 {
				t.Fatalf("the GPU of a bound pod was freed: %v", free)
			}
			if res := filter(t, url, b, "n1"); res.NodeNames != nil && len(*res.NodeNames) > 0 {
				t.Fatalf("a second pod got the held GPU: %v", *res.NodeNames)
			}
			fc.mu.Lock()
			fc.failGet = false
			fc.mu.Unlock()
			if fc.pod(t, "ns", "a").Spec.NodeName != "n1" {
				t.Fatal("the fake did not apply the binding")
			}
			if !tc.failGet {
				return
			}
			// kube-scheduler retries a pod whose bind failed: its filter
			// keeps the unconfirmed hold (passing only its node), and the
			// next bind learns from the read back that the pod is bound.
			s.state.UpsertNode(testNode("n2", "A100", 1, 8, 32))
			if got := passedOne(t, filter(t, url, a, "n2", "n1")); got != "n1" {
				t.Fatalf("re-filter of the unconfirmed pod passed %s, want n1 where it is bound", got)
			}
			if res := filter(t, url, b, "n1"); res.NodeNames != nil && len(*res.NodeNames) > 0 {
				t.Fatalf("after a's re-filter a second pod got its GPU: %v", *res.NodeNames)
			}
			if msg := bind(t, url, a, "n1"); msg != "" {
				t.Fatalf("second bind of the bound pod: %q", msg)
			}
			if got := phaseOf(s, a.UID); got != "assumed@n1" {
				t.Fatalf("after the second bind pod a is %s, want assumed@n1", got)
			}
		})
	}
}
