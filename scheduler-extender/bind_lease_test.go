package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/internal/testenv"
)

// slowBindings is an API server that answers only pods/binding, each after
// delay unless the client goes away first; it counts the Bindings started and
// in flight, and when each started.
type slowBindings struct {
	delay    time.Duration
	inFlight atomic.Int64
	mu       sync.Mutex
	starts   []time.Time
}

func (s *slowBindings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/binding") {
		http.NotFound(w, r)
		return
	}
	// Read the body first: the server notices a client that goes away (and
	// ends r's context) only once the request body has been consumed.
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.mu.Unlock()
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-r.Context().Done(): // the client cancelled it
		return
	case <-t.C:
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Success"}`)
}

func (s *slowBindings) started() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.starts...)
}

// bindsElsewhere is a fake clientset whose Bindings go to another clientset
// (a real one, on an API server of the test's own).
type bindsElsewhere struct {
	*fake.Clientset
	binds kubernetes.Interface
}

func (c bindsElsewhere) CoreV1() corev1client.CoreV1Interface {
	return bindsElsewhereCore{CoreV1Interface: c.Clientset.CoreV1(), binds: c.binds.CoreV1()}
}

type bindsElsewhereCore struct {
	corev1client.CoreV1Interface
	binds corev1client.CoreV1Interface
}

func (c bindsElsewhereCore) Pods(namespace string) corev1client.PodInterface {
	return bindsElsewherePods{PodInterface: c.CoreV1Interface.Pods(namespace), binds: c.binds.Pods(namespace)}
}

type bindsElsewherePods struct {
	corev1client.PodInterface
	binds corev1client.PodInterface
}

func (p bindsElsewherePods) Bind(ctx context.Context, b *corev1.Binding, opts metav1.CreateOptions) error {
	return p.binds.Bind(ctx, b, opts)
}

// postBind calls /bind over HTTP (from any goroutine) and returns the bind's error.
func postBind(url string, pod *corev1.Pod, node string) error {
	body, err := json.Marshal(bindArgs(pod, node))
	if err != nil {
		return err
	}
	resp, err := http.Post(url+"/bind", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var res extenderv1.ExtenderBindingResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return fmt.Errorf("bind answered %d: %w", resp.StatusCode, err)
	}
	if res.Error != "" {
		return fmt.Errorf("%s", res.Error)
	}
	return nil
}

// TestBindingsStopWithLease: the leader commits a 12-member gang against an
// API server that takes 2 s per Binding (8 run at once), and loses its lease
// mid-commit (its renewals refused). 500 ms after the loss no Binding of it is
// in flight, and none started after the loss: a standby may lead soon after,
// and a Binding the old leader sends then can book devices the new leader
// gives to another pod. Before, the Bindings ran on under a context detached
// from everything for up to the API timeout, and the queued ones started after
// the loss.
func TestBindingsStopWithLease(t *testing.T) {
	t.Parallel()
	const members = 12
	api := &slowBindings{delay: 2 * time.Second}
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)
	slowClient, err := kubernetes.NewForConfig(&rest.Config{Host: apiSrv.URL, QPS: 1000, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	objs := []runtime.Object{testNode("n1", "A100", 4, 64, 256), testNode("n2", "A100", 4, 64, 256),
		testNode("n3", "A100", 4, 64, 256)}
	pods := make([]*corev1.Pod, members)
	for i := range pods {
		pods[i] = gangPod(fmt.Sprintf("m%02d", i), "g", members, 1, i)
		objs = append(objs, pods[i])
	}
	fc := fake.NewClientset(objs...)
	var cut atomic.Bool
	fc.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if cut.Load() {
			return true, nil, errPartition
		}
		return false, nil, nil
	})
	a := startReplica(t, bindsElsewhere{Clientset: fc, binds: slowClient}, "pod-a")
	testenv.WaitFor(t, 10*time.Second, "pod-a leading", a.srv.Ready)
	testenv.WaitFor(t, 10*time.Second, "every member in the index", func() bool {
		for _, p := range pods {
			if phaseOf(a.srv, p.UID) == "unknown" {
				return false
			}
		}
		return true
	})
	var lostAt atomic.Pointer[time.Time]
	context.AfterFunc(a.srv.lead.lease, func() { now := time.Now(); lostAt.Store(&now) })

	passedOne(t, filter(t, a.http.URL, pods[0], "n1", "n2", "n3")) // plans the whole gang
	errs := make(chan error, members)
	for _, p := range pods {
		node, ok := strings.CutPrefix(phaseOf(a.srv, p.UID), "planned@")
		if !ok {
			t.Fatalf("member %s is %s, want planned", p.Name, phaseOf(a.srv, p.UID))
		}
		go func() { errs <- postBind(a.http.URL, p, node) }()
	}
	testenv.WaitFor(t, 10*time.Second, "the commit's first Bindings in flight", func() bool {
		return api.inFlight.Load() == maxParallelAPI
	})
	cut.Store(true) // the API stops taking pod-a's renewals: the lease is lost within RenewDeadline
	testenv.WaitFor(t, 10*time.Second, "pod-a losing its lease", func() bool { return lostAt.Load() != nil })
	lost := *lostAt.Load()
	if !testenv.Poll(time.Until(lost.Add(500*time.Millisecond)), func() bool { return api.inFlight.Load() == 0 }) {
		t.Errorf("%d Bindings still in flight 500 ms after the lease was lost", api.inFlight.Load())
	}
	for range pods {
		if err := <-errs; err == nil {
			t.Log("a member was bound") // possible only before the loss
		}
	}
	after := 0
	for _, s := range api.started() {
		if s.After(lost) {
			after++
		}
	}
	if after > 0 {
		t.Errorf("%d of %d Bindings started after the lease was lost", after, len(api.started()))
	}
	if n := len(api.started()); n != maxParallelAPI {
		t.Errorf("%d Bindings started, want the first %d only", n, maxParallelAPI)
	}
}
