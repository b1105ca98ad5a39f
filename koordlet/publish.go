package koordlet

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// nodeMetricsPublisher delivers node metrics to the scheduler (the Node annotation in
// Kubernetes mode).
type nodeMetricsPublisher interface {
	Publish(ctx context.Context, m contract.NodeMetrics) error
}

var _ nodeMetricsPublisher = (*nodestatus.NodeAnnotator)(nil)

// publisher averages the per-period figures over the publishing window and, at the end
// of each window, hands the result to the sink when the report policy says it is due (a
// material change, a failed last write, or the heartbeat), in its own goroutine so a
// slow API server never delays the control loop.
type publisher struct {
	sink    nodeMetricsPublisher
	window  time.Duration
	policy  qos.ReportPolicy
	memory  func() (contract.MemoryMetrics, error)
	written func() *contract.BatchResources
	// gpu returns the GPU section (nil without GPU features); called off the control
	// loop, as it may ask kubelet for its allocation.
	gpu func(ctx context.Context) *contract.GPUMetrics

	start                         time.Time
	n                             float64
	node, ls, batch, budget, cpus float64
	busy                          chan struct{}
	inflight                      sync.WaitGroup
	// last is the document the Node holds (the last successful write; nil before
	// it) and lastFailed whether the attempt after it failed. Only the publishing
	// goroutine touches them: busy lets one run at a time, and its receive at the
	// end of one happens before the send that starts the next.
	last       *contract.NodeMetrics
	lastFailed bool
}

func newPublisher(sink nodeMetricsPublisher, window time.Duration, policy qos.ReportPolicy,
	memory func() (contract.MemoryMetrics, error), written func() *contract.BatchResources) *publisher {
	return &publisher{sink: sink, window: window, policy: policy, memory: memory, written: written,
		busy: make(chan struct{}, 1)}
}

func (p *publisher) add(ctx context.Context, now time.Time, u Usage, b qos.Budget, log *slog.Logger, m *metrics.Agent) {
	if p.start.IsZero() {
		p.start = now
	}
	p.n++
	p.node += u.Node
	p.ls += u.LS + u.UnknownPods
	p.batch += u.Batch
	p.budget += b.Applied
	p.cpus = u.CPUs
	elapsed := now.Sub(p.start)
	if elapsed < p.window {
		return
	}
	nm := contract.NodeMetrics{
		Version: contract.NodeMetricsVersion, Timestamp: now.UTC(), WindowMillis: elapsed.Milliseconds(),
		CPU: contract.CPUMetrics{
			Capacity:    milli(p.cpus),
			Used:        milli(p.node / p.n),
			LS:          milli(p.ls / p.n),
			Batch:       milli(p.batch / p.n),
			BatchBudget: milli(p.budget / p.n),
		},
	}
	if p.written != nil {
		nm.Batch = p.written() // what is on the Node now; nil until the first write
	}
	p.start, p.n, p.node, p.ls, p.batch, p.budget = now, 0, 0, 0, 0, 0
	if p.memory != nil {
		mem, err := p.memory()
		if err != nil {
			log.Warn("node memory unknown in this window's node metrics", "err", err)
		}
		nm.Memory = mem
	}
	select {
	case p.busy <- struct{}{}:
	default:
		log.Warn("previous node-metrics publish still running; skipping this window")
		return
	}
	p.inflight.Go(func() {
		defer func() { <-p.busy }()
		ctx, cancel := context.WithTimeout(ctx, p.window)
		defer cancel()
		if p.gpu != nil {
			if g := p.gpu(ctx); g != nil {
				nm.Version, nm.GPU = contract.NodeMetricsVersion2, g
			}
		}
		reason := p.policy.Due(p.last, p.lastFailed, nm)
		if reason == "" {
			return
		}
		if err := p.sink.Publish(ctx, nm); err != nil {
			p.lastFailed = true
			m.Errors.WithLabelValues(metrics.ErrKindNodePatch).Inc()
			log.Error("publishing node metrics", "reason", reason, "err", err)
			return
		}
		p.last, p.lastFailed = &nm, false
		m.NodeMetricsWrites.WithLabelValues(string(reason)).Inc()
	})
}

// wait blocks until an in-flight publish has returned.
func (p *publisher) wait() { p.inflight.Wait() }

func milli(cores float64) int64 {
	if math.IsNaN(cores) || cores < 0 {
		return 0
	}
	return int64(math.Round(cores * 1000))
}
