package admission

import (
	"context"
	"fmt"
	"time"

	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
	"k8s.io/client-go/tools/cache"
)

var _ Cluster = (*ClusterCache)(nil)

// ClusterCache is a Cluster backed by namespace and PriorityClass informers. A miss
// in the cache (an object created a moment ago, or caches not synced yet) falls back
// to a live GET, so a namespace labelled and used at once is still seen.
type ClusterCache struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	ns      corelisters.NamespaceLister
	pc      schedulinglisters.PriorityClassLister
	synced  []cache.InformerSynced
}

// NewClusterCache builds the informers; Start runs them.
func NewClusterCache(client kubernetes.Interface, resync time.Duration) *ClusterCache {
	f := informers.NewSharedInformerFactory(client, resync)
	nsInf := f.Core().V1().Namespaces()
	pcInf := f.Scheduling().V1().PriorityClasses()
	return &ClusterCache{
		client: client, factory: f, ns: nsInf.Lister(), pc: pcInf.Lister(),
		synced: []cache.InformerSynced{nsInf.Informer().HasSynced, pcInf.Informer().HasSynced},
	}
}

// Start runs the informers until ctx ends.
func (c *ClusterCache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// Shutdown waits for the informers' goroutines after ctx passed to Start ended.
func (c *ClusterCache) Shutdown() { c.factory.Shutdown() }

// HasSynced reports whether both caches hold a full list.
func (c *ClusterCache) HasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// NamespaceLabels returns the labels of namespace name.
func (c *ClusterCache) NamespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	if ns, err := c.ns.Get(name); err == nil {
		return ns.Labels, nil
	}
	ns, err := c.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("namespace %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting namespace %q: %w", name, err)
	}
	return ns.Labels, nil
}

// PriorityClass returns PriorityClass name.
func (c *ClusterCache) PriorityClass(ctx context.Context, name string) (*schedulingv1.PriorityClass, error) {
	if pc, err := c.pc.Get(name); err == nil {
		return pc, nil
	}
	pc, err := c.client.SchedulingV1().PriorityClasses().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("PriorityClass %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting PriorityClass %q: %w", name, err)
	}
	return pc, nil
}
