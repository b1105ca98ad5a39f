package extenderbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	extender "github.com/understory/understory/scheduler-extender"
)

// Failover is the failover run (-runs failover): two extender replicas with
// leader election on one fake API server serving Nodes nodes and RSSPods pods
// (the memory run's cluster); the leader dies (its lease writes fail from then
// on, as a killed process's would stop) and the standby, synced all along,
// must take the lease, catch up and serve.
type Failover struct {
	Date  time.Time `json:"date"`
	Nodes int       `json:"nodes"`
	Pods  int       `json:"pods"`
	// Lease settings (the shipped manifest's unless a test changed them).
	LeaseSeconds  float64 `json:"lease_seconds"`
	RenewSeconds  float64 `json:"renew_deadline_seconds"`
	RetrySeconds  float64 `json:"retry_period_seconds"`
	SyncSeconds   float64 `json:"standby_sync_seconds"` // the standby's cold start, before the kill
	FailoverSecs  float64 `json:"failover_seconds"`     // kill → the standby serving (Ready)
	CatchUpSecs   float64 `json:"catch_up_seconds"`     // of which: lease taken → serving
	CatchUpBy     string  `json:"catch_up_by"`          // "barrier" (its own pod) or "list" (every bound pod)
	TargetSeconds float64 `json:"target_seconds"`
	Machine       Machine `json:"machine"`
	Pass          bool    `json:"pass"`
}

// leaseStore is the fake API server's one Lease, with optimistic concurrency,
// and the client (user agent: the replica's identity) whose calls fail from
// the kill on.
type leaseStore struct {
	mu    sync.Mutex
	lease *coordinationv1.Lease
	rv    int
	dead  atomic.Pointer[string]
}

// serve answers GET, POST and PUT of Leases; ok=false for another path.
func (s *leaseStore) serve(w http.ResponseWriter, r *http.Request) bool {
	const prefix = "/apis/coordination.k8s.io/v1/namespaces/"
	if !strings.HasPrefix(r.URL.Path, prefix) || !strings.Contains(r.URL.Path, "/leases") {
		return false
	}
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	fail := func(st *apierrors.StatusError) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(st.ErrStatus.Code))
		out := st.ErrStatus
		out.Kind, out.APIVersion = "Status", "v1"
		_ = json.NewEncoder(w).Encode(out)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.dead.Load(); d != nil && r.UserAgent() == *d {
		// A killed process neither renews nor releases.
		fail(apierrors.NewServiceUnavailable("the leader is dead"))
		return true
	}
	var in coordinationv1.Lease
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			fail(apierrors.NewBadRequest(err.Error()))
			return true
		}
	}
	switch r.Method {
	case http.MethodGet:
		if s.lease == nil {
			fail(apierrors.NewNotFound(gr, extender.LeaseName))
			return true
		}
	case http.MethodPost:
		if s.lease != nil {
			fail(apierrors.NewAlreadyExists(gr, in.Name))
			return true
		}
		s.rv++
		in.ResourceVersion = strconv.Itoa(s.rv)
		s.lease = &in
	case http.MethodPut:
		if s.lease == nil || in.ResourceVersion != s.lease.ResourceVersion {
			fail(apierrors.NewConflict(gr, in.Name, fmt.Errorf("resourceVersion %q is not %q", in.ResourceVersion,
				s.lease.ResourceVersion)))
			return true
		}
		s.rv++
		in.ResourceVersion = strconv.Itoa(s.rv)
		s.lease = &in
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	out := s.lease.DeepCopy()
	out.APIVersion, out.Kind = "coordination.k8s.io/v1", "Lease"
	_ = json.NewEncoder(w).Encode(out)
	return true
}

// failoverNamespace holds the Lease and the replicas' own pods.
const failoverNamespace = "understory-system"

// podWatches is the fake API server's pod watch streams and the replicas' own
// pods: a PATCH of one (a new leader's catch-up barrier) gets the next
// resourceVersion and goes to every open pod watch as MODIFIED, in order, as
// the API server would send it. The listed pods never change.
type podWatches struct {
	mu      sync.Mutex
	rv      int // the last resourceVersion handed out (0: none yet; the list's is 1)
	streams map[chan []byte]struct{}
}

const ownPodPrefix = "/api/v1/namespaces/" + failoverNamespace + "/pods/"

// serve answers pod watches and PATCHes of the replicas' pods; ok=false for
// another request.
func (h *podWatches) serve(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "true":
		ch := make(chan []byte, 16)
		h.mu.Lock()
		if h.streams == nil {
			h.streams = map[chan []byte]struct{}{}
		}
		h.streams[ch] = struct{}{}
		h.mu.Unlock()
		defer func() { h.mu.Lock(); delete(h.streams, ch); h.mu.Unlock() }()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		f, _ := w.(http.Flusher)
		if f != nil {
			f.Flush()
		}
		for {
			select {
			case <-r.Context().Done():
				return true
			case ev := <-ch:
				if _, err := w.Write(ev); err != nil {
					return true
				}
				if f != nil {
					f.Flush()
				}
			}
		}
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, ownPodPrefix):
		name := strings.TrimPrefix(r.URL.Path, ownPodPrefix)
		var patch struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.NewDecoder(r.Body).Decode(&patch); err != nil || !strings.HasPrefix(name, "extender-") {
			http.Error(w, fmt.Sprintf("bad patch of %s: %v", name, err), http.StatusBadRequest)
			return true
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.rv = max(h.rv, 1) + 1
		pod := corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: failoverNamespace, Name: name, UID: types.UID("uid-" + name),
				ResourceVersion: strconv.Itoa(h.rv), Annotations: patch.Metadata.Annotations}}
		body, err := json.Marshal(pod)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return true
		}
		ev, err := json.Marshal(map[string]any{"type": "MODIFIED", "object": json.RawMessage(body)})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return true
		}
		for ch := range h.streams {
			ch <- append(ev, '\n') // buffered; a barrier is written once a takeover
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return true
	}
	return false
}

// failoverLeader is the election of a failover run: the shipped manifest's
// durations (scheduler-extender.yaml) unless o.leader overrides them.
func failoverLeader(o Options, id string) extender.LeaderConfig {
	c := extender.DefaultLeaderConfig(failoverNamespace, id)
	if o.leader != nil {
		c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = o.leader.LeaseDuration, o.leader.RenewDeadline, o.leader.RetryPeriod
	}
	if !o.FailoverList {
		c.Pod = types.NamespacedName{Namespace: failoverNamespace, Name: "extender-" + id}
	}
	return c
}

// runFailover measures one failover at o.Nodes and o.RSSPods.
func runFailover(ctx context.Context, o Options) (Failover, error) {
	nodes, devs := memNodes(o.Nodes, o.Seed)
	lc := failoverLeader(o, "a")
	res := Failover{Date: time.Now().UTC(), Nodes: o.Nodes, Pods: o.RSSPods, TargetSeconds: o.TargetFailover.Seconds(),
		LeaseSeconds: lc.LeaseDuration.Seconds(), RenewSeconds: lc.RenewDeadline.Seconds(),
		RetrySeconds: lc.RetryPeriod.Seconds(), Machine: thisMachine()}
	leases := &leaseStore{}
	watches := &podWatches{}
	pods := fakeAPI(nodes, o.RSSPods, devs)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !leases.serve(w, r) && !watches.serve(w, r) {
			pods.ServeHTTP(w, r)
		}
	}))
	defer api.Close()
	start := func(id string) (*extender.Server, context.CancelFunc, chan error, error) {
		client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: -1, UserAgent: id,
			ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
		if err != nil {
			return nil, nil, nil, err
		}
		lc := failoverLeader(o, id)
		srv, err := extender.NewServer(extender.DefaultConfig(), extender.Deps{Client: client, Leader: &lc,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return nil, nil, nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- srv.Run(rctx) }()
		return srv, cancel, done, nil
	}
	wait := func(what string, d time.Duration, cond func() bool) error {
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s: not within %v", what, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	a, stopA, doneA, err := start("a")
	if err != nil {
		return res, err
	}
	defer func() { stopA(); <-doneA }()
	if err := wait("a leading", 10*time.Minute, a.Ready); err != nil {
		return res, err
	}
	syncStart := time.Now()
	b, stopB, doneB, err := start("b")
	if err != nil {
		return res, err
	}
	defer func() { stopB(); <-doneB }()
	if err := wait("b synced, standing by", 10*time.Minute, func() bool {
		st := b.Status()
		return st.Synced && st.Leader == "a"
	}); err != nil {
		return res, err
	}
	res.SyncSeconds = time.Since(syncStart).Seconds()
	// Let the standby settle (its initial lists freed), as it would have long
	// before a real failover.
	time.Sleep(lc.LeaseDuration)

	dead := "a"
	leases.dead.Store(&dead)
	kill := time.Now()
	budget := res.TargetSeconds*float64(time.Second) + float64(lc.LeaseDuration)
	if err := wait("b serving", time.Duration(budget), b.Ready); err != nil {
		return res, err
	}
	res.FailoverSecs = time.Since(kill).Seconds()
	if a.Ready() {
		return res, fmt.Errorf("two replicas serving: the dead leader still serves while the standby does")
	}
	select {
	case err := <-doneA:
		doneA <- err
	case <-time.After(lc.RenewDeadline + lc.RetryPeriod):
		return res, fmt.Errorf("the dead leader's Run did not return after it lost the lease")
	}
	st := b.Status()
	res.CatchUpSecs, res.CatchUpBy = st.LeaderCatchUpSeconds, st.LeaderCatchUpBy
	res.Pass = res.FailoverSecs <= res.TargetSeconds
	return res, nil
}
