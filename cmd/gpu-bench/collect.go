//go:build cgo

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/understory/understory/koordlet/gpu"
)

// haveCgo: this build has NVML (the collector and the parts that drive it).
const haveCgo = true

// mockProc is one process on a mock GPU.
type mockProc struct {
	pid            uint32
	smUtil, memUtl uint32
	memUsed        uint64
}

// mockNode is go-nvml's 8-GPU DGX A100 mock whose GPUs run the processes set on them. It
// answers like the driver: the device's utilisation is its processes' sum, and
// GetProcessUtilization returns one sample per computing process, stamped at the query
// (the driver samples continuously), only when newer than the timestamp asked for.
type mockNode struct {
	srv *dgxa100.Server

	mu    sync.Mutex
	procs map[int][]mockProc // GPU index → processes
}

func newMockNode() *mockNode {
	n := &mockNode{srv: dgxa100.New(), procs: map[int][]mockProc{}}
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
	return n
}

func (n *mockNode) get(gpu int) []mockProc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.procs[gpu]
}

// set replaces the processes of a GPU.
func (n *mockNode) set(gpu int, procs []mockProc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs[gpu] = slices.Clone(procs)
}

// collector opens a gpu.Collector over the mock (initialised, as NewCollector wants).
func (n *mockNode) collector(procRoot string) (*gpu.Collector, error) {
	if ret := n.srv.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialising the NVML mock: %w", ret)
	}
	return gpu.NewCollector(n.srv, procRoot)
}

// hybridProcCgroup is /proc/<pid>/cgroup of a process in cgroup path on a hybrid host,
// as long as the kernel writes it (the collector reads it once per process).
func hybridProcCgroup(path string) string {
	return strings.NewReplacer("%s", path).Replace(`12:hugetlb:%s
11:pids:%s
10:net_cls,net_prio:%s
9:perf_event:%s
8:devices:%s
7:cpu,cpuacct:%s
6:blkio:%s
5:memory:%s
4:rdma:/
3:freezer:%s
2:cpuset:%s
1:name=systemd:%s
0::/
`)
}

// podUID is the pod UID of fake pod k (Kubernetes' UUID form).
func podUID(k int) string { return fmt.Sprintf("%08x-aaaa-4bbb-8ccc-%012x", k, k) }

// containerID is the container ID of fake container k (64 hex digits).
func containerID(k int) string { return fmt.Sprintf("%064x", k) }

// lsCgroup and batchCgroup are the cgroup paths of a container of an LS pod (cgroupfs
// driver, burstable) and of a batch pod below the agent's tier (systemd driver).
func lsCgroup(uid, ctr string) string { return "/kubepods/burstable/pod" + uid + "/" + ctr }

func batchCgroup(uid, ctr string) string {
	return "/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod" +
		strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + ctr + ".scope"
}

// writeProc writes <procRoot>/<pid>/cgroup and <procRoot>/<pid>/stat (a python3
// process started at pid's tick; the collector reads the stat line every scrape).
func writeProc(procRoot string, pid uint32, cgroup string) error {
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

// runCollect times Collector.Collect on the 8-GPU mock, every GPU running
// cfg.ProcsPerGPU processes, each in its own container of a pod (alternately LS and
// batch) on a fake hybrid /proc: full reads of every GPU (the scrapes one after the
// other, as fast as they go), then probes of every GPU (process lists unchanged). The
// mock answers in nanoseconds where a driver takes microseconds per query, so this is
// the collector's own cost: NVML calls through go-nvml's mock, attribution (a process's
// /proc/<pid>/cgroup read once, in the warm-up; its /proc/<pid>/stat at most once a
// second) and the merge.
func runCollect(ctx context.Context, cfg collectConfig, printf func(string, ...any)) (*collectRun, error) {
	procRoot, err := os.MkdirTemp("", "understory-gpu-bench-proc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(procRoot)
	node := newMockNode()
	for g := range mockGPUs {
		var procs []mockProc
		for j := range cfg.ProcsPerGPU {
			k := g*cfg.ProcsPerGPU + j
			pid := uint32(10_000 + k)
			path := lsCgroup(podUID(k), containerID(k))
			if j%2 == 1 {
				path = batchCgroup(podUID(k), containerID(k))
			}
			if err := writeProc(procRoot, pid, hybridProcCgroup(path)); err != nil {
				return nil, err
			}
			procs = append(procs, mockProc{pid: pid, smUtil: uint32(10 + j), memUtl: 5, memUsed: 1 << 30})
		}
		node.set(g, procs)
	}
	c, err := node.collector(procRoot)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	probe := make([]gpu.Scrape, mockGPUs)
	for i := range probe {
		probe[i] = gpu.ScrapeProbe
	}
	scrapeAs := func(plan []gpu.Scrape) (time.Duration, error) {
		start := time.Now()
		s, err := c.Collect(ctx, start, plan)
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		// Check the scrape read what the mock runs: a broken attribution must not
		// pass for a fast collector.
		if len(s.Devices) != mockGPUs {
			return 0, fmt.Errorf("collect read %d GPUs, want %d", len(s.Devices), mockGPUs)
		}
		for _, d := range s.Devices {
			if d.Probed != (plan != nil) {
				return 0, fmt.Errorf("GPU %d: probed %t, plan %v", d.Index, d.Probed, plan)
			}
			if !d.Healthy || len(d.Processes) != cfg.ProcsPerGPU {
				return 0, fmt.Errorf("GPU %d: healthy %t (%s), %d processes, want %d", d.Index, d.Healthy, d.Err,
					len(d.Processes), cfg.ProcsPerGPU)
			}
			for _, p := range d.Processes {
				if !p.Pod.Attributed() {
					return 0, fmt.Errorf("GPU %d: process %d not attributed to its pod", d.Index, p.PID)
				}
			}
		}
		return took, nil
	}
	scrape := func() (time.Duration, error) { return scrapeAs(nil) }
	for range min(cfg.Iterations/10+1, 100) { // warm the caches, and the mock's lastSeen
		if _, err := scrape(); err != nil {
			return nil, err
		}
	}
	took := make([]float64, 0, cfg.Iterations)
	var sum time.Duration
	for range cfg.Iterations {
		d, err := scrape()
		if err != nil {
			return nil, err
		}
		sum += d
		took = append(took, float64(d)/float64(time.Microsecond))
	}
	slices.Sort(took)
	mean := float64(sum) / float64(time.Microsecond) / float64(cfg.Iterations)
	run := &collectRun{GPUs: mockGPUs, ProcsPerGPU: cfg.ProcsPerGPU, Scrapes: cfg.Iterations,
		ScrapeUSMean: mean, ScrapeUSP50: percentile(took, 0.50), ScrapeUSP99: percentile(took, 0.99),
		USPerDevice: mean / mockGPUs}
	var probeSum time.Duration
	for range cfg.Iterations {
		d, err := scrapeAs(probe)
		if err != nil {
			return nil, err
		}
		probeSum += d
	}
	run.ProbeUSMean = float64(probeSum) / float64(time.Microsecond) / float64(cfg.Iterations)
	run.ProbeUSPerDevice = run.ProbeUSMean / mockGPUs
	printf("collect: %.1f µs per scrape of %d GPUs x %d processes (p50 %.1f, p99 %.1f): %.2f µs per device; "+
		"a probe of every GPU %.1f µs (%.2f per device)\n", run.ScrapeUSMean, mockGPUs, cfg.ProcsPerGPU,
		run.ScrapeUSP50, run.ScrapeUSP99, run.USPerDevice, run.ProbeUSMean, run.ProbeUSPerDevice)
	return run, nil
}
