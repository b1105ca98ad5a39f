package podsource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// ErrNoNodeName is returned by Kube.Run when the node name is empty: the
// field selector "spec.nodeName=" would select every unscheduled pod.
var ErrNoNodeName = errors.New("node name is empty")

// NodeNameField is the pod field the informer selects on.
const NodeNameField = "spec.nodeName"

// Kube serves the pods bound to one node from a client-go informer.
// List, HasSynced and Changed are safe for concurrent use with Run.
type Kube struct {
	nodeName string
	logger   *slog.Logger
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
	changed  chan struct{}
	setupErr error
	running  atomic.Bool
	errors   atomic.Uint64
}

// NewKube builds (but does not start) a pod informer for nodeName.
// resync is the informer resync period (0 disables it; resyncs do not
// signal Changed). A nil logger discards logs.
func NewKube(pods PodClient, nodeName string, logger *slog.Logger, resync time.Duration) *Kube {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	selector := fields.OneTermEqualSelector(NodeNameField, nodeName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	k := &Kube{
		nodeName: nodeName,
		logger:   logger.With("source", "kube", "node", nodeName),
		informer: informer,
		lister:   corelisters.NewPodLister(informer.GetIndexer()),
		changed:  newChanged(),
	}
	k.setupErr = errors.Join(
		k.informer.SetTransform(stripManagedFields),
		k.informer.SetWatchErrorHandlerWithContext(k.watchError),
	)
	if _, err := k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if k.mine(obj) {
				notify(k.changed)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, okOld := oldObj.(*corev1.Pod)
			n, okNew := newObj.(*corev1.Pod)
			if okOld && okNew && n.ResourceVersion != "" && o.ResourceVersion == n.ResourceVersion {
				return // periodic resync, nothing changed
			}
			if k.mine(oldObj) || k.mine(newObj) {
				notify(k.changed)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if k.mine(obj) {
				notify(k.changed)
			}
		},
	}); err != nil {
		k.setupErr = errors.Join(k.setupErr, err)
	}
	return k
}

// mine reports whether obj is a pod bound to this node. The API server
// already filters by field selector; this is the defence for clients that
// ignore it (the fake clientset does).
func (k *Kube) mine(obj any) bool {
	p, ok := obj.(*corev1.Pod)
	return ok && p.Spec.NodeName == k.nodeName
}

func (k *Kube) watchError(_ context.Context, _ *cache.Reflector, err error) {
	k.errors.Add(1)
	k.logger.Warn("pod list/watch failed; serving last known pods", "err", err)
}

// ErrorCount is how many pod list or watch calls have failed so far.
func (k *Kube) ErrorCount() uint64 { return k.errors.Load() }

// stripManagedFields drops metadata.managedFields before caching: the agent
// never reads them and they are often the largest part of a pod object.
func stripManagedFields(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// Run starts the informer and blocks until ctx is done.
func (k *Kube) Run(ctx context.Context) error {
	if k.nodeName == "" {
		return ErrNoNodeName
	}
	if k.setupErr != nil {
		return fmt.Errorf("setting up pod informer: %w", k.setupErr)
	}
	if !k.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.informer.RunWithContext(ctx)
	}()
	defer func() { <-done }() // wait for the informer goroutine

	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return k.informer.HasSynced(), nil
	})
	if err == nil {
		k.logger.Info("pod informer synced", "pods", len(k.List()))
		notify(k.changed)
	}
	<-ctx.Done()
	return nil
}

// HasSynced reports whether the initial list has been received.
func (k *Kube) HasSynced() bool { return k.informer.HasSynced() }

// Changed receives after a pod on this node was added, updated or deleted
// (coalesced, buffered 1).
func (k *Kube) Changed() <-chan struct{} { return k.changed }

// List returns the cached pods bound to this node in all namespaces, ordered
// by namespace and name. The pods are shared with the informer cache: do not
// modify them. While the API server is unreachable it keeps returning the
// last known set.
func (k *Kube) List() []*corev1.Pod {
	all, err := k.lister.List(labels.Everything())
	if err != nil { // the indexer lister never fails with Everything()
		k.logger.Error("listing cached pods", "err", err)
		return nil
	}
	out := all[:0] // all is freshly allocated: filter in place
	for _, p := range all {
		if p.Spec.NodeName == k.nodeName {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// Active reports whether pod has not terminated (phase is neither Succeeded
// nor Failed). Deletion timestamps are not considered: a pod being deleted
// still runs until its containers exit.
func Active(pod *corev1.Pod) bool {
	if pod == nil {
		return false
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}
