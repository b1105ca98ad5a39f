package koordlet

import (
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the apply step's part that goes to the API server: the plan's batch
// resources to the Node writer, its events to the event recorder and its pod conditions
// to the condition writer. Each of those writes from its own goroutine; nothing here
// waits for the API server.

// podConditionSink takes the condition to write on a pod, without blocking.
type podConditionSink interface {
	Set(pod *corev1.Pod, c corev1.PodCondition)
	Forget(uid types.UID)
}

var _ podConditionSink = (*nodestatus.PodConditionWriter)(nil)

// handoff hands the plan's API writes to their writers.
type handoff struct {
	metrics *metrics.Agent
	log     *slog.Logger
	// batchSink writes the batch resources to the Node; nil in static mode.
	batchSink batchResourceSink
	// events records the notices (at most one a reason every batchEventEvery on a pod).
	events *batchEvents
	// conditions writes the pod condition; nil: none (static mode).
	conditions podConditionSink
}

// send hands over the plan's batch resources (when the reclaimer decided a write is
// due: a drop, a rise past the deadband, a refresh), its events, and its pod conditions
// (the pods forgotten first). pods is how many pods the agent knows.
func (h *handoff) send(p qos.Plan, pods int, now time.Time) {
	if p.Reclaim {
		h.publish(p.Reclaimed)
	}
	for _, n := range p.Notices {
		h.events.warn(n, now, pods)
	}
	if h.conditions == nil {
		return
	}
	for _, uid := range p.Forget {
		h.conditions.Forget(uid)
	}
	for _, c := range p.Conditions {
		h.conditions.Set(podRef(c.Namespace, c.Name, c.UID), c.Condition.PodCondition())
	}
}

// publish hands the published batch resources to the Node writer when a write is due.
// Values the reclaimer had to clamp or sanitise are logged and counted.
func (h *handoff) publish(r qos.Reclaimed) {
	for _, t := range []struct {
		name  string
		terms qos.ReclaimTerms
	}{{"cpu", r.CPU}, {"memory", r.Memory}} {
		if t.terms.Sanitized != "" && t.terms.Write {
			h.metrics.Errors.WithLabelValues(metrics.ErrKindBatchResource).Inc()
			h.log.Warn("batch resource computed from unusable inputs; clamped", "resource", t.name,
				"note", t.terms.Sanitized, "published", t.terms.Published)
		}
	}
	if h.batchSink == nil || !(r.CPU.Write || r.Memory.Write) {
		return
	}
	if h.batchSink.Set(nodestatus.Resources{CPUMilli: r.BatchCPUMilli(), MemoryBytes: r.BatchMemoryBytes()}) {
		h.metrics.Errors.WithLabelValues(metrics.ErrKindBatchResource).Inc()
	}
}

// batchResourceSink writes the batch resources to the agent's own Node
// (nodestatus.Publisher): Set never blocks, the writer retries on its own.
type batchResourceSink interface {
	Set(r nodestatus.Resources) (clamped bool)
	Status() nodestatus.Status
}

var _ batchResourceSink = (*nodestatus.Publisher)(nil)

// exportReclaim sets understory_batch_resource{resource,term} for one resource.
func exportReclaim(m *metrics.Agent, resource string, t qos.ReclaimTerms) {
	g := m.BatchResource
	for _, kv := range []struct {
		term string
		v    float64
	}{
		{"capacity", t.Capacity}, {"threshold", t.Threshold}, {"ls_usage", t.LSUsage},
		{"ls_recent", t.LSRecent}, {"ls_window_percentile", t.LSWindowPercentile}, {"ls_request", t.LSRequest},
		{"ls_term", t.LSTerm}, {"be_usage", t.BEUsage}, {"system_usage", t.SystemUsage}, {"raw", t.Raw},
		{"batch_request", t.BatchRequest}, {"computed", t.Computed}, {"published", t.Published},
	} {
		g.WithLabelValues(resource, kv.term).Set(kv.v)
	}
}

// writtenBatch is what the Node writer last wrote, for the node-metrics annotation; nil
// until the first write (and in static mode).
func writtenBatch(sink batchResourceSink) *contract.BatchResources {
	if sink == nil {
		return nil
	}
	w := sink.Status().Written
	if w == nil {
		return nil
	}
	return &contract.BatchResources{CPU: w.CPUMilli, Memory: w.MemoryBytes}
}

// The events tell a batch pod's owner, with a Warning event on the pod (kubectl
// describe shows it), when the agent holds the pod back hard: frozen because LS leaves
// batch nothing, or throttled in most of its CFS periods. The plan decides which pods
// hear what (qos.Plan.Notices); evictions have their own events (koordlet/evict). The
// messages carry numbers that change from one interval to the next, so the recorder's
// deduplication (same pod, reason and message) would not hold them back: each pod gets
// each reason at most once per batchEventEvery. The same states also set the pod
// condition qos.ConditionBatchSlowed (the plan decides it too; the handoff hands it over).

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
