package extender

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
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
	gangs   *Gangs
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
		if err := s.startGroupInformer(ctx, InformerPodGroups, PodGroupGVR, s.gangs.UpsertPodGroup, s.gangs.DeletePodGroup); err != nil {
			return err
		}
		if s.cfg.VolcanoPodGroups {
			if err := s.startGroupInformer(ctx, InformerVolcanoPodGroups, VolcanoPodGroupGVR, s.gangs.UpsertVolcanoPodGroup,
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
