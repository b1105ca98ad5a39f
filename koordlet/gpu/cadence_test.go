package gpu

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/qos"
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
	frozen := with(func(g *gpuCadence) { g.batch, g.shared, g.frozen = true, true, true })
	inMPS := with(func(g *gpuCadence) { g.batch, g.shared, g.mps = true, true, true })
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
		{"batch shares it, frozen: utilisation probed", frozen, period, 0, 0, ScrapeUtil},
		{"batch shares it, frozen: in full once due", frozen, every - period/2, 0, 0, ScrapeFull},
		{"batch shares it, frozen, last read failed: full", func() gpuCadence {
			g := frozen
			g.healthy = false
			return g
		}(), period, 0, 0, ScrapeFull},
		{"batch shares it, frozen, clock went back: full", frozen, -period, 0, 0, ScrapeFull},
		{"LS and batch in MPS partitions: probed", inMPS, period, 0, 0, ScrapeProbe},
		{"LS and batch in MPS partitions: in full once due", inMPS, every - period/2, 0, 0, ScrapeFull},
		{"batch alone, frozen (LS left within hold): probed", with(func(g *gpuCadence) {
			g.batch, g.frozen = true, true
		}), period, 0, 0, ScrapeProbe},
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
		{"shared, batch frozen", gpuCadence{known: true, healthy: true, batch: true, shared: true, frozen: true}, true,
			every, CadenceFrozen},
		{"shared, MPS partitions", gpuCadence{known: true, healthy: true, batch: true, shared: true, mps: true}, true,
			every, CadenceMPS},
		{"shared, batch frozen, every GPU in full every period",
			gpuCadence{known: true, healthy: true, batch: true, shared: true, frozen: true}, true, period, CadenceFast},
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
			if i < len(plan) && plan[i] != ScrapeFull {
				ds[i].Probed, ds[i].ScrapedAt, ds[i].UtilNow = true, lastFull[i], plan[i] == ScrapeUtil
				continue
			}
			ds[i].ScrapedAt, lastFull[i] = now, now
		}
		return Sample{Devices: ds}, nil
	}}
	r := newRig(t, src, false)
	now := time.Unix(1_700_000_000, 0)
	step := func() call {
		r.m.step(t.Context(), now)
		now = now.Add(50 * time.Millisecond)
		c := calls[len(calls)-1]
		c.fast = r.m.fast
		return c
	}
	P, F, U := ScrapeProbe, ScrapeFull, ScrapeUtil
	// GPU 0: LS idle beside batch, GPU 1: batch alone, GPU 2: LS alone. GPU 0's own
	// utilisation is what it reads while the loop holds its batch frozen: 0.
	shared := func() []Device {
		ds := []Device{gpu(0, lsProc(0), batchProc), gpu(1, batchProc), gpu(2, lsProc(30))}
		ds[0].Util = 0
		return ds
	}
	devs = shared
	for i, want := range []call{
		{nil, true},               // nothing known yet: every GPU in full; LS arrives on 0: frozen for hold
		{[]Scrape{U, P, P}, true}, // 50 ms: batch shares 0 and is frozen; 1 and 2 probed
		{[]Scrape{U, P, P}, true},
		{[]Scrape{U, P, P}, true},
		{[]Scrape{U, P, P}, true}, // 200 ms: LS idle for hold, thawed
		{[]Scrape{F, P, P}, true}, // batch beside LS on 0: in full every period
		{[]Scrape{F, P, P}, true},
	} {
		if got := step(); !slices.Equal(got.plan, want.plan) || got.fast != want.fast {
			t.Fatalf("step %d: plan %v fast %t, want %v %t", i, got.plan, got.fast, want.plan, want.fast)
		}
	}
	// Probed GPUs are read in full again once the full-scrape period has passed.
	for range 13 { // to 950 ms after the first full read: not due yet
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
	// LS busy on GPU 0 freezes its batch: from the next step on only the GPU's list and
	// utilisation are read, in full again every full-scrape period, and in full every
	// period once batch is thawed.
	busy := func() []Device {
		ds := []Device{gpu(0, lsProc(5), batchProc), gpu(1, batchProc), gpu(2, lsProc(30))}
		ds[0].Util = 5
		return ds
	}
	devs = busy
	if got := step(); !slices.Equal(got.plan, []Scrape{F, P, P}) {
		t.Fatalf("the step that freezes: plan %v", got.plan)
	}
	full := 0
	for i := range 40 {
		got := step()
		if got.plan[0] == F {
			full++
		} else if got.plan[0] != U {
			t.Fatalf("frozen step %d: plan %v, want GPU 0 read with its utilisation only", i, got.plan)
		}
	}
	if full != 2 {
		t.Fatalf("%d full reads of the frozen GPU in 2 s, want 2 (one per full-scrape period)", full)
	}
	if st := r.m.Status(); st.GPUs[0].Cadence != CadenceFrozen || st.GPUs[0].Decision.Duty != 1 {
		t.Fatalf("frozen GPU 0: cadence %q duty %v, want %q 1", st.GPUs[0].Cadence, st.GPUs[0].Decision.Duty,
			CadenceFrozen)
	}
	// The GPU's own utilisation says LS went idle: thawed after hold (200 ms), then read
	// in full every period again.
	devs = shared
	for i := 0; ; i++ {
		got := step()
		if r.m.Status().GPUs[0].Decision.Duty == 0 {
			break
		}
		if i > 6 {
			t.Fatalf("batch still frozen %d steps after the GPU read idle (hold 200 ms); plan %v", i, got.plan)
		}
	}
	for range 2 {
		if got := step(); got.plan[0] != F || r.m.Status().GPUs[0].Decision.Duty != 0 {
			t.Fatalf("thawed beside idle LS: plan %v duty %v, want GPU 0 in full, thawed", got.plan,
				r.m.Status().GPUs[0].Decision.Duty)
		}
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

// TestManagerUtilProbeOnlyWhenAllFrozen: a GPU is read with its utilisation only while
// every batch pod on it is frozen: a pod the freeze leaves out (terminating, or without a
// cgroup) computes on, and the GPU's utilisation would count its work as LS's.
func TestManagerUtilProbeOnlyWhenAllFrozen(t *testing.T) {
	t.Parallel()
	root := cgroupstest.NewRoot(t, cgroupstest.Hybrid)
	cgroupstest.AddGroup(t, root, cgroupstest.Hybrid, batchCg)
	const leaving, unplaced = types.UID("batch-leaving"), types.UID("batch-no-cgroup")
	pods := PodMap{
		mgrLSUID:    {UID: mgrLSUID, Namespace: "web", Name: "infer", Class: qos.ClassLS, Cgroup: lsCg},
		mgrBatchUID: {UID: mgrBatchUID, Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: batchCg},
		leaving: {UID: leaving, Namespace: "ml", Name: "old", Class: qos.ClassBatch, Cgroup: batchCg + "-old",
			Terminating: true},
		unplaced: {UID: unplaced, Namespace: "ml", Name: "new", Class: qos.ClassBatch},
	}
	var plans [][]Scrape
	var procs []Process
	var lastFull time.Time
	src := &planSource{collect: func(now time.Time, plan []Scrape) (Sample, error) {
		plans = append(plans, slices.Clone(plan))
		d := device(procs...)
		d.Util, d.ScrapedAt = 5, now
		if len(plan) > 0 && plan[0] != ScrapeFull {
			d.Probed, d.UtilNow, d.ScrapedAt = true, plan[0] == ScrapeUtil, lastFull
		}
		lastFull = d.ScrapedAt
		return Sample{Devices: []Device{d}}, nil
	}}
	m, err := NewManager(Options{Source: src, Pods: func() PodView { return pods },
		Groups: cgroups.OpenLayout(root, cgroups.LayoutHybrid), Cycler: newFakeCycler(),
		Policy: qos.DefaultGPUThrottlePolicy(), Period: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name  string
		other types.UID // a second batch pod's process on the GPU ("": none)
		want  Scrape
	}{
		{"a terminating batch pod computes on", leaving, ScrapeFull},
		{"a batch pod without a cgroup computes on", unplaced, ScrapeFull},
		{"every batch pod frozen", "", ScrapeUtil},
	} {
		procs = []Process{lsProc(5), batchProc}
		if tc.other != "" {
			procs = append(procs, Process{PID: 400, SMUtil: 30, Pod: PodRef{UID: tc.other}})
		}
		for range 2 {
			m.step(t.Context(), now)
			now = now.Add(50 * time.Millisecond)
		}
		st := m.Status().GPUs[0]
		if got := plans[len(plans)-1]; !st.Decision.Frozen || len(got) != 1 || got[0] != tc.want {
			t.Fatalf("%s: frozen %t, plan %v, want %v", tc.name, st.Decision.Frozen, got, tc.want)
		}
	}
}
