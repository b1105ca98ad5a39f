package kueuequota

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/kueuequota/quota"
)

// electedReplica is one follower replica of a leader election test: its own
// Kueue objects (a fake dynamic client, whose actions count its passes) on a
// shared Kubernetes API (Nodes, the Lease).
type electedReplica struct {
	f    *Follower
	dyn  *dynfake.FakeDynamicClient
	done chan error
	stop context.CancelFunc
}

func newReplica(t *testing.T, client kubernetes.Interface) *electedReplica {
	t.Helper()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		clusterQueuesGVR: "ClusterQueueList", workloadsGVR: "WorkloadList",
	}, clusterQueue("a", "1", 0, 0))
	cfg := DefaultConfig()
	cfg.Resources = []string{contract.ResourceBatchCPU}
	cfg.Params = quota.Params{RiseFraction: 1}
	cfg.Interval = 20 * time.Millisecond
	f, err := New(client, dyn, cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &electedReplica{f: f, dyn: dyn}
}

// start runs the replica's RunElected as identity until stopped (or the test ends).
func (r *electedReplica) start(t *testing.T, identity string) {
	t.Helper()
	lc := testLeaderConfig(identity)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.f.RunElected(ctx, lc) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
}

// wait returns what RunElected returned, failing t when it does not return in time.
func (r *electedReplica) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("RunElected did not return within %v", timeout)
		return nil
	}
}

// passes counts the replica's passes: each lists the ClusterQueues once.
func (r *electedReplica) passes() int {
	n := 0
	for _, a := range r.dyn.Actions() {
		if a.GetVerb() == "list" && a.GetResource() == clusterQueuesGVR {
			n++
		}
	}
	return n
}

func (r *electedReplica) leading() bool { return testutil.ToFloat64(r.f.m.leader) == 1 }

// testLeaderConfig: short durations, so that a test takes seconds; a standby
// takes a Lease not renewed for 3 s, a leader gives up after 2 s of failed
// renewals (20 tries: a loaded machine does not lose it by chance).
func testLeaderConfig(identity string) LeaderConfig {
	lc := DefaultLeaderConfig("understory-system", identity)
	lc.LeaseDuration, lc.RenewDeadline, lc.RetryPeriod = 3*time.Second, 2*time.Second, 100*time.Millisecond
	return lc
}

func holder(t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	l, err := client.CoordinationV1().Leases("understory-system").Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Two replicas: only the one holding the Lease runs passes; the other, synced,
// runs none for longer than a Lease lasts; when the leader stops, it releases
// the Lease and the other takes over (at its next try, not after the Lease's 3 s).
func TestRunElectedOnlyTheLeaderRunsPasses(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(node("n1", 4000, false))
	a, b := newReplica(t, client), newReplica(t, client)
	a.start(t, "a")
	testenv.WaitFor(t, 10*time.Second, "replica a leading and running passes", func() bool {
		return a.leading() && a.passes() >= 2 && holder(t, client) == "a"
	})
	b.start(t, "b")
	testenv.WaitFor(t, 10*time.Second, "replica b's Node informer synced", b.f.Synced)
	before := a.passes()
	testenv.Hold(t, 4*time.Second, "replica b running no pass while a holds the Lease (longer than the Lease lasts)", func() bool {
		return b.passes() == 0 && !b.leading() && holder(t, client) == "a"
	})
	if a.passes() <= before {
		t.Errorf("the leader ran no pass meanwhile (%d passes)", a.passes())
	}

	stopped := time.Now()
	a.stop()
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatalf("stopped leader: %v, want nil", err)
	}
	if a.leading() {
		t.Error("a stopped replica still reports leading")
	}
	passes := a.passes()
	testenv.WaitFor(t, 10*time.Second, "replica b taking over and running passes", func() bool {
		return b.leading() && b.passes() >= 1 && holder(t, client) == "b"
	})
	if took, lease := time.Since(stopped), testLeaderConfig("").LeaseDuration; took >= lease {
		t.Errorf("b took over %v after a stopped: not before the Lease expired (%v), so a did not release it", took, lease)
	}
	if a.passes() != passes {
		t.Errorf("replica a ran passes after it stopped: %d, then %d", passes, a.passes())
	}
}

// A leader that cannot renew its Lease stops running passes and returns
// ErrLeadershipLost (the command then exits).
func TestRunElectedLostLease(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(node("n1", 4000, false))
	var broken atomic.Bool
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if broken.Load() {
			return true, nil, errors.New("API server unreachable")
		}
		return false, nil, nil
	})
	a := newReplica(t, client)
	a.start(t, "a")
	testenv.WaitFor(t, 10*time.Second, "replica a leading and running passes", func() bool {
		return a.leading() && a.passes() >= 1
	})
	broken.Store(true)
	if err := a.wait(t, 15*time.Second); !errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("RunElected = %v, want ErrLeadershipLost", err)
	}
	if a.leading() {
		t.Error("the replica still reports leading after losing the Lease")
	}
	n := a.passes()
	testenv.Hold(t, 200*time.Millisecond, "no pass after RunElected returned", func() bool { return a.passes() == n })
}

// TestLeaderConfigValidate: the defaults are valid, and RunElected refuses a bad
// config (the rules themselves: internal/election).
func TestLeaderConfigValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultLeaderConfig("understory-system", "pod-1").Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	f := newReplica(t, fake.NewClientset()).f
	lc := DefaultLeaderConfig("understory-system", "")
	if err := f.RunElected(context.Background(), lc); !errors.Is(err, ErrLeaderConfig) {
		t.Errorf("RunElected with no identity = %v, want ErrLeaderConfig", err)
	}
}
