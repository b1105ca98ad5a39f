package gpumodel

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Preemption is how a slice expiry takes the GPU from a context that still has work.
type Preemption int

const (
	// PreemptInstruction stops the running kernel where it is (Hopper's compute
	// preemption); the rest of the kernel runs when its context is back.
	PreemptInstruction Preemption = iota
	// PreemptKernel lets the running kernel finish first, then switches.
	PreemptKernel
)

func (p Preemption) String() string {
	switch p {
	case PreemptInstruction:
		return "instruction"
	case PreemptKernel:
		return "kernel"
	}
	return fmt.Sprintf("Preemption(%d)", int(p))
}

// MarshalText writes the name, for the JSON.
func (p Preemption) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads the name.
func (p *Preemption) UnmarshalText(b []byte) error {
	for _, m := range []Preemption{PreemptInstruction, PreemptKernel} {
		if string(b) == m.String() {
			*p = m
			return nil
		}
	}
	return fmt.Errorf("%w: preemption %q is neither instruction nor kernel", ErrScenario, b)
}

// Arrivals is how LS requests are spaced.
type Arrivals int

const (
	// ArrivalsFixed schedules request i at i/rate, as the real bench's LS stand-in does
	// (an open loop; a request whose time has come while the previous one runs starts when
	// that one ends, and its latency counts from its scheduled time).
	ArrivalsFixed Arrivals = iota
	// ArrivalsPoisson draws exponential gaps of mean 1/rate.
	ArrivalsPoisson
)

func (a Arrivals) String() string {
	switch a {
	case ArrivalsFixed:
		return "fixed"
	case ArrivalsPoisson:
		return "poisson"
	}
	return fmt.Sprintf("Arrivals(%d)", int(a))
}

// MarshalText writes the name, for the JSON.
func (a Arrivals) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Lever is what the node does about batch.
type Lever int

const (
	// LeverNone leaves the GPU's time-slicing alone (per-context slices, if set, are
	// part of the GPU, not a lever here).
	LeverNone Lever = iota
	// LeverFreeze stops batch's process from FreezeAt on: it launches nothing more; what
	// it had queued on the GPU still runs.
	LeverFreeze
	// LeverGate forwards batch's kernel launches to the GPU only while LS has no request
	// in flight, and at most Gate.Depth batch kernels at a time.
	LeverGate
)

func (l Lever) String() string {
	switch l {
	case LeverNone:
		return "nothing"
	case LeverFreeze:
		return "freeze"
	case LeverGate:
		return "gate"
	}
	return fmt.Sprintf("Lever(%d)", int(l))
}

// MarshalText writes the name, for the JSON.
func (l Lever) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// GPU is the time-slice scheduler's parameters.
type GPU struct {
	// DefaultSlice is the timeslice of a context that sets none.
	DefaultSlice time.Duration `json:"defaultSlice"`
	// SwitchCost is the time the GPU runs nothing while it changes contexts (state saved
	// and loaded, caches cold: one lump).
	SwitchCost time.Duration `json:"switchCost"`
	// Preemption is how a slice expiry stops the running kernel.
	Preemption Preemption `json:"preemption"`
}

// LS is the latency-sensitive process: requests of Kernels kernels each.
type LS struct {
	// Rate is requests per second; 0 leaves the LS context idle.
	Rate     float64  `json:"rate"`
	Arrivals Arrivals `json:"arrivals"`
	Kernels  int      `json:"kernels"`
	// Kernel is one kernel's mean length, the host's overheads folded in.
	Kernel time.Duration `json:"kernel"`
	// Jitter is the standard deviation of a kernel's length relative to Kernel (drawn
	// normal, cut at 3 deviations).
	Jitter float64 `json:"jitter"`
	// Slice is LS's timeslice; 0: the GPU's default.
	Slice time.Duration `json:"slice,omitempty"`
}

// Batch is the batch process: kernels back to back, a synchronize every SyncEvery.
type Batch struct {
	// Kernel is one kernel's mean length; 0: no batch process.
	Kernel    time.Duration `json:"kernel"`
	Jitter    float64       `json:"jitter"`
	SyncEvery int           `json:"syncEvery"`
	// SyncGap is the host's time from a synchronize's return to the next launch.
	SyncGap time.Duration `json:"syncGap"`
	// Slice is batch's timeslice; 0: the GPU's default.
	Slice time.Duration `json:"slice,omitempty"`
}

// Gate sizes the launch gate (LeverGate).
type Gate struct {
	// Depth is how many batch kernels may be on the GPU at once (1: LS waits for at
	// most the rest of one).
	Depth int `json:"depth"`
	// Gap is the host's time from an event (a batch kernel done, LS done) to the
	// forwarded launch.
	Gap time.Duration `json:"gap"`
}

// Scenario is one simulated run.
type Scenario struct {
	GPU   GPU   `json:"gpu"`
	LS    LS    `json:"ls"`
	Batch Batch `json:"batch"`
	Lever Lever `json:"lever"`
	// FreezeAt is when LeverFreeze stops batch's process.
	FreezeAt time.Duration `json:"freezeAt,omitempty"`
	Gate     Gate          `json:"gate,omitzero"`
	// Duration is the measured window: LS requests scheduled in it, batch kernels
	// finished in it.
	Duration time.Duration `json:"duration"`
	Seed     uint64        `json:"seed"`
	// Trace keeps every GPU segment in Result.Segments (tests, debugging).
	Trace bool `json:"-"`
}

// ErrScenario is returned for a scenario that cannot run.
var ErrScenario = errors.New("gpumodel: invalid scenario")

func (s Scenario) validate() error {
	switch {
	case s.Duration <= 0:
		return fmt.Errorf("%w: duration %v", ErrScenario, s.Duration)
	case s.GPU.DefaultSlice <= 0 || s.GPU.SwitchCost < 0:
		return fmt.Errorf("%w: slice %v, switch cost %v", ErrScenario, s.GPU.DefaultSlice, s.GPU.SwitchCost)
	case s.LS.Rate < 0 || s.LS.Rate > 0 && (s.LS.Kernels <= 0 || s.LS.Kernel <= 0):
		return fmt.Errorf("%w: LS rate %g, %d kernels of %v", ErrScenario, s.LS.Rate, s.LS.Kernels, s.LS.Kernel)
	case s.Batch.Kernel < 0 || s.Batch.Kernel > 0 && s.Batch.SyncEvery <= 0:
		return fmt.Errorf("%w: batch kernel %v, sync every %d", ErrScenario, s.Batch.Kernel, s.Batch.SyncEvery)
	case s.LS.Jitter < 0 || s.Batch.Jitter < 0 || s.LS.Slice < 0 || s.Batch.Slice < 0 || s.Batch.SyncGap < 0:
		return fmt.Errorf("%w: negative jitter, slice or gap", ErrScenario)
	case s.Lever == LeverGate && (s.Gate.Depth <= 0 || s.Gate.Gap < 0):
		return fmt.Errorf("%w: gate depth %d, gap %v", ErrScenario, s.Gate.Depth, s.Gate.Gap)
	}
	return nil
}

// SegmentKind is what the GPU did in a segment.
type SegmentKind string

// The segment kinds.
const (
	SegRun    SegmentKind = "run"
	SegSwitch SegmentKind = "switch"
)

// Segment is a stretch of GPU time: a context's kernels running, or a switch to it.
type Segment struct {
	Kind       SegmentKind
	Ctx        string
	Start, End time.Duration
}

// Result is what a run measured.
type Result struct {
	LS LSStats `json:"ls"`
	// BatchKernels finished within the window; BatchPerSecond is their rate.
	BatchKernels   int     `json:"batchKernels"`
	BatchPerSecond float64 `json:"batchPerSecond"`
	// Switches and Preemptions (switches that stopped work mid-way) over the whole run.
	Switches    int `json:"switches"`
	Preemptions int `json:"preemptions"`
	// Busy is each context's kernel time and SwitchTime the switches', over the window.
	BusyLS     time.Duration `json:"busyLS"`
	BusyBatch  time.Duration `json:"busyBatch"`
	SwitchTime time.Duration `json:"switchTime"`
	Segments   []Segment     `json:"-"`
}

// The contexts' names, indices into sim.tsgs.
const (
	ctxLS    = 0
	ctxBatch = 1
)

// ctxName names a context in the trace.
func ctxName(ctx int) string {
	if ctx == ctxLS {
		return "ls"
	}
	return "batch"
}

// never is a time that does not come.
const never = time.Duration(math.MaxInt64)

// tsg is one context's time-slice group: its queue of kernels on the GPU.
type tsg struct {
	slice time.Duration
	queue []time.Duration // what is left of each kernel, head first
	done  int             // kernels finished
	busy  time.Duration   // kernel time within the window
}

type gpuState int

const (
	gpuIdle gpuState = iota
	gpuRunning
	gpuSwitching
)

// sim is one run's state. Host actions are events in a heap; the GPU's next event is
// computed from its state, so a preemption leaves no stale event behind.
type sim struct {
	sc     Scenario
	now    time.Duration
	events eventHeap
	seq    uint64
	res    Result

	tsgs     [2]tsg
	state    gpuState
	loaded   int           // the context on the GPU (-1: none yet)
	target   int           // the context being switched to
	runFrom  time.Duration // when the head kernel (re)started
	sliceEnd time.Duration
	swEnd    time.Duration
	swFrom   time.Duration
	pending  bool // PreemptKernel: switch when the head kernel ends
	segFrom  time.Duration

	// LS host.
	lsRNG, batchRNG *rand.Rand
	lsSched         []time.Duration
	lsNext          int // the next request to start
	lsCur           int // the request in flight (-1: none)
	lsTarget        int // tsgs[ctxLS].done when lsCur is done
	lsLat           []float64

	// Batch host: the app's burst left to forward, on the GPU, and unfinished.
	bHeld, bOnGPU, bLeft int
	bFrozen              bool
}

// Run simulates one scenario. It is deterministic for a seed.
func Run(sc Scenario) (Result, error) {
	if err := sc.validate(); err != nil {
		return Result{}, err
	}
	s := &sim{sc: sc, loaded: -1, lsCur: -1, sliceEnd: never,
		lsRNG:    rand.New(rand.NewPCG(sc.Seed, 1)),
		batchRNG: rand.New(rand.NewPCG(sc.Seed, 2)),
	}
	s.tsgs[ctxLS].slice = cmpOr(sc.LS.Slice, sc.GPU.DefaultSlice)
	s.tsgs[ctxBatch].slice = cmpOr(sc.Batch.Slice, sc.GPU.DefaultSlice)
	s.lsSched = arrivals(sc.LS, sc.Duration, rand.New(rand.NewPCG(sc.Seed, 3)))
	if len(s.lsSched) > 0 {
		s.at(s.lsSched[0], s.lsBegin)
	}
	if sc.Lever == LeverFreeze { // before batch's first launch: frozen from FreezeAt 0 on, it launches none
		s.at(sc.FreezeAt, func() { s.bFrozen = true })
	}
	if sc.Batch.Kernel > 0 {
		s.at(0, s.batchBurst)
	}
	// A run ends when the window is over and every scheduled LS request has finished
	// (a hopelessly late LS gives up 5 s after the window, as the real stand-in does).
	stop := sc.Duration + 5*time.Second
	for {
		tg := s.gpuNext()
		th := never
		if len(s.events) > 0 {
			th = s.events[0].t
		}
		t := min(tg, th)
		if t == never || t > stop || t >= sc.Duration && s.lsNext >= len(s.lsSched) && s.lsCur < 0 {
			break
		}
		s.now = t
		if th <= tg { // host first: work that arrives at a slice's end is seen there
			ev := heap.Pop(&s.events).(event)
			ev.fn()
		} else {
			s.gpuStep()
		}
	}
	s.closeSegment(min(s.now, sc.Duration))
	s.res.LS = summarise(s.lsSched[:len(s.lsLat)], s.lsLat)
	s.res.BatchPerSecond = float64(s.res.BatchKernels) / sc.Duration.Seconds()
	s.res.BusyLS, s.res.BusyBatch = s.tsgs[ctxLS].busy, s.tsgs[ctxBatch].busy
	return s.res, nil
}

func cmpOr(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// arrivals is every LS request's scheduled time within the window.
func arrivals(ls LS, window time.Duration, rng *rand.Rand) []time.Duration {
	if ls.Rate <= 0 {
		return nil
	}
	var out []time.Duration
	mean := float64(time.Second) / ls.Rate
	for i := 0; ; i++ {
		var t time.Duration
		switch ls.Arrivals {
		case ArrivalsPoisson:
			prev := time.Duration(0)
			if len(out) > 0 {
				prev = out[len(out)-1]
			}
			t = prev + time.Duration(rng.ExpFloat64()*mean)
		default:
			t = time.Duration(float64(i) * mean)
		}
		if t >= window {
			return out
		}
		out = append(out, t)
	}
}

// draw is one kernel's length: mean with a normal relative jitter cut at 3 deviations.
func draw(rng *rand.Rand, mean time.Duration, jitter float64) time.Duration {
	if jitter == 0 {
		return mean
	}
	z := max(-3, min(3, rng.NormFloat64()))
	return max(1, time.Duration(float64(mean)*(1+jitter*z)))
}

// at schedules a host action.
func (s *sim) at(t time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, event{t: t, seq: s.seq, fn: fn})
}

// --- the GPU ---

// gpuNext is the time of the GPU's next event.
func (s *sim) gpuNext() time.Duration {
	switch s.state {
	case gpuSwitching:
		return s.swEnd
	case gpuRunning:
		return min(s.runFrom+s.tsgs[s.loaded].queue[0], s.sliceEnd)
	}
	return never
}

// gpuStep handles the GPU's event at s.now.
func (s *sim) gpuStep() {
	if s.state == gpuSwitching {
		s.closeSegment(s.now)
		s.loaded = s.target
		s.state = gpuIdle
		if len(s.tsgs[s.loaded].queue) > 0 {
			s.startSlice()
		} else if next := s.nextWithWork(); next >= 0 {
			s.startSwitch(next)
		}
		return
	}
	g := &s.tsgs[s.loaded]
	if s.runFrom+g.queue[0] <= s.now {
		s.account(s.runFrom, s.now)
		g.queue = g.queue[1:]
		g.done++
		s.runFrom = s.now
		s.kernelDone(s.loaded)
		switch {
		case s.pending:
			s.pending = false
			if next := s.nextWithWork(); next >= 0 {
				s.startSwitch(next)
				return
			}
			s.sliceEnd = s.now + g.slice
			if len(g.queue) == 0 {
				s.goIdle()
			}
		case len(g.queue) > 0:
		default:
			if next := s.nextWithWork(); next >= 0 {
				s.startSwitch(next)
			} else {
				s.goIdle()
			}
		}
		return
	}
	// The slice is over.
	next := s.nextWithWork()
	switch {
	case next < 0:
		s.sliceEnd += g.slice
	case s.sc.GPU.Preemption == PreemptKernel:
		s.pending = true
		s.sliceEnd = never
	default:
		s.account(s.runFrom, s.now)
		g.queue[0] -= s.now - s.runFrom
		s.res.Preemptions++
		s.startSwitch(next)
	}
}

// enqueue puts kernels on a context's queue; an idle GPU takes them at once.
func (s *sim) enqueue(ctx int, kernels ...time.Duration) {
	s.tsgs[ctx].queue = append(s.tsgs[ctx].queue, kernels...)
	if s.state != gpuIdle {
		return
	}
	if ctx == s.loaded || s.loaded < 0 { // the first context needs no switch: it was there before the run
		s.loaded = ctx
		s.startSlice()
		return
	}
	s.startSwitch(ctx)
}

// nextWithWork is the next context after the loaded one, round robin, with work queued
// (-1: none).
func (s *sim) nextWithWork() int {
	n := len(s.tsgs)
	for i := 1; i < n; i++ {
		c := (max(s.loaded, 0) + i) % n
		if len(s.tsgs[c].queue) > 0 {
			return c
		}
	}
	return -1
}

// startSlice runs the loaded context with a fresh slice.
func (s *sim) startSlice() {
	s.state = gpuRunning
	s.runFrom = s.now
	s.segFrom = s.now
	s.sliceEnd = s.now + s.tsgs[s.loaded].slice
	s.pending = false
}

func (s *sim) startSwitch(to int) {
	s.closeSegment(s.now)
	s.state = gpuSwitching
	s.target = to
	s.swFrom = s.now
	s.swEnd = s.now + s.sc.GPU.SwitchCost
	s.segFrom = s.now
	s.sliceEnd = never
	s.pending = false
	s.res.Switches++
}

func (s *sim) goIdle() {
	s.closeSegment(s.now)
	s.state = gpuIdle
	s.sliceEnd = never
}

// closeSegment ends the running or switching segment at t (accounting and trace).
func (s *sim) closeSegment(t time.Duration) {
	switch s.state {
	case gpuSwitching:
		from, to := min(s.segFrom, s.sc.Duration), min(t, s.sc.Duration)
		s.res.SwitchTime += to - from
		s.trace(SegSwitch, s.target, s.segFrom, t)
	case gpuRunning:
		s.trace(SegRun, s.loaded, s.segFrom, t)
	}
	s.segFrom = t
}

// account adds kernel time of the loaded context within the window.
func (s *sim) account(from, to time.Duration) {
	from, to = min(from, s.sc.Duration), min(to, s.sc.Duration)
	s.tsgs[s.loaded].busy += to - from
}

func (s *sim) trace(k SegmentKind, ctx int, from, to time.Duration) {
	if !s.sc.Trace || to <= from {
		return
	}
	s.res.Segments = append(s.res.Segments, Segment{Kind: k, Ctx: ctxName(ctx), Start: from, End: to})
}

// kernelDone tells the kernel's host.
func (s *sim) kernelDone(ctx int) {
	if ctx == ctxLS {
		if s.lsCur >= 0 && s.tsgs[ctxLS].done == s.lsTarget {
			s.lsEnd()
		}
		return
	}
	if s.now <= s.sc.Duration {
		s.res.BatchKernels++
	}
	s.bOnGPU--
	s.bLeft--
	if s.bLeft == 0 {
		s.at(s.now+s.sc.Batch.SyncGap, s.batchBurst)
		return
	}
	if s.sc.Lever == LeverGate {
		s.at(s.now+s.sc.Gate.Gap, s.forward)
	}
}

// --- the hosts ---

// lsBegin starts the next LS request: all its kernels go to the GPU (the launches are
// far shorter than the kernels).
func (s *sim) lsBegin() {
	i := s.lsNext
	s.lsNext++
	s.lsCur = i
	ks := make([]time.Duration, s.sc.LS.Kernels)
	for k := range ks {
		ks[k] = draw(s.lsRNG, s.sc.LS.Kernel, s.sc.LS.Jitter)
	}
	s.lsTarget = s.tsgs[ctxLS].done + len(ks)
	s.enqueue(ctxLS, ks...)
}

// lsEnd finishes the request in flight and starts the next when its time has come.
func (s *sim) lsEnd() {
	s.lsLat = append(s.lsLat, float64(s.now-s.lsSched[s.lsCur])/float64(time.Millisecond))
	s.lsCur = -1
	if s.lsNext < len(s.lsSched) {
		s.at(max(s.now, s.lsSched[s.lsNext]), s.lsBegin)
	}
	if s.sc.Lever == LeverGate {
		s.at(s.now+s.sc.Gate.Gap, s.forward)
	}
}

// batchBurst is the batch app launching its next SyncEvery kernels (a frozen process
// launches nothing).
func (s *sim) batchBurst() {
	if s.bFrozen {
		return
	}
	s.bHeld = s.sc.Batch.SyncEvery
	s.bLeft = s.sc.Batch.SyncEvery
	s.forward()
}

// forward passes held batch launches to the GPU: all of them, or under the gate while
// LS has no request in flight, up to Gate.Depth on the GPU.
func (s *sim) forward() {
	for s.bHeld > 0 {
		if s.sc.Lever == LeverGate && (s.lsCur >= 0 || s.bOnGPU >= s.sc.Gate.Depth) {
			return
		}
		s.bHeld--
		s.bOnGPU++
		s.enqueue(ctxBatch, draw(s.batchRNG, s.sc.Batch.Kernel, s.sc.Batch.Jitter))
	}
}

// --- events ---

type event struct {
	t   time.Duration
	seq uint64
	fn  func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	ev := old[len(old)-1]
	*h = old[:len(old)-1]
	return ev
}
