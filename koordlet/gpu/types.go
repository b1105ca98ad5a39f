package gpu

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Sentinel errors callers branch on.
var (
	// ErrNoNVML means NVML cannot be used here: the build has no cgo, or the driver's
	// library (libnvidia-ml.so.1) is missing, or nvmlInit failed. GPU features turn off.
	ErrNoNVML = errors.New("NVML unavailable")
	// ErrDeviceLost means a GPU fell off the bus or stopped answering mid-run
	// (NVML ERROR_GPU_IS_LOST); the device is reported unhealthy, never fatal.
	ErrDeviceLost = errors.New("GPU lost")
	// ErrNVMLPanic means a go-nvml call panicked instead of returning an error (its
	// GetProcessUtilization slices past its buffer when samples arrive between its two
	// driver calls). The collector recovers it: that read yields no sample.
	ErrNVMLPanic = errors.New("go-nvml panicked")
)

// Scrape is how much of one GPU a Collect reads.
type Scrape uint8

const (
	// ScrapeFull reads every figure of the GPU: memory, utilisation, the processes, their
	// utilisation, and attributes the processes to pods.
	ScrapeFull Scrape = iota
	// ScrapeProbe lists only the GPU's compute processes: one NVML call, no /proc read.
	// When the list holds the PIDs of the GPU's last full scrape, that scrape's Device
	// is returned again (Device.Probed); when it differs, the GPU has no healthy full
	// scrape, or the probe fails, the GPU is read in full.
	ScrapeProbe
	// ScrapeUtil is a probe that also reads the GPU's own utilisation (two NVML calls,
	// no per-process utilisation, no /proc read). When the list holds the PIDs of the
	// GPU's last full scrape, that scrape's Device is returned with the utilisation of
	// now (Device.Probed and Device.UtilNow); otherwise as ScrapeProbe. The loop asks for
	// it only while it holds the GPU's batch pods frozen: then nothing of batch computes
	// there, the GPU's own utilisation is that of the other processes, and the driver's
	// per-process utilisation, its dearest query (83–92 % of the agent's CPU on an
	// H200), could not change the decision.
	ScrapeUtil
)

// String names the scrape in /status.
func (s Scrape) String() string {
	switch s {
	case ScrapeProbe:
		return "probe"
	case ScrapeUtil:
		return "util"
	}
	return "full"
}

// Source is where GPU samples come from: the NVML collector (Open, NewCollector), or a
// fake in tests.
type Source interface {
	// Collect scrapes every GPU once. now stamps the Sample and bounds how old the
	// per-process samples asked from the driver may be. plan[i] says how much of GPU
	// index i to read; a GPU past its end (a nil plan: every GPU) is read in full. An
	// error means no Sample at all (NVML unusable, closed, ctx done); one device
	// failing only marks that device unhealthy.
	Collect(ctx context.Context, now time.Time, plan []Scrape) (Sample, error)
	// Close releases NVML. Collect fails afterwards.
	Close() error
}

// Sample is one scrape of every GPU on the node.
type Sample struct {
	Time    time.Time
	Devices []Device
}

// Device is one GPU at one scrape. Utilisation figures are percent (0..100) over the
// driver's last sample window; memory is bytes.
type Device struct {
	Index    int
	UUID     string
	Model    string
	MemTotal uint64
	MemUsed  uint64
	// Util is the device's SM (GPU) utilisation, MemUtil its memory-controller one.
	Util    float64
	MemUtil float64
	// Healthy is false when a query failed this scrape; Err says which and why.
	// The figures after the failed query are zero and mean unknown.
	Healthy bool
	Err     string
	// Fault is the error behind Err, for errors.Is (ErrDeviceLost wraps a GPU that
	// fell off the bus); nil while Healthy.
	Fault error
	// UtilUnsupported: the driver reports no utilisation for this device
	// (ERROR_NOT_SUPPORTED, e.g. a GPU in MIG mode). Util, MemUtil and the
	// processes' SMUtil and MemUtil are then zero and mean unknown, not idle.
	UtilUnsupported bool
	// Processes are the compute processes on the device, with their utilisation where
	// the driver reported it. Shared with later Probed copies: read-only.
	Processes []Process
	// Probed: the Collect only probed the device (ScrapeProbe, ScrapeUtil) and found the
	// processes of its last full scrape, whose figures these are (but for Util and
	// MemUtil where UtilNow); ScrapedAt says when that was.
	Probed bool
	// UtilNow: Util and MemUtil of a Probed device were read by this Collect
	// (ScrapeUtil); its processes' figures are still those of its last full scrape.
	UtilNow bool
	// ScrapedAt is when the figures were read: the Collect's now, or for a Probed
	// device the time of its last full scrape.
	ScrapedAt time.Time
}

// Process is one process using a GPU.
type Process struct {
	PID uint32
	// SMUtil and MemUtil are the process's share of the device (percent) over the last
	// sample window; zero when the driver had no sample for it.
	SMUtil  float64
	MemUtil float64
	// MemUsed is the device memory the process holds, bytes.
	MemUsed uint64
	// Pod is the pod the process belongs to; zero when it could not be attributed
	// (another PID namespace, no cgroup, not a pod cgroup, or it exited).
	Pod PodRef
}

// PodRef names the pod (and container) a process runs in, as read from its cgroup.
type PodRef struct {
	UID types.UID
	// ContainerID is the runtime's container ID (64 hex digits), without a
	// runtime prefix; empty when the cgroup names only the pod.
	ContainerID string
}

// Attributed reports whether the process was mapped to a pod.
func (r PodRef) Attributed() bool { return r.UID != "" }
