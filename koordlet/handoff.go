package koordlet

import (
	"log/slog"
	"time"

	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the apply step's part that goes to the API server: the plan's batch
// resources to the Node writer, its events to the event recorder and its pod conditions
// to the condition writer. Each of those writes from its own goroutine; nothing here
// waits for the API server.

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
