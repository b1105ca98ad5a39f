package gpu

import (
	"testing"
	"time"
)

// TestSampleHold drives one device's hold read by read: the period estimate, the hold
// it gives, and when a held sample goes (a later pass without it, known before the read;
// staleness).
func TestSampleHold(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_800_000_000, 0)
	us := func(d time.Duration) uint64 { return uint64(base.Add(d).UnixMicro()) }
	type smp struct {
		pid uint32
		sm  uint32
		at  time.Duration // the driver's timestamp, from base
	}
	type read struct {
		at      time.Duration // the read's now, from base
		samples []smp
		want    map[uint32]uint32 // held after the read
		hold    time.Duration
		devIdle bool // the device's utilisation read 0
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"period unknown, then learnt from two passes", []read{
			{at: 50 * time.Millisecond, samples: []smp{{1, 40, 10 * time.Millisecond}},
				want: map[uint32]uint32{1: 40}, hold: sampleHoldUnknown},
			{at: 100 * time.Millisecond, want: map[uint32]uint32{1: 40}, hold: sampleHoldUnknown},
			{at: 200 * time.Millisecond, samples: []smp{{1, 50, 177 * time.Millisecond}},
				want: map[uint32]uint32{1: 50}, hold: sampleFresh},
		}},
		{"a later pass without it, returned by an earlier read: idle", []read{
			{at: 50 * time.Millisecond, samples: []smp{{1, 40, 10 * time.Millisecond}, {2, 60, 11 * time.Millisecond}},
				want: map[uint32]uint32{1: 40, 2: 60}, hold: sampleHoldUnknown},
			// Pass 2 lacks pid 1: held this read (the rest of the pass may still come) ...
			{at: 200 * time.Millisecond, samples: []smp{{2, 60, 177 * time.Millisecond}},
				want: map[uint32]uint32{1: 40, 2: 60}, hold: sampleFresh},
			// ... and dropped at the next.
			{at: 250 * time.Millisecond, want: map[uint32]uint32{2: 60}, hold: sampleFresh},
		}},
		{"one pass read across two reads: no absence", []read{
			{at: 50 * time.Millisecond, samples: []smp{{1, 40, 10 * time.Millisecond}, {2, 60, 10 * time.Millisecond}},
				want: map[uint32]uint32{1: 40, 2: 60}, hold: sampleHoldUnknown},
			{at: 200 * time.Millisecond, samples: []smp{{2, 60, 180 * time.Millisecond}},
				want: map[uint32]uint32{1: 40, 2: 60}, hold: sampleFresh},
			{at: 250 * time.Millisecond, samples: []smp{{1, 45, 181 * time.Millisecond}},
				want: map[uint32]uint32{1: 45, 2: 60}, hold: sampleFresh},
		}},
		{"stale without any pass", []read{
			{at: 0, samples: []smp{{1, 40, -100 * time.Millisecond}}, want: map[uint32]uint32{1: 40},
				hold: sampleHoldUnknown},
			{at: time.Second / 2, samples: []smp{{1, 40, 400 * time.Millisecond}}, want: map[uint32]uint32{1: 40},
				hold: sampleFresh},
			{at: time.Second/2 + sampleFresh - time.Millisecond, want: map[uint32]uint32{1: 40}, hold: sampleFresh},
			{at: time.Second/2 + sampleFresh, want: map[uint32]uint32{}, hold: sampleFresh},
		}},
		{"the device idle: no pass needed", []read{
			{at: 50 * time.Millisecond, samples: []smp{{1, 40, 10 * time.Millisecond}},
				want: map[uint32]uint32{1: 40}, hold: sampleHoldUnknown},
			{at: 200 * time.Millisecond, samples: []smp{{1, 40, 177 * time.Millisecond}},
				want: map[uint32]uint32{1: 40}, hold: sampleFresh},
			// Within a period (and samplePass) of the sample: the device's 0 may be of
			// an older period.
			{at: 400 * time.Millisecond, want: map[uint32]uint32{1: 40}, hold: sampleFresh, devIdle: true},
			{at: 450 * time.Millisecond, want: map[uint32]uint32{}, hold: sampleFresh, devIdle: true},
		}},
		{"the device idle, period unknown: stale only", []read{
			{at: 50 * time.Millisecond, samples: []smp{{1, 40, 10 * time.Millisecond}},
				want: map[uint32]uint32{1: 40}, hold: sampleHoldUnknown, devIdle: true},
			{at: time.Second, want: map[uint32]uint32{1: 40}, hold: sampleHoldUnknown, devIdle: true},
		}},
		{"slow driver: two periods, capped", []read{
			{at: 0, samples: []smp{{1, 40, 0}, {1, 30, 1500 * time.Millisecond}}, want: map[uint32]uint32{1: 30},
				hold: maxSampleHold},
			{at: 10 * time.Millisecond, samples: []smp{{1, 35, 2700 * time.Millisecond}},
				want: map[uint32]uint32{1: 35}, hold: 2400 * time.Millisecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newSampleHold()
			for k, r := range tc.reads {
				now := base.Add(r.at)
				h.begin()
				for _, s := range r.samples {
					h.add(s.pid, s.sm, s.sm/2, us(s.at), now)
				}
				h.end(now, r.devIdle)
				got := map[uint32]uint32{}
				for pid, s := range h.procs {
					got[pid] = s.sm
				}
				if len(got) != len(r.want) {
					t.Fatalf("read %d: held %v, want %v", k, got, r.want)
				}
				for pid, sm := range r.want {
					if got[pid] != sm {
						t.Fatalf("read %d: held %v, want %v", k, got, r.want)
					}
				}
				if d := h.holdFor(); d != r.hold {
					t.Fatalf("read %d: hold %v (period %d µs), want %v", k, d, h.period, r.hold)
				}
			}
			h.clear()
			if len(h.procs) != 0 || h.newest != 0 || h.holdFor() != sampleHoldUnknown {
				t.Fatalf("clear left %+v", h)
			}
		})
	}
}

// TestSampleHoldDue: the driver is asked only once a pass newer than the newest read
// may have come, always while the period is unknown, and at least every sampleFresh
// of the caller's clock, so that timestamps ahead of a host clock set back do not stop
// the reads.
func TestSampleHoldDue(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_800_000_000, 0)
	us := func(d time.Duration) uint64 { return uint64(base.Add(d).UnixMicro()) }
	learnt := func() *sampleHold { // passes at 0 and 1/6 s, last asked at 1/6 s + 20 ms
		h := newSampleHold()
		h.add(1, 40, 0, us(0), base)
		h.add(1, 40, 0, us(time.Second/6), base.Add(time.Second/6))
		h.read = base.Add(time.Second/6 + 20*time.Millisecond)
		return h
	}
	for _, tc := range []struct {
		name string
		h    func() *sampleHold
		now  time.Time
		want bool
	}{
		{"nothing read yet", newSampleHold, base, true},
		{"period unknown", func() *sampleHold {
			h := newSampleHold()
			h.add(1, 40, 0, us(0), base)
			h.read = base
			return h
		}, base.Add(10 * time.Millisecond), true},
		{"before the next pass can come", learnt, base.Add(300 * time.Millisecond), false},
		{"when it can", learnt, base.Add(2 * time.Second / 6), true},
		{"the host clock set back: asked after sampleFresh anyway", func() *sampleHold {
			h := learnt()
			h.add(1, 40, 0, us(time.Hour), base) // a timestamp an hour ahead of now
			return h
		}, base.Add(time.Second/6 + 20*time.Millisecond + sampleFresh), true},
		{"the host clock set back, within sampleFresh", func() *sampleHold {
			h := learnt()
			h.add(1, 40, 0, us(time.Hour), base)
			return h
		}, base.Add(time.Second), false},
		{"no clock", learnt, time.Time{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.h().due(tc.now); got != tc.want {
				t.Errorf("due = %v, want %v", got, tc.want)
			}
		})
	}
}
