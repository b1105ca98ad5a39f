package koordlet

import (
	"fmt"
	"log/slog"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/qos"
)

// Defaults of TimesliceConfig.
const (
	// DefaultTimesliceDirectory is the host directory of the installed shim (lib/) and
	// the containers' report directories (reports/<pod UID>/<container>/); the GPU
	// agent's DaemonSet mounts it at the same path.
	DefaultTimesliceDirectory = "/var/lib/understory/tsg"
	// DefaultTimesliceLibrary is the shim in the GPU agent's image (images.Components).
	DefaultTimesliceLibrary = "/usr/lib/understory/libunderstory-tsg.so"
)

// EventGPUSliceSelfSet is the Warning Event on a pod whose GPU context set itself a
// longer time slice than the agent's.
const EventGPUSliceSelfSet = "GPUSliceSelfSet"

// TimesliceConfig is gpu.timeslice: the feature gate of the per-context GPU time slices
// (docs/gpu.md, "Per-context time slices"), the policy that chooses the slices, and
// where the shim lives.
type TimesliceConfig struct {
	// Enabled (default false): the agent installs the shim, the NRI plugin injects it
	// into shared-GPU containers on GPUs without MPS, and the GPU loop reads its reports
	// and chooses each GPU's lever with qos.ChooseGPUTimeslice. Without an observer
	// outside the tenant every context is unconfirmed, so every GPU where batch runs
	// stays on the freeze (or MPS).
	Enabled bool `json:"enabled"`
	// The policy's fields: lsSlice, batchSlice, switchCost, lsMaxWait,
	// freezeAbovePercent (qos.GPUTimeslicePolicy).
	qos.GPUTimeslicePolicy
	// Directory is the host directory of lib/ and reports/ (absolute).
	Directory string `json:"directory,omitempty"`
	// Library is the shim the agent installs from (a file in its image; absolute).
	Library string `json:"library,omitempty"`
}

// DefaultTimesliceConfig returns gpu.timeslice's defaults: off.
func DefaultTimesliceConfig() TimesliceConfig {
	return TimesliceConfig{GPUTimeslicePolicy: qos.DefaultGPUTimeslicePolicy(), Directory: DefaultTimesliceDirectory,
		Library: DefaultTimesliceLibrary}
}

// Validate checks every field, also with the gate off.
func (c TimesliceConfig) Validate() error {
	if err := c.GPUTimeslicePolicy.Validate(); err != nil {
		return err
	}
	for _, f := range []struct{ key, path string }{{"directory", c.Directory}, {"library", c.Library}} {
		if !filepath.IsAbs(f.path) || filepath.Clean(f.path) != f.path || f.path == "/" {
			return fmt.Errorf("gpu.timeslice.%s: %q must be a clean absolute path: %w", f.key, f.path, ErrInvalidConfig)
		}
	}
	return nil
}

// newTimeslices installs the shim and returns the planner (gpu.timeslice.enabled; nil
// when off). A shim that cannot be installed is logged: the feature then runs without
// it (no container gets the shim, every GPU keeps the freeze).
func newTimeslices(c TimesliceConfig, log *slog.Logger, mpsOn func(uuid string) bool) (*gpu.Timeslices, error) {
	if !c.Enabled {
		return nil, nil
	}
	lib, err := timeslice.Install(c.Library, filepath.Join(c.Directory, gpu.TimesliceLibDir))
	if err != nil {
		log.Warn("GPU time-slice shim not installed; no container gets it, every GPU keeps the freeze", "err", err)
		lib = ""
	} else {
		log.Info("GPU time-slice shim installed", "library", lib, "observer", "none (every context unconfirmed)")
	}
	return gpu.NewTimeslices(gpu.TimesliceOptions{Policy: c.GPUTimeslicePolicy, Directory: c.Directory,
		Library: lib, MPSOn: mpsOn})
}

// TimesliceOptions is the NRI plugin's time-slice planner: the GPU loop's Timeslices,
// or nil with gpu.timeslice off or GPU features off.
func (a *Agent) TimesliceOptions() devices.TimeslicePlanner {
	if a.gpu == nil || a.gpu.tsg == nil {
		return nil
	}
	return a.gpu.tsg
}

// selfSetEvent records a context that set itself a longer slice as a Warning Event on
// its pod. The GPU loop calls it (rate-limited there); the event sinks do not block.
func (m *gpuMPS) selfSetEvent(ev gpu.SelfSetEvent) {
	if m.events == nil {
		return
	}
	m.events.Warn(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace,
		Name: ev.Pod.Name}}, EventGPUSliceSelfSet, ev.Message)
}
