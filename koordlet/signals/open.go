package signals

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/understory/understory/koordlet/signals/psi"
	"github.com/understory/understory/koordlet/signals/runqlat"
)

// Options configure the sources. Roots are values: tests pass fakes.
type Options struct {
	// Mode is the configured mode; the zero value is ModeAuto.
	Mode Mode
	// Cgroup2Root is the cgroup2 hierarchy: the cgroup mount on a v2 node, its unified/
	// on a hybrid one; "" on a v1-only node.
	Cgroup2Root string
	// ProcRoot is the host's /proc (for /proc/pressure).
	ProcRoot string
	// CPUCgroupRoot is where a pod's cpu.stat with its CFS throttled time lives: the v1
	// cpu controller's directory on a hybrid node, Cgroup2Root on a v2 one.
	CPUCgroupRoot string
	// PollInterval is how often the eBPF source reads its maps while delays past the
	// threshold keep coming (the probe wakes it at the first one).
	PollInterval time.Duration
	// RunqueueQuantile and RunqueueThreshold: an LS pod whose run-queue delay at this
	// quantile, over one poll interval (up to five while fewer delays arrived; up to a
	// second when most of those are past the threshold, see EBPF.window), passes the threshold is harmed, provided the
	// interval saw at least RunqueueMinSamples wake-ups of the pod.
	RunqueueQuantile   float64
	RunqueueThreshold  time.Duration
	RunqueueMinSamples uint64
	// RunqueueAnyCause judges every delay. Otherwise, where the probe can tell
	// (runqlat.Probe.Attributes), the delays past the threshold must be batch's
	// (runqlat.Histogram.Batch): they ended by taking the CPU from a batch task. The
	// rest were spent behind LS or system tasks, and cutting batch cannot shorten them.
	RunqueueAnyCause bool
	// CPUStall is the LS pods' cpu.pressure "some" trigger and MemoryStall their
	// memory.pressure "some" trigger, both per PSIWindow.
	CPUStall, MemoryStall, PSIWindow time.Duration
	Logger                           *slog.Logger
}

// Defaults of Options (and of the agent's signals config).
const (
	// DefaultPollInterval is how often the eBPF maps are read while delays past the
	// threshold keep coming (the kernel wakes the source at the first one; a quiet node is
	// read once a second): a harm is seen within 20 ms of enough delays, inside the 50 ms
	// reaction target.
	DefaultPollInterval = 20 * time.Millisecond
	// DefaultRunqueueQuantile and DefaultRunqueueThreshold: a SCHED_IDLE batch task is
	// preempted by a waking LS task within microseconds, so LS tasks waiting
	// milliseconds for a CPU wait behind something they cannot preempt: mostly other LS
	// tasks, which is why the delays must also be batch's (RunqueueAnyCause); batch
	// holds the CPU that long only in the kernel, or from a cgroup the kernel weighs
	// above the LS pod. 2 ms is above one EEVDF base slice on small nodes (0.75 ms ×
	// (1 + log2 CPUs): 1.5 ms at 2 CPUs).
	DefaultRunqueueQuantile  = 0.99
	DefaultRunqueueThreshold = 2 * time.Millisecond
	// DefaultRunqueueMinSamples: fewer wake-ups in one interval make the quantile the
	// maximum of a handful, one unlucky wake-up.
	DefaultRunqueueMinSamples = 20
	// DefaultCPUStall and DefaultPSIWindow: 20 ms of stall in 500 ms (4 %), the
	// kernel's shortest trigger window, so a trigger fires within half a second of a
	// lasting stall and at most twice a second per pod.
	DefaultCPUStall  = 20 * time.Millisecond
	DefaultPSIWindow = 500 * time.Millisecond
	// DefaultMemoryStall: an LS pod's tasks stalled on memory (reclaim, refaults) for
	// 50 ms in 500 ms (10 %): rarer than CPU waits, and a CPU cut helps only when batch's
	// memory traffic is the cause, so the bar is higher.
	DefaultMemoryStall = 50 * time.Millisecond
)

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = ModeAuto
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.RunqueueQuantile <= 0 {
		o.RunqueueQuantile = DefaultRunqueueQuantile
	}
	if o.RunqueueThreshold <= 0 {
		o.RunqueueThreshold = DefaultRunqueueThreshold
	}
	if o.RunqueueMinSamples == 0 {
		o.RunqueueMinSamples = DefaultRunqueueMinSamples
	}
	if o.PSIWindow <= 0 {
		o.PSIWindow = DefaultPSIWindow
	}
	if o.CPUStall <= 0 {
		o.CPUStall = DefaultCPUStall
	}
	if o.MemoryStall <= 0 {
		o.MemoryStall = DefaultMemoryStall
	}
	if o.CPUCgroupRoot == "" {
		o.CPUCgroupRoot = o.Cgroup2Root
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Opener opens one kind of source.
type Opener struct {
	Mode Mode
	Open func(Options) (Source, error)
}

// DefaultOpeners are the real sources, best first: eBPF, PSI.
func DefaultOpeners() []Opener {
	return []Opener{{Mode: ModeEBPF, Open: OpenEBPF}, {Mode: ModePSI, Open: OpenPSI}}
}

// Open returns the best source allowed from o.Mode down, with the State saying why.
// It fails only on bad options: sampling is always there.
func Open(o Options) (Source, State, error) { return OpenWith(o, DefaultOpeners()) }

// OpenWith is Open over the given openers (best first; tests pass fakes).
func OpenWith(o Options, openers []Opener) (Source, State, error) {
	o = o.withDefaults()
	if _, err := ParseMode(string(o.Mode)); err != nil {
		return nil, State{}, err
	}
	st := State{Requested: o.Mode}
	start := 0
	switch o.Mode {
	case ModeSampling:
		start = len(openers)
	case ModeEBPF, ModePSI:
		start = len(openers)
		for i, op := range openers {
			if op.Mode == o.Mode {
				start = i
				break
			}
		}
	}
	for _, op := range openers[start:] {
		src, err := op.Open(o)
		if err == nil {
			st.Active = src.Mode()
			if b, ok := src.(batchOnlySource); ok {
				st.BatchOnly = b.BatchOnly()
			}
			return src, st, nil
		}
		st.Fallbacks = append(st.Fallbacks, Fallback{Mode: op.Mode, Reason: Reason(err), Error: err.Error()})
	}
	st.Active = ModeSampling
	return Sampling(), st, nil
}

// batchOnlySource is a source that may judge only the harm batch caused (the eBPF one).
type batchOnlySource interface {
	BatchOnly() bool
}

// Reasons of a Fallback.
const (
	ReasonPermission  = "permission"
	ReasonNoBTF       = "no_btf"
	ReasonNoTracefs   = "no_tracefs"
	ReasonNoCgroup2   = "no_cgroup2"
	ReasonUnsupported = "unsupported"
	ReasonError       = "error"
)

// Reason names why a source could not be opened, from the sentinels it wraps.
func Reason(err error) string {
	for _, r := range reasons {
		for _, target := range r.errs {
			if errors.Is(err, target) {
				return r.reason
			}
		}
	}
	return ReasonError
}

// String says what the state means in one line, for the log.
func (s State) String() string {
	msg := fmt.Sprintf("signal source %s (requested %s)", s.Active, s.Requested)
	if s.BatchOnly {
		msg += ", run-queue harm from batch's delays only"
	}
	for _, f := range s.Fallbacks {
		msg += fmt.Sprintf("; %s unavailable (%s): %s", f.Mode, f.Reason, f.Error)
	}
	return msg
}

// reasons map the sentinels of the sources to a Fallback's Reason, first match wins.
var reasons = []struct {
	reason string
	errs   []error
}{
	{ReasonNoCgroup2, []error{ErrNoCgroup2}},
	{ReasonPermission, []error{runqlat.ErrPermission, psi.ErrPermission}},
	{ReasonNoBTF, []error{runqlat.ErrNoBTF}},
	{ReasonNoTracefs, []error{runqlat.ErrNoTracefs}},
	{ReasonUnsupported, []error{psi.ErrUnsupported, errors.ErrUnsupported}},
}
