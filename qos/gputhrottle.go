package qos

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons reported in GPUThrottleDecision.Reason.
const (
	// GPUReasonIdle: LS needs nothing of the GPU (or has been idle for `hold`); batch runs.
	GPUReasonIdle = "idle"
	// GPUReasonNoBatch: no batch pod uses the GPU; nothing to freeze.
	GPUReasonNoBatch = "no-batch"
	// GPUReasonLSArrived: an LS process has just appeared on the GPU (freeze lever): batch
	// is frozen at once, before the driver's per-process sample (up to ~1 s late) shows
	// what the newcomer does.
	GPUReasonLSArrived = "ls-arrived"
	// GPUReasonLSWoke: an LS process on the GPU began using the CPU (lsWakeCPUPercent of a
	// core or more) after a window below it (freeze lever): it is about to send work, so
	// batch is frozen at once, before the driver's per-process sample shows it. Like an
	// arrival it holds for `hold`; LS's utilisation keeps batch frozen after that.
	GPUReasonLSWoke = "ls-woke"
	// GPUReasonLSUtil: LS utilisation crossed lsUtilOnPercent and has not fallen below
	// lsUtilOffPercent since (freeze lever): batch frozen.
	GPUReasonLSUtil = "ls-util-above-threshold"
	// GPUReasonHold: LS needed the GPU less than `hold` ago: batch stays frozen.
	GPUReasonHold = "hold"
	// GPUReasonMPSWithinCap: MPS lever, LS is on the GPU and its demand fits in what its
	// partition protects: batch runs beside it in its own partition.
	GPUReasonMPSWithinCap = "mps-within-cap"
	// GPUReasonMPSCapStale: MPS lever, LS's demand reached what its partition protects
	// (the smaller of LS's own cap and what batch's cap leaves, less
	// mps.freezeMarginPercent). MPS caps are fixed when a client starts, so the
	// partition cannot grow: batch is frozen instead until LS has been idle for `hold`.
	GPUReasonMPSCapStale = "mps-cap-stale"
	// GPUReasonMPSCapUnconfirmed: every process on the GPU is a planned MPS client, but
	// the agent could not confirm from outside the tenant that each batch client runs
	// within its planned cap at its planned priority (CheckGPUMPSClients: its environment
	// asks for more, lacks the variables or cannot be read, or a client of the server
	// belongs to no planned pod). A cap the tenant set itself protects nothing, so the GPU
	// uses the freeze lever: batch is frozen while an LS process is on the GPU (LS's
	// utilisation is reported under the MPS server, so its presence is what counts) and
	// thawed once none has been there for `hold`.
	GPUReasonMPSCapUnconfirmed = "mps-cap-unconfirmed"
	// GPUReasonUnknown: the GPU could not be read this step; its state is held.
	GPUReasonUnknown = "unknown"
	// GPUReasonTimeslice: the timeslice lever (ChooseGPUTimeslice confirmed every batch
	// context's short slice): batch runs beside LS and the GPU's own scheduler switches
	// it out when LS becomes runnable; nothing is frozen.
	GPUReasonTimeslice = "timeslice"
)

// Levers in GPUThrottleDecision.Lever: how LS is protected on the GPU.
const (
	// GPULeverFreeze: LS and batch time-slice the GPU (no MPS, MIG, MPS off, or a process
	// on the GPU that is not a client of the agent's MPS server), or a batch client's MPS
	// cap could not be confirmed (GPUReasonMPSCapUnconfirmed); batch is frozen solid while
	// LS needs the GPU.
	GPULeverFreeze = "freeze"
	// GPULeverMPS: every process of LS and batch pods on the GPU is a client of the
	// agent's MPS server with an SM cap; batch runs in its partition and is frozen only
	// while LS's demand outgrows its own (GPUReasonMPSCapStale).
	GPULeverMPS = "mps"
)

// Defaults of [GPUThrottlePolicy]; the arithmetic behind them is on GPUThrottle and in
// docs/gpu.md ("Levers").
const (
	DefaultGPUDutyPeriod       = 100 * time.Millisecond
	DefaultGPULSUtilOnPercent  = 2.0
	DefaultGPULSUtilOffPercent = 1.0
	DefaultGPUHold             = time.Second
	DefaultGPULSWakeCPUPercent = 20.0
	// MaxGPULSWakeCPUPercent bounds lsWakeCPUPercent: percent of one core, and a GPU's LS
	// processes are few.
	MaxGPULSWakeCPUPercent   = 10000.0
	DefaultGPUStarveAfter    = 5 * time.Minute
	MinGPUDutyPeriod         = 10 * time.Millisecond
	MaxGPUDutyPeriod         = time.Second
	gpuUtilMaxPercent        = 100.0
	gpuThrottleSanitizedUnkn = "unknown GPU: freeze state held, starvation timer restarted"
)

// ErrGPUThrottleKeyRemoved is wrapped (with ErrInvalidConfig) by Validate for a key
// of a fractional duty cycle (activeDuty, maxDuty, restorePerSecond): the throttle has
// none, and a file that sets one must say so rather than be taken as tuning.
var ErrGPUThrottleKeyRemoved = errors.New("key removed with the fractional duty cycle")

// GPUThrottlePolicy is the YAML-configurable part of GPU-aware batch throttling. Plain
// data with JSON/YAML tags (sigs.k8s.io/yaml); durations are strings such as "1s". As
// with Policy, pre-fill it with DefaultGPUThrottlePolicy() before unmarshalling, then
// call Validate.
type GPUThrottlePolicy struct {
	// Period is the freezer's clock, in [10ms, 1s]: the agent's cycler and GPU loop step
	// on its grid. Batch is frozen solid or not at all; there is no fractional duty.
	Period metav1.Duration `json:"period"`
	// LSUtilOnPercent is the LS utilisation of a GPU (percent of the device, summed over
	// its LS processes) at or above which batch is frozen (freeze lever), in (0, 100].
	LSUtilOnPercent float64 `json:"lsUtilOnPercent"`
	// LSUtilOffPercent is the LS utilisation below which LS counts as idle again, in
	// [0, lsUtilOnPercent): the hysteresis band.
	LSUtilOffPercent float64 `json:"lsUtilOffPercent"`
	// Hold is how long LS must have been idle before batch is thawed, >= 0. It also bounds
	// how long an LS process that merely arrived (and holds its CUDA context), or woke on
	// the CPU without using the GPU, keeps batch frozen.
	Hold metav1.Duration `json:"hold"`
	// LSWakeCPUPercent is the CPU use (percent of one core, the busiest LS process of the
	// GPU over the agent's CPU window) at which an LS process that was below it counts as
	// waking (freeze lever): batch is frozen at once (GPUReasonLSWoke). 0 turns the signal
	// off; at most MaxGPULSWakeCPUPercent.
	LSWakeCPUPercent float64 `json:"lsWakeCPUPercent"`
	// StarveAfter is how long batch may stay frozen solid before the decision says
	// Escalate (suspend or evict), >= 0; 0 never escalates.
	StarveAfter metav1.Duration `json:"starveAfter"`
	// MPS is the MPS partition policy: how the caps are chosen, and when LS outgrows its
	// partition.
	MPS GPUMPSPolicy `json:"mps"`

	// Keys of a fractional duty cycle, which the throttle does not have (on a real
	// GPU a duty cycle lost to both levers, the freeze and MPS). Set, they fail
	// Validate with an error naming what replaces them; never set them.
	RemovedActiveDuty       *float64 `json:"activeDuty,omitempty"`
	RemovedMaxDuty          *float64 `json:"maxDuty,omitempty"`
	RemovedRestorePerSecond *float64 `json:"restorePerSecond,omitempty"`
}

// DefaultGPUThrottlePolicy returns the defaults. It passes Validate.
func DefaultGPUThrottlePolicy() GPUThrottlePolicy {
	return GPUThrottlePolicy{
		Period:           metav1.Duration{Duration: DefaultGPUDutyPeriod},
		LSUtilOnPercent:  DefaultGPULSUtilOnPercent,
		LSUtilOffPercent: DefaultGPULSUtilOffPercent,
		Hold:             metav1.Duration{Duration: DefaultGPUHold},
		LSWakeCPUPercent: DefaultGPULSWakeCPUPercent,
		StarveAfter:      metav1.Duration{Duration: DefaultGPUStarveAfter},
		MPS:              DefaultGPUMPSPolicy(),
	}
}

// Validate reports every out-of-range field; each error names the field by its YAML key
// and wraps ErrInvalidConfig (several are joined with errors.Join). A removed key also
// wraps ErrGPUThrottleKeyRemoved and says what replaces it. A zero GPUThrottlePolicy is
// invalid: start from the defaults.
func (p GPUThrottlePolicy) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("gpu throttle %s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	removed := func(field string, v *float64, instead string) {
		if v != nil {
			errs = append(errs, fmt.Errorf("gpu throttle %s: %v: %w: batch is no longer duty-cycled but frozen "+
				"solid while LS needs the GPU (or runs in an MPS partition); %s: %w", field, *v,
				ErrGPUThrottleKeyRemoved, instead, ErrInvalidConfig))
		}
	}
	removed("activeDuty", p.RemovedActiveDuty, "an LS process that arrives freezes batch for `hold`; "+
		"set gpu.throttle.hold and gpu.throttle.lsUtilOnPercent instead")
	removed("maxDuty", p.RemovedMaxDuty, "a freeze is always whole; to bound how long batch may stay "+
		"frozen set gpu.throttle.starveAfter instead")
	removed("restorePerSecond", p.RemovedRestorePerSecond, "batch is thawed at once once LS has been idle "+
		"for gpu.throttle.hold; set that instead")
	if d := p.Period.Duration; d < MinGPUDutyPeriod || d > MaxGPUDutyPeriod {
		bad("period", d, fmt.Sprintf("must be in [%v, %v]", MinGPUDutyPeriod, MaxGPUDutyPeriod))
	}
	onOK := p.LSUtilOnPercent > 0 && p.LSUtilOnPercent <= gpuUtilMaxPercent // false for NaN
	if !onOK {
		bad("lsUtilOnPercent", p.LSUtilOnPercent, "must be in (0, 100]")
	}
	switch {
	case !(p.LSUtilOffPercent >= 0 && p.LSUtilOffPercent <= gpuUtilMaxPercent):
		bad("lsUtilOffPercent", p.LSUtilOffPercent, "must be in [0, lsUtilOnPercent)")
	case onOK && p.LSUtilOffPercent >= p.LSUtilOnPercent:
		bad("lsUtilOffPercent", p.LSUtilOffPercent,
			fmt.Sprintf("must be below lsUtilOnPercent (%v): the hysteresis band", p.LSUtilOnPercent))
	}
	if p.Hold.Duration < 0 {
		bad("hold", p.Hold.Duration, "must be >= 0")
	}
	if !(p.LSWakeCPUPercent >= 0 && p.LSWakeCPUPercent <= MaxGPULSWakeCPUPercent) {
		bad("lsWakeCPUPercent", p.LSWakeCPUPercent, fmt.Sprintf("must be in [0, %v] (0: off)", MaxGPULSWakeCPUPercent))
	}
	if p.StarveAfter.Duration < 0 {
		bad("starveAfter", p.StarveAfter.Duration, "must be >= 0 (0 never escalates)")
	}
	if err := p.MPS.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// forceGPUThrottleRange maps out-of-range fields to in-range values that keep LS
// protected and escalate less: a bad field takes its default (bounded by the fields it
// depends on), a negative starveAfter disables escalation; removed keys are dropped. The
// result passes Validate.
func forceGPUThrottleRange(p GPUThrottlePolicy) GPUThrottlePolicy {
	p.RemovedActiveDuty, p.RemovedMaxDuty, p.RemovedRestorePerSecond = nil, nil, nil
	if d := p.Period.Duration; d < MinGPUDutyPeriod || d > MaxGPUDutyPeriod {
		p.Period.Duration = DefaultGPUDutyPeriod
	}
	if !(p.LSUtilOnPercent > 0 && p.LSUtilOnPercent <= gpuUtilMaxPercent) {
		p.LSUtilOnPercent = DefaultGPULSUtilOnPercent
	}
	if !(p.LSUtilOffPercent >= 0 && p.LSUtilOffPercent < p.LSUtilOnPercent) {
		p.LSUtilOffPercent = math.Min(DefaultGPULSUtilOffPercent, p.LSUtilOnPercent/2)
	}
	if p.Hold.Duration < 0 {
		p.Hold.Duration = DefaultGPUHold
	}
	if !(p.LSWakeCPUPercent >= 0 && p.LSWakeCPUPercent <= MaxGPULSWakeCPUPercent) {
		p.LSWakeCPUPercent = DefaultGPULSWakeCPUPercent
	}
	if p.StarveAfter.Duration < 0 {
		p.StarveAfter.Duration = 0
	}
	p.MPS = forceGPUMPSRange(p.MPS)
	return p
}

// GPUThrottleInput is one GPU at one step, as the agent measured it.
type GPUThrottleInput struct {
	// Index is the GPU's NVML index; the key of its state. Indices should be unique in
	// one Step; a repeated index is merged into the first (see Step).
	Index int
	// LSActive: an LS process is on the GPU. LSUtil > 0 implies it.
	LSActive bool
	// LSArrived: an LS process that was not on the GPU at the last step is now (the agent
	// tracks the PIDs). Without MPS it freezes batch at once, for `hold` at least.
	LSArrived bool
	// LSUtil is the LS pods' utilisation of the GPU, percent of the device (0..100).
	LSUtil float64
	// LSCPUPercent is the CPU use of the GPU's busiest LS process over the agent's last
	// CPU window, percent of one core; LSCPUKnown says it was measured (the agent measures
	// it only where batch runs beside LS without MPS, and not for a process it sees for
	// the first time). An LS process crossing lsWakeCPUPercent from below between two
	// measured steps woke (GPUReasonLSWoke).
	LSCPUPercent float64
	LSCPUKnown   bool
	// BatchUtil is the batch pods' utilisation, percent; reported, not used.
	BatchUtil float64
	// BatchPods is the number of batch pods using the GPU; 0 means nothing to freeze.
	BatchPods int
	// MPS: every LS and batch process on the GPU is a client of the agent's MPS server,
	// with the caps below (the MPS lever). False: the freeze lever.
	MPS bool
	// LSCapPercent is the largest CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the GPU's LS
	// clients (0: none known, taken as 100); BatchCapPercent the largest of its batch
	// clients (0: none). Used only with MPS.
	LSCapPercent, BatchCapPercent int
	// BatchMemLimitMiB is the sum of the pinned device memory limits of the GPU's batch
	// clients, MiB: the most batch may allocate on the GPU through CUDA (0: unbounded, a
	// batch client has none). Used only with MPS, and only reported.
	BatchMemLimitMiB uint64
	// MPSCapUnconfirmed, with MPS, says why the batch clients' caps could not be confirmed
	// (CheckGPUMPSClients); non-empty: the freeze lever, batch frozen while LS is on the
	// GPU (GPUReasonMPSCapUnconfirmed).
	MPSCapUnconfirmed string
	// Timeslice: ChooseGPUTimeslice gave the GPU the timeslice lever (every batch
	// context's short slice confirmed, LS not suffering). Without MPS, batch is then not
	// frozen (GPUReasonTimeslice, GPULeverTimeslice); LS's need of the GPU is still
	// tracked, so that a step that leaves the lever freezes at once where LS needs it.
	// Ignored with MPS.
	Timeslice bool
	// Unknown: the collector could not read the GPU this step (the other fields are
	// ignored); its freeze state is held.
	Unknown bool
}

// GPUThrottleDecision is one GPU's freeze with the terms behind it, JSON-encodable for
// /status.
type GPUThrottleDecision struct {
	GPU int `json:"gpu"`
	// Lever is GPULeverFreeze, GPULeverMPS or GPULeverTimeslice.
	Lever string `json:"lever"`
	// Frozen: the GPU's batch pods are to be frozen solid. Duty is the same as a number
	// for the freezer cycler and the metrics: 1 frozen, 0 not.
	Frozen bool    `json:"frozen"`
	Duty   float64 `json:"duty"`
	// Reason is one of the GPUReason* constants.
	Reason string `json:"reason"`
	// The inputs after sanitising.
	LSActive  bool    `json:"lsActive"`
	LSArrived bool    `json:"lsArrived,omitempty"`
	LSUtil    float64 `json:"lsUtilPercent"`
	// LSCPU is LSCPUPercent when measured (absent otherwise).
	LSCPU     *float64 `json:"lsCpuPercent,omitempty"`
	BatchUtil float64  `json:"batchUtilPercent"`
	BatchPods int      `json:"batchPods"`
	// LSCapPercent and BatchCapPercent are the MPS caps of the GPU's clients (MPS lever
	// only); ProtectedPercent is the LS demand the partition protects: the smaller of LS's
	// cap and what batch's cap leaves. LS at or above ProtectedPercent less the margin
	// freezes batch (GPUReasonMPSCapStale).
	LSCapPercent     int `json:"lsCapPercent,omitempty"`
	BatchCapPercent  int `json:"batchCapPercent,omitempty"`
	ProtectedPercent int `json:"protectedPercent,omitempty"`
	// BatchMemLimitMiB is the sum of the batch clients' pinned device memory limits, MiB
	// (MPS lever only; absent: unbounded).
	BatchMemLimitMiB uint64 `json:"batchMemLimitMiB,omitempty"`
	// MPSCapUnconfirmed says why the GPU left the MPS lever although every process on it
	// is a planned client (GPUReasonMPSCapUnconfirmed).
	MPSCapUnconfirmed string `json:"mpsCapUnconfirmed,omitempty"`
	// LSNeedsGPU: LS needed the GPU at this step or less than `hold` ago, so batch is
	// (or, with no batch on the GPU, would be) frozen. IdleFor is how long LS has not
	// needed it then (thawed at `hold`).
	LSNeedsGPU bool            `json:"lsNeedsGPU"`
	IdleFor    metav1.Duration `json:"lsIdleFor"`
	// Starved: batch is frozen; StarvedFor is for how long without a thaw.
	Starved    bool            `json:"starved"`
	StarvedFor metav1.Duration `json:"starvedFor"`
	// Escalate: starved for at least starveAfter; suspend or evict the GPU's batch pods.
	Escalate bool `json:"escalate,omitempty"`
	// ClockJump: the clock went back or jumped forward; timers restarted.
	ClockJump bool `json:"clockJump,omitempty"`
	// Sanitized is empty when every input was usable; otherwise it says what was
	// replaced and by what.
	Sanitized string `json:"sanitized,omitempty"`
}

// GPUThrottle is GPU-aware batch throttling with an on/off freeze: per GPU it decides
// whether the batch pods using the GPU are frozen solid, so that LS work on it gets the
// device. The agent calls Step once per GPU loop step and hands the result to the
// freezer cycler (koordlet/gpu/duty) at duty 1 or 0. It is not safe for concurrent use;
// the agent's GPU loop owns it.
//
// Rules, per GPU. LS "needs" the GPU at a step when
//
//	freeze lever (no MPS):  an LS process arrived (LSArrived), or woke on the CPU (its
//	                        CPU use crossed lsWakeCPUPercent from below between two
//	                        measured steps), or LS utilisation is high (hysteresis: on
//	                        at >= lsUtilOnPercent, off below lsUtilOffPercent);
//	MPS lever:              LS utilisation >= ProtectedPercent - mps.freezeMarginPercent,
//	                        ProtectedPercent = min(LS cap, 100 - batch cap);
//	MPS, cap unconfirmed:   an LS process is on the GPU (the freeze lever: a batch cap
//	                        the agent could not confirm protects nothing).
//
// Batch is frozen at once at a step where LS needs the GPU and thawed once LS has not
// needed it for `hold`; on the timeslice lever (GPUThrottleInput.Timeslice, without MPS)
// it is never frozen, while LS's need is tracked as on the freeze lever. Why on/off and
// not a fractional duty cycle: on a real GPU, in each thaw window of a duty cycle batch
// queued a burst that the next LS requests waited behind (docs/gpu.md, "Levers").
// Batch counts as starved while frozen; past starveAfter without a thaw the decision
// says Escalate, and the agent goes on to suspend (cuda-checkpoint) or eviction.
//
// Defaults (the arithmetic, docs/gpu.md "Levers"): an LS process that only holds its
// CUDA context sends no kernels and reads 0 %, so it freezes batch only for `hold` (1 s)
// after it arrived; with the 50 ms loop batch runs again about 1.05 s later, inside the
// target of 90 % of its alone throughput within 2 s. The arrival freeze covers the
// driver's per-process sample, which lags up to ~1 s: an LS that starts sending is seen
// at >= 2 % before the hold runs out and keeps batch frozen. 2 % is one 3.3 ms request
// every 165 ms; LS sparser than that time-slices with batch.
//
// The wake covers an LS process that holds its context, was idle, and starts sending
// while batch runs: the driver's per-process sample shows it late, and on an H200 next
// to a deep-queue batch it did not cross 2 % for 4.7 s (bench/gpureal). A process that
// launches work uses the CPU first (a CUDA synchronize spins by default), so a crossing
// of lsWakeCPUPercent (20 % of a core) freezes batch within the agent's CPU window
// (100 ms). Only the crossing counts: an LS process busy on the CPU without using the
// GPU freezes batch for `hold` once, not for as long as it is busy; one with CPU bursts
// and no GPU work costs batch `hold` per burst (raise lsWakeCPUPercent, or 0 turns the
// signal off). An LS process that waits for the GPU without spinning (blocking
// synchronisation) may stay below the threshold: then only its utilisation counts.
//
// Traps:
//
//   - A flapping LS keeps batch frozen: every step that needs the GPU restarts the hold.
//     This is the intent; to release sooner after LS leaves, shorten hold.
//   - Bad utilisation figures are taken as the worst for LS: a NaN, infinite or negative LS
//     utilisation is 100 %. A GPU the collector could not read (Unknown) keeps its state;
//     its starvation timer restarts, because a stale reading is no evidence for eviction.
//   - A GPU absent from a Step is forgotten: if it comes back, it starts thawed and
//     freezes at once if LS needs it. Pass an unreadable GPU as Unknown instead of
//     dropping it.
//   - A clock that goes back, or a step more than EscalationMaxGapPeriods control periods
//     (at least MinEscalationGap) after the last, restarts the hold and starvation
//     timers, as in the Escalator.
//   - A pod on several GPUs must be frozen when any of its GPUs says so; the cycler does
//     that when given one key per GPU.
type GPUThrottle struct {
	p      GPUThrottlePolicy
	maxGap time.Duration
	gpus   map[int]*gpuThrottleState
}

// gpuThrottleState is what one GPU remembers between steps.
type gpuThrottleState struct {
	want         bool      // LS wants batch frozen (needed within hold), whether batch is there or not
	why          string    // the reason of the last step that needed the GPU
	engaged      bool      // LS utilisation is "high" (between on and off crossings)
	cpuKnown     bool      // the last step measured LS's CPU
	cpuBusy      bool      // ... and found it at or above lsWakeCPUPercent
	needAt       time.Time // last step that needed the GPU: the hold runs from here
	frozen       bool      // batch frozen (want and batch present)
	starvedSince time.Time
	last         time.Time
	hasLast      bool
}

// NewGPUThrottle returns a controller for p and the period of the agent's GPU loop (for
// the clock-jump check; <= 0 disables the forward-jump check). p should have passed
// Validate; as the constructor cannot fail, out-of-range fields are forced into range
// (read them back with Policy).
func NewGPUThrottle(p GPUThrottlePolicy, period time.Duration) *GPUThrottle {
	t := &GPUThrottle{p: forceGPUThrottleRange(p), gpus: map[int]*gpuThrottleState{}}
	if period > 0 {
		t.maxGap = max(EscalationMaxGapPeriods*period, MinEscalationGap)
	}
	return t
}

// Policy returns the policy in use, after NewGPUThrottle forced it into range.
func (t *GPUThrottle) Policy() GPUThrottlePolicy { return t.p }

// Reset forgets every GPU: the next Step starts each thawed.
func (t *GPUThrottle) Reset() { clear(t.gpus) }

// Step computes every GPU's freeze at now, sorted by GPU index. GPUs absent from in are
// forgotten. A repeated index is merged into the first, the worst case for LS: active or
// arrived if either is, the higher utilisations, the larger pod count, MPS only if both
// are (with the larger batch cap and memory limit, the smaller LS cap, unconfirmed if either
// is), the timeslice lever only if both have it, unknown only if both are.
func (t *GPUThrottle) Step(now time.Time, in []GPUThrottleInput) []GPUThrottleDecision {
	merged := make([]GPUThrottleInput, 0, len(in))
	dups := map[int]bool{}
	for _, x := range in {
		i := slices.IndexFunc(merged, func(m GPUThrottleInput) bool { return m.Index == x.Index })
		if i < 0 {
			merged = append(merged, x)
			continue
		}
		dups[x.Index] = true
		m := &merged[i]
		switch {
		case m.Unknown && !x.Unknown:
			*m = x
		case !m.Unknown && !x.Unknown:
			m.LSActive = m.LSActive || x.LSActive
			m.LSArrived = m.LSArrived || x.LSArrived
			m.LSUtil = worstUtil(m.LSUtil, x.LSUtil)
			switch {
			case m.LSCPUKnown && x.LSCPUKnown:
				m.LSCPUPercent = worstUtil(m.LSCPUPercent, x.LSCPUPercent)
			case x.LSCPUKnown:
				m.LSCPUPercent, m.LSCPUKnown = x.LSCPUPercent, true
			}
			m.BatchUtil = math.Max(m.BatchUtil, x.BatchUtil)
			m.BatchPods = max(m.BatchPods, x.BatchPods)
			m.MPS = m.MPS && x.MPS
			m.Timeslice = m.Timeslice && x.Timeslice
			if x.MPSCapUnconfirmed != "" {
				m.MPSCapUnconfirmed = joinNote(m.MPSCapUnconfirmed, x.MPSCapUnconfirmed)
			}
			m.BatchCapPercent = max(m.BatchCapPercent, x.BatchCapPercent)
			if m.BatchMemLimitMiB == 0 || x.BatchMemLimitMiB == 0 {
				m.BatchMemLimitMiB = 0 // unbounded in either: unbounded
			} else {
				m.BatchMemLimitMiB = max(m.BatchMemLimitMiB, x.BatchMemLimitMiB)
			}
			m.LSCapPercent = min(capOrFull(m.LSCapPercent), capOrFull(x.LSCapPercent))
		}
	}
	for idx := range t.gpus {
		if !slices.ContainsFunc(merged, func(m GPUThrottleInput) bool { return m.Index == idx }) {
			delete(t.gpus, idx)
		}
	}
	out := make([]GPUThrottleDecision, 0, len(merged))
	for _, x := range merged {
		s := t.gpus[x.Index]
		if s == nil {
			s = &gpuThrottleState{}
			t.gpus[x.Index] = s
		}
		d := s.step(t.p, t.maxGap, now, x)
		if dups[x.Index] {
			d.Sanitized = joinNote(d.Sanitized, fmt.Sprintf("gpu %d given more than once: merged", x.Index))
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b GPUThrottleDecision) int { return a.GPU - b.GPU })
	return out
}

// capOrFull is an LS cap with 0 (none known) read as 100.
func capOrFull(c int) int {
	if c <= 0 || c > 100 {
		return 100
	}
	return c
}

// worstUtil is the higher of two LS utilisations, a NaN being the highest.
func worstUtil(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return math.Max(a, b)
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// sanePercent maps v into [0, 100]: bad is what a NaN, infinite or negative v becomes;
// the note says what was replaced ("" when nothing).
func sanePercent(name string, v, bad float64) (float64, string) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
		return bad, fmt.Sprintf("%s=%v unusable: assumed %v", name, v, bad)
	case v > gpuUtilMaxPercent:
		return gpuUtilMaxPercent, fmt.Sprintf("%s=%v above 100: capped", name, v)
	}
	return v, ""
}

// step advances one GPU to now.
func (s *gpuThrottleState) step(p GPUThrottlePolicy, maxGap time.Duration, now time.Time,
	in GPUThrottleInput) GPUThrottleDecision {
	d := GPUThrottleDecision{GPU: in.Index, Lever: GPULeverFreeze}
	if s.hasLast {
		if dt := now.Sub(s.last); dt < 0 || (maxGap > 0 && dt > maxGap) {
			// The gap is no evidence: the hold and starvation timers restart at now.
			d.ClockJump = true
			s.starvedSince = now
			if s.want {
				s.needAt = now
			}
		}
	}
	s.last, s.hasLast = now, true

	if in.Unknown {
		d.Reason, d.Sanitized = GPUReasonUnknown, gpuThrottleSanitizedUnkn
		s.starvedSince = now
		s.cpuKnown = false // no CPU crossing spans an unread step
		s.fill(p, now, &d)
		d.Escalate = false
		return d
	}

	var notes []string
	note := func(n string) {
		if n != "" {
			notes = append(notes, n)
		}
	}
	lsUtil, n := sanePercent("lsUtil", in.LSUtil, gpuUtilMaxPercent)
	note(n)
	batchUtil, n := sanePercent("batchUtil", in.BatchUtil, 0)
	note(n)
	pods := in.BatchPods
	if pods < 0 {
		note(fmt.Sprintf("batchPods=%d negative: assumed 0", in.BatchPods))
		pods = 0
	}
	active := in.LSActive || in.LSArrived || lsUtil > 0
	d.LSActive, d.LSArrived, d.LSUtil, d.BatchUtil, d.BatchPods = active, in.LSArrived, lsUtil, batchUtil, pods
	cpuKnown := in.LSCPUKnown
	if cpuKnown && (math.IsNaN(in.LSCPUPercent) || math.IsInf(in.LSCPUPercent, 0) || in.LSCPUPercent < 0) {
		note(fmt.Sprintf("lsCpu=%v unusable: not measured", in.LSCPUPercent))
		cpuKnown = false
	}
	cpuBusy := cpuKnown && p.LSWakeCPUPercent > 0 && in.LSCPUPercent >= p.LSWakeCPUPercent
	if cpuKnown {
		v := in.LSCPUPercent
		d.LSCPU = &v
	}
	// A wake is a crossing between two measured steps: a process first measured busy, or
	// measured again after a gap, is no evidence of one (arrivals have their own rule).
	woke := cpuBusy && s.cpuKnown && !s.cpuBusy && !in.MPS
	s.cpuKnown, s.cpuBusy = cpuKnown, cpuBusy

	need, why := false, ""
	switch {
	case in.MPS && in.MPSCapUnconfirmed != "":
		// The partition is the tenant's word only: the freeze lever, on LS's presence
		// (its utilisation is reported under the MPS server's PID).
		d.MPSCapUnconfirmed = in.MPSCapUnconfirmed
		s.engaged = false
		if active {
			need, why = true, GPUReasonMPSCapUnconfirmed
		}
	case in.MPS:
		d.Lever = GPULeverMPS
		s.engaged = false // the utilisation hysteresis belongs to the freeze lever
		lsCap, batchCap := capOrFull(in.LSCapPercent), in.BatchCapPercent
		if batchCap < 0 || batchCap >= 100 {
			// An unlimited (or nonsense) batch cap protects nothing: the whole GPU is
			// batch's. The agent never hands one out; take the worst case.
			note(fmt.Sprintf("batchCap=%d: no partition, LS protected by the freeze alone", in.BatchCapPercent))
			batchCap = 100
		}
		protected := min(lsCap, 100-batchCap)
		d.LSCapPercent, d.BatchCapPercent, d.ProtectedPercent = lsCap, batchCap, protected
		d.BatchMemLimitMiB = in.BatchMemLimitMiB
		if active && lsUtil >= float64(protected)-p.MPS.FreezeMarginPercent {
			need, why = true, GPUReasonMPSCapStale
		}
	default:
		switch {
		case !active:
			s.engaged = false
		case lsUtil >= p.LSUtilOnPercent:
			s.engaged = true
		case lsUtil < p.LSUtilOffPercent:
			s.engaged = false
		}
		switch {
		case s.engaged:
			need, why = true, GPUReasonLSUtil
		case in.LSArrived:
			need, why = true, GPUReasonLSArrived
		case woke:
			need, why = true, GPUReasonLSWoke
		}
	}
	d.Sanitized = strings.Join(notes, "; ")
	timeslice := in.Timeslice && !in.MPS
	if timeslice {
		d.Lever = GPULeverTimeslice
	}

	switch {
	case need:
		s.want, s.why, s.needAt = true, why, now
	case s.want && now.Sub(s.needAt) >= p.Hold.Duration:
		s.want = false
	}
	if s.want {
		d.LSNeedsGPU, d.IdleFor = true, metav1.Duration{Duration: now.Sub(s.needAt)}
	}
	switch {
	case pods == 0:
		// Nothing to freeze; a batch pod that arrives while LS still wants the GPU is
		// frozen at once.
		s.frozen = false
		d.Reason = GPUReasonNoBatch
	case timeslice:
		// The GPU's scheduler switches batch out within a batch slice of LS becoming
		// runnable: nothing to freeze. s.want still follows LS, for the step that leaves
		// the lever.
		s.frozen = false
		d.Reason = GPUReasonTimeslice
	case s.want:
		s.frozen = true
		d.Reason = s.why
		if !need {
			d.Reason = GPUReasonHold
		}
	default:
		s.frozen = false
		d.Reason = GPUReasonIdle
		if in.MPS && active {
			d.Reason = GPUReasonMPSWithinCap
		}
	}
	s.fill(p, now, &d)
	return d
}

// fill sets the freeze and starvation fields of d from s.
func (s *gpuThrottleState) fill(p GPUThrottlePolicy, now time.Time, d *GPUThrottleDecision) {
	d.Frozen = s.frozen
	d.Duty = 0
	if s.frozen {
		d.Duty = 1
	}
	if !s.frozen {
		s.starvedSince = time.Time{}
		return
	}
	if s.starvedSince.IsZero() {
		s.starvedSince = now
	}
	d.Starved = true
	d.StarvedFor = metav1.Duration{Duration: now.Sub(s.starvedSince)}
	d.Escalate = p.StarveAfter.Duration > 0 && d.StarvedFor.Duration >= p.StarveAfter.Duration
}
