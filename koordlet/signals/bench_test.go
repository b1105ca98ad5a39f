package signals

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkEBPFPoll is one read of the eBPF source with 100 LS pods watched (each with two
// container cgroups), what it does every pollInterval: one histogram map lookup per pod
// and the quantile of each delta. Needs root and BPF; run it on a quiet machine:
//
//	go test -run '^$' -bench EBPFPoll -benchtime 2000x ./koordlet/signals/
//
// ns/op × (1 s / pollInterval) is the source's CPU per second (at 20 ms: ns/op × 50).
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
	now := time.Now()
	_ = s.poll(now)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		now = now.Add(20 * time.Millisecond)
		if err := s.poll(now); err != nil {
			b.Fatal(err)
		}
	}
}
