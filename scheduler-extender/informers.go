package extender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/wire"
)

// ErrNotSynced means the informers' caches did not fill before Run was stopped.
var ErrNotSynced = errors.New("informer caches not synced")

// touchingListWatch is a ListWatch that reports its informer's contact with
// the API server (informerContact): every successful list, the watch streams
// while open, and every watch event (bookmarks included). While the API
// server cannot be reached, its list and watch retry every unreachableRetry
// (retryUnreachable) instead of handing the error to the reflector, whose
// backoff would delay the recovery by tens of seconds; log says when a list
// or watch starts failing.
func touchingListWatch(ic *informerContact, log *slog.Logger,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	failing := func(call string) func(error) {
		return func(err error) {
			log.Warn("API server unreachable: retrying every "+unreachableRetry.String(), "informer", ic.name,
				"call", call, "err", err)
		}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := retryUnreachable(ctx, unreachableRetry,
				func(ctx context.Context) (runtime.Object, error) { return list(ctx, o) }, failing("list"))
			if err == nil {
				ic.Touch()
			}
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := retryUnreachable(ctx, unreachableRetry,
				func(ctx context.Context) (watch.Interface, error) { return watchFn(ctx, o) }, failing("watch"))
			if err != nil {
				return nil, err
			}
			return ic.watchOpened(w), nil
		},
	}
}

// informers follow the cluster: node and pod informers feed the index
// (State), PodGroup informers (scheduler-plugins, Volcano) the gangs, each
// reporting its contact with the API server (apiContact); synced says when
// the node and pod handlers have fed their initial lists. Events and nudges
// the index queued while handling an event are flushed after it.
type informers struct {
	cfg     Config
	client  kubernetes.Interface
	dynamic dynamic.Interface // nil: no PodGroup informers
	ix      *State
	gangs   *gang.Gangs
	contact *apiContact
	out     *outbox
	log     *slog.Logger
	barrier *podBarrier // the leader's catch-up barrier; nil without one
	synced  atomic.Bool
	wg      sync.WaitGroup // start's informers, until they stop
}

// tombstone unwraps a DeletedFinalStateUnknown.
func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// start starts the node, pod and PodGroup (scheduler-plugins, Volcano)
// informers and waits for the node and pod caches. The PodGroup informers are
// not waited for: without their CRD they never sync, and such gangs then wait
// with a clear reason.
func (s *informers) start(ctx context.Context) error {
	c := s.client
	st := s.ix
	nodes := cache.NewSharedIndexInformer(touchingListWatch(s.contact.informer(InformerNodes), s.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Nodes().Watch(ctx, o)
		}), &corev1.Node{}, s.cfg.InformerResync, cache.Indexers{})
	pods := cache.NewSharedIndexInformer(touchingListWatch(s.contact.informer(InformerPods), s.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
		}), &corev1.Pod{}, s.cfg.InformerResync, cache.Indexers{})
	for _, inf := range []cache.SharedIndexInformer{nodes, pods} {
		if err := inf.SetTransform(slimObject); err != nil {
			return fmt.Errorf("setting informer transform: %w", err)
		}
	}
	// Sync is judged on the handler registrations, not on the informers: an
	// informer has synced once its store holds the initial list, possibly
	// before its handlers have fed that list into the index.
	nodeReg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.upsertNodeObj(obj) },
		UpdateFunc: func(_, obj any) { s.upsertNodeObj(obj) },
		DeleteFunc: func(obj any) {
			if n, ok := tombstone(obj).(*corev1.Node); ok {
				st.DeleteNode(n.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("adding node handler: %w", err)
	}
	podReg, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.upsertPodObj(obj) },
		UpdateFunc: func(_, obj any) { s.upsertPodObj(obj) },
		DeleteFunc: func(obj any) {
			if p, ok := tombstone(obj).(*podRecord); ok {
				st.DeletePod(p.UID)
				s.out.flush()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("adding pod handler: %w", err)
	}
	s.wg.Go(func() { nodes.RunWithContext(ctx) })
	s.wg.Go(func() { pods.RunWithContext(ctx) })
	if s.dynamic != nil {
		// Not waited for: without its CRD a PodGroup informer never syncs, and
		// such gangs then wait with a clear reason.
		if err := s.startGroupInformer(ctx, InformerPodGroups, gang.PodGroupGVR, s.gangs.UpsertPodGroup, s.gangs.DeletePodGroup); err != nil {
			return err
		}
		if s.cfg.VolcanoPodGroups {
			if err := s.startGroupInformer(ctx, InformerVolcanoPodGroups, gang.VolcanoPodGroupGVR, s.gangs.UpsertVolcanoPodGroup,
				s.gangs.DeleteVolcanoPodGroup); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), nodeReg.HasSynced, podReg.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return ErrNotSynced
	}
	// The initial lists were decoded whole (full objects, before the
	// transforms slimmed them): several times the heap the index keeps. The
	// runtime would hand that back to the OS only slowly, so once, now, it is
	// collected and returned (a stop-the-world collection of some tens of
	// milliseconds at 100 000 pods, before any request is served).
	debug.FreeOSMemory()
	s.synced.Store(true)
	s.log.Info("informer caches synced", "after", time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *informers) upsertNodeObj(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		s.ix.UpsertNode(n)
	}
}

// upsertPodObj takes what the pod informer stores: a podRecord, its
// transform's output (set above, before the informer runs: it never hands out
// a *corev1.Pod).
func (s *informers) upsertPodObj(obj any) {
	if p, ok := obj.(*podRecord); ok {
		s.ix.upsertRecord(p)
		s.out.flush()
		s.barrier.observe(p) // after the index took it
	}
}

// barrierOrNil is the catch-up barrier; nil without informers or one.
func (s *informers) barrierOrNil() *podBarrier {
	if s == nil {
		return nil
	}
	return s.barrier
}

// startGroupInformer watches one PodGroup resource into the index.
func (s *informers) startGroupInformer(ctx context.Context, name string, gvr schema.GroupVersionResource,
	upsert func(*unstructured.Unstructured), del func(namespace, name string)) error {
	ri := s.dynamic.Resource(gvr).Namespace(metav1.NamespaceAll)
	inf := cache.NewSharedIndexInformer(touchingListWatch(s.contact.informer(name), s.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return ri.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return ri.Watch(ctx, o) },
	), &unstructured.Unstructured{}, s.cfg.InformerResync, cache.Indexers{})
	if err := inf.SetTransform(slimObject); err != nil {
		return fmt.Errorf("setting %s informer transform: %w", gvr.GroupResource(), err)
	}
	set := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			upsert(u)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if u, ok := tombstone(obj).(*unstructured.Unstructured); ok {
				del(u.GetNamespace(), u.GetName())
			}
		},
	}); err != nil {
		return fmt.Errorf("adding %s handler: %w", gvr.GroupResource(), err)
	}
	s.wg.Go(func() { inf.RunWithContext(ctx) })
	return nil
}

// Informers whose staleness the extender reports. Binds depend on the node
// and pod informers (they tell which devices are held); the PodGroup ones
// only feed gangs' minMember.
const (
	InformerNodes            = "nodes"
	InformerPods             = "pods"
	InformerPodGroups        = "podgroups"
	InformerVolcanoPodGroups = "volcano-podgroups"
)

// ErrCacheStale means an informer binds depend on has not been in contact with
// the API server for longer than Config.MaxCacheStaleness: binds are refused
// (kube-scheduler retries the pod) rather than booked on a cache that may miss
// pods bound meanwhile.
var ErrCacheStale = errors.New("informer cache stale")

// bindInformers are the informers whose staleness refuses binds.
var bindInformers = []string{InformerNodes, InformerPods}

// informerContact is one informer's contact with the API server: its cache is
// current while a watch stream is open (client-go's HTTP/2 health checks end a
// dead stream within about 45 s); otherwise it is as old as the last sign of
// contact: a successful list, an event (bookmarks included) or the end of a
// stream. Safe for concurrent use.
type informerContact struct {
	name     string
	now      func() time.Time
	since    time.Time    // when the tracker was made: staleness before any contact
	last     atomic.Int64 // unix nanos of the last sign of contact; 0 before the first
	watching atomic.Int32 // watch streams open now
}

// Touch records a sign of contact.
func (c *informerContact) Touch() { c.last.Store(c.now().UnixNano()) }

// Staleness is how long the informer's cache may have missed changes: 0 while
// a watch stream is open, else the time since the last contact (or since the
// tracker was made, before any).
func (c *informerContact) Staleness() time.Duration {
	if c.watching.Load() > 0 {
		return 0
	}
	t := c.since
	if n := c.last.Load(); n != 0 {
		t = time.Unix(0, n)
	}
	return max(0, c.now().Sub(t))
}

// LastContact is the time of the last sign of contact (zero before any).
func (c *informerContact) LastContact() time.Time {
	if n := c.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// watchOpened wraps a watch that just opened: the stream counts as contact
// while open, every event but errors touches, and its end is the last contact.
func (c *informerContact) watchOpened(w watch.Interface) watch.Interface {
	c.watching.Add(1)
	c.Touch()
	cw := &contactWatch{in: w, out: make(chan watch.Event), stopped: make(chan struct{})}
	go func() {
		defer close(cw.out)
		defer func() {
			c.Touch()
			c.watching.Add(-1)
		}()
		for e := range w.ResultChan() {
			if e.Type != watch.Error {
				c.Touch()
			}
			select {
			case cw.out <- e:
			case <-cw.stopped:
				return
			}
		}
	}()
	return cw
}

// contactWatch forwards a watch's events (see informerContact.watchOpened).
type contactWatch struct {
	in      watch.Interface
	out     chan watch.Event
	once    sync.Once
	stopped chan struct{}
}

func (w *contactWatch) Stop() {
	w.once.Do(func() { close(w.stopped) })
	w.in.Stop()
}

func (w *contactWatch) ResultChan() <-chan watch.Event { return w.out }

// apiContact tracks every informer's contact (informerContact), by name.
// Informers are registered before they start; lookups never lock.
type apiContact struct {
	now func() time.Time
	mu  sync.Mutex
	by  atomic.Pointer[map[string]*informerContact]
}

func newAPIContact(now func() time.Time) *apiContact {
	c := &apiContact{now: now}
	c.by.Store(&map[string]*informerContact{})
	return c
}

// informer returns the tracker of informer name, making it on first use.
func (c *apiContact) informer(name string) *informerContact {
	if ic := (*c.by.Load())[name]; ic != nil {
		return ic
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.by.Load()
	if ic := old[name]; ic != nil {
		return ic
	}
	ic := &informerContact{name: name, now: c.now, since: c.now()}
	next := make(map[string]*informerContact, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = ic
	c.by.Store(&next)
	return ic
}

// Staleness is each registered informer's staleness, by name.
func (c *apiContact) Staleness() map[string]time.Duration {
	by := *c.by.Load()
	out := make(map[string]time.Duration, len(by))
	for name, ic := range by {
		out[name] = ic.Staleness()
	}
	return out
}

// status lists every registered informer, by name.
func (c *apiContact) status() []wire.InformerStatus {
	by := *c.by.Load()
	out := make([]wire.InformerStatus, 0, len(by))
	for _, name := range slices.Sorted(maps.Keys(by)) {
		ic := by[name]
		is := wire.InformerStatus{Name: name, Watching: ic.watching.Load() > 0, StalenessSeconds: ic.Staleness().Seconds()}
		if t := ic.LastContact(); !t.IsZero() {
			is.LastContact = &t
		}
		out = append(out, is)
	}
	return out
}

// staleBeyond names the first informer binds depend on whose staleness
// exceeds limit, and that staleness.
func (c *apiContact) staleBeyond(limit time.Duration) (string, time.Duration, bool) {
	by := *c.by.Load()
	for _, name := range bindInformers {
		if ic := by[name]; ic != nil {
			if d := ic.Staleness(); d > limit {
				return name, d, true
			}
		}
	}
	return "", 0, false
}

// staleForBind is ErrCacheStale (with the informer and its staleness) when
// binds must be refused (an informer binds depend on is stale beyond limit,
// Config.MaxCacheStaleness), nil otherwise.
func (c *apiContact) staleForBind(limit time.Duration) error {
	if name, d, stale := c.staleBeyond(limit); stale {
		return fmt.Errorf("the %s informer has not heard from the API server for %s (limit %s, -max-cache-staleness); "+
			"retry later: %w", name, d.Round(time.Second), limit, ErrCacheStale)
	}
	return nil
}

// unreachableRetry is how often an informer's list or watch is retried while
// the API server cannot be reached (retryUnreachable).
const unreachableRetry = time.Second

// unreachable reports whether err means the API server could not be reached
// or could not answer for now (refused, reset, EOF, a network timeout, 503,
// 500, 504), as opposed to an answer that retrying would not change
// (forbidden, not found, gone, invalid). 429 is left to client-go, which
// retries it itself after the server's Retry-After.
func unreachable(err error) bool {
	var ne net.Error
	switch {
	case err == nil:
		return false
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err)
}

// retryUnreachable calls f until it returns something other than an
// unreachable error, or ctx ends (its error), every `every`. Informers list
// and watch through it. client-go's reflector backs off exponentially after
// each failed list or watch (800 ms doubling to 30 s, with up to as much
// again of jitter), so after a 30 s API outage it would try again only
// 20–50 s after the API server came back; retried here, the informer resumes
// within `every`. failing is called once when the first call fails (a
// streak of failures is reported once).
func retryUnreachable[T any](ctx context.Context, every time.Duration, f func(context.Context) (T, error),
	failing func(error)) (T, error) {
	for first := true; ; first = false {
		v, err := f(ctx)
		if !unreachable(err) || ctx.Err() != nil {
			return v, err
		}
		if first && failing != nil {
			failing(err)
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}
