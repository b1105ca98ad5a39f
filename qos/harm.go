package qos

import (
	"errors"
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Signal names what caused a batch budget cut: a fast interference signal that showed
// LS harm, or the utilisation budget. Its values are metric label values.
type Signal string

const (
	// SignalNone: nothing showed LS harm.
	SignalNone Signal = ""
	// SignalRunqueueDelay: an LS pod's run-queue delay (eBPF) passed its threshold.
	SignalRunqueueDelay Signal = "runqueue_delay"
	// SignalPSICPU: an LS pod's CPU stall (cpu.pressure, less its own CFS throttling)
	// passed its trigger.
	SignalPSICPU Signal = "psi_cpu"
	// SignalPSIMemory: the node's memory stall passed its trigger.
	SignalPSIMemory Signal = "psi_memory"
	// SignalUtilisation: LS and system usage left batch less than it had (the
	// Budgeter's cut; the only cause in sampling mode, or while no signal can be read).
	SignalUtilisation Signal = "utilisation"
)

// Signals returns every cause a cut may record, for metric label values.
func Signals() []Signal {
	return []Signal{SignalRunqueueDelay, SignalPSICPU, SignalPSIMemory, SignalUtilisation}
}

// Reasons of a GuardDecision besides the Budgeter's (ReasonInitial, ReasonCut,
// ReasonRestore, ReasonRestoreLimited, ReasonHold).
const (
	// ReasonHarmHold: LS harm was seen within restoreHold (or the evidence predates
	// the last cut, or batch is at its floor): the budget stays.
	ReasonHarmHold = "harm-hold"
	// ReasonNoHarm: no signal shows LS harm and batch is at its ceiling: the budget
	// stays there, whatever utilisation says.
	ReasonNoHarm = "no-harm"
)

// Defaults of [GuardConfig].
const (
	// DefaultCutPercent halves batch per harm cut: multiplicative decrease, so a few
	// cuts reach the floor whatever the node size, and one cut never zeroes batch on a
	// single noisy reading.
	DefaultCutPercent = 50.0
	// DefaultRestoreHold is how long the budget stays after the last harm: longer than
	// a PSI trigger window (500 ms), so the next event of a lasting harm comes before
	// the first raise.
	DefaultRestoreHold = time.Second
	// DefaultRestorePercentPerSecond grows batch back by 10 % of the node's CPUs a
	// second: ten seconds from the floor to the whole node.
	DefaultRestorePercentPerSecond = 10.0
)

// GuardConfig is the YAML-configurable part of the Guard. As with Policy,
// pre-fill it with DefaultGuardConfig() before unmarshalling, then Validate.
type GuardConfig struct {
	// CutPercent is how much of the budget in force one harm cut takes away, in
	// (0, 100]; the cut goes to the utilisation target instead when that is lower.
	CutPercent float64 `json:"cutPercent"`
	// RestoreHold is how long the budget stays after the last harm before it grows,
	// in [0, 1m].
	RestoreHold metav1.Duration `json:"restoreHold"`
	// RestorePercentPerSecond is how fast the budget grows back once the hold is
	// over, in percent of node CPUs per second, in (0, 1000].
	RestorePercentPerSecond float64 `json:"restorePercentPerSecond"`
}

// DefaultGuardConfig returns the defaults. It passes Validate.
func DefaultGuardConfig() GuardConfig {
	return GuardConfig{CutPercent: DefaultCutPercent, RestoreHold: metav1.Duration{Duration: DefaultRestoreHold},
		RestorePercentPerSecond: DefaultRestorePercentPerSecond}
}

// Validate reports every out-of-range field by its YAML key; each error wraps
// ErrInvalidConfig (several are joined).
func (c GuardConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	if !(c.CutPercent > 0 && c.CutPercent <= 100) {
		bad("cutPercent", c.CutPercent, "must be in (0, 100]")
	}
	if h := c.RestoreHold.Duration; h < 0 || h > time.Minute {
		bad("restoreHold", h, "must be within [0, 1m]")
	}
	if !(c.RestorePercentPerSecond > 0 && c.RestorePercentPerSecond <= 1000) {
		bad("restorePercentPerSecond", c.RestorePercentPerSecond, "must be in (0, 1000]")
	}
	return errors.Join(errs...)
}

// GuardInput is one call of Guard.Next: the control period's utilisation budget, or a
// harm signal between two periods (then Budget is the last period's).
type GuardInput struct {
	Now time.Time
	// Budget is the Budgeter's decision: its Min, Max and NodeCPUs bound the result and
	// its Target is the utilisation target a harm cut goes to when that is lower.
	Budget Budget
	// Harm is what showed LS harm since the last call; SignalNone when nothing did.
	Harm Signal
	// HarmSince is the start of the window the harm was measured over (the previous
	// map read, the start of the PSI trigger window). Evidence that began before the
	// last cut took effect holds the budget but does not cut again: it may be the very
	// harm that cut already answered.
	HarmSince time.Time
	// Blind: no signal could be read since the last call (the source failed).
	// Utilisation decides, as in sampling mode: fail safe, never generous.
	Blind bool
}

// GuardDecision is what to apply and why.
type GuardDecision struct {
	// Applied is the budget to enforce, cores, within [Budget.Min, Budget.Max].
	Applied float64 `json:"applied"`
	// Previous is what was applied before this call.
	Previous float64 `json:"previous"`
	// Reason is ReasonInitial, ReasonCut, ReasonRestore, ReasonRestoreLimited,
	// ReasonHarmHold or ReasonNoHarm.
	Reason string `json:"reason"`
	// Cause is what cut (Reason == ReasonCut): the harm signal, or SignalUtilisation
	// for a blind cut or a ceiling that moved down. SignalNone otherwise.
	Cause Signal `json:"cause,omitempty"`
}

// Guard is the batch budget when the agent has a harm signal (eBPF run-queue delay or
// PSI): it cuts only when a signal shows LS harm, and then at once, even before LS
// utilisation rises (to the utilisation target, or by cutPercent of the budget when that
// is higher); when no signal shows harm it never cuts on utilisation alone: SCHED_IDLE
// already yields to LS, and every throttle costs LS latency. After the last harm it holds
// for restoreHold, then restores slowly, by restorePercentPerSecond of the node's CPUs a
// second, up to the ceiling.
//
// Traps:
//   - The first call applies the utilisation target, as the Budgeter does: a restarted
//     agent must not give batch the whole node before it has seen anything.
//   - Restore is per second of the caller's clock, not per call: a harm signal may call
//     Next between two periods. A clock going back restarts the hold and earns nothing.
//   - A blind call (the source failed) is sampling mode for that call: a broken signal
//     never leaves batch unbounded next to a loaded LS.
//   - Not safe for concurrent use; the agent's control loop owns it.
type Guard struct {
	cfg      GuardConfig
	last     float64
	hasLast  bool
	lastCall time.Time
	lastHarm time.Time // zero: no harm since the start (or since a clock jump)
	lastCut  time.Time // when the last cut was decided; zero: none
	// start caps the first decision when hasStart (StartFrom).
	start    float64
	hasStart bool
}

// StartFrom makes the guard's first decision continue from cores, the batch limit a
// (re)starting agent found in force (the previous run's, which harm may have cut, or its
// shutdown budget): at most cores instead of the utilisation target, and held there for
// RestoreHold as after harm, since the new run has not seen whether LS is harmed yet;
// then it grows back at the restore rate. NaN or negative cores (no limit found) and a
// call after the first decision change nothing.
func (g *Guard) StartFrom(cores float64) {
	if g.hasLast || math.IsNaN(cores) || cores < 0 {
		return
	}
	g.start, g.hasStart = cores, true
}

// NewGuard returns a Guard for c, forced into range (c should have passed Validate).
func NewGuard(c GuardConfig) *Guard {
	if !(c.CutPercent > 0) {
		c.CutPercent = DefaultCutPercent
	}
	c.CutPercent = math.Min(c.CutPercent, 100)
	if c.RestoreHold.Duration < 0 {
		c.RestoreHold.Duration = 0
	}
	if !(c.RestorePercentPerSecond > 0) || math.IsInf(c.RestorePercentPerSecond, 0) {
		c.RestorePercentPerSecond = DefaultRestorePercentPerSecond
	}
	return &Guard{cfg: c}
}

// maxRestoreGap bounds the time one call may restore for: a stalled loop must not
// hand batch the whole node in one step when it resumes.
const maxRestoreGap = time.Second

// Next decides the budget for this call and remembers it.
func (g *Guard) Next(in GuardInput) GuardDecision {
	b := in.Budget
	lo, hi := b.Min, math.Max(b.Min, b.Max)
	if !g.hasLast {
		g.hasLast, g.lastCall = true, in.Now
		if in.Harm != SignalNone {
			g.lastHarm = in.Now
		}
		target := b.Target
		if g.hasStart {
			target = math.Min(target, g.start)
			g.lastHarm = in.Now // unknown yet: hold what was in force, as after harm
		}
		g.last = clamp(target, lo, hi)
		return GuardDecision{Applied: g.last, Previous: hi, Reason: ReasonInitial}
	}
	prev := g.last
	d := GuardDecision{Previous: prev}
	dt := in.Now.Sub(g.lastCall)
	if dt < 0 {
		// The clock went back: restart the timers, earn nothing.
		dt, g.lastHarm, g.lastCut = 0, time.Time{}, time.Time{}
	}
	g.lastCall = in.Now
	target := clamp(b.Target, lo, hi)
	switch {
	case in.Harm != SignalNone:
		g.lastHarm = in.Now
		cut := math.Max(lo, math.Min(prev*(1-g.cfg.CutPercent/100), target))
		fresh := g.lastCut.IsZero() || !in.HarmSince.Before(g.lastCut)
		if fresh && cut < prev {
			d.Applied, d.Reason, d.Cause = cut, ReasonCut, in.Harm
			g.lastCut = in.Now
		} else {
			d.Applied, d.Reason = prev, ReasonHarmHold
		}
	case in.Blind && target < prev:
		d.Applied, d.Reason, d.Cause = target, ReasonCut, SignalUtilisation
		g.lastCut = in.Now
	case !g.lastHarm.IsZero() && in.Now.Sub(g.lastHarm) < g.cfg.RestoreHold.Duration:
		d.Applied, d.Reason = prev, ReasonHarmHold
	case prev >= hi:
		d.Applied, d.Reason = prev, ReasonNoHarm
	default:
		if in.Blind {
			// Utilisation decides the raise too: never above its target.
			hi = math.Max(prev, target)
		}
		step := g.cfg.RestorePercentPerSecond / 100 * math.Max(b.NodeCPUs, 0) * min(dt, maxRestoreGap).Seconds()
		d.Applied, d.Reason = math.Min(hi, prev+step), ReasonRestoreLimited
		if d.Applied >= hi {
			d.Reason = ReasonRestore
		}
		if d.Applied == prev {
			d.Reason = ReasonHold
		}
	}
	// The bounds may have moved (node size, policy): stay within them. A ceiling that
	// moved down is a cut utilisation (the policy) made.
	if d.Applied > math.Max(b.Min, b.Max) {
		d.Applied, d.Reason, d.Cause = math.Max(b.Min, b.Max), ReasonCut, SignalUtilisation
	}
	d.Applied = math.Max(d.Applied, lo)
	g.last = d.Applied
	return d
}

// Applied returns the budget decided last and whether there is one.
func (g *Guard) Applied() (float64, bool) { return g.last, g.hasLast }

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(v, hi)) }
