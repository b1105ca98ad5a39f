//go:build cgo

package dashboards

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// haveGPUNode: this build can run the mock GPU node (go-nvml needs cgo).
const haveGPUNode = true

// gpuProc is one process on a mock GPU.
type gpuProc struct {
	pid            uint32
	smUtil, memUtl uint32
	memUsed        uint64
	batch          bool // its SM time shrinks with the GPU's batch duty, as a frozen process's would
}

// gpuNode is a GPU node without GPUs: go-nvml's 8-GPU DGX A100 mock, answering like
// the driver from the processes set on it, read by the agent's real GPU loop
// (koordlet/gpu: collector, attribution through a fake /proc, qos.GPUThrottle, the
// freezer duty cycle on real cgroups) and exported by the real metrics.GPU on
// /metrics, as the agent serves it.
type gpuNode struct {
	srv *dgxa100.Server
	hs  *httptest.Server
	m   *gpu.Manager

	mu    sync.Mutex
	procs map[int][]gpuProc
	duty  map[int]float64 // the loop's last duty per GPU
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

// hybridProcCgroup is /proc/<pid>/cgroup of a process in cgroup path on a hybrid host.
func hybridProcCgroup(path string) string {
	return strings.NewReplacer("%s", path).Replace("12:pids:%s\n7:cpu,cpuacct:%s\n5:memory:%s\n" +
		"3:freezer:%s\n1:name=systemd:%s\n0::/\n")
}

// startGPUNode runs the GPU loop over the mock and serves its metrics. The batch
// pods' cgroups are real (below base, a private kubelet root), empty, and frozen by
// the duty cycle as the agent would freeze them.
func startGPUNode(ctx context.Context, t *testing.T, h *cgroups.Hierarchy, base string) *gpuNode {
	t.Helper()
	n := &gpuNode{srv: dgxa100.New(), procs: map[int][]gpuProc{}, duty: map[int]float64{}}
	for i, dev := range n.srv.Devices {
		d := dev.(*dgxa100.Device)
		total := d.MemoryInfo.Total
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			var used uint64
			for _, p := range n.get(i) {
				used += p.memUsed
			}
			used = min(used, total)
			return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			var u nvml.Utilization
			for _, p := range n.get(i) {
				u.Gpu += p.smUtil
				u.Memory += p.memUtl
			}
			return nvml.Utilization{Gpu: min(u.Gpu, 100), Memory: min(u.Memory, 100)}, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			ps := n.get(i)
			out := make([]nvml.ProcessInfo, len(ps))
			for k, p := range ps {
				out[k] = nvml.ProcessInfo{Pid: p.pid, UsedGpuMemory: p.memUsed}
			}
			return out, nvml.SUCCESS
		}
		d.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			now := uint64(time.Now().UnixMicro())
			var out []nvml.ProcessUtilizationSample
			if now > since {
				for _, p := range n.get(i) {
					if p.smUtil > 0 || p.memUtl > 0 {
						out = append(out, nvml.ProcessUtilizationSample{Pid: p.pid, TimeStamp: now,
							SmUtil: p.smUtil, MemUtil: p.memUtl})
					}
				}
			}
			if len(out) == 0 {
				return nil, nvml.ERROR_NOT_FOUND // as the driver: no sample newer than since
			}
			return out, nvml.SUCCESS
		}
	}

	procRoot := t.TempDir()
	view := gpu.PodMap{}
	for k, p := range gpuPods() {
		pid := uint32(5000 + k)
		kubeQOS, tierPath := cgroups.QOSBurstable, "/kubepods/burstable/pod"
		if p.class == qos.ClassBatch {
			kubeQOS, tierPath = cgroups.QOSBestEffort, "/kubepods/besteffort/pod"
		}
		if err := writeFakeProc(procRoot, pid, hybridProcCgroup(tierPath+string(p.uid)+"/"+p.ctr)); err != nil {
			t.Fatal(err)
		}
		info := gpu.PodInfo{UID: p.uid, Namespace: "ml", Name: p.name, Class: p.class,
			Containers: map[string]string{p.ctr: "main"}, StartTime: time.Now()}
		if p.class == qos.ClassBatch {
			rel, err := cgroups.PodPath(cgroups.DriverCgroupfs, kubeQOS, string(p.uid))
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
			if err := writeFakeProc(procRoot, pidInference2, hybridProcCgroup(tierPath+string(p.uid)+"/"+p.ctr)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		if err := reclaim(h, base); err != nil {
			t.Errorf("removing the GPU node's cgroups: %v", err)
		}
	})

	if ret := n.srv.Init(); ret != nvml.SUCCESS {
		t.Fatalf("initialising the NVML mock: %v", ret)
	}
	src, err := gpu.NewCollector(n.srv, procRoot)
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

// followDuty keeps each GPU's last duty, which the mock's batch processes follow.
func (n *gpuNode) followDuty(ctx context.Context) {
	for {
		st := n.m.Status()
		n.mu.Lock()
		for _, g := range st.GPUs {
			n.duty[g.Index] = g.Decision.Duty
		}
		n.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// get returns a GPU's processes as the driver would report them now: a batch
// process computes only while its pod is thawed.
func (n *gpuNode) get(gpu int) []gpuProc {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := append([]gpuProc(nil), n.procs[gpu]...)
	for i := range out {
		if out[i].batch {
			out[i].smUtil = uint32(float64(out[i].smUtil) * (1 - n.duty[gpu]))
		}
	}
	return out
}

// set replaces the processes of a GPU.
func (n *gpuNode) set(gpu int, procs ...gpuProc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs[gpu] = procs
}

// addr is the exporter's host:port.
func (n *gpuNode) addr() string { return strings.TrimPrefix(n.hs.URL, "http://") }

// pidInference2 is the inference service's second process (on GPU 3).
const pidInference2 = 5005

// lsLoad scripts the GPUs for an LS phase: GPU 0 is shared by the inference service
// (busy only while LS is loaded: the throttle cuts trainer-0 to its highest duty,
// then holds and restores) and trainer-0; GPU 1 by the always-on, light embedder
// (below the on threshold: the active duty) and trainer-1; GPU 2 runs only trainer-2
// (no LS: duty 0); GPU 3 only the inference service's second replica while LS is
// loaded; GPUs 4–7 stay idle.
func (n *gpuNode) lsLoad(on bool) {
	// PIDs are the pods' (5000 + their index in gpuPods); memory fits the mock's
	// 40 GB A100s.
	inference := gpuProc{pid: 5000, smUtil: 70, memUtl: 35, memUsed: 8 << 30}
	embedder := gpuProc{pid: 5001, smUtil: 12, memUtl: 8, memUsed: 4 << 30}
	trainer0 := gpuProc{pid: 5002, smUtil: 55, memUtl: 40, memUsed: 20 << 30, batch: true}
	trainer1 := gpuProc{pid: 5003, smUtil: 60, memUtl: 45, memUsed: 16 << 30, batch: true}
	trainer2 := gpuProc{pid: 5004, smUtil: 80, memUtl: 50, memUsed: 28 << 30, batch: true}
	n.set(1, embedder, trainer1)
	n.set(2, trainer2)
	if on {
		n.set(0, inference, trainer0)
		second := inference
		second.pid, second.smUtil, second.memUsed = pidInference2, 45, 6<<30
		n.set(3, second)
		return
	}
	n.set(0, trainer0)
	n.set(3)
}

// writeFakeProc writes <procRoot>/<pid>/cgroup and /stat (a process started at
// tick pid) for the collector's attribution.
func writeFakeProc(procRoot string, pid uint32, cgroup string) error {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		return err
	}
	stat := fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 4194560 52021 0 12 0 9121 1412 0 0 20 0 64 0 %d "+
		"21474836480 1048576 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 0 0 0 0 0\n",
		pid, pid, pid, pid)
	return os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
}
