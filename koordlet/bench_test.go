package koordlet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
)

// BenchmarkTick110Pods is one control period over 110 pods (a third each LS, BE and
// in-place batch) on a fake hybrid cgroup root: the agent's steady-state cost. The
// per-period budget target (1 % of a core at 100 ms) is 1 ms per tick.
func BenchmarkTick110Pods(b *testing.B) {
	root := cgroupstest.NewRoot(b, cgroupstest.Hybrid)
	cgroupstest.AddGroup(b, root, cgroupstest.Hybrid, "kubepods/understory-batch")
	var pods []*corev1.Pod
	for i := range 110 {
		uid := types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
		var ann map[string]string
		req, qosDir := "", "besteffort"
		switch i % 3 {
		case 0:
			req, qosDir = "100m", "burstable"
		case 1:
			ann = map[string]string{"understory.io/qos-class": "batch"}
		}
		pods = append(pods, testPod(fmt.Sprintf("p%d", i), uid, ann, req))
		cgroupstest.AddGroup(b, root, cgroupstest.Hybrid, "kubepods/"+qosDir+"/pod"+string(uid))
	}
	cfg := config.Default()
	cfg.CgroupRoot, cfg.ProcRoot = root, b.TempDir()
	cpu := &fakeCPU{times: collect.CPUTimes{CPUs: 2}}
	src := newFakePods(pods...)
	a, err := New(cfg, Deps{Pods: src, Registry: prometheus.NewRegistry(), NodeCPU: cpu,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	a.syncPods(src.List())
	now := time.Now()
	ctx := context.Background()
	tick := func() {
		now = now.Add(100 * time.Millisecond)
		cpu.add(150*time.Millisecond, 200*time.Millisecond)
		a.tick(ctx, now)
	}
	for range 20 { // past the first samples, the pod set-up and the first stats read
		tick()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		tick()
	}
}
