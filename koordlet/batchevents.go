package koordlet

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// This file tells a batch pod's owner, with a Warning event on the pod (kubectl
// describe shows it), when the agent holds the pod back hard: frozen because LS leaves
// batch nothing, or throttled in most of its CFS periods. The plan decides which pods
// hear what (qos.Plan.Notices); evictions have their own events (koordlet/evict). The
// messages carry numbers that change from one interval to the next, so the recorder's
// deduplication (same pod, reason and message) would not hold them back: each pod gets
// each reason at most once per batchEventEvery. The same states also set the pod
// condition qos.ConditionBatchSlowed (the plan decides it too; handoff.go hands it over).

// Reasons of the agent's Warning events on batch pods.
const (
	EventBatchFrozen    = string(qos.NoticeFrozen)
	EventBatchThrottled = string(qos.NoticeThrottled)
)

// batchEventEvery is the shortest time between two events of one reason on one pod.
const batchEventEvery = 5 * time.Minute

// batchEvents records the agent's Warning events on batch pods, each reason at most once
// per batchEventEvery on a pod. Not safe for concurrent use (the control loop's).
type batchEvents struct {
	rec  eventRecorder
	last map[batchEventKey]time.Time
}

type batchEventKey struct {
	uid    types.UID
	reason string
}

func newBatchEvents(rec eventRecorder) *batchEvents {
	return &batchEvents{rec: rec, last: map[batchEventKey]time.Time{}}
}

// warn records the notice's event unless the pod had one of that reason within
// batchEventEvery. Entries older than that are dropped as the map grows past the pods it
// serves (pods: how many the agent knows).
func (e *batchEvents) warn(n qos.Notice, now time.Time, pods int) {
	k := batchEventKey{n.UID, string(n.Kind)}
	if t, ok := e.last[k]; ok && now.Sub(t) < batchEventEvery && !now.Before(t) {
		return
	}
	if len(e.last) > 2*pods+16 {
		for key, t := range e.last {
			if now.Sub(t) >= batchEventEvery || now.Before(t) {
				delete(e.last, key)
			}
		}
	}
	e.last[k] = now
	e.rec.Warn(podRef(n.Namespace, n.Name, n.UID), string(n.Kind), n.Message)
}

// podRef is what an event or a condition needs of a pod: its namespace, name and UID.
func podRef(namespace, name string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uid}}
}
