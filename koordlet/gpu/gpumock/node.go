//go:build cgo

package gpumock

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/understory/understory/koordlet/gpu"
)

// Proc is one process on a mock GPU: its host PID, SM and memory utilisation (percent
// of the device) and used memory (bytes).
type Proc struct {
	PID             uint32
	SMUtil, MemUtil uint32
	MemUsed         uint64
	// Batch: its SM time shrinks with the GPU's duty (SetDuty), as a frozen process's would.
	Batch bool
}

// Node is go-nvml's 8-GPU DGX A100 mock whose GPUs run the processes set on them,
// answering like the driver (see the package's traps). It is safe for concurrent use:
// the GPU loop queries it while the test sets processes and duties.
type Node struct {
	srv *dgxa100.Server

	mu    sync.Mutex
	procs map[int][]Proc  // GPU index → processes
	duty  map[int]float64 // GPU index → the duty its batch processes follow
}

// New returns a node with every GPU idle and at duty 0.
func New() *Node {
	n := &Node{srv: dgxa100.New(), procs: map[int][]Proc{}, duty: map[int]float64{}}
	for i, dev := range n.srv.Devices {
		d := dev.(*dgxa100.Device)
		total := d.MemoryInfo.Total
		// v1 counts the driver's reserved memory as used, v2 apart (Reserved).
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			used := min(n.memUsed(i, total)+Reserved, total)
			return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			used := n.memUsed(i, total)
			return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total,
				Reserved: Reserved, Used: used, Free: total - Reserved - used}, nvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			var u nvml.Utilization
			for _, p := range n.now(i) {
				u.Gpu += p.SMUtil
				u.Memory += p.MemUtil
			}
			return nvml.Utilization{Gpu: min(u.Gpu, 100), Memory: min(u.Memory, 100)}, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			ps := n.now(i)
			out := make([]nvml.ProcessInfo, len(ps))
			for k, p := range ps {
				out[k] = nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemUsed}
			}
			return out, nvml.SUCCESS
		}
		d.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			now := uint64(time.Now().UnixMicro())
			var out []nvml.ProcessUtilizationSample
			if now > since {
				for _, p := range n.now(i) {
					if p.SMUtil > 0 || p.MemUtil > 0 {
						out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: now,
							SmUtil: p.SMUtil, MemUtil: p.MemUtil})
					}
				}
			}
			if len(out) == 0 {
				return nil, nvml.ERROR_NOT_FOUND // as the driver: no sample newer than since
			}
			return out, nvml.SUCCESS
		}
	}
	return n
}

// Reserved is the memory the mock driver reserves on every GPU: GetMemoryInfo (v1) counts
// it as used, GetMemoryInfo_v2 reports it apart (615 MiB, as an H200 with driver 580
// showed).
const Reserved = 615 << 20

// memUsed is the memory GPU i's processes hold, bounded by what the driver leaves them.
func (n *Node) memUsed(gpu int, total uint64) uint64 {
	var used uint64
	for _, p := range n.now(gpu) {
		used += p.MemUsed
	}
	return min(used, total-Reserved)
}

// Server is the NVML mock itself (an nvml.Interface), for callers that open their own
// collector or query it directly.
func (n *Node) Server() *dgxa100.Server { return n.srv }

// Set replaces the processes of a GPU (none: idle).
func (n *Node) Set(gpu int, procs ...Proc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs[gpu] = slices.Clone(procs)
}

// SetDuty sets the duty, the frozen share of time, that a GPU's batch processes follow:
// a fraction in [0, 1], clamped there (NaN reads 0).
func (n *Node) SetDuty(gpu int, duty float64) {
	if !(duty > 0) {
		duty = 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.duty[gpu] = min(duty, 1)
}

// Procs returns a GPU's processes as the driver would report them now: a batch
// process computes only while its pod is thawed, so its SM utilisation is scaled
// by (1 - the GPU's duty). The slice is the caller's.
func (n *Node) Procs(gpu int) []Proc { return slices.Clone(n.now(gpu)) }

// now is Procs for the mock's own queries, without a copy at duty 0: bench/gpubench
// times the collector through the mock, whose answers must stay close to free. The
// slice is read-only (Set replaces a GPU's slice, never writes into it).
func (n *Node) now(gpu int) []Proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	ps, duty := n.procs[gpu], n.duty[gpu]
	if duty == 0 {
		return ps
	}
	out := slices.Clone(ps)
	for i := range out {
		if out[i].Batch {
			out[i].SMUtil = uint32(float64(out[i].SMUtil) * (1 - duty))
		}
	}
	return out
}

// Collector initialises the mock (as gpu.NewCollector wants) and opens a collector
// over it that attributes processes through procRoot (see WriteProc). The collector's
// Close shuts the mock down.
func (n *Node) Collector(procRoot string) (*gpu.Collector, error) {
	if ret := n.srv.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialising the NVML mock: %w", ret)
	}
	return gpu.NewCollector(n.srv, procRoot)
}
