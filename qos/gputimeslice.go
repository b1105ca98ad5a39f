package qos

import (
	"errors"
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Levers of a GPU besides GPULeverFreeze and GPULeverMPS, in GPUTimesliceDecision.Lever.
const (
	// GPULeverTimeslice: every batch context on the GPU runs with a short time slice the
	// agent asked for and confirmed from outside the tenant, LS's with a long one. The
	// GPU's own scheduler then switches batch out within about a batch slice plus the
	// switch cost of LS becoming runnable, so batch is not frozen while LS works.
	GPULeverTimeslice = "timeslice"
	// GPULeverNone: no batch pod uses the GPU; nothing to throttle. The slices are still
	// chosen, so that LS's contexts hold their long slice when batch comes.
	GPULeverNone = "none"
)

// Reasons in GPUTimesliceDecision.Reason: why the GPU got its lever.
const (
	// GPUTimesliceReasonUnknown: the GPU could not be read (unhealthy); the freeze lever,
	// whose state GPUThrottle holds for an unknown GPU. No slices are chosen.
	GPUTimesliceReasonUnknown = "unknown"
	// GPUTimesliceReasonMIG: the GPU is in MIG mode; the freeze lever, as GPUThrottle and
	// the MPS partitions treat MIG. No slices are chosen.
	GPUTimesliceReasonMIG = "mig"
	// GPUTimesliceReasonMPS: the GPU runs the MPS lever (every LS and batch process is a
	// client of the agent's MPS server). MPS clients share the server's context, so a
	// per-context slice cannot tell LS from batch: the partition stays, with
	// GPUThrottle's checks of it. No slices are chosen.
	GPUTimesliceReasonMPS = "mps"
	// GPUTimesliceReasonNoBatch: no batch pod and no batch context on the GPU
	// (GPULeverNone).
	GPUTimesliceReasonNoBatch = "no-batch"
	// GPUTimesliceReasonNoBatchContext: batch pods are placed on the GPU but none has a
	// context on it yet: the timeslice lever, so that a batch process can start and the
	// shim set its slice at its context's creation (under the freeze a frozen process
	// creates none). A context that comes without a confirmed slice sends the GPU to the
	// freeze at the next decision.
	GPUTimesliceReasonNoBatchContext = "no-batch-context"
	// GPUTimesliceReasonConfirmed: every batch context's slice is confirmed from outside
	// the tenant and within the bound on LS's wait (GPULeverTimeslice).
	GPUTimesliceReasonConfirmed = "slices-confirmed"
	// GPUTimesliceReasonUnconfirmed: a batch context's slice is not confirmed from
	// outside the tenant (no observer, no shim report, a driver or firmware refusal, a
	// read-back that differs, an unsupported driver, a slice above the bound): the
	// freeze lever. Detail names the context.
	GPUTimesliceReasonUnconfirmed = "slice-unconfirmed"
	// GPUTimesliceReasonSelfSet: a batch context was seen setting itself a slice longer
	// than the agent's: the freeze lever, the stricter one. Detail names the context.
	GPUTimesliceReasonSelfSet = "self-set-slice"
	// GPUTimesliceReasonEscalated: every batch slice is confirmed, but LS still suffers
	// (its demand above freezeAbovePercent, or the caller's harm signal): the freeze.
	GPUTimesliceReasonEscalated = "escalated"
)

// Verdicts on one context, in GPUTimesliceVerdict.Verdict.
const (
	// GPUTimesliceConfirmed: the slice the agent asked is in force, by the outside
	// observer and the shim alike (and, for batch where LS is on the GPU, within the
	// bound on LS's wait).
	GPUTimesliceConfirmed = "confirmed"
	// GPUTimesliceUnconfirmed: not confirmed; Why says what is missing or differs.
	GPUTimesliceUnconfirmed = "unconfirmed"
	// GPUTimesliceSelfSet: the context set itself, and the driver accepted, a slice
	// longer than the agent's value for its class ("self-set slice").
	GPUTimesliceSelfSet = "self-set"
)

// Defaults of [GPUTimeslicePolicy] and the driver's own slice.
//
// The switch cost and the driver's default are those of the discrete-event model of the
// GPU's time-slicing (bench/gpumodel) fitted to the real H200 rows of 2026-11-28: best
// fit at a default slice of 2370 µs and a switch of 255 µs, the fits within 5 % spanning
// switches of 150–300 µs. The model predicts, for that pair (LS 32 % busy), LS p99 1.09×
// alone at a batch slice of 100 µs with LS's long (10 ms), 1.19× at 500 µs and 1.61× at
// 2048 µs, and 1.27× at 100 µs with LS's left at the default: both halves matter. These
// are a model's numbers, not measurements; the real run sets them.
const (
	// DefaultGPUTimesliceLSSlice is LS's slice: longer than an LS request (3.2 ms on the
	// standard pair), so that LS is not switched out mid-request for batch.
	DefaultGPUTimesliceLSSlice = 10 * time.Millisecond
	// DefaultGPUTimesliceBatchSlice is batch's shortest slice where LS is on the GPU.
	DefaultGPUTimesliceBatchSlice = 100 * time.Microsecond
	// DefaultGPUTimesliceSwitchCost is the cost of one switch between contexts, as
	// fitted by the model.
	DefaultGPUTimesliceSwitchCost = 255 * time.Microsecond
	// DefaultGPUTimesliceLSMaxWait bounds LS's worst wait for the GPU when it becomes
	// runnable while batch runs: batch's slice plus one switch.
	DefaultGPUTimesliceLSMaxWait = 500 * time.Microsecond
	// DefaultGPUTimesliceFreezeAbovePercent: LS demand above which the freeze replaces
	// the slices. Not measured: where LS keeps more than 80 % of the GPU busy, batch
	// could gain a fifth of it at most, and LS pays a wait at each of its many wake-ups.
	DefaultGPUTimesliceFreezeAbovePercent = 80.0
	// GPUTimesliceDriverDefault is the slice a context runs with unless someone sets
	// another (2048 µs by a reading of a CUDA trace; the model's fits say 1.0–2.6 ms).
	// Batch gets it where no LS is on the GPU: a shorter slice would only add switches
	// between batch contexts.
	GPUTimesliceDriverDefault = 2048 * time.Microsecond
)

// Bounds of GPUTimeslicePolicy.
const (
	// MinGPUTimesliceBatchSlice: below it a switch (~255 µs) is more than 25 times the
	// slice, and batch would mostly switch.
	MinGPUTimesliceBatchSlice = 10 * time.Microsecond
	// MaxGPUTimesliceLSSlice: two LS contexts on one GPU wait for each other's slice.
	MaxGPUTimesliceLSSlice = 100 * time.Millisecond
	// gpuTimesliceStep is the grain batch's slice is rounded down to, so that small moves
	// of LS's demand do not ask every context again.
	gpuTimesliceStep = 10 * time.Microsecond
)

// GPUTimeslicePolicy chooses per-context GPU time slices (the timeslice lever). Plain
// data with JSON/YAML tags; durations are strings such as "100us" or "10ms", whole
// microseconds (the driver's unit). Pre-fill it with DefaultGPUTimeslicePolicy() before
// unmarshalling, then call Validate; a zero GPUTimeslicePolicy is invalid.
type GPUTimeslicePolicy struct {
	// LSSlice is every LS context's slice, in [2048µs (the driver's default), 100ms].
	LSSlice metav1.Duration `json:"lsSlice"`
	// BatchSlice is batch's shortest slice where LS is on the GPU, in [10µs,
	// lsMaxWait − switchCost].
	BatchSlice metav1.Duration `json:"batchSlice"`
	// SwitchCost is the cost of one switch between contexts, >= 0.
	SwitchCost metav1.Duration `json:"switchCost"`
	// LSMaxWait bounds LS's worst wait where batch runs (batch's slice + switchCost), in
	// [batchSlice + switchCost, 2048µs]: at or above the driver's default slice the
	// lever would buy nothing.
	LSMaxWait metav1.Duration `json:"lsMaxWait"`
	// FreezeAbovePercent: LS demand (percent of the GPU) above which the GPU escalates to
	// the freeze, in (0, 100]; 100 leaves escalation to the harm signal alone.
	FreezeAbovePercent float64 `json:"freezeAbovePercent"`
}

// DefaultGPUTimeslicePolicy returns the defaults. It passes Validate.
func DefaultGPUTimeslicePolicy() GPUTimeslicePolicy {
	return GPUTimeslicePolicy{
		LSSlice:            metav1.Duration{Duration: DefaultGPUTimesliceLSSlice},
		BatchSlice:         metav1.Duration{Duration: DefaultGPUTimesliceBatchSlice},
		SwitchCost:         metav1.Duration{Duration: DefaultGPUTimesliceSwitchCost},
		LSMaxWait:          metav1.Duration{Duration: DefaultGPUTimesliceLSMaxWait},
		FreezeAbovePercent: DefaultGPUTimesliceFreezeAbovePercent,
	}
}

// Validate reports every out-of-range field, named by its key in the agent's
// configuration (gpu.timeslice.<field>), each wrapping ErrInvalidConfig (several are
// joined with errors.Join).
func (p GPUTimeslicePolicy) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("gpu.timeslice.%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	dur := func(field string, d time.Duration, r gpuTimesliceRange, rule string) bool {
		switch {
		case d%time.Microsecond != 0:
			bad(field, d, "must be whole microseconds (the driver's unit)")
		case !r.holds(d):
			bad(field, d, rule)
		default:
			return true
		}
		return false
	}
	dur("lsSlice", p.LSSlice.Duration, gpuTimesliceLSSliceRange(), fmt.Sprintf("must be in [%v, %v]: at least the "+
		"driver's default, at most what another LS context may wait", GPUTimesliceDriverDefault, MaxGPUTimesliceLSSlice))
	bs, sc, mw := p.BatchSlice.Duration, p.SwitchCost.Duration, p.LSMaxWait.Duration
	bsOK := dur("batchSlice", bs, gpuTimesliceBatchSliceRange(),
		fmt.Sprintf("must be in [%v, lsMaxWait − switchCost]", MinGPUTimesliceBatchSlice))
	scOK := dur("switchCost", sc, gpuTimesliceSwitchCostRange(), fmt.Sprintf("must be in [0, %v)", GPUTimesliceDriverDefault))
	mwOK := dur("lsMaxWait", mw, gpuTimesliceLSMaxWaitRange(), fmt.Sprintf("must be in [batchSlice + switchCost, %v]: "+
		"at or above the driver's default slice the lever buys nothing", GPUTimesliceDriverDefault))
	if bsOK && scOK && mwOK && bs+sc > mw {
		bad("lsMaxWait", mw, fmt.Sprintf("must be at least batchSlice + switchCost (%v + %v): LS's worst "+
			"wait behind batch's shortest slice", bs, sc))
	}
	if !(p.FreezeAbovePercent > 0 && p.FreezeAbovePercent <= 100) { // false for NaN
		bad("freezeAbovePercent", p.FreezeAbovePercent, "must be in (0, 100]")
	}
	return errors.Join(errs...)
}

// gpuTimesliceRange is the range of a duration of GPUTimeslicePolicy, bounds included.
type gpuTimesliceRange struct{ lo, hi time.Duration }

// holds says d is whole microseconds within r.
func (r gpuTimesliceRange) holds(d time.Duration) bool {
	return d%time.Microsecond == 0 && d >= r.lo && d <= r.hi
}

// The ranges of GPUTimeslicePolicy's durations, each on its own; Validate also holds
// batchSlice + switchCost <= lsMaxWait.
func gpuTimesliceLSSliceRange() gpuTimesliceRange {
	return gpuTimesliceRange{GPUTimesliceDriverDefault, MaxGPUTimesliceLSSlice}
}

func gpuTimesliceBatchSliceRange() gpuTimesliceRange {
	return gpuTimesliceRange{MinGPUTimesliceBatchSlice, GPUTimesliceDriverDefault}
}

func gpuTimesliceSwitchCostRange() gpuTimesliceRange {
	return gpuTimesliceRange{0, GPUTimesliceDriverDefault - time.Microsecond}
}

func gpuTimesliceLSMaxWaitRange() gpuTimesliceRange {
	return gpuTimesliceRange{time.Microsecond, GPUTimesliceDriverDefault}
}

// forceGPUTimesliceRange maps out-of-range fields to their defaults; where batchSlice,
// switchCost and lsMaxWait are each in range but do not fit together, all three take
// theirs. The result passes Validate.
func forceGPUTimesliceRange(p GPUTimeslicePolicy) GPUTimeslicePolicy {
	def := DefaultGPUTimeslicePolicy()
	if !gpuTimesliceLSSliceRange().holds(p.LSSlice.Duration) {
		p.LSSlice = def.LSSlice
	}
	if !gpuTimesliceBatchSliceRange().holds(p.BatchSlice.Duration) {
		p.BatchSlice = def.BatchSlice
	}
	if !gpuTimesliceSwitchCostRange().holds(p.SwitchCost.Duration) {
		p.SwitchCost = def.SwitchCost
	}
	if !gpuTimesliceLSMaxWaitRange().holds(p.LSMaxWait.Duration) {
		p.LSMaxWait = def.LSMaxWait
	}
	if p.BatchSlice.Duration+p.SwitchCost.Duration > p.LSMaxWait.Duration {
		p.BatchSlice, p.SwitchCost, p.LSMaxWait = def.BatchSlice, def.SwitchCost, def.LSMaxWait
	}
	if !(p.FreezeAbovePercent > 0 && p.FreezeAbovePercent <= 100) {
		p.FreezeAbovePercent = DefaultGPUTimesliceFreezeAbovePercent
	}
	return p
}

// GPUTimesliceContext is one CUDA context (its time-slice group) on a GPU, with what the
// agent asked for it and what was seen of it. The caller lists every context the shim
// or the observer reported on the GPU, and every LS or batch process on it (from NVML)
// that neither reported, as one entry with nothing seen: a batch process nobody saw
// set a slice is unconfirmed.
type GPUTimesliceContext struct {
	// Pod names the context's pod in reasons (namespace/name or UID); PID its process;
	// Context its time-slice group as the shim and the observer name it (client and
	// object handles). Only reported.
	Pod     string `json:"pod"`
	PID     int    `json:"pid"`
	Context string `json:"context,omitempty"`
	// Class is its pod's class. ClassBatch gets batch's slice and must be confirmed;
	// anything else (LS, BE, a process of no pod) gets LS's, the safe side, as the GPU
	// loop counts every process but batch's as LS.
	Class Class `json:"class"`
	// AskedUs is the slice the agent asked for it, µs (0: none asked).
	AskedUs uint64 `json:"askedUs"`

	// What the shim, inside the tenant's process, reported. ShimReported: it reported a
	// set for this context. ShimRefused: it reported that it changed nothing, and why
	// (an unsupported driver, a bad configuration, a call it could not read).
	// ShimErrno and ShimStatus are the ioctl error and the resource manager's status of
	// its SET and read-back (0: success); ShimReadBackUs the slice GET_TIMESLICE read
	// back.
	ShimReported   bool   `json:"shimReported,omitempty"`
	ShimRefused    string `json:"shimRefused,omitempty"`
	ShimErrno      int    `json:"shimErrno,omitempty"`
	ShimStatus     uint32 `json:"shimStatus,omitempty"`
	ShimReadBackUs uint64 `json:"shimReadBackUs,omitempty"`

	// What an observer outside the tenant (on the driver's ioctl path) saw. Observed: it
	// saw the SET_TIMESLICE that gave the context the agent's value; ObservedSetUs is the
	// value that call carried, ObservedErrno and ObservedStatus what the driver returned.
	Observed       bool   `json:"observed,omitempty"`
	ObservedSetUs  uint64 `json:"observedSetUs,omitempty"`
	ObservedErrno  int    `json:"observedErrno,omitempty"`
	ObservedStatus uint32 `json:"observedStatus,omitempty"`

	// SelfSet: the observer saw a later SET_TIMESLICE of the context by its own process,
	// not the agent's; SelfSetUs is the longest such value, SelfSetErrno and
	// SelfSetStatus what the driver returned to that call.
	SelfSet       bool   `json:"selfSet,omitempty"`
	SelfSetUs     uint64 `json:"selfSetUs,omitempty"`
	SelfSetErrno  int    `json:"selfSetErrno,omitempty"`
	SelfSetStatus uint32 `json:"selfSetStatus,omitempty"`
}

// GPUTimesliceInput is one GPU as the agent sees it when it chooses the lever.
type GPUTimesliceInput struct {
	// Index is the GPU's NVML index; only reported.
	Index int
	// Unknown: the GPU could not be read (unhealthy); MIG: it is in MIG mode; MPS: every
	// LS and batch process on it is a client of the agent's MPS server (the MPS lever,
	// GPUThrottleInput.MPS).
	Unknown, MIG, MPS bool
	// DriverSupported: the driver's version is one the shim and the observer support;
	// Driver names it for the reasons. False: no slice is confirmed on the GPU.
	DriverSupported bool
	Driver          string
	// LSDemandPercent is LS's recent peak utilisation of the GPU, percent
	// (GPUDemandPeak over a window; NaN, infinite or negative: unknown, taken as 100).
	LSDemandPercent float64
	// LSHarm: the caller found LS suffering on the GPU with the slices in force (its own
	// measure, e.g. LS latency against alone); escalates to the freeze.
	LSHarm bool
	// LSRequestMilli and BatchRequestMilli are the understory.io/gpu-milli requests of the
	// LS and batch containers placed on the GPU (each bounded to [0, 1000], each sum to
	// 1000).
	LSRequestMilli, BatchRequestMilli []int64
	// BatchPods is the number of batch pods placed on the GPU.
	BatchPods int
	// Contexts are the GPU's contexts (see GPUTimesliceContext).
	Contexts []GPUTimesliceContext
}

// GPUTimesliceVerdict is one context's verdict, JSON-encodable for /status.
type GPUTimesliceVerdict struct {
	Pod     string `json:"pod"`
	PID     int    `json:"pid"`
	Context string `json:"context,omitempty"`
	Class   Class  `json:"class"`
	// AskedUs is what the agent had asked; WantUs what the policy asks now for the
	// context's class. Reask: they differ, the agent should ask WantUs (a batch slice
	// asked within the bound stays confirmed meanwhile).
	AskedUs uint64 `json:"askedUs"`
	WantUs  uint64 `json:"wantUs"`
	Reask   bool   `json:"reask,omitempty"`
	// ReadBackUs is the shim's read-back (0: none); SelfSetUs the longest slice the
	// context set itself (0: none seen).
	ReadBackUs uint64 `json:"readBackUs,omitempty"`
	SelfSetUs  uint64 `json:"selfSetUs,omitempty"`
	// Verdict is GPUTimesliceConfirmed, GPUTimesliceUnconfirmed or GPUTimesliceSelfSet;
	// Why says why it is not confirmed, Note what else was seen (a self-set the driver
	// refused).
	Verdict string `json:"verdict"`
	Why     string `json:"why,omitempty"`
	Note    string `json:"note,omitempty"`
}

// GPUTimesliceDecision is one GPU's lever with the slices and the verdicts behind it,
// JSON-encodable for /status.
type GPUTimesliceDecision struct {
	GPU int `json:"gpu"`
	// Lever is GPULeverTimeslice, GPULeverMPS, GPULeverFreeze or GPULeverNone. The freeze
	// lever is GPUThrottle's: batch frozen solid while LS needs the GPU.
	Lever string `json:"lever"`
	// Reason is one of the GPUTimesliceReason* constants; Detail names the context
	// behind it, or the driver.
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// LSPresent: LS requests, LS demand or an LS context on the GPU.
	LSPresent bool `json:"lsPresent"`
	// LSSliceUs and BatchSliceUs are the slices the agent asks of LS's and batch's
	// contexts, µs (absent where the GPU gets none: unknown, MIG, MPS). SliceReason says
	// how batch's was chosen.
	LSSliceUs    uint64 `json:"lsSliceUs,omitempty"`
	BatchSliceUs uint64 `json:"batchSliceUs,omitempty"`
	SliceReason  string `json:"sliceReason,omitempty"`
	// LSWorstWaitUs is batch's slice plus the switch cost: LS's worst wait for the GPU
	// behind batch, where LS is on it.
	LSWorstWaitUs uint64 `json:"lsWorstWaitUs,omitempty"`
	// LSSuffers: LS demand above freezeAbovePercent, or the caller's harm signal; with
	// every batch slice confirmed it escalates to the freeze.
	LSSuffers bool `json:"lsSuffers,omitempty"`
	// Contexts are the verdicts, in the order of the input's contexts.
	Contexts []GPUTimesliceVerdict `json:"contexts,omitempty"`
	// Sanitized says what input was replaced and by what.
	Sanitized string `json:"sanitized,omitempty"`
}

// ChooseGPUTimeslice decides which lever protects LS on one GPU, the slices the agent
// asks of its contexts, and each context's verdict. It keeps no state; call it per GPU
// and step.
//
// Which lever:
//
//	unknown (unhealthy)        freeze (GPUThrottle holds an unknown GPU's freeze state)
//	MIG                        freeze, as today: per-context slices are not confirmed there
//	MPS lever                  mps: the clients share one context, slices do not apply
//	no batch pod or context    none
//	a batch context self-set   freeze (self-set-slice)
//	a batch context unconfirmed, or the driver unsupported
//	                           freeze (slice-unconfirmed)
//	LS suffers                 freeze (escalated)
//	otherwise                  timeslice
//
// A context's slice counts as confirmed only when confirmed from outside the tenant: the
// shim runs inside the tenant's process, so its report alone is the tenant's word. A
// batch context is confirmed when the driver is supported, the agent asked it a slice,
// the observer saw the SET_TIMESLICE of that value succeed, the shim reported the same
// set succeeded and read back the value asked, and, where LS is on the GPU, the slice in
// force is at most lsMaxWait − switchCost. A later self-set the driver accepted is the
// slice in force: longer than the agent's value for the class (the larger of what was
// asked and what is wanted now) it is a "self-set slice", reported, and for batch sends
// the GPU to the freeze (LS's is reported only: it costs batch and other LS, and the
// freeze cannot hold an LS process). Only batch confirmation gates the lever: an LS
// context without its long slice costs LS itself (the model: 1.27× instead of 1.09×),
// is reported unconfirmed, and escalation covers it if LS suffers.
//
// The slices, µs:
//
//	LS present = LS requests > 0, LS demand > 0 or an LS context on the GPU
//	LS         = lsSlice                                         (10 ms)
//	maxBatch   = lsMaxWait − switchCost                          (245 µs)
//	lsTerm     = max(LS requests, ⌈10 × LS demand⌉)              gpu-milli, ≤ 1000
//	share      = min(batch requests, 1000 − lsTerm)              gpu-milli
//	batch      = LS present: batchSlice + (maxBatch − batchSlice) × share / 1000,
//	             rounded down to 10 µs, at least batchSlice      (100–240 µs)
//	             no LS:      the driver's default, 2048 µs
//
// so LS's worst wait behind batch, batch's slice plus one switch, stays within
// lsMaxWait; batch's slice grows with its part of what LS leaves (fewer switches where
// batch holds more of the GPU) and shrinks as LS's requests or demand grow. Without LS,
// short slices would only add switches between batch contexts.
//
// Escalation: with every batch slice confirmed, LS demand above freezeAbovePercent or
// the caller's harm signal gives the freeze (escalated). The demand should be a peak
// over a window (GPUDemandPeak): the freeze does not lower LS's own demand, so the GPU
// stays escalated for about that window, not flapping per step.
//
// Traps:
//
//   - A change of the slice wanted (LS arriving where batch asked 2048 µs) leaves the
//     batch contexts above the bound until they are asked again (Reask), and the GPU on
//     the freeze meanwhile. A frozen process cannot ask: the shim must get its new value
//     while batch is thawed. LS is counted present from its requests, known when its pod
//     is placed, so the change usually comes before LS's process sends work; an LS that
//     works without pause keeps batch frozen until starveAfter, as the freeze always did.
//   - GET_TIMESLICE returns what the driver recorded when the firmware accepted the
//     value, not what the hardware runs: a firmware that floors small slices silently
//     reads back equal. Only a measurement on the GPU shows it.
//   - A self-set the driver refused changes nothing; it is noted on the verdict only.
//   - An unusable LS demand (NaN, infinite, negative) is taken as 100, the worst for LS:
//     the shortest batch slice, and escalation. A negative pod count counts as 0;
//     Sanitized says what was replaced. Requests are bounded to [0, 1000] each silently,
//     as in ChooseGPUMPSCaps.
func ChooseGPUTimeslice(p GPUTimeslicePolicy, in GPUTimesliceInput) GPUTimesliceDecision {
	p = forceGPUTimesliceRange(p)
	d := GPUTimesliceDecision{GPU: in.Index}
	switch {
	case in.Unknown:
		d.Lever, d.Reason = GPULeverFreeze, GPUTimesliceReasonUnknown
		return d
	case in.MIG:
		d.Lever, d.Reason = GPULeverFreeze, GPUTimesliceReasonMIG
		return d
	case in.MPS:
		d.Lever, d.Reason = GPULeverMPS, GPUTimesliceReasonMPS
		return d
	}

	var notes []string
	demand := in.LSDemandPercent
	switch {
	case math.IsNaN(demand) || math.IsInf(demand, 0) || demand < 0:
		notes = append(notes, fmt.Sprintf("lsDemand=%v unusable: assumed 100", demand))
		demand = 100
	case demand > 100:
		demand = 100
	}
	lsReq, batchReq := sumMilli(in.LSRequestMilli), sumMilli(in.BatchRequestMilli)
	pods := in.BatchPods
	if pods < 0 {
		notes = append(notes, fmt.Sprintf("batchPods=%d negative: assumed 0", pods))
		pods = 0
	}
	batchCtx, lsCtx := 0, 0
	for _, c := range in.Contexts {
		if c.Class == ClassBatch {
			batchCtx++
		} else {
			lsCtx++
		}
	}
	d.LSPresent = lsReq > 0 || demand > 0 || lsCtx > 0
	d.LSSuffers = demand > p.FreezeAbovePercent || in.LSHarm

	lsUs := usOf(p.LSSlice.Duration)
	batchUs, why := chooseBatchSlice(p, d.LSPresent, demand, lsReq, batchReq)
	maxBatchUs := usOf(p.LSMaxWait.Duration - p.SwitchCost.Duration)
	d.LSSliceUs, d.BatchSliceUs, d.SliceReason = lsUs, batchUs, why
	if d.LSPresent {
		d.LSWorstWaitUs = batchUs + usOf(p.SwitchCost.Duration)
	}

	d.Contexts = make([]GPUTimesliceVerdict, 0, len(in.Contexts))
	var selfSet, unconfirmed []string
	for _, c := range in.Contexts {
		want := lsUs
		if c.Class == ClassBatch {
			want = batchUs
		}
		v := judgeGPUTimeslice(c, want, in, d.LSPresent, maxBatchUs)
		d.Contexts = append(d.Contexts, v)
		if c.Class != ClassBatch {
			continue
		}
		switch v.Verdict {
		case GPUTimesliceSelfSet:
			selfSet = append(selfSet, v.Why)
		case GPUTimesliceUnconfirmed:
			unconfirmed = append(unconfirmed, v.Why)
		}
	}
	if len(d.Contexts) == 0 {
		d.Contexts = nil
	}
	d.Sanitized = joinNotes(notes)

	switch {
	case pods == 0 && batchCtx == 0:
		d.Lever, d.Reason = GPULeverNone, GPUTimesliceReasonNoBatch
	case len(selfSet) > 0:
		d.Lever, d.Reason, d.Detail = GPULeverFreeze, GPUTimesliceReasonSelfSet, firstOf(selfSet)
	case !in.DriverSupported:
		d.Lever, d.Reason, d.Detail = GPULeverFreeze, GPUTimesliceReasonUnconfirmed, driverUnsupported(in.Driver)
	case len(unconfirmed) > 0:
		d.Lever, d.Reason, d.Detail = GPULeverFreeze, GPUTimesliceReasonUnconfirmed, firstOf(unconfirmed)
	case d.LSSuffers:
		d.Lever, d.Reason = GPULeverFreeze, GPUTimesliceReasonEscalated
		d.Detail = fmt.Sprintf("LS demand %.0f %% (freeze above %.0f %%)", demand, p.FreezeAbovePercent)
		if in.LSHarm {
			d.Detail += ", LS harmed"
		}
	case batchCtx == 0:
		d.Lever, d.Reason = GPULeverTimeslice, GPUTimesliceReasonNoBatchContext
	default:
		d.Lever, d.Reason = GPULeverTimeslice, GPUTimesliceReasonConfirmed
	}
	return d
}

// chooseBatchSlice is batch's slice in µs and how it was chosen (see
// ChooseGPUTimeslice).
func chooseBatchSlice(p GPUTimeslicePolicy, lsPresent bool, demand float64, lsReq, batchReq int64) (uint64, string) {
	if !lsPresent {
		return usOf(GPUTimesliceDriverDefault), "no LS on the GPU: batch at the driver's default slice"
	}
	base := usOf(p.BatchSlice.Duration)
	maxBatch := usOf(p.LSMaxWait.Duration - p.SwitchCost.Duration)
	lsTerm := min(max(lsReq, int64(math.Ceil(10*demand))), milliPerGPU)
	share := uint64(max(min(batchReq, milliPerGPU-lsTerm), 0))
	step := usOf(gpuTimesliceStep)
	us := base + (maxBatch-base)*share/milliPerGPU
	us = max(us/step*step, base)
	return us, fmt.Sprintf("LS on the GPU: batch %d µs for %d milli of %d left by LS (requests %d, demand %.0f %%); "+
		"LS's worst wait %d + %d switch ≤ %d µs", us, share, milliPerGPU-lsTerm, lsReq, demand, us,
		usOf(p.SwitchCost.Duration), usOf(p.LSMaxWait.Duration))
}

// judgeGPUTimeslice is one context's verdict: want is the policy's slice for its class
// now, maxBatchUs the bound on a batch slice where LS is on the GPU.
func judgeGPUTimeslice(c GPUTimesliceContext, want uint64, in GPUTimesliceInput, lsPresent bool,
	maxBatchUs uint64) GPUTimesliceVerdict {
	v := GPUTimesliceVerdict{Pod: c.Pod, PID: c.PID, Context: c.Context, Class: c.Class, AskedUs: c.AskedUs,
		WantUs: want, Reask: c.AskedUs != want}
	if c.ShimReported && c.ShimErrno == 0 && c.ShimStatus == 0 {
		v.ReadBackUs = c.ShimReadBackUs
	}
	class := "LS"
	if c.Class == ClassBatch {
		class = "batch"
	}
	name := fmt.Sprintf("%s context of pod %s pid %d", class, clipNote(c.Pod), c.PID)
	if c.Context != "" {
		name += " (" + clipNote(c.Context) + ")"
	}
	inForce := c.AskedUs
	if c.SelfSet {
		v.SelfSetUs = c.SelfSetUs
		agent := max(c.AskedUs, want)
		switch {
		case c.SelfSetErrno != 0 || c.SelfSetStatus != 0:
			v.Note = fmt.Sprintf("set itself %d µs, refused by the driver (errno %d, status %#x)", c.SelfSetUs,
				c.SelfSetErrno, c.SelfSetStatus)
		case c.SelfSetUs > agent:
			v.Verdict = GPUTimesliceSelfSet
			v.Why = fmt.Sprintf("%s set itself a slice of %d µs, longer than the agent's %d µs", name, c.SelfSetUs, agent)
			return v
		default:
			inForce = c.SelfSetUs
			v.Note = fmt.Sprintf("set itself %d µs, not longer than the agent's %d µs", c.SelfSetUs, agent)
		}
	}
	why := ""
	switch {
	case !in.DriverSupported:
		why = driverUnsupported(in.Driver)
	case c.AskedUs == 0:
		why = "the agent asked it no slice"
	case !c.Observed:
		why = "no outside observation of its slice (the shim's report alone is the tenant's word)"
	case c.ObservedErrno != 0 || c.ObservedStatus != 0:
		why = fmt.Sprintf("the driver refused its slice (errno %d, status %#x, seen from outside)", c.ObservedErrno,
			c.ObservedStatus)
	case c.ObservedSetUs != c.AskedUs:
		why = fmt.Sprintf("seen set to %d µs from outside, the agent asked %d µs", c.ObservedSetUs, c.AskedUs)
	case c.ShimRefused != "":
		why = "the shim set nothing: " + clipNote(c.ShimRefused)
	case !c.ShimReported:
		why = "no shim report (no shim in the container?)"
	case c.ShimErrno != 0 || c.ShimStatus != 0:
		why = fmt.Sprintf("the shim reports the driver or firmware refused it (errno %d, status %#x)", c.ShimErrno,
			c.ShimStatus)
	case c.ShimReadBackUs != c.AskedUs:
		why = fmt.Sprintf("read back %d µs, the agent asked %d µs (the firmware changed it)", c.ShimReadBackUs,
			c.AskedUs)
	case c.Class == ClassBatch && lsPresent && inForce > maxBatchUs:
		why = fmt.Sprintf("%d µs in force, above the %d µs a batch slice may have beside LS (ask again)", inForce,
			maxBatchUs)
	}
	if why != "" {
		v.Verdict, v.Why = GPUTimesliceUnconfirmed, name+": "+why
		return v
	}
	v.Verdict = GPUTimesliceConfirmed
	return v
}

// sumMilli sums gpu-milli requests, each bounded to [0, 1000], the sum to 1000.
func sumMilli(rs []int64) int64 {
	var s int64
	for _, r := range rs {
		s = min(s+min(max(r, 0), milliPerGPU), milliPerGPU)
	}
	return s
}

// usOf is d in whole microseconds (0 for d <= 0).
func usOf(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(d / time.Microsecond)
}

func driverUnsupported(driver string) string {
	if driver == "" {
		return "the driver's version is unknown or unsupported"
	}
	return fmt.Sprintf("driver %s is not a supported version", clipNote(driver))
}

// firstOf is the first reason, with how many more there are.
func firstOf(whys []string) string {
	if len(whys) == 1 {
		return whys[0]
	}
	return fmt.Sprintf("%s (and %d more)", whys[0], len(whys)-1)
}

func joinNotes(notes []string) string {
	s := ""
	for _, n := range notes {
		s = joinNote(s, n)
	}
	return s
}
