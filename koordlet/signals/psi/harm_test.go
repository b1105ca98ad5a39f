package psi

import (
	"testing"
	"time"
)

func TestHarm(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name      string
		w         Window
		explained time.Duration
	}{
		{
			// Measured on this machine: one busy loop, quota 10 ms / 100 ms, 2 s.
			name:      "self-throttled single thread",
			w:         Window{Wall: 2000 * ms, Stall: 1805 * ms, Throttled: 1763 * ms, Usage: 203 * ms},
			explained: 1763 * ms,
		},
		{
			// Two threads throttled together on two CPUs: the throttled time
			// counts both run queues, the stall only the wall time.
			name:      "two CPUs throttled together, plus 200 ms of contention",
			w:         Window{Wall: 1000 * ms, Stall: 1150 * ms, Throttled: 1900 * ms, Usage: 100 * ms},
			explained: 950 * ms,
		},
		{
			name:      "no usage known: one CPU assumed",
			w:         Window{Wall: 1000 * ms, Stall: 600 * ms, Throttled: 500 * ms},
			explained: 500 * ms,
		},
		{
			name:      "no wall known: throttled time as is, capped by the stall",
			w:         Window{Stall: 300 * ms, Throttled: 500 * ms, Usage: 100 * ms},
			explained: 300 * ms,
		},
		{
			name:      "not throttled: all of the stall is harm",
			w:         Window{Wall: 100 * ms, Stall: 40 * ms, Usage: 60 * ms},
			explained: 0,
		},
		{
			// The lag: this interval's throttling is credited in the next one.
			name:      "throttled time not credited yet",
			w:         Window{Wall: 100 * ms, Stall: 90 * ms, Usage: 10 * ms},
			explained: 0,
		},
		{
			name:      "throttled time credited late: clamped, never negative harm",
			w:         Window{Wall: 100 * ms, Stall: 5 * ms, Throttled: 180 * ms, Usage: 10 * ms},
			explained: 5 * ms,
		},
		{
			name:      "throttled time beyond the wall (clock skew between reads)",
			w:         Window{Wall: 100 * ms, Stall: 100 * ms, Throttled: 130 * ms, Usage: 0},
			explained: 100 * ms,
		},
		{
			name: "negative inputs are zero",
			w:    Window{Wall: -1, Stall: -5 * ms, Throttled: -1, Usage: -1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, h := Explained(tc.w), Harm(tc.w)
			if diff := e - tc.explained; diff < -time.Microsecond || diff > time.Microsecond {
				t.Errorf("Explained = %v, want %v", e, tc.explained)
			}
			if h != max(tc.w.Stall, 0)-e {
				t.Errorf("Harm = %v, want Stall-Explained = %v", h, max(tc.w.Stall, 0)-e)
			}
		})
	}
}

func TestSampleSince(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	a := Sample{Time: t0, Stall: time.Second, Throttled: 2 * time.Second, Usage: 3 * time.Second}
	b := Sample{Time: t0.Add(500 * time.Millisecond), Stall: 1400 * time.Millisecond,
		Throttled: 2300 * time.Millisecond, Usage: 3050 * time.Millisecond}
	want := Window{Wall: 500 * time.Millisecond, Stall: 400 * time.Millisecond,
		Throttled: 300 * time.Millisecond, Usage: 50 * time.Millisecond}
	if got := b.Since(a); got != want {
		t.Errorf("Since = %+v, want %+v", got, want)
	}
	if got := a.Since(b); got != (Window{}) {
		t.Errorf("backwards Since = %+v, want zero", got)
	}
	if got := (Sample{Stall: time.Second}).Since(Sample{}); got != (Window{Stall: time.Second}) {
		t.Errorf("Since without times = %+v, want no wall", got)
	}
}
