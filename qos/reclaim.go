package qos

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReclaimPolicy says which LS figure the Reclaimer subtracts from the node.
type ReclaimPolicy string

// The reclaim policies.
const (
	// ReclaimPolicyUsage: capacity*threshold - LS usage - BE usage - system usage.
	// For CPU, which the agent takes back from batch within one control period.
	ReclaimPolicyUsage ReclaimPolicy = "usage"
	// ReclaimPolicyMaxUsageRequest: capacity*threshold - max(LS usage, LS requests)
	// - BE usage - system usage. For memory, which cannot be taken back without
	// killing: LS pods may grow to their requests at any time.
	ReclaimPolicyMaxUsageRequest ReclaimPolicy = "maxUsageRequest"
)

// Defaults of [ReclaimConfig]; docs/design.md gives the reasons.
const (
	// DefaultReclaimCPUThreshold is DefaultThreshold, the Budgeter's: the
	// scheduler may then place as much batch CPU as the budget lets run while
	// LS is at its window percentile. A higher value places batch pods the
	// budget throttles all the time; a lower one leaves budget unsold.
	DefaultReclaimCPUThreshold = DefaultThreshold
	// DefaultReclaimMemoryThreshold leaves 10% of the memory pods may use
	// (kubepods' limit, itself below the node's) for page cache and LS growth
	// beyond max(usage, requests), which is already conservative: memory
	// overcommit ends in OOM kills, not in throttling. It sits below the
	// eviction threshold (0.95) so that batch sized to it never triggers
	// evictions on its own; 0.8 left batch 65% of what LS left on the memory
	// benchmark, short of the 70% target (docs/benchmarks.md).
	DefaultReclaimMemoryThreshold = 0.9
	// DefaultLSPercentile and DefaultLSWindow: LS usage is the 95th percentile
	// of per-second peaks over 5 minutes (Koordinator aggregates over 300 s).
	DefaultLSPercentile = 0.95
	DefaultLSWindow     = 5 * time.Minute
	// DefaultSmoothing is the time constant of the moving average that makes
	// the "recent" usage: a one-period burst moves it by 1% (100 ms / 10 s) of
	// its size, a lasting rise shows within seconds.
	DefaultSmoothing = 10 * time.Second
	// DefaultCPUDeadbandPercent: CPU changes within 10% of capacity are not
	// written (Koordinator's resourceDiffThreshold is 10% too). Equal to
	// 1 - DefaultReclaimCPUThreshold: a drop held back by the deadband still
	// leaves published <= capacity - LS term - BE - system.
	DefaultCPUDeadbandPercent = 10.0
	// DefaultMemoryDeadbandPercent is smaller: memory over-promised is not
	// taken back by throttling, and memory usage is far less noisy than CPU.
	DefaultMemoryDeadbandPercent = 5.0
	// DefaultRiseStepPercentPerMinute: a pending rise grows the published value
	// by at most 10% of capacity per minute (1.6 cores a minute on 16 CPUs).
	DefaultRiseStepPercentPerMinute = 10.0
	// DefaultRefreshInterval: the value is rewritten at least this often, so a
	// small drift within the deadband does not last and an overwritten Node
	// status is repaired.
	DefaultRefreshInterval = 15 * time.Minute
)

// Ranges that Validate enforces (and NewReclaimer forces).
const (
	minLSWindow        = 10 * time.Second
	maxLSWindow        = 24 * time.Hour
	minSmoothing       = time.Second
	maxDeadbandPercent = 50.0
	minRefresh         = time.Minute
	maxRefresh         = 24 * time.Hour
	// maxCreditGap is the most time one call of Next counts towards the rise
	// limit: a clock that jumps forward, or an agent that stalled, does not
	// earn a large rise at once.
	maxCreditGap = time.Minute
)

// Reasons reported in ReclaimTerms.Reason.
const (
	// ReasonReclaimInitial: first call after NewReclaimer or Reset; Published =
	// Computed, Write = true.
	ReasonReclaimInitial = "initial"
	// ReasonReclaimDrop: Computed is more than the deadband below the published
	// value (or 0, or at its floor, what batch pods request: nothing is spare; or
	// the published value exceeds capacity); published at once.
	ReasonReclaimDrop = "drop"
	// ReasonReclaimRise: Computed is more than the deadband above the published
	// value and the rise limit allows all of it; published.
	ReasonReclaimRise = "rise"
	// ReasonReclaimRiseDamped: Computed is more than the deadband above the
	// published value but the rise limit holds it back. With Write, the value
	// grew by what the limit allows (at least the deadband, leaving at least the
	// deadband to go); without, the limit has not yet earned that step, or the
	// rest, which is written whole ("rise") once the limit allows it.
	ReasonReclaimRiseDamped = "rise-damped"
	// ReasonReclaimDeadband: Computed differs from the published value by no
	// more than the deadband; nothing is written.
	ReasonReclaimDeadband = "deadband"
	// ReasonReclaimRefresh: refreshInterval passed since the last write; the
	// value (Computed, or what the rise limit allows) is written even if
	// within the deadband.
	ReasonReclaimRefresh = "refresh"
	// ReasonReclaimHold: Computed equals the published value.
	ReasonReclaimHold = "hold"
)

// ResourceReclaim is the policy of one resource.
type ResourceReclaim struct {
	// Policy is "usage" or "maxUsageRequest".
	Policy ReclaimPolicy `json:"policy"`
	// Threshold is the fraction of capacity that LS, BE, system and batch may
	// use together, in (0, 1].
	Threshold float64 `json:"threshold"`
	// DeadbandPercent is the smallest change, in percent of capacity, that is
	// written (drops to 0, a published value above capacity and refreshes
	// excepted), in [0, 50]. Keep it <= 100*(1-Threshold): a drop it holds back
	// then still fits in the headroom the threshold leaves.
	DeadbandPercent float64 `json:"deadbandPercent"`
}

// ReclaimConfig configures the Reclaimer. Like Policy it is plain data for a
// larger YAML config: pre-fill it with DefaultReclaimConfig() before
// unmarshalling, then call Validate.
type ReclaimConfig struct {
	// CPU is the batch-cpu policy (default usage, threshold 0.9, deadband 10%).
	CPU ResourceReclaim `json:"cpu"`
	// Memory is the batch-memory policy (default maxUsageRequest, threshold
	// 0.9, deadband 5%).
	Memory ResourceReclaim `json:"memory"`
	// LSPercentile is the percentile of LS usage over LSWindow, in (0, 1].
	LSPercentile float64 `json:"lsPercentile"`
	// LSWindow is the window of that percentile, in [10s, 24h]. Usage is kept
	// as per-step peaks: 1 s steps, or LSWindow/300 when longer.
	LSWindow metav1.Duration `json:"lsWindow"`
	// Smoothing is the time constant of the exponential moving average that
	// gives the recent LS, BE and system usage, in [1s, LSWindow].
	Smoothing metav1.Duration `json:"smoothing"`
	// RiseStepPercentPerMinute bounds how fast the published value rises, in
	// percent of capacity per minute of pending rise, in (0, 100]. Drops are
	// never limited.
	RiseStepPercentPerMinute float64 `json:"riseStepPercentPerMinute"`
	// RefreshInterval is the longest time between two writes, in [1m, 24h].
	RefreshInterval metav1.Duration `json:"refreshInterval"`
}

// DefaultReclaimConfig returns the default configuration. It passes Validate.
func DefaultReclaimConfig() ReclaimConfig {
	return ReclaimConfig{
		CPU: ResourceReclaim{Policy: ReclaimPolicyUsage, Threshold: DefaultReclaimCPUThreshold,
			DeadbandPercent: DefaultCPUDeadbandPercent},
		Memory: ResourceReclaim{Policy: ReclaimPolicyMaxUsageRequest, Threshold: DefaultReclaimMemoryThreshold,
			DeadbandPercent: DefaultMemoryDeadbandPercent},
		LSPercentile:             DefaultLSPercentile,
		LSWindow:                 metav1.Duration{Duration: DefaultLSWindow},
		Smoothing:                metav1.Duration{Duration: DefaultSmoothing},
		RiseStepPercentPerMinute: DefaultRiseStepPercentPerMinute,
		RefreshInterval:          metav1.Duration{Duration: DefaultRefreshInterval},
	}
}

// Validate reports every out-of-range field; each error names the field by its
// YAML key (cpu.threshold, lsWindow, ...) and wraps ErrInvalidConfig (several
// are joined with errors.Join). A zero ReclaimConfig is invalid: start from
// DefaultReclaimConfig.
func (c ReclaimConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	for _, r := range []struct {
		name string
		rr   ResourceReclaim
	}{{"cpu", c.CPU}, {"memory", c.Memory}} {
		if !r.rr.Policy.valid() {
			bad(r.name+".policy", fmt.Sprintf("%.64q", string(r.rr.Policy)),
				fmt.Sprintf("must be %q or %q", ReclaimPolicyUsage, ReclaimPolicyMaxUsageRequest))
		}
		if !(r.rr.Threshold > 0 && r.rr.Threshold <= 1) { // also catches NaN
			bad(r.name+".threshold", r.rr.Threshold, "must be in (0, 1]")
		}
		if !(r.rr.DeadbandPercent >= 0 && r.rr.DeadbandPercent <= maxDeadbandPercent) {
			bad(r.name+".deadbandPercent", r.rr.DeadbandPercent, fmt.Sprintf("must be in [0, %v]", maxDeadbandPercent))
		}
	}
	if !(c.LSPercentile > 0 && c.LSPercentile <= 1) {
		bad("lsPercentile", c.LSPercentile, "must be in (0, 1]")
	}
	if w := c.LSWindow.Duration; w < minLSWindow || w > maxLSWindow {
		bad("lsWindow", w, fmt.Sprintf("must be in [%v, %v]", minLSWindow, maxLSWindow))
	}
	if s := c.Smoothing.Duration; s < minSmoothing || s > c.LSWindow.Duration {
		bad("smoothing", s, fmt.Sprintf("must be in [%v, lsWindow (%v)]", minSmoothing, c.LSWindow.Duration))
	}
	if !(c.RiseStepPercentPerMinute > 0 && c.RiseStepPercentPerMinute <= 100) {
		bad("riseStepPercentPerMinute", c.RiseStepPercentPerMinute, "must be in (0, 100]")
	}
	if r := c.RefreshInterval.Duration; r < minRefresh || r > maxRefresh {
		bad("refreshInterval", r, fmt.Sprintf("must be in [%v, %v]", minRefresh, maxRefresh))
	}
	return errors.Join(errs...)
}

func (p ReclaimPolicy) valid() bool {
	return p == ReclaimPolicyUsage || p == ReclaimPolicyMaxUsageRequest
}

// ResourceUsage is one measurement of one resource, in cores (CPU) or bytes
// (memory).
type ResourceUsage struct {
	// Capacity is what pods may use on the node (allocatable), > 0.
	Capacity float64
	// LSUsage is what LS pods (and unattributed kubepods usage) use now.
	LSUsage float64
	// LSRequest is the sum of LS pods' requests; used by maxUsageRequest only.
	LSRequest float64
	// BEUsage is what BE pods use now (batch pods are not counted anywhere).
	BEUsage float64
	// SystemUsage is what runs outside pods: kernel, kubelet, runtime, daemons.
	SystemUsage float64
	// BatchRequest is the sum of the batch resource (understory.io/batch-cpu or
	// batch-memory) that the pods bound to the node request. The published value
	// never drops below it: kubelet re-admits every pod against allocatable when it
	// restarts and kills those that no longer fit (kubernetes#64784), so a value
	// below what running batch pods hold would turn a kubelet restart during an
	// LS burst into lost batch work. Throttling running batch is the tier's job,
	// not the allocatable's; at the floor nothing new fits.
	BatchRequest float64
}

// ReclaimInput is one control period's measurements. Now is the time they were
// taken (the caller's clock: the Reclaimer reads none).
type ReclaimInput struct {
	Now    time.Time
	CPU    ResourceUsage
	Memory ResourceUsage
}

// ReclaimTerms is one decision for one resource with every term that led to
// it, in cores or bytes. Every number is finite (JSON-encodable).
type ReclaimTerms struct {
	Policy    ReclaimPolicy `json:"policy"`
	Capacity  float64       `json:"capacity"`
	Threshold float64       `json:"threshold"`
	// LSUsage is this call's LS sample (after sanitizing); LSRecent its moving
	// average; LSWindowPercentile the percentile of per-step peaks over the
	// window, from LSWindowSteps complete steps (0 steps: no value yet).
	LSUsage            float64 `json:"lsUsage"`
	LSRecent           float64 `json:"lsRecent"`
	LSWindowPercentile float64 `json:"lsWindowPercentile"`
	LSWindowSteps      int     `json:"lsWindowSteps"`
	// LSRequest is the LS requests; 0 unless Policy is maxUsageRequest.
	LSRequest float64 `json:"lsRequest"`
	// LSTerm = max(LSRecent, LSWindowPercentile), and LSRequest under
	// maxUsageRequest: what is subtracted for LS.
	LSTerm float64 `json:"lsTerm"`
	// BEUsage and SystemUsage are this call's samples; BERecent and
	// SystemRecent their moving averages, which are subtracted.
	BEUsage      float64 `json:"beUsage"`
	BERecent     float64 `json:"beRecent"`
	SystemUsage  float64 `json:"systemUsage"`
	SystemRecent float64 `json:"systemRecent"`
	// Raw = Capacity*Threshold - LSTerm - BERecent - SystemRecent; may be < 0.
	Raw float64 `json:"raw"`
	// BatchRequest is what the node's batch pods request (ResourceUsage), capped
	// at Capacity: the floor of Computed.
	BatchRequest float64 `json:"batchRequest"`
	// Computed = max(clamp(Raw, 0, Capacity), BatchRequest).
	Computed float64 `json:"computed"`
	// Deadband is the resource's DeadbandPercent of Capacity.
	Deadband float64 `json:"deadband"`
	// Previous is the value published before this call (0 on the first).
	Previous float64 `json:"previous"`
	// Published is the value that is (or stays) published after this call.
	Published float64 `json:"published"`
	// Write is true when Published must be written to the Node now.
	Write bool `json:"write"`
	// Reason is one of the ReasonReclaim* values.
	Reason string `json:"reason"`
	// Sanitized is empty when every input was usable; otherwise it says what
	// was NaN, infinite, negative or above capacity and what was used instead,
	// and notes clock jumps that reset the window.
	Sanitized string `json:"sanitized,omitempty"`
}

// Reclaimed is one call's result: CPU in cores, Memory in bytes.
type Reclaimed struct {
	CPU    ReclaimTerms `json:"cpu"`
	Memory ReclaimTerms `json:"memory"`
}

// BatchCPUMilli is the CPU value to publish as understory.io/batch-cpu, in
// millicores, rounded down (never promise more than computed).
func (r Reclaimed) BatchCPUMilli() int64 { return floorInt64(r.CPU.Published * 1000) }

// BatchMemoryBytes is the value to publish as understory.io/batch-memory, in
// bytes, rounded down.
func (r Reclaimed) BatchMemoryBytes() int64 { return floorInt64(r.Memory.Published) }

func floorInt64(v float64) int64 {
	switch {
	case !(v > 0): // NaN too
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(v)
}

// Reclaimer computes the batch-cpu and batch-memory a node publishes, one call
// of Next per control period, with the time the measurements were taken. It
// keeps the LS usage window, the moving averages and the published values. It
// is not safe for concurrent use.
type Reclaimer struct {
	cfg     ReclaimConfig
	cpu     reclaimState
	mem     reclaimState
	last    time.Time
	started bool
}

// reclaimState is the memory of one resource.
type reclaimState struct {
	rr     ResourceReclaim
	window *percentileWindow
	// Moving averages; valid when haveRecent.
	lsRecent, beRecent, sysRecent float64
	haveRecent                    bool
	// What is published, and when it was last written.
	published float64
	hasPub    bool
	lastWrite time.Time
	// credit is the rise the limit allows now, as a fraction of capacity. It
	// grows while a rise is pending and is spent by every write.
	credit float64
}

// NewReclaimer returns a Reclaimer for c. c should have passed Validate; as the
// constructor cannot fail, out-of-range fields are forced into the safe side
// of their range instead (unknown policy -> maxUsageRequest; threshold NaN or
// <= 0 -> 0, i.e. nothing reclaimed, > 1 -> 1; lsPercentile out of range -> 1;
// durations, deadbandPercent and riseStepPercentPerMinute clamped into their
// ranges, a NaN or non-positive rise step -> 0, i.e. never rise), so Next
// never yields NaN.
func NewReclaimer(c ReclaimConfig) *Reclaimer {
	c = forceReclaimRange(c)
	r := &Reclaimer{cfg: c}
	r.cpu = reclaimState{rr: c.CPU, window: newPercentileWindow(c.LSPercentile, c.LSWindow.Duration)}
	r.mem = reclaimState{rr: c.Memory, window: newPercentileWindow(c.LSPercentile, c.LSWindow.Duration)}
	return r
}

// Config returns the configuration in use, after NewReclaimer forced it into
// range.
func (r *Reclaimer) Config() ReclaimConfig { return r.cfg }

// Reset forgets everything: the window, the averages and the published values.
// The next call of Next is "initial" and writes.
func (r *Reclaimer) Reset() {
	r.started = false
	for _, s := range []*reclaimState{&r.cpu, &r.mem} {
		s.window.reset()
		s.haveRecent, s.hasPub, s.published, s.credit = false, false, 0, 0
	}
}

// Next computes both resources for the measurements in. See the package doc
// and docs/design.md for the formulas; in short, per resource:
//
//	lsTerm   = max(percentile of LS peaks over lsWindow, moving average of LS)
//	           (and LS requests under maxUsageRequest)
//	computed = clamp(capacity*threshold - lsTerm - avg BE - avg system, 0, capacity)
//
// A drop of computed beyond the deadband is published at once; a rise beyond it
// is published at most riseStepPercentPerMinute of capacity per minute of
// pending rise, and only in steps of at least the deadband; anything within the
// deadband is written only every refreshInterval.
//
// Time going backwards resets the window and the averages (the samples' ages
// are unknown) and restarts the refresh clock; a gap longer than lsWindow
// resets them too. Neither causes more than one write.
func (r *Reclaimer) Next(in ReclaimInput) Reclaimed {
	var clockNote string
	var dt time.Duration
	now := in.Now
	switch {
	case !r.started:
		r.started = true
	case now.Before(r.last):
		clockNote = fmt.Sprintf("clock went back by %v: LS window and averages reset", r.last.Sub(now))
		r.resetHistory(now, true)
	case now.Sub(r.last) > r.cfg.LSWindow.Duration:
		clockNote = fmt.Sprintf("gap of %v since the last sample: LS window and averages reset", now.Sub(r.last))
		r.resetHistory(now, false)
	default:
		dt = now.Sub(r.last)
	}
	r.last = now
	alpha := 1 - math.Exp(-float64(dt)/float64(r.cfg.Smoothing.Duration))
	creditMin := min(dt, maxCreditGap).Minutes()
	return Reclaimed{
		CPU:    r.cpu.next(in.CPU, now, alpha, creditMin, r.cfg, clockNote),
		Memory: r.mem.next(in.Memory, now, alpha, creditMin, r.cfg, clockNote),
	}
}

// resetHistory forgets the window and the averages; when the clock went back
// it also restarts the refresh clock, which would otherwise wait until the
// clock caught up again.
func (r *Reclaimer) resetHistory(now time.Time, back bool) {
	for _, s := range []*reclaimState{&r.cpu, &r.mem} {
		s.window.reset()
		s.haveRecent = false
		if back && s.hasPub {
			s.lastWrite = now
		}
	}
}

// next is Next for one resource.
func (s *reclaimState) next(u ResourceUsage, now time.Time, alpha, creditMin float64, c ReclaimConfig,
	clockNote string) ReclaimTerms {
	var notes []string
	if clockNote != "" {
		notes = append(notes, clockNote)
	}
	t := ReclaimTerms{Policy: s.rr.Policy, Threshold: s.rr.Threshold, Previous: s.published}
	if isFinite(u.Capacity) && u.Capacity > 0 {
		t.Capacity = u.Capacity
		t.LSUsage = s.sample("lsUsage", u.LSUsage, t.Capacity, true, &notes)
		t.BEUsage = s.sample("beUsage", u.BEUsage, t.Capacity, true, &notes)
		t.SystemUsage = s.sample("systemUsage", u.SystemUsage, t.Capacity, true, &notes)
		if s.rr.Policy == ReclaimPolicyMaxUsageRequest {
			// Requests above capacity are possible (static pods); they zero the
			// result anyway, so they are kept as they are.
			t.LSRequest = s.sample("lsRequest", u.LSRequest, t.Capacity, false, &notes)
		}
		s.window.add(now, t.LSUsage)
		if !s.haveRecent {
			s.lsRecent, s.beRecent, s.sysRecent, s.haveRecent = t.LSUsage, t.BEUsage, t.SystemUsage, true
		} else {
			s.lsRecent += alpha * (t.LSUsage - s.lsRecent)
			s.beRecent += alpha * (t.BEUsage - s.beRecent)
			s.sysRecent += alpha * (t.SystemUsage - s.sysRecent)
		}
		t.LSRecent, t.BERecent, t.SystemRecent = s.lsRecent, s.beRecent, s.sysRecent
		t.LSWindowPercentile, t.LSWindowSteps = s.window.percentile()
		t.LSTerm = math.Max(t.LSRecent, t.LSWindowPercentile)
		if s.rr.Policy == ReclaimPolicyMaxUsageRequest {
			t.LSTerm = math.Max(t.LSTerm, t.LSRequest)
		}
		// Finite terms can still overflow to -Inf near MaxFloat64.
		t.Raw = math.Max(t.Capacity*t.Threshold-t.LSTerm-t.BERecent-t.SystemRecent, -math.MaxFloat64)
		t.BatchRequest = math.Min(nonNegFiniteOrZero(u.BatchRequest), t.Capacity)
		t.Computed = math.Max(math.Max(0, math.Min(t.Raw, t.Capacity)), t.BatchRequest)
		t.Deadband = s.rr.DeadbandPercent / 100 * t.Capacity
	} else {
		// Without the capacity nothing can be computed and nothing is given:
		// report the samples only when finite, keep the history untouched.
		notes = append(notes, fmt.Sprintf("capacity=%v unusable: assumed 0, nothing reclaimed", u.Capacity))
		t.LSUsage = nonNegFiniteOrZero(u.LSUsage)
		t.BEUsage = nonNegFiniteOrZero(u.BEUsage)
		t.SystemUsage = nonNegFiniteOrZero(u.SystemUsage)
	}
	if len(notes) > 0 {
		t.Sanitized = strings.Join(notes, "; ")
	}
	s.decide(&t, now, creditMin, c)
	return t
}

// sample returns v when it is a finite number >= 0 (capped to capacity when
// capAt), else capacity: a reading that cannot be used is taken as the worst
// one, never as a generous one. It still passes through the window and the
// average like any sample, so one bad reading cannot zero batch but a broken
// collector does within a few smoothing time constants.
func (s *reclaimState) sample(name string, v, capacity float64, capAt bool, notes *[]string) float64 {
	switch {
	case !isFinite(v) || v < 0:
		*notes = append(*notes, fmt.Sprintf("%s=%v unusable: taken as capacity %v", name, v, capacity))
		return capacity
	case capAt && v > capacity:
		*notes = append(*notes, fmt.Sprintf("%s=%v above capacity: clamped to %v", name, v, capacity))
		return capacity
	}
	return v
}

// decide fills Published, Write and Reason and updates the published state.
func (s *reclaimState) decide(t *ReclaimTerms, now time.Time, creditMin float64, c ReclaimConfig) {
	write := func(v float64, reason string) {
		t.Published, t.Write, t.Reason = v, true, reason
		s.published, s.hasPub, s.lastWrite, s.credit = v, true, now, 0
	}
	if !s.hasPub {
		write(t.Computed, ReasonReclaimInitial)
		return
	}
	pub := s.published
	t.Published, t.Reason = pub, ReasonReclaimHold
	// The rise limit: credit grows only while a rise is pending.
	if t.Computed > pub {
		s.credit = math.Min(1, s.credit+c.RiseStepPercentPerMinute/100*creditMin)
	} else {
		s.credit = 0
	}
	ceiling := math.Min(t.Computed, pub+s.credit*t.Capacity)
	switch {
	// A drop is written at once when it passes the deadband, and also when LS
	// leaves batch nothing beyond what its pods already request (Raw at or below
	// BatchRequest): a value held above that floor would let the scheduler place
	// a pod there is no room for.
	case t.Computed < pub && (pub-t.Computed > t.Deadband || t.Computed == 0 || pub > t.Capacity ||
		t.Raw <= t.BatchRequest):
		write(t.Computed, ReasonReclaimDrop)
	case now.Sub(s.lastWrite) >= c.RefreshInterval.Duration:
		write(ceiling, ReasonReclaimRefresh)
	case t.Computed-pub > t.Deadband:
		switch {
		case ceiling >= t.Computed:
			write(t.Computed, ReasonReclaimRise)
		case ceiling-pub >= t.Deadband && t.Computed-ceiling >= t.Deadband:
			// A partial step is written only when what is left is itself
			// worth a write; otherwise wait until the limit allows it all,
			// so a rise never ends stuck within the deadband below Computed.
			write(ceiling, ReasonReclaimRiseDamped)
		default:
			t.Reason = ReasonReclaimRiseDamped
		}
	case t.Computed != pub:
		t.Reason = ReasonReclaimDeadband
	}
}

// forceReclaimRange maps every out-of-range field to the safe side of its range.
func forceReclaimRange(c ReclaimConfig) ReclaimConfig {
	for _, rr := range []*ResourceReclaim{&c.CPU, &c.Memory} {
		if !rr.Policy.valid() {
			rr.Policy = ReclaimPolicyMaxUsageRequest
		}
		switch {
		case !(rr.Threshold > 0):
			rr.Threshold = 0
		case rr.Threshold > 1:
			rr.Threshold = 1
		}
		switch {
		case !(rr.DeadbandPercent >= 0):
			rr.DeadbandPercent = 0
		case rr.DeadbandPercent > maxDeadbandPercent:
			rr.DeadbandPercent = maxDeadbandPercent
		}
	}
	if !(c.LSPercentile > 0 && c.LSPercentile <= 1) {
		c.LSPercentile = 1
	}
	c.LSWindow.Duration = min(max(c.LSWindow.Duration, minLSWindow), maxLSWindow)
	c.Smoothing.Duration = min(max(c.Smoothing.Duration, minSmoothing), c.LSWindow.Duration)
	switch {
	case !(c.RiseStepPercentPerMinute > 0):
		c.RiseStepPercentPerMinute = 0
	case c.RiseStepPercentPerMinute > 100:
		c.RiseStepPercentPerMinute = 100
	}
	c.RefreshInterval.Duration = min(max(c.RefreshInterval.Duration, minRefresh), maxRefresh)
	return c
}
