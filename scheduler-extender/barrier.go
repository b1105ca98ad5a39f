package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/understory/understory/contract"
)

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
