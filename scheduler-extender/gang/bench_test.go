package gang

import (
	"fmt"
	"math/rand"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/wire"
)

// cpuNow is this process's user+system CPU time; benchmarks report it per op
// because wall time means little on a machine shared with other work.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

// gangBench is a 5 000-node index (nodes of 0, 1, 2, 4 or 8 GPUs, a third of
// the GPUs held by bound pods: the extender's benchmark cluster) with one
// Volcano gang of members pods of gpusEach GPUs each, all pending, and the
// candidate list of a filter.
func gangBench(b *testing.B, members, gpusEach int) (*fakeIndex, Pod, [][]byte) {
	b.Helper()
	ix := newFakeIndex(Config{MaxMembers: max(1000, members), PlanTTL: time.Minute, BindTimeout: 20 * time.Second}, time.Now)
	rng := rand.New(rand.NewSource(1))
	names := make([][]byte, 5000)
	for i := range names {
		name := fmt.Sprintf("node-%d", i)
		names[i] = []byte(name)
		g := []int{0, 8, 8, 2, 4, 1}[rng.Intn(6)]
		ix.addNode(testNode(name, "A100", g, 96, 512))
		for d := 0; d < g; d++ {
			if rng.Intn(3) == 0 {
				ix.addPod(podtest.Pod("b", fmt.Sprintf("p-%d-%d", i, d), podtest.GPUs(1)), name, []int{d})
			}
		}
	}
	var trigger Pod
	for i := range members {
		p := ix.addPod(podtest.Pod("ns", fmt.Sprintf("m%04d", i), append(podtest.Volcano("big", members), podtest.GPUs(gpusEach), podtest.CPU(4000), podtest.Created(i))...), "", nil)
		if i == 0 {
			trigger = p
		}
	}
	return ix, trigger, names
}

// planGang is what a gang member's filter computes for its gang, without the
// commit: the job (copies taken under the lock, as filterLocked does) and its
// run outside the lock. It returns how many members fit now.
func planGang(b *testing.B, ix *fakeIndex, trigger Pod, names [][]byte) int {
	ix.Lock()
	_, _, job := ix.gs.filterLocked(trigger, names, wire.Outcome{})
	if job == nil {
		ix.Unlock()
		b.Fatal("the gang was not planned")
	}
	job.g.planning = false
	ix.Unlock()
	job.run()
	return len(job.slots)
}

// BenchmarkGangPlan1000x5000 plans a 1 000-member gang over 5 000 nodes (the
// goal is ≤ 100 ms per plan). fits: 1 000 members of 1 GPU fit now. waits:
// 1 000 members of 8 GPUs do not fit now but would fit the empty cluster, so
// the plan also runs the "can it ever fit" check (everJob) over the whole
// cluster.
func BenchmarkGangPlan1000x5000(b *testing.B) {
	for _, c := range []struct {
		name     string
		gpusEach int
		fits     bool
	}{{"fits", 1, true}, {"waits", 8, false}} {
		b.Run(c.name, func(b *testing.B) {
			ix, trigger, names := gangBench(b, 1000, c.gpusEach)
			b.ReportAllocs()
			b.ResetTimer()
			start := cpuNow()
			for b.Loop() {
				if n := planGang(b, ix, trigger, names); (n == 1000) != c.fits {
					b.Fatalf("%d of 1000 members fit", n)
				}
			}
			reportCPU(b, start)
		})
	}
}
