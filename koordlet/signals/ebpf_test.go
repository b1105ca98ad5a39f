package signals

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/signals/runqlat"
	"github.com/understory/understory/qos"
)

// fakeProbe is a run-queue delay probe whose histograms the test sets. Like the kernel
// it counts the delays at or above its threshold as slow events.
type fakeProbe struct {
	mu        sync.Mutex
	children  map[uint64][]uint64 // watched id -> children
	hists     map[uint64]runqlat.Histogram
	readErr   error
	closed    bool
	threshold time.Duration
	setErr    error // SetThreshold's
	slow      uint64
	slowErr   error
	reads     int
	slowCalls int // SlowEvents calls
	// The wake-up, like the kernel's: while armed, the first slow delay disarms and sends
	// on wake. A nil wake is a probe without one (before Linux 5.8).
	wake   chan struct{}
	armed  bool
	arms   int
	armErr error
	onArm  func() // called by Arm before it arms (without p.mu)
	// attributes: the probe tells batch's slow delays from the rest (tp_btf on 5.15+);
	// batchOnly is what SetBatchOnly set.
	attributes bool
	batchOnly  bool
	batchErr   error // SetBatchOnly's
}

var (
	_ probe = (*fakeProbe)(nil)
	_ waker = (*fakeProbe)(nil)
)

func newFakeProbe() *fakeProbe {
	return &fakeProbe{children: map[uint64][]uint64{}, hists: map[uint64]runqlat.Histogram{}}
}

func (p *fakeProbe) Watch(id uint64, children ...uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.children[id] = append(p.children[id], children...)
	if _, ok := p.hists[id]; !ok {
		p.hists[id] = runqlat.Histogram{}
	}
	return nil
}

func (p *fakeProbe) Unwatch(id uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.children[id]; ok {
		delete(p.children, id)
		delete(p.hists, id)
		return nil
	}
	for parent, cs := range p.children {
		for i, c := range cs {
			if c == id {
				p.children[parent] = append(cs[:i:i], cs[i+1:]...)
			}
		}
	}
	return nil
}

func (p *fakeProbe) Read(dst map[uint64]runqlat.Histogram) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads++
	clear(dst)
	if p.readErr != nil {
		return p.readErr
	}
	for id, h := range p.hists {
		dst[id] = h
	}
	return nil
}

func (p *fakeProbe) SetThreshold(d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.setErr != nil {
		return p.setErr
	}
	p.threshold = d
	return nil
}

func (p *fakeProbe) SetBatchOnly(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.batchErr != nil {
		return p.batchErr
	}
	p.batchOnly = on
	return nil
}

func (p *fakeProbe) Attributes() bool { return p.attributes }

func (p *fakeProbe) SlowEvents() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slowCalls++
	return p.slow, p.slowErr
}

func (p *fakeProbe) Arm() error {
	if p.onArm != nil {
		p.onArm()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return os.ErrClosed
	}
	if p.armErr != nil {
		return p.armErr
	}
	p.armed = true
	p.arms++
	return nil
}

func (p *fakeProbe) Wake() <-chan struct{} { return p.wake }

func (p *fakeProbe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed && p.wake != nil {
		close(p.wake)
	}
	p.closed = true
	return nil
}

// counts is how many times the slow-event count was looked at and the probe armed.
func (p *fakeProbe) counts() (slowCalls, arms int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slowCalls, p.arms
}

// readCount is how many times the histograms were read.
func (p *fakeProbe) readCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads
}

// add counts n delays in the bucket of d into id's histogram, each ended by taking the
// CPU from batch.
func (p *fakeProbe) add(id uint64, d time.Duration, n uint64) { p.addFrom(id, d, n, true) }

// addLS counts n delays of d spent behind LS tasks: batch's only to a probe that cannot
// tell (it counts every slow delay as batch's, as classic tracepoints do).
func (p *fakeProbe) addLS(id uint64, d time.Duration, n uint64) { p.addFrom(id, d, n, false) }

func (p *fakeProbe) addFrom(id uint64, d time.Duration, n uint64, batch bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.hists[id]
	i := 0
	for i < runqlat.NumBuckets-1 && runqlat.BucketUpper(i) <= d {
		i++
	}
	h.Buckets[i] += n
	h.Count += n
	h.SumNs += n * uint64(d)
	if !p.attributes {
		batch = true
	}
	if p.threshold > 0 && d >= p.threshold && batch {
		h.Batch += n
	}
	p.hists[id] = h
	if p.threshold > 0 && d >= p.threshold && n > 0 && (batch || !p.batchOnly) {
		p.slow += n
		if p.armed && p.wake != nil {
			p.armed = false
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
	}
}

// inode is a fake cgroup id: the directory's inode (what runqlat.CgroupID returns on a
// cgroup2 mount).
func inode(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}

// ebpfRig is an eBPF source over a fake probe and a fake cgroup2 root with one pod.
type ebpfRig struct {
	s     *EBPF
	p     *fakeProbe
	root  string
	podID uint64
	now   time.Time
}

const podRel = "kubepods/burstable/pod1"

func newEBPFRig(t *testing.T) *ebpfRig {
	t.Helper()
	return newEBPFRigWith(t, newFakeProbe())
}

func newEBPFRigWith(t *testing.T, p *fakeProbe) *ebpfRig {
	t.Helper()
	return newEBPFRigOpts(t, p, Options{})
}

// newEBPFRigOpts is a rig whose source has o (roots and logger set here).
func newEBPFRigOpts(t *testing.T, p *fakeProbe, o Options) *ebpfRig {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{podRel, podRel + "/ctr-a", podRel + "/ctr-b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, podRel, "cpu.pressure"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &ebpfRig{p: p, root: root, now: t0}
	o.Cgroup2Root, o.Logger = root, discard()
	r.s = newEBPF(o, p, inode, func() time.Time { return r.now })
	if err := r.s.Watch(Pod{UID: "u1", Namespace: "ns", Name: "ls", Cgroup: podRel}); err != nil {
		t.Fatal(err)
	}
	id, err := inode(filepath.Join(root, podRel))
	if err != nil {
		t.Fatal(err)
	}
	r.podID = id
	return r
}

// poll advances the clock 20 ms and reads.
func (r *ebpfRig) poll(t *testing.T) []Harm {
	t.Helper()
	r.now = r.now.Add(20 * time.Millisecond)
	_ = r.s.poll(r.now)
	h, err := r.s.Take(nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestEBPFHarmAboveThreshold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fast  uint64        // delays of 10 µs
		slow  uint64        // delays of slowD
		slowD time.Duration // default 5 ms
		harm  bool
	}{
		{"quiet pod", 0, 0, 0, false},
		{"fast wake-ups only", 500, 0, 0, false},
		{"p99 over 2 ms", 90, 10, 0, true},
		{"2 % slow: p99 is in the slow bucket", 98, 2, 0, true},
		{"1 % slow: p99 is the last fast one", 99, 1, 0, false},
		{"under 1 % slow", 200, 1, 0, false},
		{"too few wake-ups to judge", 5, 5, 0, false},
		// 1.5 ms sits in [1.024, 2.048) ms: below 2 ms for sure only by its lower bound;
		// the conservative rule never fires on it.
		{"bucket straddling the threshold", 0, 100, 1500 * time.Microsecond, false},
		{"bucket above the threshold", 0, 100, 2100 * time.Microsecond, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newEBPFRig(t)
			if h := r.poll(t); len(h) != 0 {
				t.Fatalf("first read (the baseline) reported %+v", h)
			}
			// Counted before: not in this interval.
			r.p.add(r.podID, 50*time.Millisecond, 1000)
			r.poll(t)
			r.p.add(r.podID, 10*time.Microsecond, tc.fast)
			d := tc.slowD
			if d == 0 {
				d = 5 * time.Millisecond
			}
			r.p.add(r.podID, d, tc.slow)
			h := r.poll(t)
			if (len(h) == 1) != tc.harm || len(h) > 1 {
				t.Fatalf("harm %+v, want harm %v", h, tc.harm)
			}
			if tc.harm && (h[0].Signal != qos.SignalRunqueueDelay || h[0].Pod != "ns/ls" || !h[0].At.Equal(r.now) ||
				!h[0].Since.Equal(r.now.Add(-20*time.Millisecond)) || h[0].Value < 2*time.Millisecond) {
				t.Fatalf("harm %+v: want runqueue_delay of ns/ls over the last 20 ms", h[0])
			}
			if tc.harm {
				select {
				case <-r.s.Wake():
				default:
					t.Fatal("harm did not wake")
				}
			}
		})
	}
}

// A pod whose delays come fewer than minSamples per poll (CPU-bound LS tasks waiting a
// whole slice each) is judged over the polls it takes to gather them, up to
// accumulateWindow polls; a longer quiet span is only a new baseline.
func TestEBPFAccumulatesSparseDelays(t *testing.T) {
	t.Parallel()
	r := newEBPFRig(t)
	r.poll(t) // baseline
	start := r.now
	for i := range 3 { // 8 slow delays a poll: 24 after three
		r.p.add(r.podID, 5*time.Millisecond, 8)
		h := r.poll(t)
		if want := i == 2; (len(h) == 1) != want || len(h) > 1 {
			t.Fatalf("poll %d: harm %+v, want harm %v", i+1, h, want)
		}
		if i == 2 && !h[0].Since.Equal(start) {
			t.Fatalf("harm since %v, want the baseline's read %v", h[0].Since, start)
		}
	}
	// Over more than twice the window a span is not one window: it is judged as a read
	// after skipped polls, at once only when certain (minSamples slow delays).
	r.p.add(r.podID, 10*time.Microsecond, 100)
	r.p.add(r.podID, 5*time.Millisecond, 5)
	r.now = r.now.Add(2 * accumulateWindow * 20 * time.Millisecond)
	if h := r.poll(t); len(h) != 0 {
		t.Fatalf("a span of %d polls with 5 slow delays of 105 judged: %+v", 2*accumulateWindow+1, h)
	}
	r.p.add(r.podID, 5*time.Millisecond, 20)
	r.now = r.now.Add(2 * accumulateWindow * 20 * time.Millisecond)
	if h := r.poll(t); len(h) != 1 {
		t.Fatalf("a span of %d polls with 20 slow delays of 20 (and 5 carried): harm %+v, want it", 2*accumulateWindow+1, h)
	}
}

// A pod whose tasks wait a whole CFS slice each time (Linux before 6.6: two CPU-bound
// tasks sharing one CPU of a 2-CPU node wait about 8 ms each, 12 delays in 100 ms) never
// gathers minSamples delays in accumulateWindow polls however harmed it is: its window
// stretches to hold them, and the harm is seen within maxAccumulate. A pod whose slow
// delays are few among fast ones keeps the short window.
func TestEBPFJudgesWholeSliceWaits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// every poll adds perPoll[i%len] delays of d, and every fastEvery-th poll one
		// fast (10 µs) delay more (0: none)
		perPoll   []uint64
		d         time.Duration
		fastEvery int
		harm      bool
	}{
		{"8 ms slices, 12 delays in 100 ms", []uint64{2, 3, 2, 3, 2}, 8 * time.Millisecond, 0, true},
		{"16 ms slices, 6 delays in 100 ms", []uint64{1, 1, 2, 1, 1}, 16 * time.Millisecond, 0, true},
		{"8 ms slices among a few fast wake-ups", []uint64{2, 3, 2, 3, 2}, 8 * time.Millisecond, 2, true},
		{"short waits, as sparse", []uint64{2, 3, 2, 3, 2}, 500 * time.Microsecond, 0, false},
		{"one slow delay a window among fast ones", []uint64{0, 0, 0, 0, 1}, 8 * time.Millisecond, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newEBPFRig(t)
			r.poll(t) // baseline
			start := r.now
			var got []Harm
			for i := 0; len(got) == 0 && r.now.Sub(start) < maxAccumulate+100*time.Millisecond; i++ {
				r.p.add(r.podID, tc.d, tc.perPoll[i%len(tc.perPoll)])
				if tc.fastEvery > 0 && i%tc.fastEvery == 0 {
					r.p.add(r.podID, 10*time.Microsecond, 1)
				}
				got = r.poll(t)
			}
			if (len(got) > 0) != tc.harm {
				t.Fatalf("harm %+v over %v, want harm %v", got, r.now.Sub(start), tc.harm)
			}
			if tc.harm && (got[0].Pod != "ns/ls" || got[0].Value < tc.d || got[0].At.Sub(got[0].Since) > maxAccumulate) {
				t.Fatalf("harm %+v: want ns/ls with its slice's delay, over at most %v", got[0], maxAccumulate)
			}
		})
	}
}

// A pod's container cgroups are counted into its histogram, found again on rescans;
// gone ones are dropped; Unwatch drops the pod.
func TestEBPFWatchesContainers(t *testing.T) {
	t.Parallel()
	r := newEBPFRig(t)
	if n := len(r.p.children[r.podID]); n != 2 {
		t.Fatalf("%d container cgroups watched, want 2", n)
	}
	if err := os.Mkdir(filepath.Join(r.root, podRel, "ctr-c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(r.root, podRel, "ctr-a")); err != nil {
		t.Fatal(err)
	}
	r.s.mu.Lock()
	r.s.rescanLocked(r.s.pods["u1"])
	r.s.mu.Unlock()
	c, _ := inode(filepath.Join(r.root, podRel, "ctr-c"))
	got := r.p.children[r.podID]
	if len(got) != 2 || (got[0] != c && got[1] != c) {
		t.Fatalf("children after a rescan %v, want ctr-b and ctr-c (%d)", got, c)
	}
	// Young pods are rescanned every rescanEvery, settled ones with containers every
	// rescanSettled, pods without containers every rescanEvery.
	r.s.mu.Lock()
	pd := r.s.pods["u1"]
	for _, tc := range []struct {
		age      time.Duration
		noChild  bool
		wantNext time.Duration
	}{{0, false, rescanEvery}, {youngFor, false, rescanSettled}, {youngFor, true, rescanEvery}} {
		r.now = pd.watchedAt.Add(tc.age)
		if tc.noChild {
			for _, c := range []string{"ctr-b", "ctr-c"} {
				if err := os.Remove(filepath.Join(r.root, podRel, c)); err != nil {
					t.Fatal(err)
				}
			}
		}
		r.s.rescanLocked(pd)
		if got := pd.nextScan.Sub(r.now); got != tc.wantNext {
			t.Errorf("pod %v old, no containers %v: next scan in %v, want %v", tc.age, tc.noChild, got, tc.wantNext)
		}
	}
	r.s.mu.Unlock()
	r.s.Unwatch("u1")
	r.s.Unwatch("unknown")
	if _, ok := r.p.hists[r.podID]; ok || len(r.s.pods) != 0 {
		t.Fatal("Unwatch left the pod")
	}
	// A pod whose cgroup is not there yet.
	err := r.s.Watch(Pod{UID: "u2", Cgroup: "kubepods/besteffort/pod2"})
	if !errors.Is(err, ErrNotExist) {
		t.Fatalf("Watch of a missing cgroup: %v, want ErrNotExist", err)
	}
}

// A failed map read is reported by Take (blind), then reads go on.
func TestEBPFReadErrorIsBlind(t *testing.T) {
	t.Parallel()
	r := newEBPFRig(t)
	r.p.readErr = fmt.Errorf("lookup: %w", os.ErrPermission)
	r.now = r.now.Add(20 * time.Millisecond)
	if err := r.s.poll(r.now); err == nil {
		t.Fatal("poll hid a read error")
	}
	if _, err := r.s.Take(nil); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Take error %v, want the read error", err)
	}
	r.p.readErr = nil
	if _, err := r.s.Take(nil); err != nil {
		t.Fatalf("error reported twice: %v", err)
	}
	if err := r.s.Close(); err != nil || !r.p.closed {
		t.Fatalf("Close: %v", err)
	}
	if err := r.s.poll(r.now); !errors.Is(err, ErrClosed) {
		t.Fatalf("poll after Close: %v", err)
	}
	if err := r.s.Watch(Pod{UID: "u3", Cgroup: podRel}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}

// The slow-event gate's threshold is the lower bound of the first harm bucket, so the
// kernel counts exactly the delays in harm buckets; at bucket 0 there is no gate.
func TestHarmBucketAndSlowThreshold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		threshold  time.Duration
		bucket     int
		gate       time.Duration
		upperBound time.Duration // BucketUpper(bucket)
	}{
		{2 * time.Millisecond, 11, 2048 * time.Microsecond, 4096 * time.Microsecond},
		{2048 * time.Microsecond, 11, 2048 * time.Microsecond, 4096 * time.Microsecond},
		{2049 * time.Microsecond, 12, 4096 * time.Microsecond, 8192 * time.Microsecond},
		{1500 * time.Nanosecond, 1, 2 * time.Microsecond, 4 * time.Microsecond},
		{time.Microsecond, 0, 0, 2 * time.Microsecond},
		{time.Nanosecond, 0, 0, 2 * time.Microsecond},
		// Past 2^24 µs only the last bucket (from 2^25 µs, no upper bound) is harm.
		{time.Minute, runqlat.NumBuckets - 1, (1 << 25) * time.Microsecond, runqlat.BucketUpper(runqlat.NumBuckets - 1)},
	}
	for _, tc := range tests {
		bucket, gate := harmBucket(tc.threshold), SlowThreshold(tc.threshold)
		if bucket != tc.bucket || gate != tc.gate || runqlat.BucketUpper(bucket) != tc.upperBound {
			t.Errorf("harmBucket(%v) = %d, SlowThreshold = %v, want %d, %v", tc.threshold, bucket, gate, tc.bucket, tc.gate)
		}
	}
}

// While no delay reaches a harm bucket the gate stays shut: no reads, but one every
// refreshEvery and one for a new pod's baseline. A slow delay opens the next poll.
func TestEBPFGateSkipsQuietReads(t *testing.T) {
	t.Parallel()
	r := newEBPFRig(t)
	// SlowThreshold is what the source sets: a program with a probe of its own
	// (bench/colo) sets the same to count what the agent counts.
	if r.p.threshold != 2048*time.Microsecond || r.p.threshold != SlowThreshold(r.s.o.RunqueueThreshold) || !r.s.gate {
		t.Fatalf("probe threshold %v (gate %v), want 2.048ms: the first harm bucket's lower bound",
			r.p.threshold, r.s.gate)
	}
	r.poll(t) // the new pod's baseline
	if n := r.p.readCount(); n != 1 {
		t.Fatalf("%d reads for the baseline, want 1", n)
	}
	// 1.5 ms is in the bucket straddling the threshold: never harm, never counted.
	for range 10 {
		r.p.add(r.podID, 10*time.Microsecond, 200)
		r.p.add(r.podID, 1500*time.Microsecond, 50)
		if h := r.poll(t); len(h) != 0 {
			t.Fatalf("quiet poll reported %+v", h)
		}
	}
	if n := r.p.readCount(); n != 1 {
		t.Fatalf("%d reads after 10 quiet polls, want 1 (the baseline)", n)
	}
	for range 40 { // to a second after the last read
		r.poll(t)
	}
	if n := r.p.readCount(); n != 2 {
		t.Fatalf("%d reads after a quiet second, want 2 (a refresh)", n)
	}
	r.p.add(r.podID, 5*time.Millisecond, 1)
	r.poll(t)
	if n := r.p.readCount(); n != 3 {
		t.Fatalf("%d reads after a slow delay, want 3", n)
	}
	r.poll(t)
	if n := r.p.readCount(); n != 3 {
		t.Fatalf("%d reads once the count stopped, want 3", n)
	}
	// A second pod needs a baseline: read at once.
	if err := os.MkdirAll(filepath.Join(r.root, "kubepods/pod2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.s.Watch(Pod{UID: "u2", Namespace: "ns", Name: "two", Cgroup: "kubepods/pod2"}); err != nil {
		t.Fatal(err)
	}
	r.poll(t)
	r.poll(t)
	// 5: the new pod's baseline, and the next poll: that read spanned skipped polls and
	// the first pod's slow delay, still unjudged, was carried into the next interval.
	if n := r.p.readCount(); n != 5 {
		t.Fatalf("%d reads after a new pod, want 5", n)
	}
}

// After skipped polls a read's delta spans several intervals: harm is reported at once
// only when certain; otherwise the slow delays are carried into the next poll, which
// judges them with its own interval's delays, the evidence starting at the poll before
// the gate opened.
func TestEBPFGateMergedWindow(t *testing.T) {
	t.Parallel()
	type step struct {
		fast, slow uint64 // 10 µs and 5 ms delays added before the poll
		harm       bool
		since      int // harm: the evidence starts this many polls back
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a burst after quiet polls: at once", []step{
			{100, 0, false, 0}, {100, 0, false, 0}, {100, 0, false, 0}, {30, 30, true, 1}}},
		{"a few slow among many quiet delays: with the next poll", []step{
			{2000, 0, false, 0}, {2000, 0, false, 0}, {100, 10, false, 0}, {10, 10, true, 2}}},
		{"a pod with few wake-ups: one slow delay after a quiet while is no harm", []step{
			{5, 0, false, 0}, {5, 0, false, 0}, {5, 0, false, 0}, {5, 0, false, 0}, {5, 1, false, 0}, {1, 0, false, 0}}},
		// 11 slow of at least 211 delays over the two intervals: above the 99th percentile.
		{"a burst, then one more slow delay: harm over the two intervals", []step{
			{2000, 0, false, 0}, {100, 10, false, 0}, {100, 1, true, 2}}},
		{"a short burst, then quiet: no harm", []step{
			{2000, 0, false, 0}, {100, 2, false, 0}, {300, 0, false, 0}, {300, 0, false, 0}}},
		// The burst's delays are judged once: a later burst too small alone is not
		// added to them.
		{"a carried burst is judged once", []step{
			{2000, 0, false, 0}, {100, 2, false, 0}, {300, 0, false, 0}, {10, 1, false, 0}, {100, 0, false, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newEBPFRig(t)
			r.poll(t) // baseline
			for i, st := range tc.steps {
				r.p.add(r.podID, 10*time.Microsecond, st.fast)
				r.p.add(r.podID, 5*time.Millisecond, st.slow)
				h := r.poll(t)
				if (len(h) == 1) != st.harm || len(h) > 1 {
					t.Fatalf("step %d: harm %+v, want harm %v", i, h, st.harm)
				}
				if st.harm && (!h[0].Since.Equal(r.now.Add(-time.Duration(st.since)*20*time.Millisecond)) || h[0].Pod != "ns/ls") {
					t.Fatalf("step %d: harm %+v, want ns/ls over the last %d polls", i, h[0], st.since)
				}
			}
		})
	}
}

// Without a gate (the probe refused the threshold), or when the count cannot be read,
// every poll reads, and harm is judged as ever.
func TestEBPFGateOff(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(p *fakeProbe){
		"threshold refused": func(p *fakeProbe) { p.setErr = errors.New("no cfg map") },
		"count unreadable":  func(p *fakeProbe) { p.slowErr = errors.New("lookup failed") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newFakeProbe()
			setup(p)
			r := newEBPFRigWith(t, p)
			r.poll(t)
			for range 5 {
				r.p.add(r.podID, 10*time.Microsecond, 100)
				if h := r.poll(t); len(h) != 0 {
					t.Fatalf("harm %+v", h)
				}
			}
			if n := p.readCount(); n != 6 {
				t.Fatalf("%d reads in 6 polls, want 6", n)
			}
			r.p.mu.Lock()
			r.p.threshold = 0 // the kernel counts nothing
			r.p.mu.Unlock()
			r.p.add(r.podID, 10*time.Microsecond, 90)
			r.p.add(r.podID, 5*time.Millisecond, 10)
			if h := r.poll(t); len(h) != 1 {
				t.Fatalf("harm %+v, want one", h)
			}
		})
	}
}

// newWakeRig is an eBPF rig whose probe wakes the source.
func newWakeRig(t *testing.T) *ebpfRig {
	t.Helper()
	p := newFakeProbe()
	p.wake = make(chan struct{}, 1)
	return newEBPFRigWith(t, p)
}

// step is one turn of runWoken at the rig's clock advanced by d.
func (r *ebpfRig) step(t *testing.T, d time.Duration, force bool, armed *bool) (again bool, harm []Harm) {
	t.Helper()
	r.now = r.now.Add(d)
	again, err := r.s.wakeStep(r.p, r.now, force, armed)
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.s.Take(nil)
	if err != nil {
		t.Fatal(err)
	}
	return again, h
}

// The wake/arm cycle on a fake clock: a quiet node is armed and only refreshed; the
// first slow delay wakes the source, which polls every interval while the count moves
// and reports the harm within one interval of the wake-up, then re-arms once a poll
// finds the count unmoved.
func TestEBPFWakeArmCycle(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t)
	armed := false
	again, _ := r.step(t, time.Second, true, &armed)
	if _, arms := r.p.counts(); again || !armed || arms != 1 {
		t.Fatalf("quiet first turn: again %v, armed %v, %d arms; want armed and waiting", again, armed, arms)
	}
	// Refreshes of a quiet node: a read each, no re-arming.
	reads := r.p.readCount()
	for range 3 {
		if again, h := r.step(t, time.Second, true, &armed); again || len(h) != 0 {
			t.Fatalf("quiet refresh: again %v, harm %+v", again, h)
		}
	}
	if n, arms := r.p.readCount()-reads, r.p.arms; n != 3 || arms != 1 {
		t.Fatalf("3 refreshes: %d reads, %d arms; want 3 and 1", n, arms)
	}

	// Harm begins: the first slow delay wakes the source.
	r.p.add(r.podID, 5*time.Millisecond, 1)
	select {
	case <-r.p.wake:
		armed = false // as runWoken does
	default:
		t.Fatal("a slow delay while armed sent no wake-up")
	}
	woke := r.now.Add(300 * time.Millisecond)
	again, h := r.step(t, 300*time.Millisecond, false, &armed)
	if !again || len(h) != 0 {
		t.Fatalf("turn at the wake-up: again %v, harm %+v; want a poll next and no harm from 1 delay", again, h)
	}
	// The next interval holds enough slow delays: reported at the next poll, the
	// wake-up's delay carried into it as the interval's before the wake-up.
	r.p.add(r.podID, 10*time.Microsecond, 90)
	r.p.add(r.podID, 5*time.Millisecond, 10)
	again, h = r.step(t, 20*time.Millisecond, false, &armed)
	if since := woke.Add(-20 * time.Millisecond); !again || len(h) != 1 || !h[0].Since.Equal(since) || r.now.Sub(woke) > 20*time.Millisecond {
		t.Fatalf("poll after the wake-up: again %v, harm %+v; want harm since %v, polling on", again, h, since)
	}
	if _, arms := r.p.counts(); armed || arms != 1 {
		t.Fatalf("re-armed while the count moves (%d arms)", arms)
	}
	// Harm goes on: polled every interval, each interval judged.
	r.p.add(r.podID, 10*time.Microsecond, 90)
	r.p.add(r.podID, 5*time.Millisecond, 10)
	if again, h = r.step(t, 20*time.Millisecond, false, &armed); !again || len(h) != 1 {
		t.Fatalf("harm going on: again %v, harm %+v", again, h)
	}
	// Quiet again: re-armed, waiting.
	if again, h = r.step(t, 20*time.Millisecond, false, &armed); again || len(h) != 0 || !armed || r.p.arms != 2 {
		t.Fatalf("quiet poll: again %v, harm %+v, armed %v, %d arms; want re-armed", again, h, armed, r.p.arms)
	}
	select {
	case <-r.p.wake:
		t.Fatal("a wake-up pending without a slow delay since arming")
	default:
	}
}

// A slow delay between the quiet poll and Arm sends nothing (the probe was disarmed):
// the turn looks at the count again after arming and polls on.
func TestEBPFWakeArmRace(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t)
	armed := false
	r.p.onArm = func() { r.p.add(r.podID, 5*time.Millisecond, 1) }
	if again, _ := r.step(t, time.Second, true, &armed); !again || !armed {
		t.Fatalf("slow delay before Arm: again %v, armed %v; want armed and polling on", again, armed)
	}
	r.p.onArm = nil
	// Arm failing: poll on rather than sleep unarmed.
	r.p.armErr = errors.New("map update failed")
	armed = false
	r.step(t, 20*time.Millisecond, false, &armed) // reads the moved count
	if again, _ := r.step(t, 20*time.Millisecond, false, &armed); !again || armed {
		t.Fatalf("Arm failing: again %v, armed %v; want polling on", again, armed)
	}
}

// eventually waits up to 2 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Second, what, cond)
}

// runSource runs s.Run until the test ends (which checks it returned nil).
func runSource(t *testing.T, s *EBPF) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(2 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Run with a probe that wakes it: armed and asleep while quiet (no poll every
// interval), woken by the first slow delay, harm reported, re-armed after.
func TestEBPFRunWoken(t *testing.T) {
	t.Parallel()
	p := newFakeProbe()
	p.wake = make(chan struct{}, 1)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, podRel, "ctr-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := newEBPF(Options{Cgroup2Root: root, Logger: discard(), PollInterval: 5 * time.Millisecond}, p, inode, time.Now)
	if err := s.Watch(Pod{UID: "u1", Namespace: "ns", Name: "ls", Cgroup: podRel}); err != nil {
		t.Fatal(err)
	}
	id, _ := inode(filepath.Join(root, podRel))
	runSource(t, s)
	eventually(t, "the first Arm", func() bool { _, a := p.counts(); return a == 1 })
	calls, _ := p.counts()
	// 20 poll intervals, armed and quiet: the count is not looked at (no polling).
	testenv.Hold(t, 100*time.Millisecond, "no polling while armed and quiet", func() bool {
		n, _ := p.counts()
		return n-calls <= 1
	})
	// Harm for a while: the source is woken and reports it.
	feed := make(chan struct{})
	go func() {
		defer close(feed)
		for range 40 {
			p.add(id, 10*time.Microsecond, 9)
			p.add(id, 5*time.Millisecond, 3)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	select {
	case <-s.Wake():
	case <-time.After(2 * time.Second):
		t.Fatal("no harm reported")
	}
	if h, err := s.Take(nil); err != nil || len(h) == 0 || h[0].Pod != "ns/ls" {
		t.Fatalf("Take: %+v, %v", h, err)
	}
	<-feed
	eventually(t, "re-arming after the harm", func() bool { _, a := p.counts(); return a >= 2 })
}

// Without a wake-up (kernels before 5.8), or when arming fails, Run polls every interval.
func TestEBPFRunPollsWithoutWake(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(p *fakeProbe){
		"no ring buffer": func(*fakeProbe) {},
		"Arm fails": func(p *fakeProbe) {
			p.wake = make(chan struct{}, 1)
			p.armErr = runqlat.ErrNoWake
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newFakeProbe()
			setup(p)
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, podRel), 0o755); err != nil {
				t.Fatal(err)
			}
			s := newEBPF(Options{Cgroup2Root: root, Logger: discard(), PollInterval: time.Millisecond}, p, inode,
				time.Now)
			if err := s.Watch(Pod{UID: "u1", Namespace: "ns", Name: "ls", Cgroup: podRel}); err != nil {
				t.Fatal(err)
			}
			runSource(t, s)
			eventually(t, "polls", func() bool { n, _ := p.counts(); return n >= 10 })
		})
	}
}

// Closing the source closes the probe and its wake-up: Run returns.
func TestEBPFRunWokenClose(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t)
	r.s.now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.s.Run(ctx) }()
	eventually(t, "the first Arm", func() bool { _, a := r.p.counts(); return a == 1 })
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after Close")
	}
}

// RunqueueHarm, the rule the source and the colo bench share: ≥ minSamples delays and the
// quantile in a bucket starting at or above the threshold (2 ms: the [2.048, 4.096) ms
// bucket and up).
func TestRunqueueHarm(t *testing.T) {
	t.Parallel()
	const allCauses = -1 // batch: every slow delay counts (batchOnly off)
	hist := func(fast, slow uint64) runqlat.Histogram {
		var h runqlat.Histogram
		h.Buckets[3] = fast  // [8, 16) µs
		h.Buckets[11] = slow // [2.048, 4.096) ms
		h.Count = fast + slow
		return h
	}
	tests := []struct {
		name       string
		fast, slow uint64
		batch      int // batch's slow delays; allCauses: batchOnly off
		want       bool
	}{
		{"too few delays", 10, 9, allCauses, false},
		{"one slow in 20: the 99th percentile is it", 19, 1, allCauses, true},
		{"one slow in 200: below the 99th percentile", 199, 1, allCauses, false},
		{"three slow in 200", 197, 3, allCauses, true},
		{"none slow", 500, 0, allCauses, false},
		{"batch only, empty", 0, 0, 0, false},
		{"batch only, one slow in 20, batch's", 19, 1, 1, true},
		{"batch only, one slow in 20, not batch's", 19, 1, 0, false},
		{"batch only, two slow in 100, both batch's", 98, 2, 2, true},
		{"batch only, two slow in 100, one batch's", 98, 2, 1, false},
		{"batch only, ten slow in 100, two batch's", 90, 10, 2, true},
		{"batch only, too few delays", 10, 9, 9, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := hist(tc.fast, tc.slow)
			h.Batch = uint64(max(tc.batch, 0))
			upper, got := RunqueueHarm(h, DefaultRunqueueQuantile, DefaultRunqueueThreshold,
				DefaultRunqueueMinSamples, tc.batch != allCauses)
			if got != tc.want || (got && upper != runqlat.BucketUpper(11)) {
				t.Fatalf("RunqueueHarm(%d fast, %d slow, batch %d) = %v, %v; want %v",
					tc.fast, tc.slow, tc.batch, upper, got, tc.want)
			}
		})
	}
}

// With a probe that attributes, only the slow delays that took the CPU from batch are
// harm: enough of them alone to put the 99th percentile in a harm bucket. Delays behind
// LS tasks neither count nor move the gate. AnyCause, or a probe that cannot tell or
// refuses batch-only counting, counts every slow delay.
func TestEBPFBatchOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		attributes, anyCause  bool
		batchErr              bool   // SetBatchOnly fails
		fast, lsSlow, btSlow  uint64 // 10 µs delays, 5 ms ones behind LS, and behind batch
		harm, batchOnly, read bool   // read: the poll read the histograms (the gate moved)
	}{
		{"slow behind LS only", true, false, false, 90, 10, 0, false, true, false},
		{"slow behind batch", true, false, false, 90, 0, 10, true, true, true},
		{"one of two slow is batch's: not enough alone", true, false, false, 98, 1, 1, false, true, true},
		{"two of three slow are batch's", true, false, false, 97, 1, 2, true, true, true},
		{"any cause: LS's count", true, true, false, 90, 10, 0, true, false, true},
		{"a probe that cannot tell counts every slow delay", false, false, false, 90, 10, 0, true, false, true},
		{"SetBatchOnly fails: every slow delay counts", true, false, true, 90, 10, 0, true, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newFakeProbe()
			p.attributes = tc.attributes
			if tc.batchErr {
				p.batchErr = errors.New("map update refused")
			}
			r := newEBPFRigOpts(t, p, Options{RunqueueAnyCause: tc.anyCause})
			if p.batchOnly != tc.batchOnly || r.s.batchOnly != tc.batchOnly {
				t.Fatalf("batch-only: probe %v, source %v; want %v", p.batchOnly, r.s.batchOnly, tc.batchOnly)
			}
			r.poll(t) // baseline
			reads := p.readCount()
			r.p.add(r.podID, 10*time.Microsecond, tc.fast)
			r.p.addLS(r.podID, 5*time.Millisecond, tc.lsSlow)
			r.p.add(r.podID, 5*time.Millisecond, tc.btSlow)
			h := r.poll(t)
			if (len(h) == 1) != tc.harm || len(h) > 1 {
				t.Fatalf("harm %+v, want harm %v", h, tc.harm)
			}
			if read := p.readCount() > reads; read != tc.read {
				t.Fatalf("the poll read the histograms: %v, want %v", read, tc.read)
			}
		})
	}
}

// A read after skipped polls carries batch's slow delays, not the others, as evidence:
// a burst of slow delays behind LS after quiet polls is never harm, and a burst of
// batch's too small to be sure at once is judged with the next poll.
func TestEBPFBatchOnlyMergedWindow(t *testing.T) {
	t.Parallel()
	p := newFakeProbe()
	p.attributes = true
	r := newEBPFRigWith(t, p)
	r.poll(t) // baseline
	r.p.add(r.podID, 10*time.Microsecond, 2000)
	r.poll(t) // read: new pod's first interval
	for range 3 {
		r.p.add(r.podID, 10*time.Microsecond, 100)
		if h := r.poll(t); len(h) != 0 {
			t.Fatalf("quiet poll: harm %+v", h)
		}
	}
	// Slow behind LS: the gate stays shut, nothing is read or carried.
	r.p.addLS(r.podID, 5*time.Millisecond, 50)
	if h := r.poll(t); len(h) != 0 || r.s.fresh {
		t.Fatalf("slow behind LS after quiet polls: harm %+v, forced read %v", h, r.s.fresh)
	}
	// Then 10 of batch's with 100 quick ones: merged, not certain (10 < 20): carried.
	r.p.add(r.podID, 10*time.Microsecond, 100)
	r.p.add(r.podID, 5*time.Millisecond, 10)
	if h := r.poll(t); len(h) != 0 || !r.s.fresh {
		t.Fatalf("batch burst after skipped polls: harm %+v, forced read %v; want none yet, and a forced read", h, r.s.fresh)
	}
	// The next interval: 10 quick, 1 of batch's: 11 of at least 120 delays are batch's.
	r.p.add(r.podID, 10*time.Microsecond, 10)
	r.p.add(r.podID, 5*time.Millisecond, 1)
	if h := r.poll(t); len(h) != 1 {
		t.Fatalf("with the carried burst: harm %+v, want it", h)
	}
}
