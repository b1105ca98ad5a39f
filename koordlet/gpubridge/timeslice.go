package gpubridge

import (
	"log/slog"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// EventGPUSliceSelfSet is the Warning Event on a pod whose GPU context set itself a
// longer time slice than the agent's.
const EventGPUSliceSelfSet = "GPUSliceSelfSet"

// newTimeslices installs the shim and returns the planner (gpu.timeslice.enabled; nil
// when off). A shim that cannot be installed is logged: the feature then runs without
// it (no container gets the shim, every GPU keeps the freeze).
func newTimeslices(c config.Timeslice, log *slog.Logger, mpsOn func(uuid string) bool) (*gpu.Timeslices, error) {
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

// selfSetEvent records a context that set itself a longer slice as a Warning Event on
// its pod. The GPU loop calls it (rate-limited there); the event sinks do not block.
func (m *gpuMPS) selfSetEvent(ev gpu.SelfSetEvent) {
	if m.events == nil {
		return
	}
	m.events.Warn(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace,
		Name: ev.Pod.Name}}, EventGPUSliceSelfSet, ev.Message)
}

// TimeslicePlanner is the NRI plugin's time-slice planner: the GPU loop's Timeslices,
// or nil with gpu.timeslice off or GPU features off.
func (b *Bridge) TimeslicePlanner() devices.TimeslicePlanner {
	if b == nil || b.tsg == nil {
		return nil
	}
	return b.tsg
}
