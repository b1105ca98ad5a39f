package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// This file sets the pod condition qos.ConditionBatchSlowed on batch pods: True with the
// reason Throttled or Frozen (and the numbers) while the agent holds the pod back, False
// with Running once it runs free again. The plan decides (qos.BatchConditions, over
// qos.NextBatchCondition: on a state change, number updates at most once every
// qos.BatchConditionRefresh); the agent hands it to PodConditionWriter, which patches
// pods/status from its own goroutine, so the loop never waits for the API server.

// PodStatusPatcher patches a pod's status subresource: podsource.CoreClient in the agent,
// an adapter over client-go's typed client in tests.
type PodStatusPatcher interface {
	PatchPodStatus(ctx context.Context, namespace, name string, pt types.PatchType, data []byte) error
}

// PodConditionWriter patches the batch pod condition into pods/status (a strategic merge
// patch of that one condition, with the pod's UID, so a pod recreated under the same name
// is not written). Set and Forget never block: the latest condition per pod waits for
// Run, which writes them one by one; a failed write is retried with backoff unless a
// newer one replaced it; a pod that is gone (or recreated: another UID) is dropped. Safe for concurrent use.
type PodConditionWriter struct {
	pods PodStatusPatcher
	log  *slog.Logger

	mu      sync.Mutex
	pending map[types.UID]pendingCondition
	wake    chan struct{}

	writes, failures atomic.Int64
}

type pendingCondition struct {
	namespace, name string
	cond            corev1.PodCondition
}

// writeTimeout bounds one patch; retryAfter is the first wait after a failed round,
// doubled up to maxRetryAfter.
const (
	writeTimeout  = 10 * time.Second
	retryAfter    = time.Second
	maxRetryAfter = time.Minute
)

// NewPodConditionWriter returns a writer over pods.
func NewPodConditionWriter(pods PodStatusPatcher, log *slog.Logger) *PodConditionWriter {
	if log == nil {
		log = slog.Default()
	}
	return &PodConditionWriter{pods: pods, log: log, pending: map[types.UID]pendingCondition{},
		wake: make(chan struct{}, 1)}
}

// Set queues c for pod (its namespace, name and UID), replacing what was queued for it.
func (w *PodConditionWriter) Set(pod *corev1.Pod, c corev1.PodCondition) {
	w.mu.Lock()
	w.pending[pod.UID] = pendingCondition{namespace: pod.Namespace, name: pod.Name, cond: c}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Forget drops what was queued for a pod.
func (w *PodConditionWriter) Forget(uid types.UID) {
	w.mu.Lock()
	delete(w.pending, uid)
	w.mu.Unlock()
}

// Writes and Failures count the patches made and failed.
func (w *PodConditionWriter) Writes() int64   { return w.writes.Load() }
func (w *PodConditionWriter) Failures() int64 { return w.failures.Load() }

// Run writes what is queued until ctx is done. After a failed round it waits (1 s,
// doubling up to a minute) before the next, also when new conditions arrive.
func (w *PodConditionWriter) Run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
		}
		if w.flush(ctx) {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, retryAfter), maxRetryAfter)
	}
}

// flush writes every queued condition once; it reports whether all succeeded (or were
// dropped: the pod is gone). A failed one goes back in the queue unless replaced.
func (w *PodConditionWriter) flush(ctx context.Context) bool {
	w.mu.Lock()
	batch := w.pending
	w.pending = map[types.UID]pendingCondition{}
	w.mu.Unlock()
	ok := true
	for uid, p := range batch {
		if ctx.Err() != nil {
			return true
		}
		err := w.patch(ctx, uid, p)
		switch {
		case err == nil:
			w.writes.Add(1)
		case errors.Is(err, errPodGone):
			w.log.Debug("pod gone; its condition dropped", "pod", p.namespace+"/"+p.name)
		default:
			w.failures.Add(1)
			ok = false
			w.log.Warn("writing the batch pod condition", "pod", p.namespace+"/"+p.name, "err", err)
			w.mu.Lock()
			if _, newer := w.pending[uid]; !newer {
				w.pending[uid] = p
			}
			w.mu.Unlock()
		}
	}
	return ok
}

// errPodGone: the pod was deleted, or recreated under its name with another UID (the API
// server refuses the patch's UID as a change of an immutable field: Invalid), or refuses
// the condition for good; writing it again cannot succeed.
var errPodGone = errors.New("pod gone")

func (w *PodConditionWriter) patch(ctx context.Context, uid types.UID, p pendingCondition) error {
	body, err := conditionPatch(uid, p.cond)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	err = w.pods.PatchPodStatus(ctx, p.namespace, p.name, types.StrategicMergePatchType, body)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err) {
		return fmt.Errorf("%w: %w", errPodGone, err)
	}
	if err != nil {
		return fmt.Errorf("patching pods/status of %s/%s: %w", p.namespace, p.name, err)
	}
	return nil
}

// conditionPatch is the strategic merge patch that sets one pod condition (conditions
// merge by type) on the pod with uid: the API server refuses it (Invalid: metadata.uid is
// immutable) when the pod's UID differs.
func conditionPatch(uid types.UID, c corev1.PodCondition) ([]byte, error) {
	type meta struct {
		UID types.UID `json:"uid"`
	}
	type status struct {
		Conditions []corev1.PodCondition `json:"conditions"`
	}
	b, err := json.Marshal(struct {
		Metadata meta   `json:"metadata"`
		Status   status `json:"status"`
	}{meta{uid}, status{[]corev1.PodCondition{c}}})
	if err != nil {
		return nil, fmt.Errorf("encoding the pod condition patch: %w", err)
	}
	return b, nil
}
