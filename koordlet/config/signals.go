package config

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/qos"
)

// Signals is the agent's fast LS harm signals: which source (signals.mode) and
// when each one counts as harm, and how the budget answers harm (qos.GuardConfig:
// cutPercent, restoreHold, restorePercentPerSecond, at this level of the YAML).
type Signals struct {
	// Mode is auto (the best this node allows, eBPF → PSI → sampling), ebpf, psi or
	// sampling (utilisation only: the agent's behaviour before signals). An explicit
	// mode this node cannot give falls back down the same order, and /status and
	// understory_signal_source_unavailable say why.
	Mode string `json:"mode,omitempty"`
	// PollInterval is how often the eBPF source reads its maps.
	PollInterval metav1.Duration `json:"pollInterval,omitempty"`
	// RunqueueDelay is when an LS pod's run-queue delay (eBPF) is harm.
	RunqueueDelay RunqueueDelay `json:"runqueueDelay"`
	// PSI is when pressure stall (PSI mode) is harm.
	PSI PSI `json:"psi"`
	qos.GuardConfig
}

// RunqueueDelay: an LS pod is harmed when its run-queue delay at Quantile, over
// one poll interval with at least MinSamples wake-ups, is above Threshold, and the
// delays above it that took the CPU from batch are alone enough for that (batch caused
// it), unless AnyCause.
type RunqueueDelay struct {
	Quantile   float64         `json:"quantile,omitempty"`
	Threshold  metav1.Duration `json:"threshold,omitempty"`
	MinSamples uint64          `json:"minSamples,omitempty"`
	// AnyCause counts every slow delay as harm, whatever held the CPU: also delays
	// behind the pod's own or other LS tasks, which cutting batch cannot shorten.
	AnyCause bool `json:"anyCause,omitempty"`
}

// PSI are the kernel PSI triggers on each LS pod: CPUStall of "some" stall per
// Window on its cpu.pressure (less its own CFS throttling), MemoryStall per Window on its
// memory.pressure.
type PSI struct {
	CPUStall    metav1.Duration `json:"cpuStall,omitempty"`
	MemoryStall metav1.Duration `json:"memoryStall,omitempty"`
	Window      metav1.Duration `json:"window,omitempty"`
}

// DefaultSignals returns the signal defaults (see koordlet/signals for why).
func DefaultSignals() Signals {
	return Signals{
		Mode:         string(signals.ModeAuto),
		PollInterval: metav1.Duration{Duration: signals.DefaultPollInterval},
		RunqueueDelay: RunqueueDelay{Quantile: signals.DefaultRunqueueQuantile,
			Threshold: metav1.Duration{Duration: signals.DefaultRunqueueThreshold}, MinSamples: signals.DefaultRunqueueMinSamples},
		PSI: PSI{CPUStall: metav1.Duration{Duration: signals.DefaultCPUStall},
			MemoryStall: metav1.Duration{Duration: signals.DefaultMemoryStall},
			Window:      metav1.Duration{Duration: signals.DefaultPSIWindow}},
		GuardConfig: qos.DefaultGuardConfig(),
	}
}

// Validate names the first bad field.
func (c Signals) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("signals.%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalid)
	}
	if _, err := signals.ParseMode(c.Mode); err != nil {
		return bad("mode", "%q must be auto, ebpf, psi or sampling", c.Mode)
	}
	if p := c.PollInterval.Duration; p < 5*time.Millisecond || p > time.Second {
		return bad("pollInterval", "%v must be within [5ms, 1s]", p)
	}
	if q := c.RunqueueDelay.Quantile; !(q > 0 && q <= 1) {
		return bad("runqueueDelay.quantile", "%v must be in (0, 1]", q)
	}
	// The probe's buckets are powers of two from 1 µs: a finer threshold means nothing.
	if th := c.RunqueueDelay.Threshold.Duration; th < 2*time.Microsecond || th > time.Second {
		return bad("runqueueDelay.threshold", "%v must be within [2µs, 1s]", th)
	}
	if c.RunqueueDelay.MinSamples < 1 {
		return bad("runqueueDelay.minSamples", "must be ≥ 1")
	}
	// The kernel's trigger limits: a window of 500ms to 10s, a stall within it.
	w := c.PSI.Window.Duration
	if w < 500*time.Millisecond || w > 10*time.Second {
		return bad("psi.window", "%v must be within [500ms, 10s] (the kernel's trigger windows)", w)
	}
	if s := c.PSI.CPUStall.Duration; s < time.Microsecond || s >= w {
		return bad("psi.cpuStall", "%v must be at least 1µs and below psi.window (%v)", s, w)
	}
	if s := c.PSI.MemoryStall.Duration; s < time.Microsecond || s >= w {
		return bad("psi.memoryStall", "%v must be at least 1µs and below psi.window (%v)", s, w)
	}
	if err := c.GuardConfig.Validate(); err != nil {
		return fmt.Errorf("signals.%w", err)
	}
	return nil
}
