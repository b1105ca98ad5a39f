package qos

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EscalationLevel is the graded action on batch pods: throttle, then freeze,
// then evict. Its integer value is what the escalation-level gauge exports.
type EscalationLevel int

const (
	// EscalationThrottle: the CPU budget alone (nothing extra to do).
	EscalationThrottle EscalationLevel = 0
	// EscalationFreeze: batch is frozen (the tier and in-place batch pods).
	EscalationFreeze EscalationLevel = 1
	// EscalationEvict: an eviction condition holds (memory pressure or CPU
	// starvation); EscalationDecision.Evict says whether to evict now.
	EscalationEvict EscalationLevel = 2
)

// String returns "throttle", "freeze" or "evict".
func (l EscalationLevel) String() string {
	switch l {
	case EscalationThrottle:
		return "throttle"
	case EscalationFreeze:
		return "freeze"
	case EscalationEvict:
		return "evict"
	}
	return fmt.Sprintf("EscalationLevel(%d)", int(l))
}

// MarshalText makes the level a string in /status JSON.
func (l EscalationLevel) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads the level back from /status JSON; an unknown word is an error
// wrapping ErrInvalidConfig.
func (l *EscalationLevel) UnmarshalText(b []byte) error {
	for _, v := range []EscalationLevel{EscalationThrottle, EscalationFreeze, EscalationEvict} {
		if string(b) == v.String() {
			*l = v
			return nil
		}
	}
	return fmt.Errorf("escalation level %s: %w", quoteValue(string(b)), ErrInvalidConfig)
}

// Reasons reported in EscalationDecision.Reason and EvictionRequest.Reason.
const (
	// EscalationReasonBudget: throttle; the CPU budget is all there is to do.
	EscalationReasonBudget = "budget"
	// EscalationReasonNoBatch: throttle; no batch pod on the node.
	EscalationReasonNoBatch = "no-batch"
	// EscalationReasonCPUContention: freeze; LS and system use leave batch less
	// than its floor (raw < min) for longer than freezeAfter.
	EscalationReasonCPUContention = "cpu-contention"
	// EvictReasonMemoryPressure: evict; node memory used crossed
	// memoryEvictThreshold and is not yet back at memoryEvictTarget.
	EvictReasonMemoryPressure = "memory-pressure"
	// EvictReasonCPUStarvation: evict; batch has been starved (at its floor or
	// frozen) for longer than starvationTimeout.
	EvictReasonCPUStarvation = "cpu-starvation"
	// EvictReasonGPUStarvation: evict; a GPU's batch pods have been frozen solid by
	// the GPU throttle for longer than its starveAfter (GPUThrottle).
	EvictReasonGPUStarvation = "gpu-starvation"
)

// Defaults of [EscalationConfig]. Placeholders until benchmarks tune them.
const (
	DefaultMemoryEvictThreshold  = 0.95
	DefaultMemoryEvictTarget     = 0.90
	DefaultFreezeAfter           = 2 * time.Second
	DefaultThawAfter             = 5 * time.Second
	DefaultThawMarginCPU         = 0.5
	DefaultStarvationTimeout     = 5 * time.Minute
	DefaultEvictionInterval      = 30 * time.Second
	DefaultMaxEvictionsPerMinute = 2
	DefaultEvictionBackoff       = 30 * time.Second
	DefaultMaxEvictionBackoff    = 10 * time.Minute
)

// EscalationMaxGapPeriods: a call more than this many expected periods after
// the previous one (and at least MinEscalationGap) is a clock jump or a
// stalled agent; the timers restart instead of counting the gap.
const EscalationMaxGapPeriods = 10

// MinEscalationGap is the smallest gap taken as a jump, whatever the period:
// a loop that is late by a GC pause or a slow cgroup write is not a jump.
const MinEscalationGap = time.Second

// maxEvictionsPerMinuteLimit bounds maxEvictionsPerMinute (one every 100 ms).
const maxEvictionsPerMinuteLimit = 600

// EscalationConfig is the YAML-configurable part of the graded actions. Plain
// data with JSON/YAML tags (sigs.k8s.io/yaml); durations are strings such as
// "2s" or "5m". As with Policy, pre-fill it with DefaultEscalationConfig()
// before unmarshalling, then call Validate.
type EscalationConfig struct {
	// MemoryEvictThreshold is the fraction of the node's pod-usable memory
	// whose use starts evicting batch pods, in (0, 1]; 0 disables memory
	// eviction.
	MemoryEvictThreshold float64 `json:"memoryEvictThreshold"`
	// MemoryEvictTarget is the fraction to evict down to, in (0,
	// memoryEvictThreshold): eviction goes on (one decision per
	// evictionInterval) until used <= target.
	MemoryEvictTarget float64 `json:"memoryEvictTarget"`
	// FreezeAfter is how long batch must be starved at its floor (raw < min)
	// before it is frozen; 0 disables freezing.
	FreezeAfter metav1.Duration `json:"freezeAfter"`
	// ThawAfter is how long raw must stay >= min + thawMarginCPU before frozen
	// batch is thawed; 0 thaws on the first such period.
	ThawAfter metav1.Duration `json:"thawAfter"`
	// ThawMarginCPU (cores, >= 0) is the hysteresis above the floor: a starved
	// batch counts as starved (and stays frozen) until raw >= min + margin.
	ThawMarginCPU float64 `json:"thawMarginCPU"`
	// StarvationTimeout is how long batch may be starved (at its floor or
	// frozen) before one batch pod is evicted per evictionInterval; 0 disables
	// starvation eviction. Must exceed freezeAfter: eviction is the last step.
	StarvationTimeout metav1.Duration `json:"starvationTimeout"`
	// EvictionInterval is the least time between two eviction decisions, so
	// that an evicted pod can go and its memory show as free, > 0.
	EvictionInterval metav1.Duration `json:"evictionInterval"`
	// MaxEvictionsPerMinute caps the evictions the node's agent posts, in
	// [1, 600] (a token bucket of this size, refilled at this rate).
	MaxEvictionsPerMinute int `json:"maxEvictionsPerMinute"`
	// EvictionBackoff is how long a pod whose eviction was refused (PDB) or
	// failed is skipped; it doubles per refusal up to maxEvictionBackoff. > 0.
	EvictionBackoff metav1.Duration `json:"evictionBackoff"`
	// MaxEvictionBackoff caps a pod's backoff, >= evictionBackoff.
	MaxEvictionBackoff metav1.Duration `json:"maxEvictionBackoff"`
}

// DefaultEscalationConfig returns the defaults. It passes Validate.
func DefaultEscalationConfig() EscalationConfig {
	return EscalationConfig{
		MemoryEvictThreshold:  DefaultMemoryEvictThreshold,
		MemoryEvictTarget:     DefaultMemoryEvictTarget,
		FreezeAfter:           metav1.Duration{Duration: DefaultFreezeAfter},
		ThawAfter:             metav1.Duration{Duration: DefaultThawAfter},
		ThawMarginCPU:         DefaultThawMarginCPU,
		StarvationTimeout:     metav1.Duration{Duration: DefaultStarvationTimeout},
		EvictionInterval:      metav1.Duration{Duration: DefaultEvictionInterval},
		MaxEvictionsPerMinute: DefaultMaxEvictionsPerMinute,
		EvictionBackoff:       metav1.Duration{Duration: DefaultEvictionBackoff},
		MaxEvictionBackoff:    metav1.Duration{Duration: DefaultMaxEvictionBackoff},
	}
}

// Validate reports every out-of-range field; each error names the field by
// its YAML key and wraps ErrInvalidConfig (several are joined with
// errors.Join). A zero EscalationConfig is invalid: start from the defaults.
func (c EscalationConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	thresholdOK := c.MemoryEvictThreshold >= 0 && c.MemoryEvictThreshold <= 1 // false for NaN
	if !thresholdOK {
		bad("memoryEvictThreshold", c.MemoryEvictThreshold, "must be in (0, 1], or 0 to disable memory eviction")
	}
	switch {
	case !(c.MemoryEvictTarget >= 0 && c.MemoryEvictTarget <= 1):
		bad("memoryEvictTarget", c.MemoryEvictTarget, "must be in (0, memoryEvictThreshold)")
	case thresholdOK && c.MemoryEvictThreshold > 0 &&
		!(c.MemoryEvictTarget > 0 && c.MemoryEvictTarget < c.MemoryEvictThreshold):
		bad("memoryEvictTarget", c.MemoryEvictTarget,
			fmt.Sprintf("must be in (0, memoryEvictThreshold=%v): eviction stops at the target", c.MemoryEvictThreshold))
	}
	nonNeg := func(field string, d metav1.Duration, rule string) bool {
		if d.Duration < 0 {
			bad(field, d.Duration, rule)
			return false
		}
		return true
	}
	freezeOK := nonNeg("freezeAfter", c.FreezeAfter, "must be >= 0 (0 disables freezing)")
	nonNeg("thawAfter", c.ThawAfter, "must be >= 0")
	if !(c.ThawMarginCPU >= 0) || math.IsInf(c.ThawMarginCPU, 0) {
		bad("thawMarginCPU", c.ThawMarginCPU, "must be a finite number of cores >= 0")
	}
	if nonNeg("starvationTimeout", c.StarvationTimeout, "must be >= 0 (0 disables starvation eviction)") &&
		freezeOK && c.StarvationTimeout.Duration > 0 && c.StarvationTimeout.Duration <= c.FreezeAfter.Duration {
		bad("starvationTimeout", c.StarvationTimeout.Duration,
			fmt.Sprintf("must exceed freezeAfter (%v): eviction is the last step", c.FreezeAfter.Duration))
	}
	if c.EvictionInterval.Duration <= 0 {
		bad("evictionInterval", c.EvictionInterval.Duration, "must be > 0")
	}
	if c.MaxEvictionsPerMinute < 1 || c.MaxEvictionsPerMinute > maxEvictionsPerMinuteLimit {
		bad("maxEvictionsPerMinute", c.MaxEvictionsPerMinute, fmt.Sprintf("must be in [1, %d]", maxEvictionsPerMinuteLimit))
	}
	if c.EvictionBackoff.Duration <= 0 {
		bad("evictionBackoff", c.EvictionBackoff.Duration, "must be > 0")
	} else if c.MaxEvictionBackoff.Duration < c.EvictionBackoff.Duration {
		bad("maxEvictionBackoff", c.MaxEvictionBackoff.Duration,
			fmt.Sprintf("must be >= evictionBackoff (%v)", c.EvictionBackoff.Duration))
	}
	return errors.Join(errs...)
}

// forceEscalationRange maps out-of-range fields to safe values, where safe
// means "evict less": a bad threshold disables memory eviction, a bad target
// becomes the threshold minus 5 points, bad durations disable what they time.
// The result always passes Validate.
func forceEscalationRange(c EscalationConfig) EscalationConfig {
	switch {
	case !(c.MemoryEvictThreshold > 0): // NaN too
		c.MemoryEvictThreshold = 0
	case c.MemoryEvictThreshold > 1:
		c.MemoryEvictThreshold = 1
	}
	if t := c.MemoryEvictThreshold; t > 0 && !(c.MemoryEvictTarget > 0 && c.MemoryEvictTarget < t) {
		c.MemoryEvictTarget = math.Max(t-0.05, t/2)
		if !(c.MemoryEvictTarget > 0 && c.MemoryEvictTarget < t) { // t subnormal: no room for a target
			c.MemoryEvictThreshold, c.MemoryEvictTarget = 0, 0
		}
	}
	if c.MemoryEvictThreshold == 0 && !(c.MemoryEvictTarget >= 0 && c.MemoryEvictTarget <= 1) {
		c.MemoryEvictTarget = 0
	}
	if c.FreezeAfter.Duration < 0 {
		c.FreezeAfter.Duration = 0
	}
	if c.ThawAfter.Duration < 0 {
		c.ThawAfter.Duration = 0
	}
	if !(c.ThawMarginCPU >= 0) || math.IsInf(c.ThawMarginCPU, 0) {
		c.ThawMarginCPU = DefaultThawMarginCPU
	}
	if s := c.StarvationTimeout.Duration; s < 0 || (s > 0 && s <= c.FreezeAfter.Duration) {
		c.StarvationTimeout.Duration = 0
	}
	if c.EvictionInterval.Duration <= 0 {
		c.EvictionInterval.Duration = DefaultEvictionInterval
	}
	c.MaxEvictionsPerMinute = min(max(c.MaxEvictionsPerMinute, 1), maxEvictionsPerMinuteLimit)
	if c.EvictionBackoff.Duration <= 0 {
		c.EvictionBackoff.Duration = DefaultEvictionBackoff
	}
	if c.MaxEvictionBackoff.Duration < c.EvictionBackoff.Duration {
		c.MaxEvictionBackoff.Duration = c.EvictionBackoff.Duration
	}
	return c
}

// EscalationInput is what the agent passes every control period.
type EscalationInput struct {
	// Now is the time of this period (the agent's clock; qos reads none).
	Now time.Time
	// Budget is this period's Budgeter.Next result: Raw, Min and Sanitized
	// are used. A Budget with Sanitized set is not evidence of starvation.
	Budget Budget
	// MemoryUsed and MemoryCapacity are the node's memory in bytes; capacity
	// is what pods may use. Capacity <= 0 or Used < 0 means unknown: no
	// memory eviction this period.
	MemoryUsed     int64
	MemoryCapacity int64
	// MemoryAt is when the memory figures were read; zero means Now. After
	// an eviction, only a reading taken later may trigger the next one.
	MemoryAt time.Time
	// HasBatch reports whether any batch pod runs on the node.
	HasBatch bool
}

// EvictionRequest is an eviction decision with the numbers behind it (for
// events and logs).
type EvictionRequest struct {
	// Reason is EvictReasonMemoryPressure, EvictReasonCPUStarvation or
	// EvictReasonGPUStarvation.
	Reason string `json:"reason"`
	// MemoryToFree (memory-pressure only) is used - target*capacity in bytes,
	// > 0: evict candidates in order until their memory covers it (at least
	// one). For cpu-starvation it is 0: evict one pod.
	MemoryToFree   int64 `json:"memoryToFreeBytes,omitempty"`
	MemoryUsed     int64 `json:"memoryUsedBytes,omitempty"`
	MemoryCapacity int64 `json:"memoryCapacityBytes,omitempty"`
	// Threshold and Target (memory-pressure only) are the fractions in force.
	Threshold float64 `json:"threshold,omitempty"`
	Target    float64 `json:"target,omitempty"`
	// StarvedFor and StarvationTimeout (cpu- and gpu-starvation): how long batch
	// has been starved, and the timeout it passed. GPU (gpu-starvation only) is
	// the starved GPU's index.
	StarvedFor        metav1.Duration `json:"starvedFor,omitzero"`
	StarvationTimeout metav1.Duration `json:"starvationTimeout,omitzero"`
	GPU               int             `json:"gpu,omitempty"`
}

// String describes the request for events and logs.
func (r EvictionRequest) String() string {
	switch r.Reason {
	case EvictReasonMemoryPressure:
		used := 0.0
		if r.MemoryCapacity > 0 {
			used = float64(r.MemoryUsed) / float64(r.MemoryCapacity)
		}
		return fmt.Sprintf("%s: node memory %d of %d bytes used (%.1f%% >= %.1f%%), %d bytes to free to reach %.1f%%",
			r.Reason, r.MemoryUsed, r.MemoryCapacity, used*100, r.Threshold*100, r.MemoryToFree, r.Target*100)
	case EvictReasonCPUStarvation:
		return fmt.Sprintf("%s: batch starved of CPU by LS pods for %v (starvationTimeout %v)",
			r.Reason, r.StarvedFor.Round(time.Second), r.StarvationTimeout.Duration)
	case EvictReasonGPUStarvation:
		return fmt.Sprintf("%s: batch on GPU %d frozen for LS pods for %v (starveAfter %v)",
			r.Reason, r.GPU, r.StarvedFor.Round(time.Second), r.StarvationTimeout.Duration)
	}
	return r.Reason
}

// Satisfied reports whether evicting `evicted` pods using `freed` bytes of
// memory fulfils the request: at least one pod, and for memory pressure
// enough memory to cover MemoryToFree.
func (r EvictionRequest) Satisfied(evicted int, freed int64) bool {
	if evicted < 1 {
		return false
	}
	if r.Reason == EvictReasonMemoryPressure {
		return freed >= r.MemoryToFree
	}
	return true
}

// EscalationDecision is one period's graded action with the terms behind it.
// It is JSON-encodable for /status.
type EscalationDecision struct {
	// Level is the highest level in force: evict while an eviction condition
	// holds (also between two evictions), else freeze while frozen, else
	// throttle.
	Level EscalationLevel `json:"level"`
	// Reason is EscalationReasonBudget or EscalationReasonNoBatch (throttle),
	// EscalationReasonCPUContention (freeze), or an EvictReason* (evict).
	Reason string `json:"reason"`
	// Freeze: batch must be frozen now (it may be while Level is evict).
	Freeze bool `json:"freeze"`
	// Froze and Thawed mark the period in which Freeze changed.
	Froze  bool `json:"froze,omitempty"`
	Thawed bool `json:"thawed,omitempty"`
	// Evict is not nil when the agent should submit an eviction now.
	Evict *EvictionRequest `json:"evict,omitempty"`
	// Starved: batch counts as starved of CPU (raw < min, and not yet back
	// at min + thawMarginCPU); StarvedFor is for how long.
	Starved    bool            `json:"starved"`
	StarvedFor metav1.Duration `json:"starvedFor"`
	// MemoryPressure: used crossed the threshold and is not back at target.
	MemoryPressure bool `json:"memoryPressure"`
	// MemoryUsedRatio is used/capacity, 0 when unknown.
	MemoryUsedRatio float64 `json:"memoryUsedRatio"`
	// NextEvictionAt is the earliest time of the next eviction decision
	// (zero when none happened yet).
	NextEvictionAt time.Time `json:"nextEvictionAt,omitzero"`
	// ClockJump: the clock went back or jumped forward; timers restarted.
	ClockJump bool `json:"clockJump,omitempty"`
	// CPUUnknown: the budget was sanitized; starvation timers restarted.
	CPUUnknown bool `json:"cpuUnknown,omitempty"`
	// MemoryUnknown: the memory figures were unusable this period.
	MemoryUnknown bool `json:"memoryUnknown,omitempty"`
}

// Escalator is the graded-action state machine, one Decide per control
// period. It is not safe for concurrent use; the agent's control loop owns it.
type Escalator struct {
	cfg    EscalationConfig
	maxGap time.Duration

	last    time.Time
	hasLast bool

	frozen       bool
	starving     bool
	starvedSince time.Time
	thawing      bool
	thawSince    time.Time
	memPressure  bool
	evicted      bool
	lastEvict    time.Time
}

// NewEscalator returns an Escalator for cfg and the agent's control period.
// cfg should have passed Validate; as the constructor cannot fail,
// out-of-range fields are forced to values that evict less (read them back
// with Config). period is the agent's control period; a period <= 0 disables
// the forward-jump check.
func NewEscalator(cfg EscalationConfig, period time.Duration) *Escalator {
	e := &Escalator{cfg: forceEscalationRange(cfg)}
	if period > 0 {
		e.maxGap = max(EscalationMaxGapPeriods*period, MinEscalationGap)
	}
	return e
}

// Config returns the configuration in use, after NewEscalator forced it into
// range.
func (e *Escalator) Config() EscalationConfig { return e.cfg }

// Decide computes this period's graded action. See the package doc for the
// rules; in short: throttle (the budget) always; freeze after freezeAfter at
// the floor, thaw after thawAfter at min + margin; evict on memory pressure
// (hysteresis threshold/target) or after starvationTimeout starved, at most
// one decision per evictionInterval.
func (e *Escalator) Decide(in EscalationInput) EscalationDecision {
	c := e.cfg
	now := in.Now
	var d EscalationDecision

	// A clock jump (backwards, or a gap far beyond the period) restarts every
	// timer at now: the gap is no evidence of starvation, and counting it
	// would fire every pending action at once.
	if e.hasLast && (now.Before(e.last) || (e.maxGap > 0 && now.Sub(e.last) > e.maxGap)) {
		d.ClockJump = true
		e.starvedSince, e.thawSince = now, now
		if e.evicted {
			e.lastEvict = now
		}
	}
	e.last, e.hasLast = now, true

	e.decideMemory(in, &d)

	if !in.HasBatch {
		// Nothing to freeze or evict: forget the CPU state (a new batch pod
		// starts unfrozen and with fresh timers).
		d.Thawed = e.frozen
		e.frozen, e.starving, e.thawing = false, false, false
		d.Level, d.Reason = EscalationThrottle, EscalationReasonNoBatch
		e.setNextEviction(&d)
		return d
	}

	e.decideCPU(in, &d)

	canEvict := !e.evicted || now.Sub(e.lastEvict) >= c.EvictionInterval.Duration
	// Not while frozen batch waits out thawAfter: LS has calmed down.
	starvedOut := e.starving && !e.thawing && c.StarvationTimeout.Duration > 0 &&
		d.StarvedFor.Duration >= c.StarvationTimeout.Duration
	switch {
	case d.MemoryPressure:
		d.Level, d.Reason = EscalationEvict, EvictReasonMemoryPressure
		memAt := in.MemoryAt
		if memAt.IsZero() || memAt.After(now) {
			memAt = now
		}
		// Only a reading taken after the last eviction may trigger the next
		// one: a stale reading still counts the evicted pod's memory.
		if canEvict && !d.MemoryUnknown && (!e.evicted || memAt.After(e.lastEvict)) {
			target := int64(math.Floor(c.MemoryEvictTarget * float64(in.MemoryCapacity)))
			d.Evict = &EvictionRequest{
				Reason:         EvictReasonMemoryPressure,
				MemoryToFree:   max(in.MemoryUsed-target, 1),
				MemoryUsed:     in.MemoryUsed,
				MemoryCapacity: in.MemoryCapacity,
				Threshold:      c.MemoryEvictThreshold,
				Target:         c.MemoryEvictTarget,
			}
		}
	case starvedOut:
		d.Level, d.Reason = EscalationEvict, EvictReasonCPUStarvation
		if canEvict {
			d.Evict = &EvictionRequest{
				Reason:            EvictReasonCPUStarvation,
				StarvedFor:        d.StarvedFor,
				StarvationTimeout: c.StarvationTimeout,
			}
		}
	case e.frozen:
		d.Level, d.Reason = EscalationFreeze, EscalationReasonCPUContention
	default:
		d.Level, d.Reason = EscalationThrottle, EscalationReasonBudget
	}
	if d.Evict != nil {
		e.evicted, e.lastEvict = true, now
	}
	e.setNextEviction(&d)
	return d
}

// decideMemory updates the memory-pressure hysteresis and fills the memory
// terms of d. Unknown figures keep the state as it was.
func (e *Escalator) decideMemory(in EscalationInput, d *EscalationDecision) {
	c := e.cfg
	if in.MemoryCapacity <= 0 || in.MemoryUsed < 0 {
		d.MemoryUnknown = true
		d.MemoryPressure = e.memPressure && c.MemoryEvictThreshold > 0
		return
	}
	ratio := float64(in.MemoryUsed) / float64(in.MemoryCapacity)
	d.MemoryUsedRatio = ratio
	switch {
	case c.MemoryEvictThreshold <= 0:
		e.memPressure = false
	case ratio >= c.MemoryEvictThreshold:
		e.memPressure = true
	case ratio <= c.MemoryEvictTarget:
		e.memPressure = false
	}
	d.MemoryPressure = e.memPressure
}

// decideCPU runs the starvation/freeze/thaw timers and fills the CPU terms
// of d.
func (e *Escalator) decideCPU(in EscalationInput, d *EscalationDecision) {
	c := e.cfg
	now := in.Now
	b := in.Budget
	if b.Sanitized != "" || !isFinite(b.Raw) || !isFinite(b.Min) {
		// Unusable measurements are no evidence: restart the starvation
		// timers (no freeze, no eviction on a broken reader), but do not
		// thaw either.
		d.CPUUnknown = true
		e.starving, e.thawing = false, false
		d.Freeze = e.frozen
		return
	}
	starvedNow := b.Raw < b.Min
	recovered := b.Raw >= b.Min+c.ThawMarginCPU

	if e.frozen {
		if recovered {
			if !e.thawing {
				e.thawing, e.thawSince = true, now
			}
			if now.Sub(e.thawSince) >= c.ThawAfter.Duration {
				e.frozen, e.thawing, e.starving = false, false, false
				d.Thawed = true
			}
		} else {
			e.thawing = false
		}
		if e.frozen && !e.starving {
			// Frozen counts as starved (after a restart of the timers).
			e.starving, e.starvedSince = true, now
		}
	} else {
		switch {
		case starvedNow && !e.starving:
			e.starving, e.starvedSince = true, now
		case recovered:
			e.starving = false
		}
		if e.starving && c.FreezeAfter.Duration > 0 && now.Sub(e.starvedSince) >= c.FreezeAfter.Duration {
			e.frozen, e.thawing = true, false
			d.Froze = true
		}
	}
	d.Freeze = e.frozen
	d.Starved = e.starving
	if e.starving {
		d.StarvedFor.Duration = now.Sub(e.starvedSince)
	}
}

func (e *Escalator) setNextEviction(d *EscalationDecision) {
	if e.evicted {
		d.NextEvictionAt = e.lastEvict.Add(e.cfg.EvictionInterval.Duration)
	}
}

// EvictionCandidate is a pod the agent may evict.
type EvictionCandidate struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// Class must be ClassBatch; any other class is never a candidate.
	Class    Class `json:"class"`
	Priority int32 `json:"priority"`
	// MemoryBytes is the pod's memory use (working set); 0 when unknown.
	MemoryBytes int64 `json:"memoryBytes"`
	// StartTime is pod.Status.StartTime; zero when unknown (sorts as oldest).
	StartTime time.Time `json:"startTime,omitzero"`
}

// OrderEvictionCandidates drops every candidate that is not a batch pod (LS
// and BE pods are never evicted) and orders the rest: lowest priority first,
// then the largest memory user, then the most recently started, then by
// namespace, name and UID so that the order is deterministic. It works in
// place: the result shares c's array, whose contents it changes.
func OrderEvictionCandidates(c []EvictionCandidate) []EvictionCandidate {
	c = slices.DeleteFunc(c, func(x EvictionCandidate) bool { return x.Class != ClassBatch })
	slices.SortStableFunc(c, func(a, b EvictionCandidate) int {
		return cmp.Or(
			cmp.Compare(a.Priority, b.Priority),
			cmp.Compare(b.MemoryBytes, a.MemoryBytes),
			b.StartTime.Compare(a.StartTime),
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.UID, b.UID),
		)
	})
	return c
}
