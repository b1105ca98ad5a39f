package cgroups

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// The agent reads ~110 pods' usage every 100 ms and must stay under 1% of
// a core: a sweep of 110 reads must cost well under 1 ms. Sweep benchmarks
// report that budget as core%@10Hz.

const benchPods = 110

// benchGroups creates n groups on the real hierarchy (removed afterwards)
// or, without root, on a fake.
func benchGroups(b *testing.B, real bool, n int) (*Hierarchy, []*Group) {
	b.Helper()
	var h *Hierarchy
	if real {
		if os.Geteuid() != 0 {
			b.Skip("real cgroup benchmark needs root")
		}
		var err error
		if h, err = Open(realRoot); errors.Is(err, ErrNoCgroupFS) {
			b.Skipf("no cgroupfs: %v", err)
		} else if err != nil {
			b.Fatal(err)
		}
	} else {
		h = OpenLayout(newFake(b, fakeHybrid), LayoutHybrid)
	}
	base := fmt.Sprintf("understory-bench-%d", os.Getpid())
	b.Cleanup(func() {
		if g, err := h.Load(base); err == nil {
			if err := g.Delete(); err != nil {
				b.Errorf("cleanup: %v", err)
			}
		}
	})
	if _, err := h.Create(base); err != nil {
		b.Fatal(err)
	}
	if !real {
		fakeGroupFiles(b, h, base)
	}
	gs := make([]*Group, n)
	for i := range gs {
		rel := fmt.Sprintf("%s/pod%d", base, i)
		var err error
		if gs[i], err = h.Create(rel); err != nil {
			b.Fatal(err)
		}
		if !real {
			fakeGroupFiles(b, h, rel)
		}
	}
	return h, gs
}

func benchSweep(b *testing.B, real bool) {
	_, gs := benchGroups(b, real, benchPods)
	rs := make([]*UsageReader, len(gs))
	for i, g := range gs {
		r, err := g.UsageReader()
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		rs[i] = r
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, r := range rs {
			if _, err := r.Read(); err != nil {
				b.Fatal(err)
			}
		}
	}
	perSweep := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perSweep*10/1e9*100, "core%@10Hz")
}

// BenchmarkUsageSweepReal: 110 UsageReader.Read on the real cgroupfs.
func BenchmarkUsageSweepReal(b *testing.B) { benchSweep(b, true) }

// BenchmarkUsageSweepFake: the same on plain files (no kernfs cost).
func BenchmarkUsageSweepFake(b *testing.B) { benchSweep(b, false) }

// BenchmarkUsageSweepStats: 110 Group.Stats (open+read+close of two files).
func BenchmarkUsageSweepStats(b *testing.B) {
	_, gs := benchGroups(b, true, benchPods)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, g := range gs {
			if _, err := g.Stats(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*10/1e9*100, "core%@10Hz")
}

// BenchmarkUsageSweepLibraryStat: 110 containerd/cgroups cgroup1 Stat
// calls (cpu + cpuacct subsystems), the reason UsageReader exists.
func BenchmarkUsageSweepLibraryStat(b *testing.B) {
	h, gs := benchGroups(b, true, benchPods)
	if h.Layout() == LayoutV2 {
		b.Skip("v1 library comparison")
	}
	subs := func() ([]cgroup1.Subsystem, error) {
		return []cgroup1.Subsystem{cgroup1.NewCpu(h.Root()), cgroup1.NewCpuacct(h.Root())}, nil
	}
	cs := make([]cgroup1.Cgroup, len(gs))
	for i, g := range gs {
		c, err := cgroup1.Load(cgroup1.StaticPath("/"+g.Path()), cgroup1.WithHierarchy(subs))
		if err != nil {
			b.Fatal(err)
		}
		cs[i] = c
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, c := range cs {
			if _, err := c.Stat(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*10/1e9*100, "core%@10Hz")
}
