package clusterbench

import (
	"context"
	"encoding/json"
	"math"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/qos"
)

// agentNode is the agent stand-in's state for one node: the agent's own Reclaimer
// and Budgeter (package qos), one of each per node for the run, as the agent keeps
// them for its life.
type agentNode struct {
	i     int
	n     benchNode
	rec   *qos.Reclaimer
	bud   *qos.Budgeter
	start time.Time // of the node-metrics window
	// node-metrics window sums
	k, sumUsed, sumLS, sumBatch, sumBudget float64
	published                              *contract.BatchResources
	metricsOffset                          time.Duration
	// lastMetrics is the node-metrics document last sent (nil before the first).
	lastMetrics *contract.NodeMetrics
}

// usage is what the tracker knows a node's batch pods hold (atomics: the tracker
// writes, the agent reads).
type usage struct {
	cpuMilli, memBytes, gpuMilli atomic.Int64
}

// second is the cluster's figures over one tick, summed over the nodes.
type second struct {
	capCPU, lsCPU, sysCPU, batchUsedCPU, batchAllocCPU, lsReqCPU float64
	capMem, lsMem, batchAllocMem                                 float64
	gpuMilli, gpuAlloc                                           float64
	publishedCPU                                                 float64
	nodes, oversubCPU, oversubMem                                int
}

func (s *second) add(o second) {
	s.capCPU += o.capCPU
	s.lsCPU += o.lsCPU
	s.sysCPU += o.sysCPU
	s.batchUsedCPU += o.batchUsedCPU
	s.batchAllocCPU += o.batchAllocCPU
	s.lsReqCPU += o.lsReqCPU
	s.capMem += o.capMem
	s.lsMem += o.lsMem
	s.batchAllocMem += o.batchAllocMem
	s.gpuMilli += o.gpuMilli
	s.gpuAlloc += o.gpuAlloc
	s.publishedCPU += o.publishedCPU
	s.nodes += o.nodes
	s.oversubCPU += o.oversubCPU
	s.oversubMem += o.oversubMem
}

// standIn acts for the agents of every node.
type standIn struct {
	client  kubernetes.Interface
	trace   *LSTrace
	nodes   []*agentNode
	used    []usage
	tick    time.Duration
	nmEvery time.Duration
	report  qos.ReportPolicy
	sysFrac float64
	origin  time.Time

	statusPatches, metricsPatches, patchErrors atomic.Int64
	// metricsByReason counts node-metrics writes by qos.ReportReason.
	metricsByReason sync.Map // qos.ReportReason -> *atomic.Int64
	writes          chan func(ctx context.Context) error

	mu     sync.Mutex
	series []second // one per tick since measureFrom
	from   time.Time
}

func newStandIn(c kubernetes.Interface, tr *LSTrace, nodes []benchNode, used []usage, o Options) *standIn {
	s := &standIn{client: c, trace: tr, used: used, tick: o.AgentTick, nmEvery: o.NodeMetricsPeriod,
		report: o.NodeMetricsReport, sysFrac: o.SystemCPUFraction, writes: make(chan func(ctx context.Context) error, 4096)}
	pol := qos.DefaultPolicy()
	// The agent's Budgeter runs every 100 ms control period; here it runs every tick,
	// so its per-period restore step is scaled to grow as fast per second.
	pol.RestoreStepPercent = math.Min(100, pol.RestoreStepPercent*o.AgentTick.Seconds()/0.1)
	s.origin = time.Now().Add(s.tick).Truncate(s.tick)
	for i, n := range nodes {
		s.nodes = append(s.nodes, &agentNode{i: i, n: n, rec: qos.NewReclaimer(qos.DefaultReclaimConfig()),
			bud:           qos.NewBudgeter(pol),
			metricsOffset: time.Duration(int64(o.NodeMetricsPeriod) * int64(i) / int64(max(len(nodes), 1)))})
	}
	return s
}

// measure starts the series at the first tick at or after t (ticks are origin + k
// ticks, so every worker's tick k falls in one bucket) and returns that time.
func (s *standIn) measure(t time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := (t.Sub(s.origin) + s.tick - 1) / s.tick
	s.from, s.series = s.origin.Add(k*s.tick), nil
	return s.from
}

func (s *standIn) snapshot() []second {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]second(nil), s.series...)
}

// run ticks every node until ctx ends, workers goroutines each owning a slice of
// the nodes.
func (s *standIn) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	s.writers(ctx, 32, &wg)
	for w := range workers {
		wg.Go(func() {
			// Every worker ticks at origin + k ticks.
			time.Sleep(time.Until(s.origin))
			tk := time.NewTicker(s.tick)
			defer tk.Stop()
			for {
				now := time.Now()
				var sum second
				for i := w; i < len(s.nodes); i += workers {
					sum.add(s.step(ctx, s.nodes[i], now))
				}
				s.record(now, sum)
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
			}
		})
	}
	wg.Wait()
}

func (s *standIn) record(now time.Time, sum second) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.from.IsZero() || now.Before(s.from.Add(-s.tick/2)) {
		return
	}
	k := int((now.Sub(s.from) + s.tick/2) / s.tick)
	for len(s.series) <= k {
		s.series = append(s.series, second{})
	}
	s.series[k].add(sum)
}

// step is one control period of one node's agent: the LS sample from the trace, the
// Reclaimer's decision (patched to the Node's status when it says Write), the
// Budgeter's batch CPU budget (what batch may run: its usage is min(requests,
// budget)), and every nmEvery the node-metrics window, written when the agent's
// report policy (qos.ReportPolicy) says it is due.
func (s *standIn) step(ctx context.Context, a *agentNode, now time.Time) second {
	capCPU := float64(a.n.shape.CPUMilli) / 1000
	capMem := float64(a.n.shape.MemBytes)
	smp := s.trace.At(a.i, now.Sub(s.origin))
	ls, lsMem := smp.CPU*capCPU, smp.Memory*capMem
	sys := s.sysFrac * capCPU
	u := &s.used[a.i]
	bCPU, bMem := float64(u.cpuMilli.Load())/1000, float64(u.memBytes.Load())
	r := a.rec.Next(qos.ReclaimInput{Now: now,
		CPU: qos.ResourceUsage{Capacity: capCPU, LSUsage: ls, LSRequest: a.n.lsCPUReq * capCPU,
			SystemUsage: sys, BatchRequest: bCPU},
		Memory: qos.ResourceUsage{Capacity: capMem, LSUsage: lsMem, LSRequest: a.n.lsMemReq * capMem,
			BatchRequest: bMem}})
	if r.CPU.Write || r.Memory.Write {
		res := nodestatus.Resources{CPUMilli: r.BatchCPUMilli(), MemoryBytes: r.BatchMemoryBytes()}
		if body, err := nodestatus.PatchFor(res); err == nil {
			name := a.n.name
			s.statusPatches.Add(1)
			s.enqueue(ctx, func(ctx context.Context) error {
				_, err := s.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
				return err
			})
			a.published = &contract.BatchResources{CPU: res.CPUMilli, Memory: res.MemoryBytes}
		}
	}
	b := a.bud.Next(qos.BudgetInput{NodeCPUs: capCPU, LSUsage: ls, SystemUsage: sys})
	batchUsed := math.Min(bCPU, b.Applied)
	// Node metrics, as the agent's publisher: window means, one patch per window
	// that the report policy finds due. A sent patch counts as written (a failed one
	// is counted in patchErrors, which fails the smoke check).
	if a.start.IsZero() {
		a.start = now.Add(-a.metricsOffset)
	}
	a.k++
	a.sumUsed += ls + sys + batchUsed
	a.sumLS += ls
	a.sumBatch += batchUsed
	a.sumBudget += b.Applied
	if el := now.Sub(a.start); el >= s.nmEvery {
		nm := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: now.UTC(),
			WindowMillis: el.Milliseconds(),
			CPU: contract.CPUMetrics{Capacity: milli(capCPU), Used: milli(a.sumUsed / a.k), LS: milli(a.sumLS / a.k),
				Batch: milli(a.sumBatch / a.k), BatchBudget: milli(a.sumBudget / a.k)},
			Memory: contract.MemoryMetrics{Capacity: int64(capMem), Used: int64(lsMem + bMem), LS: int64(lsMem),
				Batch: int64(bMem)},
			Batch: a.published}
		a.start, a.k, a.sumUsed, a.sumLS, a.sumBatch, a.sumBudget = now, 0, 0, 0, 0, 0
		if reason := s.report.Due(a.lastMetrics, false, nm); reason != "" && s.publishMetrics(ctx, a.n.name, nm) {
			a.lastMetrics = &nm
			c, _ := s.metricsByReason.LoadOrStore(reason, new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
		}
	}
	out := second{capCPU: capCPU, lsCPU: ls, sysCPU: sys, batchUsedCPU: batchUsed, batchAllocCPU: bCPU,
		lsReqCPU: a.n.lsCPUReq * capCPU, capMem: capMem, lsMem: lsMem, batchAllocMem: bMem,
		gpuMilli: float64(a.n.shape.GPUs * contract.MilliPerGPU), gpuAlloc: float64(u.gpuMilli.Load()), nodes: 1}
	if a.published != nil {
		out.publishedCPU = float64(a.published.CPU) / 1000
	}
	// LS oversubscribed: what LS uses plus what the agent lets batch run (CPU), or
	// plus what batch pods hold (memory: it cannot be taken back), above allocatable.
	if ls+sys+batchUsed > capCPU*(1+1e-9) {
		out.oversubCPU = 1
	}
	if lsMem+bMem > capMem*(1+1e-9) {
		out.oversubMem = 1
	}
	return out
}

// publishMetrics writes both node-metrics annotations in one merge patch, as the
// agent's NodeAnnotator does (koordlet/nodestatus, NodeAnnotator).
// It reports whether the patch was sent.
func (s *standIn) publishMetrics(ctx context.Context, node string, nm contract.NodeMetrics) bool {
	vals, err := nm.EncodeAnnotations()
	if err != nil {
		s.patchErrors.Add(1)
		return false
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": vals}})
	if err != nil {
		s.patchErrors.Add(1)
		return false
	}
	s.metricsPatches.Add(1)
	s.enqueue(ctx, func(ctx context.Context) error {
		_, err := s.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	})
	return true
}

// metricsWrites returns the node-metrics writes so far by reason.
func (s *standIn) metricsWrites() map[string]int64 {
	out := map[string]int64{}
	s.metricsByReason.Range(func(k, v any) bool {
		out[string(k.(qos.ReportReason))] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// enqueue hands a write to the writer pool (as each agent writes off its control
// loop); it blocks while the pool's queue is full.
func (s *standIn) enqueue(ctx context.Context, w func(ctx context.Context) error) {
	select {
	case s.writes <- w:
	case <-ctx.Done():
	}
}

// writers runs n writer goroutines until ctx ends.
func (s *standIn) writers(ctx context.Context, n int, wg *sync.WaitGroup) {
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case w := <-s.writes:
					rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					if err := w(rctx); err != nil && ctx.Err() == nil {
						s.patchErrors.Add(1)
					}
					cancel()
				}
			}
		})
	}
}

func milli(cores float64) int64 {
	if math.IsNaN(cores) || cores < 0 {
		return 0
	}
	return int64(math.Round(cores * 1000))
}
