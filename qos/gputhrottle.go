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
	// GPUReasonIdle: no LS work on the GPU and nothing left to restore; duty 0.
	GPUReasonIdle = "idle"
	// GPUReasonNoBatch: no batch pod uses the GPU; duty 0 (nothing to freeze).
	GPUReasonNoBatch = "no-batch"
	// GPUReasonLSActive: an LS process is active on the GPU; duty = activeDuty.
	GPUReasonLSActive = "ls-active"
	// GPUReasonLSUtil: LS utilisation crossed lsUtilOnPercent and has not fallen below
	// lsUtilOffPercent since; duty = maxDuty.
	GPUReasonLSUtil = "ls-util-above-threshold"
	// GPUReasonHold: the target fell, but the last trigger is less than `hold` ago;
	// duty unchanged.
	GPUReasonHold = "hold"
	// GPUReasonRestoring: duty is falling towards the target at restorePerSecond.
	GPUReasonRestoring = "restoring"
	// GPUReasonUnknown: the GPU could not be read this step; duty unchanged.
	GPUReasonUnknown = "unknown"
)

// Defaults of [GPUThrottlePolicy]. Placeholders until benchmarks on a real GPU tune them.
const (
	DefaultGPUDutyPeriod        = 100 * time.Millisecond
	DefaultGPULSUtilOnPercent   = 25.0
	DefaultGPULSUtilOffPercent  = 10.0
	DefaultGPUActiveDuty        = 0.3
	DefaultGPUMaxDuty           = 0.9
	DefaultGPURestorePerSecond  = 0.1
	DefaultGPUHold              = 2 * time.Second
	DefaultGPUStarveAfter       = 5 * time.Minute
	MinGPUDutyPeriod            = 10 * time.Millisecond
	MaxGPUDutyPeriod            = time.Second
	gpuUtilMaxPercent           = 100.0
	gpuThrottleSanitizedUnknown = "unknown GPU: duty held, starvation timer restarted"
)

// GPUThrottlePolicy is the YAML-configurable part of GPU-aware batch throttling. Plain
// data with JSON/YAML tags (sigs.k8s.io/yaml); durations are strings such as "100ms". As
// with Policy, pre-fill it with DefaultGPUThrottlePolicy() before unmarshalling, then
// call Validate.
type GPUThrottlePolicy struct {
	// Period is the duty-cycle period of the freezer, in [10ms, 1s]: batch is frozen for
	// duty*period of each period. Used by the agent's cycler, not by GPUThrottle.
	Period metav1.Duration `json:"period"`
	// LSUtilOnPercent is the LS utilisation of a GPU (percent of the device, summed over
	// its LS processes) at or above which batch is cut to maxDuty, in (0, 100].
	LSUtilOnPercent float64 `json:"lsUtilOnPercent"`
	// LSUtilOffPercent is the LS utilisation below which that cut is released, in
	// [0, lsUtilOnPercent): the hysteresis band.
	LSUtilOffPercent float64 `json:"lsUtilOffPercent"`
	// ActiveDuty is the duty while an LS process is active on the GPU below the on
	// threshold, in [0, maxDuty]; 0 throttles on utilisation only.
	ActiveDuty float64 `json:"activeDuty"`
	// MaxDuty is the highest duty, in (0, 1]; 1 freezes batch for whole periods. Below 1,
	// batch keeps a sliver of each period (its watchdogs and collectives keep running).
	MaxDuty float64 `json:"maxDuty"`
	// RestorePerSecond is how fast duty falls back once the hold has passed, in duty per
	// second, > 0 (0.1: from 0.9 to 0 in 9 s). Cuts are never limited.
	RestorePerSecond float64 `json:"restorePerSecond"`
	// Hold is how long duty stays up after the last step that reached it, >= 0.
	Hold metav1.Duration `json:"hold"`
	// StarveAfter is how long batch may be held at maxDuty before the decision says
	// Escalate (suspend or evict), >= 0; 0 never escalates.
	StarveAfter metav1.Duration `json:"starveAfter"`
}

// DefaultGPUThrottlePolicy returns the defaults. It passes Validate.
func DefaultGPUThrottlePolicy() GPUThrottlePolicy {
	return GPUThrottlePolicy{
		Period:           metav1.Duration{Duration: DefaultGPUDutyPeriod},
		LSUtilOnPercent:  DefaultGPULSUtilOnPercent,
		LSUtilOffPercent: DefaultGPULSUtilOffPercent,
		ActiveDuty:       DefaultGPUActiveDuty,
		MaxDuty:          DefaultGPUMaxDuty,
		RestorePerSecond: DefaultGPURestorePerSecond,
		Hold:             metav1.Duration{Duration: DefaultGPUHold},
		StarveAfter:      metav1.Duration{Duration: DefaultGPUStarveAfter},
	}
}

// Validate reports every out-of-range field; each error names the field by its YAML key
// and wraps ErrInvalidConfig (several are joined with errors.Join). A zero
// GPUThrottlePolicy is invalid: start from the defaults.
func (p GPUThrottlePolicy) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("gpu throttle %s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
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
	maxOK := p.MaxDuty > 0 && p.MaxDuty <= 1
	if !maxOK {
		bad("maxDuty", p.MaxDuty, "must be in (0, 1]")
	}
	switch {
	case !(p.ActiveDuty >= 0 && p.ActiveDuty <= 1):
		bad("activeDuty", p.ActiveDuty, "must be in [0, maxDuty]")
	case maxOK && p.ActiveDuty > p.MaxDuty:
		bad("activeDuty", p.ActiveDuty, fmt.Sprintf("must not exceed maxDuty (%v)", p.MaxDuty))
	}
	if !(p.RestorePerSecond > 0) || math.IsInf(p.RestorePerSecond, 0) {
		bad("restorePerSecond", p.RestorePerSecond, "must be a finite duty per second > 0")
	}
	if p.Hold.Duration < 0 {
		bad("hold", p.Hold.Duration, "must be >= 0")
	}
	if p.StarveAfter.Duration < 0 {
		bad("starveAfter", p.StarveAfter.Duration, "must be >= 0 (0 never escalates)")
	}
	return errors.Join(errs...)
}

// forceGPUThrottleRange maps out-of-range fields to in-range values that keep LS
// protected and escalate less: a bad field takes its default (bounded by the fields it
// depends on), a negative starveAfter disables escalation. The result passes Validate.
func forceGPUThrottleRange(p GPUThrottlePolicy) GPUThrottlePolicy {
	if d := p.Period.Duration; d < MinGPUDutyPeriod || d > MaxGPUDutyPeriod {
		p.Period.Duration = DefaultGPUDutyPeriod
	}
	if !(p.LSUtilOnPercent > 0 && p.LSUtilOnPercent <= gpuUtilMaxPercent) {
		p.LSUtilOnPercent = DefaultGPULSUtilOnPercent
	}
	if !(p.LSUtilOffPercent >= 0 && p.LSUtilOffPercent < p.LSUtilOnPercent) {
		p.LSUtilOffPercent = math.Min(DefaultGPULSUtilOffPercent, p.LSUtilOnPercent/2)
	}
	if !(p.MaxDuty > 0 && p.MaxDuty <= 1) {
		p.MaxDuty = DefaultGPUMaxDuty
	}
	if !(p.ActiveDuty >= 0 && p.ActiveDuty <= p.MaxDuty) {
		p.ActiveDuty = math.Min(DefaultGPUActiveDuty, p.MaxDuty)
	}
	if !(p.RestorePerSecond > 0) || math.IsInf(p.RestorePerSecond, 0) {
		p.RestorePerSecond = DefaultGPURestorePerSecond
	}
	if p.Hold.Duration < 0 {
		p.Hold.Duration = DefaultGPUHold
	}
	if p.StarveAfter.Duration < 0 {
		p.StarveAfter.Duration = 0
	}
	return p
}

// GPUThrottleInput is one GPU at one step, as the agent measured it.
type GPUThrottleInput struct {
	// Index is the GPU's NVML index; the key of its state. Indices should be unique in
	// one Step; a repeated index is merged into the first (see Step).
	Index int
	// LSActive: an LS process has work on this GPU. The agent decides what counts (a
	// process present, or one with non-zero utilisation). LSUtil > 0 implies it.
	LSActive bool
	// LSUtil is the LS pods' utilisation of the GPU, percent of the device (0..100).
	LSUtil float64
	// BatchUtil is the batch pods' utilisation, percent; reported, not used.
	BatchUtil float64
	// BatchPods is the number of batch pods using the GPU; 0 means nothing to freeze.
	BatchPods int
	// Unknown: the collector could not read the GPU this step (the other fields are
	// ignored); its duty is held.
	Unknown bool
}

// GPUThrottleDecision is one GPU's duty with the terms behind it, JSON-encodable for
// /status.
type GPUThrottleDecision struct {
	GPU int `json:"gpu"`
	// Duty is the fraction of each period the GPU's batch pods are frozen, 0..maxDuty.
	Duty float64 `json:"duty"`
	// BatchShare = 1 - Duty: the fraction of each period batch may run.
	BatchShare float64 `json:"batchShare"`
	// Target is the duty the LS state asks for; Duty reaches it at once when higher, and
	// after hold and the restore ramp when lower.
	Target float64 `json:"target"`
	// Reason is one of the GPUReason* constants.
	Reason string `json:"reason"`
	// The inputs after sanitising.
	LSActive  bool    `json:"lsActive"`
	LSUtil    float64 `json:"lsUtilPercent"`
	BatchUtil float64 `json:"batchUtilPercent"`
	BatchPods int     `json:"batchPods"`
	// Starved: Duty is at maxDuty; StarvedFor is for how long.
	Starved    bool            `json:"starved"`
	StarvedFor metav1.Duration `json:"starvedFor"`
	// Escalate: starved for at least starveAfter; suspend or evict the GPU's batch pods.
	Escalate bool `json:"escalate,omitempty"`
	// ClockJump: the clock went back or jumped forward; timers restarted, no restore.
	ClockJump bool `json:"clockJump,omitempty"`
	// Sanitized is empty when every input was usable; otherwise it says what was
	// replaced and by what.
	Sanitized string `json:"sanitized,omitempty"`
}

// GPUThrottle is GPU-aware batch throttling: it decides, per GPU, the duty, the fraction
// of each duty period for which the batch pods using that GPU are frozen, so that LS work
// on the GPU gets the device. The agent calls Step once per GPU scrape and hands the
// duties to the freezer duty cycler (koordlet/gpu/duty). It is not safe for concurrent
// use; the agent's GPU loop owns it.
//
// Rules, per GPU:
//
//	target = maxDuty     while LS utilisation is "high" (hysteresis: on at >= lsUtilOnPercent,
//	                     off below lsUtilOffPercent)
//	       = activeDuty  while an LS process is active on the GPU but not high
//	       = 0           otherwise
//	duty   = target at once when target >= duty (cut fast);
//	         held for `hold` after the last step whose target reached duty;
//	         then lowered by at most restorePerSecond per second of step (restore slowly).
//
// Batch counts as starved while duty is at maxDuty; past starveAfter the decision says
// Escalate, and the agent goes on to suspend (cuda-checkpoint) or eviction.
//
// Traps:
//
//   - A flapping LS (active/idle, or above/below the thresholds every step) keeps the duty
//     where its highest recent trigger put it: every step that reaches the duty restarts
//     the hold, and the off threshold lies below the on one. This is the intent; to react
//     faster to a departed LS, shorten hold, not the thresholds.
//   - Bad utilisation figures are taken as the worst for LS: a NaN, infinite or negative LS
//     utilisation is 100 %. A GPU the collector could not read (Unknown) keeps its duty;
//     its starvation timer restarts, because a stale reading is no evidence for eviction.
//   - A GPU absent from a Step is forgotten: if it comes back, it starts from duty 0 and
//     cuts at once if LS is there. Pass an unreadable GPU as Unknown instead of dropping it.
//   - A clock that goes back, or a step more than EscalationMaxGapPeriods control periods
//     (at least MinEscalationGap) after the last, earns no restore and restarts the hold
//     and starvation timers, as in the Escalator.
//   - Duty applies to the batch pods on the GPU. A pod on several GPUs must get the highest
//     duty of its GPUs; the cycler does that when given one key per GPU.
type GPUThrottle struct {
	p      GPUThrottlePolicy
	maxGap time.Duration
	gpus   map[int]*gpuThrottleState
}

// gpuThrottleState is what one GPU remembers between steps.
type gpuThrottleState struct {
	duty         float64
	engaged      bool      // LS utilisation is "high" (between on and off crossings)
	triggerAt    time.Time // last step whose target reached duty: the hold runs from here
	starving     bool
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

// Reset forgets every GPU: the next Step starts each from duty 0.
func (t *GPUThrottle) Reset() { clear(t.gpus) }

// Step computes every GPU's duty at now, sorted by GPU index. GPUs absent from in are
// forgotten. A repeated index is merged into the first, the worst case for LS: active if
// either is, the higher utilisations, the larger pod count, unknown only if both are.
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
			m.LSUtil = worstUtil(m.LSUtil, x.LSUtil)
			m.BatchUtil = math.Max(m.BatchUtil, x.BatchUtil)
			m.BatchPods = max(m.BatchPods, x.BatchPods)
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

// step advances one GPU to now.
func (s *gpuThrottleState) step(p GPUThrottlePolicy, maxGap time.Duration, now time.Time,
	in GPUThrottleInput) GPUThrottleDecision {
	d := GPUThrottleDecision{GPU: in.Index}

	var dt time.Duration
	if s.hasLast {
		dt = now.Sub(s.last)
		if dt < 0 || (maxGap > 0 && dt > maxGap) {
			// The gap is no evidence: no restore credit, timers restart at now.
			d.ClockJump = true
			dt = 0
			s.triggerAt, s.starvedSince = now, now
		}
	}
	s.last, s.hasLast = now, true

	if in.Unknown {
		d.Target, d.Reason, d.Sanitized = s.duty, GPUReasonUnknown, gpuThrottleSanitizedUnknown
		s.starvedSince = now
		s.fill(p, now, &d)
		d.Escalate = false
		return d
	}

	var notes []string
	lsUtil := in.LSUtil
	switch {
	case math.IsNaN(lsUtil) || math.IsInf(lsUtil, 0) || lsUtil < 0:
		notes = append(notes, fmt.Sprintf("lsUtil=%v unusable: assumed 100", in.LSUtil))
		lsUtil = gpuUtilMaxPercent
	case lsUtil > gpuUtilMaxPercent:
		notes = append(notes, fmt.Sprintf("lsUtil=%v above 100: capped", in.LSUtil))
		lsUtil = gpuUtilMaxPercent
	}
	batchUtil := in.BatchUtil
	switch {
	case math.IsNaN(batchUtil) || math.IsInf(batchUtil, 0) || batchUtil < 0:
		notes = append(notes, fmt.Sprintf("batchUtil=%v unusable: reported as 0", in.BatchUtil))
		batchUtil = 0
	case batchUtil > gpuUtilMaxPercent:
		notes = append(notes, fmt.Sprintf("batchUtil=%v above 100: capped", in.BatchUtil))
		batchUtil = gpuUtilMaxPercent
	}
	pods := in.BatchPods
	if pods < 0 {
		notes = append(notes, fmt.Sprintf("batchPods=%d negative: assumed 0", in.BatchPods))
		pods = 0
	}
	active := in.LSActive || lsUtil > 0
	d.LSActive, d.LSUtil, d.BatchUtil, d.BatchPods = active, lsUtil, batchUtil, pods
	d.Sanitized = strings.Join(notes, "; ")

	// Hysteresis on LS utilisation: on at >= on, off below off, unchanged between.
	switch {
	case !active:
		s.engaged = false
	case lsUtil >= p.LSUtilOnPercent:
		s.engaged = true
	case lsUtil < p.LSUtilOffPercent:
		s.engaged = false
	}
	target, reason := 0.0, GPUReasonIdle
	switch {
	case s.engaged:
		target, reason = p.MaxDuty, GPUReasonLSUtil
	case active:
		target, reason = p.ActiveDuty, GPUReasonLSActive
	}
	d.Target = target

	switch {
	case pods == 0:
		// Nothing to freeze; a batch pod that arrives later is cut at once if needed.
		s.duty = 0
		reason = GPUReasonNoBatch
	case target >= s.duty:
		s.duty = target
		if target > 0 {
			s.triggerAt = now
		}
	case now.Sub(s.triggerAt) < p.Hold.Duration:
		reason = GPUReasonHold
	default:
		s.duty = math.Max(target, s.duty-p.RestorePerSecond*dt.Seconds())
		if s.duty > target {
			reason = GPUReasonRestoring
		}
	}
	d.Reason = reason
	s.fill(p, now, &d)
	return d
}

// fill sets the duty and starvation fields of d from s.
func (s *gpuThrottleState) fill(p GPUThrottlePolicy, now time.Time, d *GPUThrottleDecision) {
	d.Duty, d.BatchShare = s.duty, 1-s.duty
	starved := s.duty >= p.MaxDuty
	if starved && !s.starving {
		s.starvedSince = now
	}
	s.starving = starved
	if starved {
		d.Starved = true
		d.StarvedFor = metav1.Duration{Duration: now.Sub(s.starvedSince)}
		d.Escalate = p.StarveAfter.Duration > 0 && d.StarvedFor.Duration >= p.StarveAfter.Duration
	}
}
