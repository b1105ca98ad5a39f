package signals

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/signals/runqlat"
	"github.com/understory/understory/qos"
)

// fakeProbe is a run-queue delay probe whose histograms the test sets.
type fakeProbe struct {
	mu       sync.Mutex
	children map[uint64][]uint64 // watched id -> children
	hists    map[uint64]runqlat.Histogram
	readErr  error
	closed   bool
}

var _ probe = (*fakeProbe)(nil)

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
	clear(dst)
	if p.readErr != nil {
		return p.readErr
	}
	for id, h := range p.hists {
		dst[id] = h
	}
	return nil
}

func (p *fakeProbe) Close() error { p.closed = true; return nil }

// add counts n delays in the bucket of d into id's histogram.
func (p *fakeProbe) add(id uint64, d time.Duration, n uint64) {
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
	p.hists[id] = h
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
	root := t.TempDir()
	for _, d := range []string{podRel, podRel + "/ctr-a", podRel + "/ctr-b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, podRel, "cpu.pressure"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := newFakeProbe()
	r := &ebpfRig{p: p, root: root, now: t0}
	r.s = newEBPF(Options{Cgroup2Root: root, Logger: discard()}, p, inode, func() time.Time { return r.now })
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
