package koordlet

import (
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// This file tells a batch pod's owner, with a Warning event on the pod (kubectl
// describe shows it), when the agent holds the pod back hard: frozen because LS leaves
// batch nothing, or throttled in most of its CFS periods. Evictions have their own
// events (koordlet/evict). The messages carry numbers that change from one interval to
// the next, so the recorder's deduplication (same pod, reason and message) would not
// hold them back: each pod gets each reason at most once per batchEventEvery. The same
// states also set the pod condition qos.ConditionBatchSlowed (batchcondition.go).

// Reasons of the agent's Warning events on batch pods.
const (
	EventBatchFrozen    = "BatchFrozen"
	EventBatchThrottled = "BatchThrottled"
)

// batchEventEvery is the shortest time between two events of one reason on one pod.
const batchEventEvery = 5 * time.Minute

// batchEvents records the agent's Warning events on batch pods, each reason at most once
// per batchEventEvery on a pod. Not safe for concurrent use (the control loop's).
type batchEvents struct {
	rec  eventRecorder
	last map[batchEventKey]time.Time
	// cond sets the batch pod condition (batchcondition.go); nil: none (static mode).
	cond *batchConditions
	// freezeMsg is the last freeze's message, the Frozen condition's while it lasts.
	freezeMsg string
}

type batchEventKey struct {
	uid    types.UID
	reason string
}

func newBatchEvents(rec eventRecorder) *batchEvents {
	return &batchEvents{rec: rec, last: map[batchEventKey]time.Time{}}
}

// warn records one event unless the pod had one of that reason within batchEventEvery.
// Entries older than that are dropped as the map grows past the pods it serves.
func (e *batchEvents) warn(st *podState, reason, msg string, now time.Time, pods int) {
	k := batchEventKey{st.uid, reason}
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
	e.rec.Warn(podRef(st), reason, msg)
}

// podRef is what an event needs of a pod: its namespace, name and UID.
func podRef(st *podState) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: st.namespace, Name: st.name, UID: st.uid}}
}

// eventful reports whether a pod gets the agent's batch events: a batch pod the agent
// knows by name (not a static pod read from a manifest without one) that is not being
// deleted.
func eventful(st *podState) bool {
	return st.class == qos.ClassBatch && st.namespace != "" && st.name != "" && !st.terminating
}

// frozen records that batch was frozen (d.Froze) on every batch pod, with the numbers
// behind it: what LS and the system leave batch (b.Raw) against the floor (b.Min), and
// for how long.
func (e *batchEvents) frozen(pods []*podState, d qos.EscalationDecision, b qos.Budget, now time.Time) {
	msg := fmt.Sprintf("frozen by the node agent: LS (%.2f cores) and the system (%.2f) leave batch %.2f of %.0f CPUs, "+
		"below its floor of %.2f, for %v; it is thawed once LS leaves room again", b.LSUsage, b.SystemUsage,
		math.Max(0, b.Raw), b.NodeCPUs, b.Min, d.StarvedFor.Duration.Round(time.Second))
	e.freezeMsg = msg
	for _, st := range pods {
		if eventful(st) {
			e.warn(st, EventBatchFrozen, msg, now, len(pods))
		}
	}
}

// throttled records, for each group throttled hard (qos.HardThrottled) over the last
// statistics interval, an event on its pods: an in-place pod's own, or every batch pod
// below the tier for the tier's. quota is each group's CFS limit in force (cores; the
// tier's is tierQuota), budget the batch budget in force.
func (e *batchEvents) throttled(pods []*podState, ts []throttling, tierQuota, budget float64, interval time.Duration,
	now time.Time) {
	for _, t := range ts {
		share, hard := qos.HardThrottled(t.periods, t.throttled)
		if !hard {
			continue
		}
		if t.st != nil {
			if eventful(t.st) {
				e.warn(t.st, EventBatchThrottled, throttledMessage("its", share, t, t.st.quota.Cores, budget, interval), now,
					len(pods))
			}
			continue
		}
		msg := throttledMessage("the batch tier's", share, t, tierQuota, budget, interval)
		for _, st := range pods {
			if st.inTier && eventful(st) {
				e.warn(st, EventBatchThrottled, msg, now, len(pods))
			}
		}
	}
}

// throttledMessage says how hard a group was throttled, at which quota, and why.
func throttledMessage(whose string, share float64, t throttling, quota, budget float64, interval time.Duration) string {
	q := "an unknown quota"
	if !math.IsNaN(quota) && quota >= 0 {
		q = fmt.Sprintf("a quota of %.2f cores", quota)
	}
	return fmt.Sprintf("throttled by the node agent in %d%% of its CFS periods over the last %v (%d of %d) at %s "+
		"(%s share of the batch budget, %.2f cores: what LS leaves)", int(math.Round(100*share)), interval.Round(time.Second),
		t.throttled, t.periods, q, whose, budget)
}
