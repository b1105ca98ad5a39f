//go:build cgo

package dashboards

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// haveGPUNode: this build can run the mock GPU node (go-nvml needs cgo).
const haveGPUNode = true

// gpuNode is a GPU node without GPUs: gpumock's node (go-nvml's 8-GPU DGX A100 mock,
// answering like the driver from the processes set on it), read by the agent's real
// GPU loop (koordlet/gpu: collector, attribution through a fake /proc,
// qos.GPUThrottle, the on/off freeze on real cgroups) and exported by the real
// metrics.GPU on /metrics, as the agent serves it.
type gpuNode struct {
	*gpumock.Node
	hs *httptest.Server
	m  *gpu.Manager
}

// The GPU node's pods: two LS inference services and three batch trainers.
type gpuPod struct {
	name  string
	uid   types.UID
	ctr   string
	class qos.Class
}

func gpuPods() []gpuPod {
	p := func(i int, name string, class qos.Class) gpuPod {
		return gpuPod{name: name, uid: types.UID(fmt.Sprintf("9a5b0000-0000-4000-8000-%012d", i)),
			ctr: fmt.Sprintf("%064x", 0xc0ffee00+i), class: class}
	}
	return []gpuPod{p(1, "inference", qos.ClassLS), p(2, "embedder", qos.ClassLS), p(3, "trainer-0", qos.ClassBatch),
		p(4, "trainer-1", qos.ClassBatch), p(5, "trainer-2", qos.ClassBatch)}
}

// startGPUNode runs the GPU loop over the mock and serves its metrics. The batch
// pods' cgroups are real (below base, a private kubelet root), empty, and frozen by
// the cycler as the agent would freeze them.
func startGPUNode(ctx context.Context, t *testing.T, h *cgroups.Hierarchy, base string) *gpuNode {
	t.Helper()
	n := &gpuNode{Node: gpumock.New()}
	procRoot := t.TempDir()
	view := gpu.PodMap{}
	for k, p := range gpuPods() {
		pid := uint32(5000 + k)
		kubeQOS, tierPath := cgroups.QOSBurstable, "/kubepods/burstable/pod"
		if p.class == qos.ClassBatch {
			kubeQOS, tierPath = cgroups.QOSBestEffort, "/kubepods/besteffort/pod"
		}
		cgroup := gpumock.HybridProcCgroup(tierPath + string(p.uid) + "/" + p.ctr)
		if err := gpumock.WriteProc(procRoot, pid, cgroup); err != nil {
			t.Fatal(err)
		}
		info := gpu.PodInfo{UID: p.uid, Namespace: "ml", Name: p.name, Class: p.class,
			Containers: map[string]string{p.ctr: "main"}, StartTime: time.Now()}
		if p.class == qos.ClassBatch {
			rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(kubeQOS, string(p.uid))
			if err != nil {
				t.Fatal(err)
			}
			info.Cgroup = base + "/" + rel
			if _, err := h.Create(info.Cgroup); err != nil {
				t.Fatalf("creating the GPU node's cgroups: %v", err)
			}
		}
		view[p.uid] = info
		if p.name == "inference" { // its second replica's process (lsLoad)
			if err := gpumock.WriteProc(procRoot, pidInference2, cgroup); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		if err := reclaim(h, base); err != nil {
			t.Errorf("removing the GPU node's cgroups: %v", err)
		}
	})

	src, err := n.Collector(procRoot)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	policy := qos.DefaultGPUThrottlePolicy()
	cyc, err := duty.New(policy.Period.Duration, log)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	gm, err := metrics.NewGPU(reg)
	if err != nil {
		t.Fatal(err)
	}
	n.m, err = gpu.NewManager(gpu.Options{Source: src, Pods: func() gpu.PodView { return view }, Groups: h,
		Cycler: cyc, Policy: policy, Metrics: gm, Log: log, ProcRoot: procRoot})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- n.m.Run(runCtx) }() // Run closes src and thaws what it froze
	go n.followDuty(runCtx)
	n.hs = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Cleanups run last first: the server and the loop stop before the cgroups go.
	t.Cleanup(func() {
		n.hs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("GPU loop: %v", err)
		}
	})
	return n
}

// followDuty keeps each GPU's last duty (1 frozen, 0 not), which the mock's batch
// processes follow.
func (n *gpuNode) followDuty(ctx context.Context) {
	for {
		for _, g := range n.m.Status().GPUs {
			n.SetDuty(g.Index, g.Decision.Duty)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// addr is the exporter's host:port.
func (n *gpuNode) addr() string { return strings.TrimPrefix(n.hs.URL, "http://") }

// pidInference2 is the inference service's second process (on GPU 3).
const pidInference2 = 5005

// lsLoad scripts the GPUs for an LS phase: GPU 0 is shared by the inference service
// (busy only while LS is loaded: the throttle freezes trainer-0 solid, then thaws it
// `hold` after LS went idle) and trainer-0; GPU 1 by the always-on, light embedder
// (above the on threshold: trainer-1 frozen solid) and trainer-1; GPU 2 runs only
// trainer-2 (no LS: never frozen); GPU 3 only the inference service's second replica while LS is
// loaded; GPUs 4–7 stay idle.
func (n *gpuNode) lsLoad(on bool) {
	// PIDs are the pods' (5000 + their index in gpuPods); memory fits the mock's
	// 40 GB A100s.
	inference := gpumock.Proc{PID: 5000, SMUtil: 70, MemUtil: 35, MemUsed: 8 << 30}
	embedder := gpumock.Proc{PID: 5001, SMUtil: 12, MemUtil: 8, MemUsed: 4 << 30}
	trainer0 := gpumock.Proc{PID: 5002, SMUtil: 55, MemUtil: 40, MemUsed: 20 << 30, Batch: true}
	trainer1 := gpumock.Proc{PID: 5003, SMUtil: 60, MemUtil: 45, MemUsed: 16 << 30, Batch: true}
	trainer2 := gpumock.Proc{PID: 5004, SMUtil: 80, MemUtil: 50, MemUsed: 28 << 30, Batch: true}
	n.Set(1, embedder, trainer1)
	n.Set(2, trainer2)
	if on {
		n.Set(0, inference, trainer0)
		second := inference
		second.PID, second.SMUtil, second.MemUsed = pidInference2, 45, 6<<30
		n.Set(3, second)
		return
	}
	n.Set(0, trainer0)
	n.Set(3)
}
