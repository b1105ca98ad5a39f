package koordlet

import (
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

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
