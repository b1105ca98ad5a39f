package gpumodel

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

const (
	us1 = time.Microsecond
	ms1 = time.Millisecond
)

// pair is a small LS and batch pair on a GPU with the given slice and switch cost.
func pair(slice, cost time.Duration, mode Preemption) Scenario {
	return Scenario{
		GPU:      GPU{DefaultSlice: slice, SwitchCost: cost, Preemption: mode},
		LS:       LS{Rate: 100, Kernels: 17, Kernel: 200 * us1},
		Batch:    Batch{Kernel: 1660 * us1, SyncEvery: 8, SyncGap: 20 * us1},
		Gate:     Gate{Depth: 1, Gap: 20 * us1},
		Duration: 2 * time.Second,
		Seed:     1,
	}
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// TestLSAloneTakesItsKernelsSum: with nothing beside it, a request's latency is the sum
// of its kernels, whatever the slice, the switch cost or the preemption mode (a slice
// expiry with no other work does not switch).
func TestLSAloneTakesItsKernelsSum(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		kernels int
		kernel  time.Duration
		slice   time.Duration
		mode    Preemption
	}{
		{name: "one kernel", kernels: 1, kernel: 300 * us1, slice: 2 * ms1},
		{name: "17 kernels", kernels: 17, kernel: 188 * us1, slice: 2 * ms1},
		{name: "slice shorter than the request", kernels: 17, kernel: 188 * us1, slice: 100 * us1},
		{name: "kernel preemption", kernels: 17, kernel: 188 * us1, slice: 100 * us1, mode: PreemptKernel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := Scenario{
				GPU:      GPU{DefaultSlice: tc.slice, SwitchCost: 500 * us1, Preemption: tc.mode},
				LS:       LS{Rate: 100, Kernels: tc.kernels, Kernel: tc.kernel},
				Duration: time.Second,
			}
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			want := float64(time.Duration(tc.kernels)*tc.kernel) / float64(ms1)
			if r.LS.Requests != 100 || !near(r.LS.P50, want, 1e-9) || !near(r.LS.Max, want, 1e-9) {
				t.Errorf("%d requests, p50 %v ms, max %v ms; want 100 of %v ms", r.LS.Requests, r.LS.P50, r.LS.Max, want)
			}
			if r.Switches != 0 || r.Preemptions != 0 {
				t.Errorf("%d switches, %d preemptions alone; want none", r.Switches, r.Preemptions)
			}
		})
	}
}

// TestSliceExpirySwitchesAfterSwitchCost follows the GPU through one LS request of three
// 400 µs kernels beside a 2 ms batch kernel, 500 µs slices and a 100 µs switch: at a
// slice's end the GPU switches to the other context with work, which runs one switch
// cost later; instruction-level preemption stops the kernel mid-way, kernel-level waits
// for its end.
func TestSliceExpirySwitchesAfterSwitchCost(t *testing.T) {
	t.Parallel()
	seg := func(k SegmentKind, ctx string, from, to float64) Segment {
		return Segment{Kind: k, Ctx: ctx, Start: time.Duration(from * float64(ms1)), End: time.Duration(to * float64(ms1))}
	}
	tests := []struct {
		mode      Preemption
		want      []Segment
		latencyMs float64
	}{
		{
			mode: PreemptInstruction,
			want: []Segment{
				seg(SegRun, "ls", 0, 0.5), seg(SegSwitch, "batch", 0.5, 0.6), seg(SegRun, "batch", 0.6, 1.1),
				seg(SegSwitch, "ls", 1.1, 1.2), seg(SegRun, "ls", 1.2, 1.7), seg(SegSwitch, "batch", 1.7, 1.8),
				seg(SegRun, "batch", 1.8, 2.3), seg(SegSwitch, "ls", 2.3, 2.4), seg(SegRun, "ls", 2.4, 2.6),
				seg(SegSwitch, "batch", 2.6, 2.7), seg(SegRun, "batch", 2.7, 3.7), // the 2 ms kernel's last 1 ms
			},
			latencyMs: 2.6,
		},
		{
			mode: PreemptKernel,
			want: []Segment{
				seg(SegRun, "ls", 0, 0.8), seg(SegSwitch, "batch", 0.8, 0.9), seg(SegRun, "batch", 0.9, 2.9),
				seg(SegSwitch, "ls", 2.9, 3.0), seg(SegRun, "ls", 3.0, 3.4), seg(SegSwitch, "batch", 3.4, 3.5),
			},
			latencyMs: 3.4,
		},
	}
	for _, tc := range tests {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			sc := Scenario{
				GPU:      GPU{DefaultSlice: 500 * us1, SwitchCost: 100 * us1, Preemption: tc.mode},
				LS:       LS{Rate: 1, Kernels: 3, Kernel: 400 * us1},
				Batch:    Batch{Kernel: 2 * ms1, SyncEvery: 1},
				Duration: 10 * ms1,
				Trace:    true,
			}
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Segments) < len(tc.want) || !reflect.DeepEqual(r.Segments[:len(tc.want)], tc.want) {
				t.Errorf("segments:\n got %v\nwant %v", r.Segments[:min(len(r.Segments), len(tc.want))], tc.want)
			}
			if r.LS.Requests != 1 || !near(r.LS.P50, tc.latencyMs, 1e-9) {
				t.Errorf("LS: %d requests, latency %v ms; want 1 of %v", r.LS.Requests, r.LS.P50, tc.latencyMs)
			}
		})
	}
}

// TestFreezeGivesBatchNothing: batch frozen from the start runs nothing and LS sees
// exactly LS alone; frozen later, batch ran only until then (and what it had queued).
func TestFreezeGivesBatchNothing(t *testing.T) {
	t.Parallel()
	base := pair(2*ms1, 250*us1, PreemptInstruction)
	base.LS.Jitter = 0.1
	lsAlone, _ := alone(base)
	la, err := Run(lsAlone)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		at       time.Duration
		maxBatch int
		minBatch int
	}{
		{name: "from the start", at: 0, maxBatch: 0},
		{name: "after 1 s", at: time.Second, minBatch: 100, maxBatch: int(time.Second/base.Batch.Kernel) + base.Batch.SyncEvery},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := base
			sc.Lever, sc.FreezeAt = LeverFreeze, tc.at
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			if r.BatchKernels < tc.minBatch || r.BatchKernels > tc.maxBatch {
				t.Errorf("batch ran %d kernels; want %d to %d", r.BatchKernels, tc.minBatch, tc.maxBatch)
			}
			if tc.at == 0 && r.LS != la.LS {
				t.Errorf("LS %+v; want LS alone's %+v", r.LS, la.LS)
			}
		})
	}
}

// TestGateBoundsLSWaitToOneBatchKernel: with the gate (depth 1) and slices longer than
// a batch kernel, LS waits at most the rest of one batch kernel and a switch; without it
// LS waits behind batch's slice.
func TestGateBoundsLSWaitToOneBatchKernel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		kernel time.Duration
		lever  Lever
		within bool
	}{
		{name: "gate, 0.5 ms kernels", kernel: 500 * us1, lever: LeverGate, within: true},
		{name: "gate, 1.66 ms kernels", kernel: 1660 * us1, lever: LeverGate, within: true},
		{name: "nothing, 1.66 ms kernels", kernel: 1660 * us1, lever: LeverNone, within: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := pair(10*ms1, 250*us1, PreemptInstruction)
			sc.Batch.Kernel, sc.Lever = tc.kernel, tc.lever
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			aloneMs := float64(17*sc.LS.Kernel) / float64(ms1)
			bound := aloneMs + float64(tc.kernel+sc.GPU.SwitchCost)/float64(ms1)
			if got := r.LS.Max <= bound+1e-9; got != tc.within {
				t.Errorf("LS max %.3f ms, bound (alone + one batch kernel + a switch) %.3f ms: within %t, want %t",
					r.LS.Max, bound, got, tc.within)
			}
			if r.LS.Max <= aloneMs || r.BatchKernels == 0 {
				t.Errorf("LS max %.3f ms (alone %.3f), batch %d kernels: LS never waited or batch never ran",
					r.LS.Max, aloneMs, r.BatchKernels)
			}
		})
	}
}

// TestBatchAlone: batch alone runs SyncEvery kernels per burst plus the host's gap, and
// a slice expiry with no other work neither switches nor costs anything.
func TestBatchAlone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		slice time.Duration
		every int
		gap   time.Duration
	}{
		{name: "sync 8", slice: 2 * ms1, every: 8, gap: 100 * us1},
		{name: "sync 64", slice: 2 * ms1, every: 64, gap: 100 * us1},
		{name: "100 µs slice", slice: 100 * us1, every: 8, gap: 100 * us1},
		{name: "no gap", slice: 2 * ms1, every: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := Scenario{
				GPU:      GPU{DefaultSlice: 2 * ms1, SwitchCost: 250 * us1},
				Batch:    Batch{Kernel: ms1, SyncEvery: tc.every, SyncGap: tc.gap, Slice: tc.slice},
				Duration: 20 * time.Second,
			}
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			want := float64(tc.every) / (time.Duration(tc.every)*ms1 + tc.gap).Seconds()
			if !near(r.BatchPerSecond, want, want*0.005) {
				t.Errorf("batch %.1f/s, want %.1f", r.BatchPerSecond, want)
			}
			if r.Switches != 0 || r.Preemptions != 0 || r.LS.Requests != 0 {
				t.Errorf("%d switches, %d preemptions, %d LS requests alone; want none", r.Switches, r.Preemptions, r.LS.Requests)
			}
		})
	}
}

// TestSwitchesPerRequest: under the default 2 ms slices each 3.4 ms LS request costs
// four switches (batch out, LS out at its slice's end, batch out again, LS done); with
// LS's slice longer than a request, two.
func TestSwitchesPerRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		lsSlice time.Duration
		want    int
	}{
		{name: "default slices", want: 4},
		{name: "LS long", lsSlice: 10 * ms1, want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := pair(2*ms1, 250*us1, PreemptInstruction)
			sc.LS.Slice = tc.lsSlice
			sc.Batch.Slice = 100 * us1
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			if per := float64(r.Switches) / float64(r.LS.Requests); !near(per, float64(tc.want), 0.05) {
				t.Errorf("%.2f switches per LS request, want %d", per, tc.want)
			}
		})
	}
}

// TestDeterministic: a seed gives the same run; another seed another.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	sc := pair(2*ms1, 250*us1, PreemptInstruction)
	sc.LS.Jitter, sc.Batch.Jitter = 0.14, 0.01
	a, errA := Run(sc)
	b, errB := Run(sc)
	sc.Seed = 2
	c, errC := Run(sc)
	if err := errors.Join(errA, errB, errC); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different runs:\n%+v\n%+v", a, b)
	}
	if a.LS == c.LS {
		t.Errorf("seeds 1 and 2 gave the same LS figures %+v", a.LS)
	}
}

// TestArrivals: fixed arrivals are every 1/rate; Poisson's have that mean and vary.
func TestArrivals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		arrivals Arrivals
		min, max int
		varies   bool
	}{
		{name: "fixed", arrivals: ArrivalsFixed, min: 2000, max: 2000},
		{name: "poisson", arrivals: ArrivalsPoisson, min: 1850, max: 2150, varies: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sched := arrivals(LS{Rate: 100, Arrivals: tc.arrivals}, 20*time.Second, rand.New(rand.NewPCG(7, 3)))
			if len(sched) < tc.min || len(sched) > tc.max {
				t.Fatalf("%d arrivals in 20 s at 100/s; want %d to %d", len(sched), tc.min, tc.max)
			}
			varies := false
			for i := 2; i < len(sched); i++ {
				if sched[i]-sched[i-1] != sched[1]-sched[0] {
					varies = true
				}
			}
			if varies != tc.varies {
				t.Errorf("gaps vary: %t, want %t", varies, tc.varies)
			}
		})
	}
}

// TestValidate: a scenario that cannot run is refused with ErrScenario.
func TestValidate(t *testing.T) {
	t.Parallel()
	ok := pair(2*ms1, 250*us1, PreemptInstruction)
	tests := []struct {
		name string
		edit func(*Scenario)
	}{
		{name: "no window", edit: func(s *Scenario) { s.Duration = 0 }},
		{name: "no slice", edit: func(s *Scenario) { s.GPU.DefaultSlice = 0 }},
		{name: "negative switch", edit: func(s *Scenario) { s.GPU.SwitchCost = -1 }},
		{name: "LS without kernels", edit: func(s *Scenario) { s.LS.Kernels = 0 }},
		{name: "batch without sync", edit: func(s *Scenario) { s.Batch.SyncEvery = 0 }},
		{name: "negative jitter", edit: func(s *Scenario) { s.LS.Jitter = -0.1 }},
		{name: "gate without depth", edit: func(s *Scenario) { s.Lever, s.Gate.Depth = LeverGate, 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := ok
			tc.edit(&sc)
			if _, err := Run(sc); !errors.Is(err, ErrScenario) {
				t.Errorf("Run = %v, want ErrScenario", err)
			}
		})
	}
	if _, err := Run(ok); err != nil {
		t.Errorf("the valid scenario: %v", err)
	}
}
