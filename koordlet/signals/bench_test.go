package signals

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkEBPFPoll is the eBPF source's poll with 100 LS pods watched (each with two
// container cgroups), what it does every pollInterval while harm goes on, or always on
// kernels without BPF ring buffers (before 5.8): from 5.8 a quiet node is not polled, the
// probe wakes the source (Run). Needs root and BPF; run it on a quiet machine:
//
//	go test -run '^$' -bench EBPFPoll -benchtime 2000x -benchmem ./koordlet/signals/
//
// quiet: no delay reaches a harm bucket, as on a node without harm; the poll reads the
// slow-event count from shared memory and skips the histograms but for the refresh
// every refreshEvery (one poll in 50 at 20 ms, counted in ns/op). busy: the count
// moved at every poll, as during harm; every poll reads the 100 histograms (one batch
// lookup) and takes the quantile of each delta.
//
// ns/op × (1 s / pollInterval) is the source's CPU per second while polling (at 20 ms:
// ns/op × 50), not counting the wake-up of the agent's thread per poll, which on a VM
// cost more than the poll (~1 % of a core at 50 a second).
func BenchmarkEBPFPoll(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (loads eBPF, creates cgroups)")
	}
	root := ""
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.controllers")); err == nil {
			root = r
		}
	}
	if root == "" {
		b.Skip("no cgroup2 mount")
	}
	src, err := OpenEBPF(Options{Cgroup2Root: root, Logger: discard()})
	if err != nil {
		b.Skipf("eBPF unavailable: %v", err)
	}
	defer src.Close()
	s := src.(*EBPF)
	base := filepath.Join(root, fmt.Sprintf("understory-signals-bench-%d", os.Getpid()))
	b.Cleanup(func() {
		for i := range 100 {
			for _, c := range []string{"a", "b", ""} {
				_ = os.Remove(filepath.Join(base, fmt.Sprintf("pod%d", i), c))
			}
		}
		_ = os.Remove(base)
	})
	for i := range 100 {
		rel := filepath.Join(filepath.Base(base), fmt.Sprintf("pod%d", i))
		for _, c := range []string{"a", "b"} {
			if err := os.MkdirAll(filepath.Join(root, rel, c), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Watch(Pod{UID: fmt.Sprint(i), Namespace: "bench", Name: fmt.Sprint(i), Cgroup: rel}); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now() // one clock for both: the refresh counts from the last read
	for _, bc := range []struct {
		name string
		gate bool
	}{{"quiet", true}, {"busy", false}} {
		b.Run(bc.name, func(b *testing.B) {
			s.mu.Lock()
			s.gate = bc.gate // off: the poll reads as if the count moved
			s.mu.Unlock()
			now = now.Add(20 * time.Millisecond)
			_ = s.poll(now)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				now = now.Add(20 * time.Millisecond)
				if err := s.poll(now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
