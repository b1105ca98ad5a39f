package gpu

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestScrapeFor(t *testing.T) {
	t.Parallel()
	const period, every = 50 * time.Millisecond, time.Second
	at := time.Unix(1_700_000_000, 0)
	idle := gpuCadence{known: true, healthy: true, scrapedAt: at}
	with := func(mut func(*gpuCadence)) gpuCadence {
		g := idle
		mut(&g)
		return g
	}
	for _, tc := range []struct {
		name   string
		g      gpuCadence
		since  time.Duration // now - at
		period time.Duration // 0: period
		every  time.Duration // 0: every
		want   Scrape
	}{
		{"new GPU: full", gpuCadence{}, period, 0, 0, ScrapeFull},
		{"last read failed: full", with(func(g *gpuCadence) { g.healthy = false }), period, 0, 0, ScrapeFull},
		{"never read in full: full", with(func(g *gpuCadence) { g.scrapedAt = time.Time{} }), period, 0, 0,
			ScrapeFull},
		{"batch shares it with LS: full every period", with(func(g *gpuCadence) { g.batch, g.shared = true, true }),
			period, 0, 0, ScrapeFull},
		{"batch alone: probed", with(func(g *gpuCadence) { g.batch = true }), period, 0, 0, ScrapeProbe},
		{"LS alone or idle: probed", idle, period, 0, 0, ScrapeProbe},
		{"probed until the full read is due", idle, every - period/2 - time.Millisecond, 0, 0, ScrapeProbe},
		{"full read due half a period early (the steps jitter)", idle, every - period/2, 0, 0, ScrapeFull},
		{"full read overdue", idle, 3 * every, 0, 0, ScrapeFull},
		{"clock before the last read: full", idle, -time.Second, 0, 0, ScrapeFull},
		{"full-scrape period = loop period: full every period", idle, period, 0, period, ScrapeFull},
		{"slow loop: every wake-up reads in full", idle, every, 0, 0, ScrapeFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, e := period, every
			if tc.period != 0 {
				p = tc.period
			}
			if tc.every != 0 {
				e = tc.every
			}
			if got := scrapeFor(tc.g, at.Add(tc.since), p, e); got != tc.want {
				t.Fatalf("scrapeFor(%+v, +%v) = %v, want %v", tc.g, tc.since, got, tc.want)
			}
		})
	}
}

func TestLoopFast(t *testing.T) {
	t.Parallel()
	batch := gpuCadence{known: true, healthy: true, batch: true}
	ls := gpuCadence{known: true, healthy: true}
	for _, tc := range []struct {
		name string
		ok   bool
		cads []gpuCadence
		want bool
	}{
		{"nothing known after a failed scrape: fast", false, nil, true},
		{"no GPU: slow", true, nil, false},
		{"LS and idle GPUs only: slow", true, []gpuCadence{ls, {}, ls}, false},
		{"a GPU runs batch: fast", true, []gpuCadence{ls, {}, batch}, true},
		{"batch next to LS: fast", true, []gpuCadence{{known: true, healthy: true, batch: true, shared: true}}, true},
		{"an index gap is not a GPU", true, []gpuCadence{{batch: true}, ls}, false},
	} {
		if got := loopFast(tc.ok, tc.cads); got != tc.want {
			t.Errorf("%s: loopFast = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestCadenceOf(t *testing.T) {
	t.Parallel()
	const period, every = 50 * time.Millisecond, time.Second
	ok := gpuCadence{known: true, healthy: true}
	for _, tc := range []struct {
		name  string
		g     gpuCadence
		fast  bool
		every time.Duration
		want  string
	}{
		{"shared", gpuCadence{known: true, healthy: true, batch: true, shared: true}, true, every, CadenceFast},
		{"unhealthy", gpuCadence{known: true}, true, every, CadenceFast},
		{"batch alone", gpuCadence{known: true, healthy: true, batch: true}, true, every, CadenceProbe},
		{"LS on a node with batch elsewhere", ok, true, every, CadenceProbe},
		{"LS on a node without batch", ok, false, every, CadenceSlow},
		{"every GPU in full every period", ok, true, period, CadenceFast},
	} {
		if got := cadenceOf(tc.g, tc.fast, period, tc.every); got != tc.want {
			t.Errorf("%s: cadence %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestManagerPlansScrapes drives the manager's plan with a fake clock through a source
// that records the plans: a GPU is read in full every period while batch shares it, probed
// otherwise, in full again every full-scrape period; a failed scrape reads every GPU in
// full next time, and the loop runs slow only while no GPU runs batch.
func TestManagerPlansScrapes(t *testing.T) {
	t.Parallel()
	gpu := func(i int, procs ...Process) Device {
		d := device(procs...)
		d.Index, d.UUID = i, "GPU-"+string(rune('0'+i))
		return d
	}
	// Devices carry ScrapedAt as a collector stamps them: the step's time for a full
	// read, the last full read's for a probe.
	type call struct {
		plan []Scrape
		fast bool
	}
	var calls []call
	var lastFull [3]time.Time
	var devs func() []Device
	fail := false
	src := &planSource{collect: func(now time.Time, plan []Scrape) (Sample, error) {
		calls = append(calls, call{plan: append([]Scrape(nil), plan...)})
		if fail {
			return Sample{}, ErrNoNVML
		}
		ds := devs()
		for i := range ds {
			if i < len(plan) && plan[i] == ScrapeProbe {
				ds[i].Probed, ds[i].ScrapedAt = true, lastFull[i]
				continue
			}
			ds[i].ScrapedAt, lastFull[i] = now, now
		}
		return Sample{Devices: ds}, nil
	}}
	r := newRig(t, src, false)
	now := time.Unix(1_700_000_000, 0)
	step := func() call {
		r.m.Step(t.Context(), now)
		now = now.Add(50 * time.Millisecond)
		c := calls[len(calls)-1]
		c.fast = r.m.fast
		return c
	}
	P, F := ScrapeProbe, ScrapeFull
	shared := func() []Device {
		return []Device{gpu(0, lsProc(5), batchProc), gpu(1, batchProc), gpu(2, lsProc(30))}
	}
	devs = shared
	for i, want := range []call{
		{nil, true},               // nothing known yet: every GPU in full
		{[]Scrape{F, P, P}, true}, // batch next to LS on 0: fast; 1 and 2 probed
		{[]Scrape{F, P, P}, true},
	} {
		if got := step(); !slices.Equal(got.plan, want.plan) || got.fast != want.fast {
			t.Fatalf("step %d: plan %v fast %t, want %v %t", i, got.plan, got.fast, want.plan, want.fast)
		}
	}
	// Probed GPUs are read in full again once the full-scrape period has passed.
	for range 17 { // to 950 ms after the first full read: not due yet
		if got := step(); !slices.Equal(got.plan, []Scrape{F, P, P}) {
			t.Fatalf("plan %v before the full read is due", got.plan)
		}
	}
	if got := step(); !slices.Equal(got.plan, []Scrape{F, F, F}) {
		t.Fatalf("a second after the last full read: plan %v, want every GPU in full", got.plan)
	}
	if got := step(); !slices.Equal(got.plan, []Scrape{F, P, P}) {
		t.Fatalf("after the full reads: plan %v, want probes again", got.plan)
	}
	if st := r.m.Status(); st.GPUs[0].Cadence != CadenceFast || st.GPUs[1].Cadence != CadenceProbe ||
		st.GPUs[2].Cadence != CadenceProbe {
		t.Fatalf("cadences %q %q %q, want fast probe probe", st.GPUs[0].Cadence, st.GPUs[1].Cadence,
			st.GPUs[2].Cadence)
	}
	// No batch anywhere: the loop slows down, and /status says so.
	devs = func() []Device { return []Device{gpu(0, lsProc(5)), gpu(1), gpu(2, lsProc(30))} }
	if got := step(); got.fast {
		t.Fatal("no GPU runs batch, but the loop stays fast")
	}
	if st := r.m.Status(); st.GPUs[2].Cadence != CadenceSlow {
		t.Fatalf("cadence %q without batch, want %q", st.GPUs[2].Cadence, CadenceSlow)
	}
	// A failed scrape: nothing is known, the next one reads every GPU in full, fast.
	fail = true
	if got := step(); !got.fast {
		t.Fatal("after a failed scrape the loop must be fast")
	}
	fail = false
	devs = shared
	if got := step(); got.plan != nil {
		t.Fatalf("after a failed scrape: plan %v, want nil (every GPU in full)", got.plan)
	}
}

// planSource hands each Collect's plan to collect.
type planSource struct {
	collect func(now time.Time, plan []Scrape) (Sample, error)
}

func (s *planSource) Collect(_ context.Context, now time.Time, plan []Scrape) (Sample, error) {
	smp, err := s.collect(now, plan)
	smp.Time = now
	return smp, err
}

func (s *planSource) Close() error { return nil }
