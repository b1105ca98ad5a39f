//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// BenchmarkManagerStep is one step of the GPU loop in the agent_cpu bench's steady state
// (bench/gpubench, `gpu-bench -parts agent_cpu`): the real collector over an 8-GPU mock, two GPUs shared
// by an LS and a batch pod (read in full every step), two LS-only and two batch-only
// GPUs (probed) and two idle ones, processes attributed through a fake /proc, the
// throttle, the metrics snapshot and /status. The cycler is a fake: the freezer writes
// are duty's. Steps are 50 ms apart on the step clock; ns/op and allocs/op are the loop's
// CPU per step.
func BenchmarkManagerStep(b *testing.B) {
	procRoot := b.TempDir()
	cgRoot := cgroupstest.NewRoot(b, cgroupstest.Hybrid)
	f := newFakeNode()
	pods := PodMap{}
	steps := map[int]gpuStep{}
	pid := uint32(1000)
	addPod := func(g int, class qos.Class, util uint32) {
		pid++
		uid := types.UID(fmt.Sprintf("%08d-aaaa-4bbb-8ccc-dddddddddddd", pid))
		ctr := fmt.Sprintf("%064x", pid)
		cg := "kubepods/burstable/pod" + string(uid)
		if class == qos.ClassBatch {
			cg = "kubepods/understory-batch/pod" + string(uid)
			cgroupstest.AddGroup(b, cgRoot, cgroupstest.Hybrid, cg)
		}
		writeCgroup(b, procRoot, pid, "0::/"+cg+"/"+ctr+"\n")
		writeStat(b, procRoot, pid, uint64(pid)*1000)
		pods[uid] = PodInfo{UID: uid, Namespace: "bench", Name: fmt.Sprintf("gpu%d-%s", g, class), Class: class,
			Cgroup: cg, Containers: map[string]string{ctr: "main"}}
		st := steps[g]
		st.util += util
		st.running = append(st.running, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 4 << 30})
		st.samples = append(st.samples, nvml.ProcessUtilizationSample{Pid: pid, SmUtil: util, MemUtil: 5})
		steps[g] = st
	}
	for g := range 2 {
		addPod(g, qos.ClassLS, 6)
		addPod(g, qos.ClassBatch, 40)
		addPod(2+g, qos.ClassLS, 20)
		addPod(4+g, qos.ClassBatch, 40)
	}
	f.set(steps)
	c, err := NewCollector(f.srv, procRoot)
	if err != nil {
		b.Fatal(err)
	}
	gm, err := metrics.NewGPU(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	m, err := NewManager(Options{Source: c, Pods: func() PodView { return pods },
		Groups: cgroups.OpenLayout(cgRoot, cgroups.LayoutHybrid), Cycler: newFakeCycler(),
		Policy: qos.DefaultGPUThrottlePolicy(), Metrics: gm, ProcRoot: procRoot})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	now := t0
	step := func() {
		// Fresh samples every step, as a busy driver has them.
		ts := uint64(now.Add(-time.Millisecond).UnixMicro())
		f.mu.Lock()
		for _, st := range f.steps {
			for j := range st.samples {
				st.samples[j].TimeStamp = ts
			}
		}
		f.mu.Unlock()
		m.step(ctx, now)
		now = now.Add(DefaultLoopPeriod)
	}
	for range 100 { // past the start-up freeze's hold: the steady state
		step()
	}
	if st := m.Status(); st.GPUs[0].Cadence != CadenceFast || st.GPUs[4].Cadence != CadenceProbe ||
		st.GPUs[0].Decision.Reason != qos.GPUReasonLSUtil || len(st.GPUs[0].BatchPods) != 1 {
		b.Fatalf("not the bench's steady state: %+v", st.GPUs)
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}
