package signals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/signals/psi"
	"github.com/understory/understory/qos"
)

// fakeTriggers is a PSI watcher the test fires.
type fakeTriggers struct {
	mu     sync.Mutex
	keys   map[string]string // key -> path
	addErr error
	events chan trigger
	runErr chan error
}

var _ triggers = (*fakeTriggers)(nil)

func newFakeTriggers() *fakeTriggers {
	return &fakeTriggers{keys: map[string]string{}, events: make(chan trigger), runErr: make(chan error, 1)}
}

func (f *fakeTriggers) Add(key, path string, stall, window time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addErr != nil {
		return f.addErr
	}
	if stall <= 0 || stall >= window {
		return fmt.Errorf("stall %v window %v: %w", stall, window, psi.ErrInvalid)
	}
	f.keys[key] = path
	return nil
}

func (f *fakeTriggers) Remove(key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.keys[key]; !ok {
		return psi.ErrUnknownKey
	}
	delete(f.keys, key)
	return nil
}

func (f *fakeTriggers) Events() <-chan trigger { return f.events }
func (f *fakeTriggers) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-f.runErr:
		return err
	}
}
func (f *fakeTriggers) Close() error { return nil }

func (f *fakeTriggers) has(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.keys[key]
	return ok
}

// fakeSampler returns the cumulative stall and throttled time the test sets.
type fakeSampler struct {
	mu               sync.Mutex
	stall, throttled time.Duration
	closed           bool
}

func (f *fakeSampler) Sample(now time.Time, withStall bool) (psi.Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	smp := psi.Sample{Time: now, Throttled: f.throttled}
	if withStall {
		smp.Stall = f.stall
	}
	return smp, nil
}
func (f *fakeSampler) Close() error { f.closed = true; return nil }

func (f *fakeSampler) grow(stall, throttled time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stall += stall
	f.throttled += throttled
}

type psiRig struct {
	s   *PSI
	w   *fakeTriggers
	smp *fakeSampler
	now time.Time
}

func newPSIRig(t *testing.T) *psiRig {
	t.Helper()
	return newPSIRigPriv(t, true)
}

// newPSIRigPriv is a PSI source over fakes; privileged ones read the stall.
func newPSIRigPriv(t *testing.T, privileged bool) *psiRig {
	t.Helper()
	r := &psiRig{w: newFakeTriggers(), smp: &fakeSampler{}, now: t0}
	r.s = newPSI(Options{Cgroup2Root: "/cg2", CPUCgroupRoot: "/cpu", ProcRoot: "/proc", Logger: discard()}, r.w,
		func(stall, stat string) (sampler, error) {
			if stall == "/cg2/kubepods/gone/cpu.pressure" {
				return nil, fmt.Errorf("open: %w", psi.ErrNotExist)
			}
			if stall != "/cg2/"+podRel+"/cpu.pressure" || stat != "/cpu/"+podRel+"/cpu.stat" {
				t.Errorf("sampler paths %q, %q", stall, stat)
			}
			return r.smp, nil
		}, func() time.Time { return r.now })
	r.s.readStall = privileged
	if err := r.s.Watch(Pod{UID: "u1", Namespace: "ns", Name: "ls", Cgroup: podRel}); err != nil {
		t.Fatal(err)
	}
	return r
}

// fire delivers one trigger of key at now through handle.
func (r *psiRig) fire(key string) []Harm {
	r.s.handle(trigger{key: key, at: r.now})
	h, _ := r.s.Take(nil)
	return h
}

func TestPSIWatchArmsBothTriggers(t *testing.T) {
	t.Parallel()
	r := newPSIRig(t)
	if !r.w.has(cpuKey("u1")) || !r.w.has(memKey("u1")) || r.w.keys[memKey("u1")] != "/cg2/"+podRel+"/memory.pressure" {
		t.Fatalf("triggers %v: want the pod's cpu and memory pressure", r.w.keys)
	}
	if err := r.s.Watch(Pod{UID: "u2", Cgroup: "kubepods/gone"}); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Watch of a gone pod: %v, want ErrNotExist", err)
	}
	r.s.Unwatch("u1")
	if r.w.has(cpuKey("u1")) || r.w.has(memKey("u1")) || !r.smp.closed {
		t.Fatal("Unwatch left a trigger or the readers open")
	}
}

// A CPU trigger is harm only when the stall the pod's own throttling does not explain
// is at the trigger's rate (20 ms per 500 ms) since the baseline a window or more ago.
func TestPSICPUTriggerDiscountsThrottling(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		stall, throttled time.Duration // growth over the 600 ms before the trigger
		harm             bool
	}{
		{"stall, no throttling", 60 * time.Millisecond, 0, true},
		{"stall all its own throttling", 60 * time.Millisecond, 60 * time.Millisecond, false},
		{"partly throttled, the rest enough", 60 * time.Millisecond, 20 * time.Millisecond, true},
		{"partly throttled, the rest too little", 30 * time.Millisecond, 20 * time.Millisecond, false},
		{"no stall (a stale trigger)", 0, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newPSIRig(t)
			r.now = r.now.Add(600 * time.Millisecond)
			r.smp.grow(tc.stall, tc.throttled)
			h := r.fire(cpuKey("u1"))
			if (len(h) == 1) != tc.harm {
				t.Fatalf("harm %+v, want %v", h, tc.harm)
			}
			if tc.harm && (h[0].Signal != qos.SignalPSICPU || h[0].Pod != "ns/ls" ||
				!h[0].Since.Equal(r.now.Add(-DefaultPSIWindow)) || h[0].Value != tc.stall-tc.throttled) {
				t.Fatalf("harm %+v", h[0])
			}
		})
	}
}

// Unprivileged triggers must not be starved by reads of the pressure file: the source
// reads none, and confirms a trigger only for a pod its own throttling does not explain.
func TestPSIUnprivilegedReadsNoStall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		throttled time.Duration
		harm      bool
	}{{0, true}, {30 * time.Millisecond, false}} {
		r := newPSIRigPriv(t, false)
		r.now = r.now.Add(600 * time.Millisecond)
		r.smp.grow(time.Hour, tc.throttled) // never read
		if h := r.fire(cpuKey("u1")); (len(h) == 1) != tc.harm {
			t.Fatalf("throttled %v: harm %+v, want %v", tc.throttled, h, tc.harm)
		}
	}
}

// The baseline is refreshed every window: an old stall does not make a new trigger harm.
func TestPSIRefreshMovesTheBaseline(t *testing.T) {
	t.Parallel()
	r := newPSIRig(t)
	r.smp.grow(time.Second, 0) // long ago
	for range 3 {
		r.now = r.now.Add(DefaultPSIWindow)
		r.s.refresh(r.now)
	}
	r.now = r.now.Add(100 * time.Millisecond)
	if h := r.fire(cpuKey("u1")); len(h) != 0 {
		t.Fatalf("harm %+v from a stall three windows old", h)
	}
}

func TestPSIMemoryTriggerIsHarm(t *testing.T) {
	t.Parallel()
	r := newPSIRig(t)
	h := r.fire(memKey("u1"))
	if len(h) != 1 || h[0].Signal != qos.SignalPSIMemory || h[0].Pod != "ns/ls" {
		t.Fatalf("harm %+v, want psi_memory of ns/ls", h)
	}
	// A gone group and an unknown key are no harm.
	r.s.handle(trigger{key: memKey("u1"), at: r.now, gone: true})
	r.s.handle(trigger{key: "cpu/other", at: r.now})
	if h, _ := r.s.Take(nil); len(h) != 0 {
		t.Fatalf("harm %+v from a gone group or an unknown key", h)
	}
}

// Run turns the watcher's events into harm and wakes; a watcher that dies leaves the
// source blind (Take errors) rather than silent.
func TestPSIRun(t *testing.T) {
	t.Parallel()
	r := newPSIRig(t)
	r.s.now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.s.Run(ctx) }()
	r.w.events <- trigger{key: memKey("u1"), at: time.Now()}
	select {
	case <-r.s.Wake():
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up after a trigger")
	}
	r.w.runErr <- errors.New("epoll died")
	if err := <-done; err == nil {
		t.Fatal("Run hid the watcher's error")
	}
	for range 2 {
		if _, err := r.s.Take(nil); err == nil {
			t.Fatal("Take after the watcher died: no error")
		}
	}
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
}
