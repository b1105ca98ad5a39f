package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/qos"
)

// GPU modes of GPU.Mode.
const (
	// GPUModeAuto turns GPU features on when NVML can be used (a cgo build, the
	// driver's libnvidia-ml.so.1 present) and off otherwise, with one log line.
	GPUModeAuto = "auto"
	// GPUModeOff never touches NVML. (Not "off": YAML 1.1 reads a bare off as false.)
	GPUModeOff = "disabled"
)

// GPU is the GPU part of the agent's configuration.
type GPU struct {
	// Mode is auto (default) or disabled.
	Mode string `json:"mode,omitempty"`
	// LoopPeriod is how often the GPU loop reads the GPUs and decides the batch duties:
	// GPUs where batch pods run beside other processes are read in full every period,
	// those where that batch is frozen only probed with their own utilisation, the others
	// (and GPUs whose LS and batch run in MPS partitions) only probed (their process
	// lists).
	LoopPeriod metav1.Duration `json:"loopPeriod,omitempty"`
	// FullScrapePeriod is how often a GPU that needs no fast reaction (no batch pod
	// shares it with another process), or whose batch the loop holds frozen, is read in
	// full: its metrics, node-metrics and /status figures are this old at most. Equal to
	// LoopPeriod, every GPU is read in full every period.
	FullScrapePeriod metav1.Duration `json:"fullScrapePeriod,omitempty"`
	// Throttle is GPU-aware batch throttling: while LS pods need a GPU, the batch pods
	// on it are frozen solid (or run in their MPS partition), and thawed once LS has been
	// idle for throttle.hold.
	Throttle qos.GPUThrottlePolicy `json:"throttle"`
	// Suspend is the feature gate and settings of suspending starved batch through
	// cuda-checkpoint before eviction.
	Suspend duty.SuspendConfig `json:"suspend"`
	// Devices is how the NRI plugin hands shared GPUs to containers (CDI or
	// NVIDIA_VISIBLE_DEVICES).
	Devices devices.Config `json:"devices"`
	// PodResourcesSocket is kubelet's PodResources API, read for the real whole-GPU
	// allocation reported in node-metrics version 2; empty disables it.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// MPS is the node's MPS control daemon (found or run by the agent) and how the NRI
	// plugin makes MPS clients; mode disabled (the default) turns MPS off.
	MPS mps.Config `json:"mps"`
	// Timeslice is the feature gate and policy of the per-context GPU time slices (off
	// by default).
	Timeslice Timeslice `json:"timeslice"`
}

// DefaultGPU returns the GPU defaults.
func DefaultGPU() GPU {
	return GPU{
		Mode:               GPUModeAuto,
		LoopPeriod:         metav1.Duration{Duration: gpu.DefaultLoopPeriod},
		FullScrapePeriod:   metav1.Duration{Duration: gpu.DefaultFullScrapePeriod},
		Throttle:           qos.DefaultGPUThrottlePolicy(),
		Suspend:            duty.DefaultSuspendConfig(),
		Devices:            devices.Config{}.WithDefaults(),
		PodResourcesSocket: podsource.DefaultPodResourcesSocket,
		MPS:                mps.Config{}.WithDefaults(),
		Timeslice:          DefaultTimeslice(),
	}
}

// Validate checks every GPU field, also with GPU features off, so that a bad config
// shows before the node gets a GPU.
func (c GPU) Validate() error {
	if c.Mode != GPUModeAuto && c.Mode != GPUModeOff {
		return fmt.Errorf("gpu.mode: %q must be %q or %q: %w", c.Mode, GPUModeAuto, GPUModeOff, ErrInvalid)
	}
	if p := c.LoopPeriod.Duration; p < 10*time.Millisecond || p > 10*time.Second {
		return fmt.Errorf("gpu.loopPeriod: %v must be within [10ms, 10s]: %w", p, ErrInvalid)
	}
	// node-metrics, /metrics and /status show a GPU's figures this old.
	if f, p := c.FullScrapePeriod.Duration, c.LoopPeriod.Duration; f < p || f > 10*time.Second {
		return fmt.Errorf("gpu.fullScrapePeriod: %v must be within [gpu.loopPeriod (%v), 10s]: %w", f, p,
			ErrInvalid)
	}
	if err := c.Throttle.Validate(); err != nil {
		return fmt.Errorf("gpu.throttle: %w", err)
	}
	if err := c.Suspend.Validate(); err != nil {
		return fmt.Errorf("gpu.suspend: %w", err)
	}
	if err := c.Devices.Validate(); err != nil {
		return fmt.Errorf("gpu.devices: %w", err)
	}
	if err := c.MPS.Validate(); err != nil {
		return fmt.Errorf("gpu.mps: %w: %w", err, ErrInvalid)
	}
	if err := c.Timeslice.Validate(); err != nil {
		return err
	}
	if c.PodResourcesSocket != "" && !strings.HasPrefix(c.PodResourcesSocket, "/") {
		return fmt.Errorf("gpu.podResourcesSocket: %q must be an absolute path: %w", c.PodResourcesSocket, ErrInvalid)
	}
	return nil
}

// Defaults of Timeslice.
const (
	// DefaultTimesliceDirectory is the host directory of the installed shim (lib/) and
	// the containers' report directories (reports/<pod UID>/<container>/); the GPU
	// agent's DaemonSet mounts it at the same path.
	DefaultTimesliceDirectory = "/var/lib/understory/tsg"
	// DefaultTimesliceLibrary is the shim in the GPU agent's image (images.Components).
	DefaultTimesliceLibrary = "/usr/lib/understory/libunderstory-tsg.so"
)

// Timeslice is gpu.timeslice: the feature gate of the per-context GPU time slices
// (docs/gpu.md, "Per-context time slices"), the policy that chooses the slices, and
// where the shim lives.
type Timeslice struct {
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

// DefaultTimeslice returns gpu.timeslice's defaults: off.
func DefaultTimeslice() Timeslice {
	return Timeslice{GPUTimeslicePolicy: qos.DefaultGPUTimeslicePolicy(), Directory: DefaultTimesliceDirectory,
		Library: DefaultTimesliceLibrary}
}

// Validate checks every field, also with the gate off.
func (c Timeslice) Validate() error {
	if err := c.GPUTimeslicePolicy.Validate(); err != nil {
		return err
	}
	for _, f := range []struct{ key, path string }{{"directory", c.Directory}, {"library", c.Library}} {
		if !filepath.IsAbs(f.path) || filepath.Clean(f.path) != f.path || f.path == "/" {
			return fmt.Errorf("gpu.timeslice.%s: %q must be a clean absolute path: %w", f.key, f.path, ErrInvalid)
		}
	}
	return nil
}

// MPSSetup is how the NRI plugin mounts and restricts MPS clients (gpu.mps, its
// defaults filled: a private shm directory, a non-root client UID).
func (c GPU) MPSSetup() devices.MPSSetup {
	m := c.MPS.WithDefaults()
	return devices.MPSSetup{ShmDir: m.ShmDirectory, ClientUID: m.ClientUID}
}
