package extender

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"syscall"
	"testing"
	"time"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/wire"
)

// benchState is a 5000-node index with a third of the GPUs in use.
func benchState(b *testing.B) (*Server, []*wire.Args) {
	b.Helper()
	s, err := NewServer(DefaultConfig(), Deps{})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	names := nodeNames("node-", 5000)
	for i, n := range names {
		g := []int{0, 8, 8, 2, 4, 1}[rng.Intn(6)]
		s.state.UpsertNode(testNode(n, "A100", g, 96, 512))
		for d := 0; d < g; d++ {
			if rng.Intn(3) == 0 {
				s.state.UpsertPod(podtest.Pod("b", fmt.Sprintf("p-%d-%d", i, d), podtest.GPUs(1), podtest.OnNode(n), podtest.Annotate(contract.AnnotationGPUDevices, fmt.Sprint(d))))
			}
		}
	}
	var args []*wire.Args
	for i, o := range []podtest.Opt{podtest.Milli(500), podtest.GPUs(1), podtest.GPUs(2), podtest.Milli(250)} {
		body, _ := json.Marshal(extenderv1.ExtenderArgs{Pod: podtest.Pod("ns", fmt.Sprintf("q%d", i), o), NodeNames: &names})
		a, err := s.dec.Args(body, nil)
		if err != nil {
			b.Fatal(err)
		}
		args = append(args, &a)
	}
	return s, args
}

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

func BenchmarkFilter5000(b *testing.B) {
	s, args := benchState(b)
	var out wire.Outcome
	b.ResetTimer()
	start := cpuNow()
	for i := 0; i < b.N; i++ {
		a := args[i%len(args)]
		out = s.res.Filter(a.Pod, a.Names, a.List, nil, out)
	}
	reportCPU(b, start)
}

func BenchmarkPrioritize5000(b *testing.B) {
	s, args := benchState(b)
	var sc []int64
	var raws []float64
	b.ResetTimer()
	start := cpuNow()
	for i := 0; i < b.N; i++ {
		a := args[i%len(args)]
		sc, raws = s.res.Prioritize(a.Pod, a.Names, a.List, sc, raws)
	}
	reportCPU(b, start)
}
