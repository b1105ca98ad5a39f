package qos

import (
	"fmt"
	"math"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
)

// ReportPolicy decides when a node-metrics document is worth writing to the Node.
// The agent measures every nodeMetricsPeriod and asks Due with the new window's
// document; like kubelet's node status (nodeStatusUpdateFrequency against
// nodeStatusReportFrequency), it writes on a material change and otherwise only
// when the last write is MaxInterval old, so that the API server's write load
// follows what changes in the cluster, not its size.
type ReportPolicy struct {
	// MaxInterval is the longest time between two writes (the heartbeat): a
	// document this old (by its timestamps) is written again even when nothing
	// changed. Readers must accept documents up to MaxInterval plus one measuring
	// period old (the extender's -metrics-max-age).
	MaxInterval metav1.Duration `json:"maxInterval,omitempty"`
	// Change is the material change, a fraction (0..1): a new document is written at
	// once when the node's LS CPU or its CPU used outside batch (LS, BE, system) moved
	// by more than Change of its CPU capacity, LS memory or memory used outside batch
	// by more than Change of its memory, a GPU's
	// utilisation, LS utilisation or reclaimable share by more than Change of the
	// device, its memory used by more than Change of its memory, or its LS free
	// share by more than Change of a GPU. 0 writes every window (each write counted
	// as a heartbeat when nothing else changed). Batch usage alone never triggers a
	// write: it moves with the batch pods the scheduler placed itself, which it
	// already counts, and with batch churn it would write on every pod start.
	Change float64 `json:"change,omitempty"`
}

// Report defaults: a write at least every 2 minutes, and at once on a move of 10 %
// of the node (docs/node-metrics.md: how these keep 5 000 nodes under 100 writes a
// second).
const (
	DefaultReportMaxInterval = 2 * time.Minute
	DefaultReportChange      = 0.1
)

// DefaultReportPolicy returns the defaults.
func DefaultReportPolicy() ReportPolicy {
	return ReportPolicy{MaxInterval: metav1.Duration{Duration: DefaultReportMaxInterval}, Change: DefaultReportChange}
}

// Validate checks p: MaxInterval within [1s, 1h], Change within [0, 1).
func (p ReportPolicy) Validate() error {
	if d := p.MaxInterval.Duration; d < time.Second || d > time.Hour {
		return fmt.Errorf("maxInterval: %v must be within [1s, 1h]: %w", d, ErrInvalidConfig)
	}
	if math.IsNaN(p.Change) || p.Change < 0 || p.Change >= 1 {
		return fmt.Errorf("change: %v must be within [0, 1): %w", p.Change, ErrInvalidConfig)
	}
	return nil
}

// ReportReason says why Due wants a write; the agent counts writes by it.
type ReportReason string

// The reasons, in the order Due checks them.
const (
	// ReportFirst: nothing was written yet (or the last write is unknown).
	ReportFirst ReportReason = "first"
	// ReportRetry: the last attempt failed, so the Node may hold an older document.
	ReportRetry ReportReason = "retry"
	// ReportShape: the version, a capacity, the GPU list (count, identity, health,
	// MPS) or the published batch resources changed: facts, not figures.
	ReportShape ReportReason = "shape"
	// ReportGPUAlloc: kubelet's whole-GPU allocation changed (the extender's ledger
	// follows it).
	ReportGPUAlloc ReportReason = "gpu_alloc"
	// ReportCPU, ReportMemory, ReportGPU: a figure moved by more than Change.
	ReportCPU    ReportReason = "cpu"
	ReportMemory ReportReason = "memory"
	ReportGPU    ReportReason = "gpu"
	// ReportHeartbeat: nothing changed materially and the last write is MaxInterval old.
	ReportHeartbeat ReportReason = "heartbeat"
)

// ReportReasons returns every ReportReason.
func ReportReasons() []ReportReason {
	return []ReportReason{ReportFirst, ReportRetry, ReportShape, ReportGPUAlloc, ReportCPU, ReportMemory, ReportGPU,
		ReportHeartbeat}
}

// Due says whether next should be written, given last, the document the Node holds
// (the last one written successfully; nil when none is known), and whether the last
// attempt failed. It compares figures and timestamps only; an empty reason means
// no write.
func (p ReportPolicy) Due(last *contract.NodeMetrics, lastFailed bool, next contract.NodeMetrics) ReportReason {
	switch {
	case last == nil:
		return ReportFirst
	case lastFailed:
		return ReportRetry
	case shapeChanged(last, &next):
		return ReportShape
	case gpuAllocChanged(last.GPU, next.GPU):
		return ReportGPUAlloc
	}
	c := p.Change
	moved := func(a, b, whole int64) bool { return whole > 0 && math.Abs(float64(a-b)) > c*float64(whole) }
	if moved(last.CPU.Used-last.CPU.Batch, next.CPU.Used-next.CPU.Batch, next.CPU.Capacity) ||
		moved(last.CPU.LS, next.CPU.LS, next.CPU.Capacity) {
		return ReportCPU
	}
	if moved(last.Memory.Used-last.Memory.Batch, next.Memory.Used-next.Memory.Batch, next.Memory.Capacity) ||
		moved(last.Memory.LS, next.Memory.LS, next.Memory.Capacity) {
		return ReportMemory
	}
	if next.GPU != nil && gpuMoved(last.GPU.Devices, next.GPU.Devices, c) {
		return ReportGPU
	}
	if c == 0 || next.Timestamp.Sub(last.Timestamp) >= p.MaxInterval.Duration {
		return ReportHeartbeat
	}
	return ""
}

// shapeChanged: what a reader must learn at once whatever its size.
func shapeChanged(a, b *contract.NodeMetrics) bool {
	if a.Version != b.Version || a.CPU.Capacity != b.CPU.Capacity || a.Memory.Capacity != b.Memory.Capacity {
		return true
	}
	if (a.Batch == nil) != (b.Batch == nil) || a.Batch != nil && *a.Batch != *b.Batch {
		return true
	}
	if (a.GPU == nil) != (b.GPU == nil) {
		return true
	}
	if a.GPU == nil {
		return false
	}
	return !slices.EqualFunc(a.GPU.Devices, b.GPU.Devices, func(x, y contract.GPUDevice) bool {
		return x.Index == y.Index && x.UUID == y.UUID && x.Model == y.Model && x.Healthy == y.Healthy &&
			x.MPS == y.MPS && x.MemTotal == y.MemTotal && (x.LSFreeMilli == nil) == (y.LSFreeMilli == nil)
	})
}

func gpuAllocChanged(a, b *contract.GPUMetrics) bool {
	var x, y *contract.GPUAllocation
	if a != nil {
		x = a.Alloc
	}
	if b != nil {
		y = b.Alloc
	}
	if (x == nil) != (y == nil) {
		return true
	}
	if x == nil {
		return false
	}
	if len(x.Pods) != len(y.Pods) {
		return true
	}
	// Pods come in any order (kubelet's), each at most once.
	type podKey struct{ ns, name, uid string }
	devs := make(map[podKey][]int, len(x.Pods))
	for _, p := range x.Pods {
		devs[podKey{p.Namespace, p.Name, p.UID}] = p.Devices
	}
	for _, q := range y.Pods {
		d, ok := devs[podKey{q.Namespace, q.Name, q.UID}]
		if !ok || !sameSet(d, q.Devices) {
			return true
		}
	}
	return false
}

func sameSet(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// gpuMoved compares devices of the same shape (shapeChanged was false).
func gpuMoved(a, b []contract.GPUDevice, c float64) bool {
	for i := range b {
		x, y := a[i], b[i]
		if math.Abs(x.Util-y.Util) > c*100 || math.Abs(x.LSUtil-y.LSUtil) > c*100 ||
			math.Abs(x.Reclaimable-y.Reclaimable) > c ||
			y.MemTotal > 0 && math.Abs(float64(x.MemUsed-y.MemUsed)) > c*float64(y.MemTotal) {
			return true
		}
		if x.LSFreeMilli != nil && y.LSFreeMilli != nil &&
			math.Abs(float64(*x.LSFreeMilli-*y.LSFreeMilli)) > c*contract.MilliPerGPU {
			return true
		}
	}
	return false
}
