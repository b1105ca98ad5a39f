package devices

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// Where a container with the time-slice shim sees it, and its report directory. Both
// below one directory of their own, which no image is expected to use.
const (
	// ShimContainerDir holds the shim's two mounts in the container.
	ShimContainerDir = "/understory-tsg"
	// ShimContainerPath is the shim library in the container (bind-mounted read-only
	// from the host file the agent installed): the path LD_PRELOAD names.
	ShimContainerPath = ShimContainerDir + "/libunderstory-tsg.so"
	// ShimContainerReportDir is the container's report directory (bind-mounted
	// read-write from its own host directory): UNDERSTORY_TSG_REPORT.
	ShimContainerReportDir = ShimContainerDir + "/report"
	// EnvLDPreload is the dynamic loader's preload list.
	EnvLDPreload = "LD_PRELOAD"
	// ShimReportMaxBytes bounds each report file the shim writes
	// (UNDERSTORY_TSG_REPORT_MAX_BYTES): the agent reads no more of a file than this.
	ShimReportMaxBytes = 256 << 10
)

// ErrTimeslicePlanner: the time-slice planner failed or answered out of range. The
// container starts without the shim (its contexts count as unconfirmed, the freeze
// protects LS); it is never refused for it.
var ErrTimeslicePlanner = errors.New("time-slice planning failed")

// TimesliceRequest is one container asking, at its creation, whether it runs with the
// time-slice shim and with which slice.
type TimesliceRequest struct {
	// GPUs are the devices the container gets (the extender's annotation).
	GPUs []GPU
	// PodUID, Namespace, Name and Container name the container.
	PodUID          types.UID
	Namespace, Name string
	Container       string
	// Batch: the pod is of the batch class (batch's short slice; else LS's long one).
	Batch bool
	// RequestMilli is the container's understory.io/gpu-milli request (0..1000).
	RequestMilli int64
}

// TimesliceClient is how a container runs with the shim. The zero value is none.
type TimesliceClient struct {
	// SliceUS is UNDERSTORY_TSG_TIMESLICE_US, 1..timeslice.MaxTimesliceUS.
	SliceUS uint64
	// Library is the shim on the host (mounted read-only at ShimContainerPath).
	Library string
	// ReportDir is the container's report directory on the host, created by the
	// planner (mounted read-write at ShimContainerReportDir).
	ReportDir string
	// Why says why the container gets no shim (with ok false).
	Why string
}

// TimeslicePlanner decides a container's shim. ok false (no error): no shim, Why says
// why (the feature's library is missing, the GPU runs MPS or is in MIG mode, ...).
type TimeslicePlanner interface {
	TimesliceClient(req TimesliceRequest) (TimesliceClient, bool, error)
}

// TimesliceContainer is what the decision needs of one container.
type TimesliceContainer struct {
	// Pod and Container name it; Pod nil: no shim.
	Pod       *corev1.Pod
	Container string
	// Batch: the pod is of the batch class.
	Batch bool
	// GPUs are the shared GPUs it gets (understory.io/gpu-milli; whole GPUs get none).
	GPUs []GPU
	// RequestMilli is its gpu-milli request.
	RequestMilli int64
	// MPSClient: it runs as an MPS client; those share one context, slices do not apply.
	MPSClient bool
	// Env is its environment as the runtime creates it ("KEY=value").
	Env []string
}

// TimesliceDecision is the shim part of a container's creation.
type TimesliceDecision struct {
	// OK: the container gets the shim, as Client says.
	OK     bool
	Client TimesliceClient
	// Env is what to set (nil: nothing): LD_PRELOAD (the shim first, then the
	// container's own list), UNDERSTORY_TSG_TIMESLICE_US, UNDERSTORY_TSG_REPORT and
	// UNDERSTORY_TSG_REPORT_MAX_BYTES, overriding the container's own values.
	Env map[string]string
	// Mounts are the shim (read-only) and the report directory (read-write).
	Mounts []MPSMount
	// Skipped says why a shared-GPU container gets no shim; "" when it gets it or uses
	// no shared GPU.
	Skipped string
	// Err is the planner's failure (the container starts without the shim).
	Err error
}

// DecideTimeslice decides whether and how a shared-GPU container runs with the
// time-slice shim (docs/gpu.md, "Per-context time slices"). A nil planner (the feature
// off), a container without shared GPUs, or an MPS client gets nothing. A planner's
// failure or an out-of-range answer never refuses the container: it starts without the
// shim, its contexts count as unconfirmed and the freeze protects LS.
//
// LD_PRELOAD: the shim goes first and the container's own list (as the dynamic loader
// reads it: the last LD_PRELOAD of the environment) follows, separated by a space, with
// any entry naming the shim's path dropped. First, because the loader binds ioctl to the
// first preloaded library that defines it: the shim then sees every ioctl the program
// makes through libc, and a preloaded library of the container's own that wraps ioctl
// too sees the shim's calls after it.
func DecideTimeslice(p TimeslicePlanner, c TimesliceContainer) TimesliceDecision {
	var d TimesliceDecision
	switch {
	case p == nil || len(c.GPUs) == 0 || c.Pod == nil:
		return d
	case c.MPSClient:
		d.Skipped = "it runs as an MPS client (one context for every client: slices do not apply)"
		return d
	}
	req := TimesliceRequest{GPUs: c.GPUs, PodUID: c.Pod.UID, Namespace: c.Pod.Namespace, Name: c.Pod.Name,
		Container: c.Container, Batch: c.Batch, RequestMilli: c.RequestMilli}
	cl, ok, err := p.TimesliceClient(req)
	switch {
	case err != nil:
		d.Err, d.Skipped = fmt.Errorf("%w: %w", ErrTimeslicePlanner, err), "planning failed"
		return d
	case !ok:
		d.Skipped = cl.Why
		if d.Skipped == "" {
			d.Skipped = "no slice for its GPU"
		}
		return d
	}
	if err := checkTimesliceClient(cl); err != nil {
		d.Err, d.Skipped = err, "planning failed"
		return d
	}
	d.OK, d.Client = true, cl
	d.Env = map[string]string{
		EnvLDPreload:                preloadWithShim(c.Env),
		timeslice.EnvTimesliceUS:    strconv.FormatUint(cl.SliceUS, 10),
		timeslice.EnvReport:         ShimContainerReportDir,
		timeslice.EnvReportMaxBytes: strconv.Itoa(ShimReportMaxBytes),
	}
	d.Mounts = []MPSMount{
		{Source: cl.Library, Destination: ShimContainerPath, ReadOnly: true},
		{Source: cl.ReportDir, Destination: ShimContainerReportDir},
	}
	return d
}

// checkTimesliceClient refuses an answer that would inject nonsense.
func checkTimesliceClient(cl TimesliceClient) error {
	clean := func(p string) bool {
		return filepath.IsAbs(p) && filepath.Clean(p) == p && p != "/" && !strings.ContainsAny(p, "\x00\n,:= ")
	}
	switch {
	case cl.SliceUS == 0 || cl.SliceUS > timeslice.MaxTimesliceUS:
		return fmt.Errorf("slice %d µs: %w", cl.SliceUS, ErrTimeslicePlanner)
	case !clean(cl.Library):
		return fmt.Errorf("shim library %q: %w", cl.Library, ErrTimeslicePlanner)
	case !clean(cl.ReportDir):
		return fmt.Errorf("report directory %q: %w", cl.ReportDir, ErrTimeslicePlanner)
	}
	return nil
}

// preloadWithShim is LD_PRELOAD with the shim first and the container's own entries
// (the last LD_PRELOAD of env, which is what the dynamic loader reads) after it. The
// loader splits the list at spaces and colons.
func preloadWithShim(env []string) string {
	own, _ := LastEnv(env, EnvLDPreload)
	out := ShimContainerPath
	for _, e := range strings.FieldsFunc(own, func(r rune) bool { return r == ' ' || r == ':' }) {
		if e != ShimContainerPath {
			out += " " + e
		}
	}
	return out
}

// LastEnv returns the value of the last key=value entry of env for key.
func LastEnv(env []string, key string) (string, bool) {
	v, found := "", false
	for _, kv := range env {
		if rest, ok := strings.CutPrefix(kv, key+"="); ok {
			v, found = rest, true
		}
	}
	return v, found
}
