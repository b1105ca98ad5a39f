package psi

import "time"

// Sample is a group's cumulative counters at one instant, for Since.
type Sample struct {
	Time time.Time
	// Stall is the cpu.pressure "some" Total (Pressure.Some.Total).
	Stall time.Duration
	// Throttled is the cpu.stat throttled time (Throttle.Time); on a hybrid
	// node from the v1 cpu hierarchy.
	Throttled time.Duration
	// Usage is the group's cumulative CPU time (cgroups.UsageReader, or
	// cgroup2 cpu.stat usage_usec); 0 when unknown.
	Usage time.Duration
}

// Since returns the growth from prev to s. A counter that went backwards (a
// group made again under the same path) counts as no growth, and so does a
// Time that did.
func (s Sample) Since(prev Sample) Window {
	grow := func(a, b time.Duration) time.Duration { return max(a-b, 0) }
	var wall time.Duration
	if !s.Time.IsZero() && !prev.Time.IsZero() {
		wall = max(s.Time.Sub(prev.Time), 0)
	}
	return Window{
		Wall:      wall,
		Stall:     grow(s.Stall, prev.Stall),
		Throttled: grow(s.Throttled, prev.Throttled),
		Usage:     grow(s.Usage, prev.Usage),
	}
}

// Window is the growth of one group's counters over one interval.
type Window struct {
	// Wall is the interval's length; 0 when unknown.
	Wall time.Duration
	// Stall is the growth of the group's cpu.pressure "some" total.
	Stall time.Duration
	// Throttled is the growth of its cpu.stat throttled time (summed over
	// CPUs by the kernel).
	Throttled time.Duration
	// Usage is the growth of its CPU time; 0 when unknown.
	Usage time.Duration
}

// Explained returns the part of w.Stall that the group's own CFS throttling
// accounts for: the wall time its tasks sat throttled, at most w.Stall.
//
// The kernel keeps a throttled group's tasks runnable for PSI, so each CPU
// on which the group is throttled counts as stalled for the whole throttled
// time, and "some" is the non-idle-weighted average of the CPUs' stall: k
// CPUs throttled together for t add t to the stall but k·t to the throttled
// time. Explained divides the throttled time by the group's parallelism
// while it was bandwidth-limited, estimated as (Throttled+Usage)/Wall (each
// of k CPUs is either running the group or holding it throttled), never
// below one; without Wall or Usage it assumes one CPU. A group that also
// slept during the interval makes that estimate low, so the discount leans
// towards explaining more: such a group cannot be much harmed anyway.
func Explained(w Window) time.Duration {
	stall, thr := max(w.Stall, 0), max(w.Throttled, 0)
	if stall == 0 || thr == 0 {
		return 0
	}
	e := thr
	if w.Wall > 0 {
		if u := max(w.Usage, 0); u > 0 {
			// T·W/(T+U) in floating point: the product overflows int64
			// beyond a few seconds.
			t, wall := float64(thr), float64(w.Wall)
			if t+float64(u) > wall {
				e = min(time.Duration(t*wall/(t+float64(u))), thr)
			}
		}
		e = min(e, w.Wall)
	}
	return min(e, stall)
}

// Harm returns the stall over the interval that the group's own throttling
// does not explain (w.Stall − Explained(w), never negative): time its tasks
// waited for a CPU that others (batch pods, or its own threads beyond its
// CPUs) held.
//
// The kernel adds a run queue's throttled time only when it is unthrottled,
// at the next period refill, while the stall grows as it happens. Over one
// short interval a throttled group therefore shows stall without throttled
// time (Harm too high) and then the reverse (Harm 0, the excess lost): take
// windows of several CFS periods (or end them just after the throttled time
// stepped) before acting on Harm. See the package doc.
func Harm(w Window) time.Duration {
	return max(w.Stall, 0) - Explained(w)
}
