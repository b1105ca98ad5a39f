package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/election"
	"github.com/understory/understory/metrics"
)

// LeaseName is the default name of the extender's leader Lease.
const LeaseName = "understory-scheduler-extender"

// ErrStandby means this replica does not lead: it refuses filter, prioritize
// and bind, and /readyz answers 503, so the Service sends kube-scheduler only
// to the leader.
var ErrStandby = errors.New("standby, not the leader")

// ErrLeadershipLost means this replica led and lost its lease. Server.Run
// returns it; the process must then exit (a fresh process starts as a standby):
// it refuses everything from the moment the lease is lost.
var ErrLeadershipLost = errors.New("leader lease lost")

// errBadLeaderConfig means a LeaderConfig is invalid.
var errBadLeaderConfig = errors.New("invalid leader election config")

// LeaderConfig configures leader election among extender replicas (Deps.Leader).
type LeaderConfig struct {
	// Config is the Lease (Namespace, Name, this replica's Identity) and the
	// election's timing: a standby takes the lease LeaseDuration after the
	// leader's last renewal; a leader that cannot renew within RenewDeadline stops
	// serving. A killed leader is replaced after at most LeaseDuration +
	// RetryPeriod + the catch-up (CatchUpTimeout bounds it).
	election.Config
	// Service, when set, is the selector-less Service kube-scheduler calls: the
	// leader, once caught up, points it at itself by writing the EndpointSlice
	// Service+"-leader" (address PodIP, port Port named PortName). Routing by
	// this rather than by readiness keeps the standby Ready (synced), so that
	// Deployment rollouts and the PodDisruptionBudget work with two replicas.
	Service, PodIP, PortName string
	Port                     int32
	// CatchUpTimeout bounds the new leader's catch-up with the API (every pod
	// bound at the moment it took the lease shown by its informer) before it
	// serves; past it the replica gives the lease up (ErrLeadershipLost).
	CatchUpTimeout time.Duration
	// Pod is this replica's own pod (the downward API's POD_NAMESPACE and
	// POD_NAME): the catch-up writes AnnotationCatchUp on it and waits for its
	// informer to deliver that write (podBarrier), whatever the cluster's size.
	// Empty, or the write refused: the catch-up lists every bound pod instead
	// (seconds at 100 000 pods).
	Pod types.NamespacedName
}

// DefaultLeaderConfig is LeaseName in namespace, as identity, with durations
// that replace a killed leader within 15 s (8 s + 1 s + the catch-up).
func DefaultLeaderConfig(namespace, identity string) LeaderConfig {
	return LeaderConfig{Config: election.Config{Namespace: namespace, Name: LeaseName, Identity: identity,
		LeaseDuration: 8 * time.Second, RenewDeadline: 5 * time.Second, RetryPeriod: time.Second},
		CatchUpTimeout: 5 * time.Second}
}

// Validate checks c; client-go's own rules included (LeaseDuration >
// RenewDeadline > 1.2 × RetryPeriod).
func (c LeaderConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return fmt.Errorf("%w: %w", err, errBadLeaderConfig)
	}
	switch {
	case c.CatchUpTimeout <= 0:
		return fmt.Errorf("catch-up timeout %v must be > 0: %w", c.CatchUpTimeout, errBadLeaderConfig)
	case c.Service != "" && (net.ParseIP(c.PodIP) == nil || c.Port <= 0 || c.PortName == ""):
		return fmt.Errorf("publishing Service %s needs the pod IP (%q), a port (%d) and its name (%q): %w",
			c.Service, c.PodIP, c.Port, c.PortName, errBadLeaderConfig)
	case (c.Pod.Namespace == "") != (c.Pod.Name == ""):
		return fmt.Errorf("own pod %q needs both a namespace and a name: %w", c.Pod, errBadLeaderConfig)
	}
	return nil
}

// Leadership phases of one replica. They only move forward: a replica that
// lost the lease never serves again (the process exits).
const (
	roleStandby  int32 = iota // follows the cluster, refuses requests
	roleCatching              // took the lease, catching up before it serves
	roleLeading               // serves
	roleLost                  // lost the lease: refuses, Run returns ErrLeadershipLost
)

// leadership runs leader election for one Server and gates it: only the
// leader, once caught up with the API, serves; the standby keeps its informers
// synced and its outbox muted (no Events, no gang nudges: nothing is written
// by two replicas). It holds no index state: what the new leader needs is in
// its index already (the informers) or recorded on the pods (gang plans,
// resumed by Server.Housekeep before it serves).
type leadership struct {
	cfg     LeaderConfig
	client  kubernetes.Interface
	log     *slog.Logger
	role    atomic.Int32
	leader  atomic.Pointer[string] // last observed holder ("" none yet)
	catchUp atomic.Int64           // the last takeover's catch-up, in nanoseconds
	// catchUpBy is how the last takeover caught up ("barrier", "list").
	catchUpBy atomic.Pointer[string]

	// lease ends, with ErrLeadershipLost as its cause, when this replica
	// stops leading (stop): the Bindings run under it (binder.apply).
	lease    context.Context
	endLease context.CancelCauseFunc
	// renewed is when this replica's last write of the Lease that left it
	// the holder started, in monotonic nanoseconds since epoch (0: never).
	epoch   time.Time
	renewed atomic.Int64

	met *metrics.Leader
}

func newLeadership(cfg LeaderConfig, client kubernetes.Interface, reg prometheus.Registerer,
	log *slog.Logger) (*leadership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, fmt.Errorf("leader election needs an API client: %w", errBadLeaderConfig)
	}
	m, err := metrics.NewLeader(reg)
	if err != nil {
		return nil, err
	}
	l := &leadership{cfg: cfg, client: client, log: log, met: m, epoch: time.Now()}
	l.lease, l.endLease = context.WithCancelCause(context.Background())
	empty := ""
	l.leader.Store(&empty)
	return l, nil
}

// serving reports whether this replica serves now (nil: no election,
// always): it leads and its lease is fresh (mayBind), so that a leader
// resumed after a pause past its lease refuses at once.
func (l *leadership) serving() bool { return l.mayBind() == nil }

// bindContext is the context Bindings run under: it ends when this replica
// stops leading (background without election).
func (l *leadership) bindContext() context.Context {
	if l == nil {
		return context.Background()
	}
	return l.lease
}

// mayBind is nil while a Binding may start (always without election): this
// replica leads, and its last renewal of the Lease started less than
// RenewDeadline ago. A standby takes the Lease no sooner than LeaseDuration
// after that renewal reached the API server (it times the Lease from when it
// saw it change), so LeaseDuration - RenewDeadline is left for the Binding's
// way there. The role alone is not enough: it changes only when client-go
// gives up renewing (up to RetryPeriod + RenewDeadline after the last
// renewal), and a process that was paused (SIGSTOP, a frozen VM) past its
// lease runs on as leader until its next renewal attempt fails; the clock
// check refuses at once. Errors wrap ErrLeadershipLost or ErrStandby.
func (l *leadership) mayBind() error {
	if l == nil {
		return nil
	}
	if l.role.Load() != roleLeading {
		return l.refusal()
	}
	if age := l.sinceRenewed(); age >= l.cfg.RenewDeadline {
		return fmt.Errorf("%s last renewed its lease %v ago (renew deadline %v): %w", l.cfg.Identity,
			age.Round(time.Millisecond), l.cfg.RenewDeadline, ErrLeadershipLost)
	}
	return nil
}

// sinceRenewed is how long ago the last renewal started.
func (l *leadership) sinceRenewed() time.Duration {
	at := l.renewed.Load()
	if at == 0 {
		return time.Duration(1<<63 - 1)
	}
	return time.Since(l.epoch) - time.Duration(at)
}

// noteWrite records a write of the Lease that started at start (monotonic
// nanoseconds since epoch) if it succeeded and left this replica the holder.
func (l *leadership) noteWrite(start int64, lease *coordinationv1.Lease, err error) {
	if err == nil && lease != nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == l.cfg.Identity {
		l.renewed.Store(max(start, 1))
	}
}

// holder is the last observed leader identity.
func (l *leadership) holder() string { return *l.leader.Load() }

// refusal is why a non-serving replica refuses (ErrStandby, or
// ErrLeadershipLost) with the leader it knows of.
func (l *leadership) refusal() error {
	switch l.role.Load() {
	case roleLost:
		return fmt.Errorf("%s lost the lease and is exiting: %w", l.cfg.Identity, ErrLeadershipLost)
	case roleCatching:
		return fmt.Errorf("standby: took the lease, catching up with the API: %w", ErrStandby)
	case roleLeading:
		if err := l.mayBind(); err != nil {
			return err
		}
	}
	h := l.holder()
	if h == "" {
		h = "unknown yet"
	}
	return fmt.Errorf("standby: leader is %s: %w", h, ErrStandby)
}

// run takes part in the election until ctx is done (nil; the lease is
// released if held) or the lease is lost (ErrLeadershipLost). s's informers
// must have synced: a replica competes only once it could serve. becomeLeader
// catches s up before it serves.
func (l *leadership) run(ctx context.Context, s *Server) error {
	var lost atomic.Bool
	// ectx ends the election early when the takeover fails: the lease is
	// released then (ReleaseOnCancel), so the other replica takes it at once.
	ectx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	// becomeLeader runs on its own goroutine (client-go starts it); run waits
	// for it, and one that would start after run returned does nothing.
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		closed bool
	)
	le, err := election.NewElector(renewWatch{Interface: l.client, l: l}, l.cfg.Config, leaderelection.LeaderCallbacks{
		OnStartedLeading: func(lctx context.Context) {
			mu.Lock()
			if closed {
				mu.Unlock()
				return
			}
			wg.Add(1)
			mu.Unlock()
			defer wg.Done()
			if err := l.becomeLeader(lctx, s); err != nil && lctx.Err() == nil {
				l.log.Error("taking over as leader failed: giving the lease up", "err", err)
				lost.Store(true)
				l.stop()
				giveUp()
			}
		},
		OnStoppedLeading: func() {
			// Called when Run ends: ctx done (shutdown: the lease is released
			// after the HTTP server drained), or the lease lost. Refuse at once
			// either way: a standby may take the lease LeaseDuration after our
			// last renewal, RenewDeadline before which we get here.
			l.stop()
			if ctx.Err() == nil {
				lost.Store(true)
			}
		},
		OnNewLeader: func(identity string) {
			if identity == "" {
				return // released: the next holder follows
			}
			id := identity
			l.leader.Store(&id)
			l.met.Transitions.Inc()
			l.log.Info("leader observed", "leader", identity, "self", identity == l.cfg.Identity)
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w: %w", err, errBadLeaderConfig)
	}
	le.Run(ectx)
	mu.Lock()
	closed = true
	mu.Unlock()
	wg.Wait()
	if lost.Load() && ctx.Err() == nil {
		return fmt.Errorf("%s: %w", l.cfg.Identity, ErrLeadershipLost)
	}
	return nil
}

// stop ends serving for good, and ends the lease context: Bindings in
// flight are cancelled.
func (l *leadership) stop() {
	l.role.Store(roleLost)
	l.endLease(fmt.Errorf("%s stopped leading: %w", l.cfg.Identity, ErrLeadershipLost))
	l.met.Leading.Set(0)
}

// renewWatch is the leadership's client as its elector sees it: every write
// of the Lease goes through renewWatchLeases, which times the renewals
// (leadership.noteWrite).
type renewWatch struct {
	kubernetes.Interface
	l *leadership
}

func (c renewWatch) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return renewWatchCoordination{CoordinationV1Interface: c.Interface.CoordinationV1(), l: c.l}
}

type renewWatchCoordination struct {
	coordinationv1client.CoordinationV1Interface
	l *leadership
}

func (c renewWatchCoordination) Leases(namespace string) coordinationv1client.LeaseInterface {
	return renewWatchLeases{LeaseInterface: c.CoordinationV1Interface.Leases(namespace), l: c.l}
}

type renewWatchLeases struct {
	coordinationv1client.LeaseInterface
	l *leadership
}

func (c renewWatchLeases) Create(ctx context.Context, lease *coordinationv1.Lease,
	opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	start := int64(time.Since(c.l.epoch))
	out, err := c.LeaseInterface.Create(ctx, lease, opts)
	c.l.noteWrite(start, out, err)
	return out, err
}

func (c renewWatchLeases) Update(ctx context.Context, lease *coordinationv1.Lease,
	opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	start := int64(time.Since(c.l.epoch))
	out, err := c.LeaseInterface.Update(ctx, lease, opts)
	c.l.noteWrite(start, out, err)
	return out, err
}

// becomeLeader catches s up with the API and then serves: every pod bound at
// this moment must be in the index (a Binding the old leader sent just before
// it died may not have reached our informer yet), the outbox is unmuted, and
// one housekeeping pass resumes the gang plans recorded on the pods and ages
// node metrics. Reservations the old leader held only in memory (filtered, not
// yet bound) are gone: kube-scheduler's bind of such a pod places it again
// (binder.Bind of an unknown pod), on the devices free now.
func (l *leadership) becomeLeader(ctx context.Context, s *Server) error {
	if !l.role.CompareAndSwap(roleStandby, roleCatching) {
		return fmt.Errorf("took the lease in role %d: %w", l.role.Load(), ErrLeadershipLost)
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, l.cfg.CatchUpTimeout)
	defer cancel()
	how, n, err := l.catchUpWith(cctx, s)
	if err != nil {
		return fmt.Errorf("catching up with the API (%s): %w", how, err)
	}
	s.out.setMuted(false)
	s.Housekeep()
	if ctx.Err() != nil || !l.role.CompareAndSwap(roleCatching, roleLeading) {
		return fmt.Errorf("lease lost while catching up: %w", ErrLeadershipLost)
	}
	l.met.Leading.Set(1)
	took := time.Since(start)
	l.met.CatchUpSeconds.Set(took.Seconds())
	l.catchUp.Store(int64(took))
	l.catchUpBy.Store(&how)
	if l.cfg.Service != "" { // serving already: kube-scheduler's calls may come at once
		if err := publishLeader(cctx, l.client, l.cfg); err != nil {
			return err
		}
	}
	l.log.Info("leading: serving filter, prioritize and bind", "identity", l.cfg.Identity,
		"catchUp", took.Round(time.Millisecond), "by", how, "boundPodsListed", n)
	return nil
}

// catchUpWith catches s's index up with the API: through the barrier on its
// own pod when it has one (O(1)), else, or when the barrier cannot be
// written, by listing every bound pod (catchUp). It says which it used and
// how many pods it listed.
func (l *leadership) catchUpWith(ctx context.Context, s *Server) (how string, listed int, err error) {
	if b := s.feed.barrierOrNil(); b != nil {
		err := b.cross(ctx, l.client, l.cfg.Identity, time.Now())
		if !errors.Is(err, errNoBarrier) {
			return "barrier", 0, err
		}
		l.log.Warn("catch-up barrier refused: listing every bound pod instead", "err", err)
	}
	n, err := catchUp(ctx, l.client, s.state, l.cfg.RetryPeriod/10)
	return "list", n, err
}

// boundPod is a pod the API shows bound, that the index must show bound too.
type boundPod struct {
	namespace, name string
	uid             types.UID
	node            string
}

// catchUp lists the pods bound now (a consistent read) and waits until the
// index shows each bound to the same node: informer events it had not yet
// handled. A pod the index still lacks after a while is read again; gone (or
// terminated, or recreated under another uid) it no longer matters. It
// returns how many bound pods it checked.
func catchUp(ctx context.Context, client kubernetes.Interface, st *State, poll time.Duration) (int, error) {
	sel := fields.AndSelectors(fields.OneTermNotEqualSelector("spec.nodeName", ""),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))).String()
	opts := metav1.ListOptions{FieldSelector: sel, Limit: 5000}
	var missing []boundPod
	total := 0
	for {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return total, fmt.Errorf("listing bound pods: %w", err)
		}
		total += len(list.Items)
		st.rlock()
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // the selector's job, unless the server ignored it
			}
			if !indexShowsBound(st, p.UID, p.Spec.NodeName) {
				missing = append(missing, boundPod{p.Namespace, p.Name, p.UID, p.Spec.NodeName})
			}
		}
		st.runlock()
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	poll = max(poll, 10*time.Millisecond)
	reread := time.Now().Add(20 * poll)
	for len(missing) > 0 {
		st.rlock()
		missing = slices.DeleteFunc(missing, func(b boundPod) bool { return indexShowsBound(st, b.uid, b.node) })
		st.runlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(reread) {
			kept := missing[:0]
			for _, b := range missing {
				p, err := client.CoreV1().Pods(b.namespace).Get(ctx, b.name, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					continue
				case err != nil:
					return total, fmt.Errorf("reading pod %s/%s: %w", b.namespace, b.name, err)
				case p.UID != b.uid || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
					continue
				}
				kept = append(kept, b)
			}
			missing = kept
			reread = time.Now().Add(20 * poll)
			if len(missing) == 0 {
				break
			}
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return total, fmt.Errorf("%d bound pods (first %s/%s on %s) not yet in the index: %w", len(missing),
				missing[0].namespace, missing[0].name, missing[0].node, ctx.Err())
		case <-t.C:
		}
	}
	return total, nil
}

// indexShowsBound reports whether the index holds uid bound (or assumed
// bound) on node. Call with st's lock held.
func indexShowsBound(st *State, uid types.UID, node string) bool {
	p := st.pod(uid)
	return p != nil && p.node == node && (p.phase == phaseBound || p.phase == phaseAssumed)
}

// LeaderSliceSuffix names the EndpointSlice a leader writes for its Service.
const LeaderSliceSuffix = "-leader"

// leaderSliceManager is the EndpointSlice managed-by label value of the
// leader's slice (the EndpointSlice controller leaves such slices alone).
const leaderSliceManager = "understory-scheduler-extender"

// publishLeader points cfg.Service at this replica: it creates or replaces
// the EndpointSlice cfg.Service+LeaderSliceSuffix with one ready endpoint, this
// pod. The Service has no selector, so this slice is its only one; a replica
// that lost the lease leaves it pointing at itself until the next leader
// writes it (it refuses, then exits, meanwhile).
func publishLeader(ctx context.Context, client kubernetes.Interface, cfg LeaderConfig) error {
	ip := net.ParseIP(cfg.PodIP)
	family := discoveryv1.AddressTypeIPv4
	if ip.To4() == nil {
		family = discoveryv1.AddressTypeIPv6
	}
	ready, proto := true, corev1.ProtocolTCP
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Service + LeaderSliceSuffix, Namespace: cfg.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: cfg.Service,
				discoveryv1.LabelManagedBy: leaderSliceManager, "app.kubernetes.io/part-of": "understory"}},
		AddressType: family,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{cfg.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: cfg.Namespace, Name: cfg.Identity}}},
		Ports: []discoveryv1.EndpointPort{{Name: &cfg.PortName, Port: &cfg.Port, Protocol: &proto}},
	}
	esc := client.DiscoveryV1().EndpointSlices(cfg.Namespace)
	old, err := esc.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = esc.Create(ctx, want, metav1.CreateOptions{})
	case err == nil:
		want.ResourceVersion = old.ResourceVersion
		_, err = esc.Update(ctx, want, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("pointing Service %s/%s at this replica (EndpointSlice %s): %w", cfg.Namespace, cfg.Service,
			want.Name, err)
	}
	return nil
}

// AnnotationCatchUp is the annotation a new leader writes on its own pod: the
// catch-up barrier (podBarrier). Its value is the identity and the time.
const AnnotationCatchUp = contract.AnnotationExtenderCatchUp

// errNoBarrier means the barrier write failed (the pod is gone, or RBAC or the
// pod policy refuses it): the catch-up then lists every bound pod instead.
var errNoBarrier = errors.New("catch-up barrier not written")

// podBarrier is the new leader's catch-up in O(1): it writes an annotation
// on its own pod and waits until its pod informer hands that write to the
// index. The pod informer delivers events in resourceVersion order (client-go's
// InOrderInformers, on by default since v0.34: NewServer falls back to the
// list when it is off), and etcd orders every write, so once the write is
// delivered every pod bound before it (a Binding the old leader sent just
// before it died included) is in the index. A relist on the way delivers a
// later version of the pod, which is as good.
//
// It only records the resourceVersion of its pod as the informer delivers it;
// nothing else about other pods (observe costs two string compares a pod event).
type podBarrier struct {
	key types.NamespacedName // the replica's own pod

	mu      sync.Mutex
	seen    string        // the last resourceVersion of key delivered
	changed chan struct{} // closed (and replaced) at each delivery of key
}

func newPodBarrier(key types.NamespacedName) *podBarrier {
	return &podBarrier{key: key, changed: make(chan struct{})}
}

// observe records a pod event's resourceVersion when it is the barrier's pod.
// The pod informer's handler calls it after the index took the event. Nil
// receiver: no barrier.
func (b *podBarrier) observe(r *podRecord) {
	if b == nil || r.Name != b.key.Name || r.Namespace != b.key.Namespace {
		return
	}
	b.mu.Lock()
	b.seen = r.ResourceVersion
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// wait returns once the informer delivered rv (or a later version) of the
// barrier's pod, or ctx's error.
func (b *podBarrier) wait(ctx context.Context, rv string) error {
	for {
		b.mu.Lock()
		seen, ch := b.seen, b.changed
		b.mu.Unlock()
		if reached(seen, rv) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s at resourceVersion %s not yet delivered by the informer (last %q): %w",
				b.key, rv, seen, ctx.Err())
		case <-ch:
		}
	}
}

// cross writes the barrier (identity and now in AnnotationCatchUp, so the
// write always makes a new resourceVersion) and waits until the informer
// delivered it. A refused write is errNoBarrier.
func (b *podBarrier) cross(ctx context.Context, client kubernetes.Interface, identity string, now time.Time) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationCatchUp: identity + " " + now.UTC().Format(time.RFC3339Nano)}}})
	if err != nil {
		return fmt.Errorf("encoding the catch-up barrier: %w", err)
	}
	p, err := client.CoreV1().Pods(b.key.Namespace).Patch(ctx, b.key.Name, types.MergePatchType, patch,
		metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("writing %s on pod %s: %w: %w", AnnotationCatchUp, b.key, err, errNoBarrier)
	}
	return b.wait(ctx, p.ResourceVersion)
}

// reached reports whether resourceVersion seen is at or past want. Both are
// etcd revisions (decimal) on every API server this runs against; opaque ones
// (another storage) only compare equal.
func reached(seen, want string) bool {
	if seen == "" {
		return false
	}
	s, serr := strconv.ParseUint(seen, 10, 64)
	w, werr := strconv.ParseUint(want, 10, 64)
	if serr != nil || werr != nil {
		return seen == want
	}
	return s >= w
}
