//go:build cgo

package gpubench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/gpumock"
)

// haveCgo: this build has NVML (the collector and the parts that drive it).
const haveCgo = true

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

// runCollect times Collector.Collect on the 8-GPU mock, every GPU running
// cfg.ProcsPerGPU processes, each in its own container of a pod (alternately LS and
// batch) on a fake hybrid /proc: full reads of every GPU (the scrapes one after the
// other, as fast as they go), then probes of every GPU (process lists unchanged). The
// mock answers in nanoseconds where a driver takes microseconds per query, so this is
// the collector's own cost: NVML calls through go-nvml's mock, attribution (a process's
// /proc/<pid>/cgroup read once, in the warm-up; its /proc/<pid>/stat at most once a
// second) and the merge.
func runCollect(ctx context.Context, cfg CollectConfig, printf func(string, ...any)) (*collectRun, error) {
	procRoot, err := os.MkdirTemp("", "understory-gpu-bench-proc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(procRoot)
	node := gpumock.New()
	for g := range mockGPUs {
		var procs []gpumock.Proc
		for j := range cfg.ProcsPerGPU {
			k := g*cfg.ProcsPerGPU + j
			pid := uint32(10_000 + k)
			path := lsCgroup(podUID(k), containerID(k))
			if j%2 == 1 {
				path = batchCgroup(podUID(k), containerID(k))
			}
			if err := gpumock.WriteProc(procRoot, pid, gpumock.HybridProcCgroup(path)); err != nil {
				return nil, err
			}
			procs = append(procs, gpumock.Proc{PID: pid, SMUtil: uint32(10 + j), MemUtil: 5, MemUsed: 1 << 30})
		}
		node.Set(g, procs...)
	}
	c, err := node.Collector(procRoot)
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
