//go:build cgo

package gpubench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/qos"
)

// The reaction part's pods and processes. The PIDs only name entries of the fake /proc
// and of the mock's process lists; the batch pod's real tasks are the burner, in the
// real cgroup the pod view names.
const (
	reactionGPU      = 0
	reactionPIDLS    = 101
	reactionPIDBatch = 202
	reactionLSUtil   = 90 // percent of the device, well above lsUtilOnPercent
	reactionBatchUtl = 60
	// reactionWait bounds each wait of a trial: a step that takes longer is a failure
	// (the pipeline lost the step), not a slow sample.
	reactionWait = 10 * time.Second
)

var (
	reactionLSPod    = gpu.PodRef{UID: types.UID(podUID(1)), ContainerID: containerID(1)}
	reactionBatchPod = gpu.PodRef{UID: types.UID(podUID(2)), ContainerID: containerID(2)}
)

// runReaction measures the time from an LS load step on a mock GPU until the batch pod's
// real cgroup is frozen, through the agent's whole GPU pipeline: go-nvml mock →
// gpu.Collector (attribution through a fake /proc) → gpu.Manager (qos.GPUThrottle) →
// duty.Cycler → the freezer. Each trial starts with LS off the GPU, duty 0 and the group
// thawed; at T0 the LS process appears on the mock at reactionLSUtil; the group's freezer
// state is polled every millisecond until FROZEN. Then LS leaves and the trial waits for
// the duty to fall back to 0 and the group to thaw (a short hold and a fast restore in
// the bench's policy keep this quick; the cut, which is measured, never waits for them).
func runReaction(ctx context.Context, cfg ReactionConfig, printf func(string, ...any)) (res *reactionResult,
	err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the reaction bench creates a cgroup and moves a process into it: run it as root")
	}
	freezer := freezerV1
	g, hroot, thawDirs, err := freezerGroup(cfg.CgroupRoot, freezerV1)
	if errors.Is(err, errUnavailable) {
		printf("reaction: %v; using the cgroup2 freezer\n", err)
		freezer = freezerV2
		g, hroot, thawDirs, err = freezerGroup(cfg.CgroupRoot, freezerV2)
	}
	if err != nil {
		return nil, err
	}
	_, cleanup, err := startBurner(g, thawDirs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	h, err := cgroups.Open(hroot)
	if err != nil {
		return nil, err
	}

	procRoot, err := os.MkdirTemp("", "understory-gpu-bench-proc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(procRoot)
	lsCg := gpumock.HybridProcCgroup(lsCgroup(string(reactionLSPod.UID), reactionLSPod.ContainerID))
	if err := gpumock.WriteProc(procRoot, reactionPIDLS, lsCg); err != nil {
		return nil, err
	}
	batchCg := gpumock.HybridProcCgroup(batchCgroup(string(reactionBatchPod.UID), reactionBatchPod.ContainerID))
	if err := gpumock.WriteProc(procRoot, reactionPIDBatch, batchCg); err != nil {
		return nil, err
	}
	pods := gpu.PodMap{
		reactionLSPod.UID: {UID: reactionLSPod.UID, Namespace: "bench", Name: "ls", Class: qos.ClassLS,
			Containers: map[string]string{reactionLSPod.ContainerID: "server"}},
		reactionBatchPod.UID: {UID: reactionBatchPod.UID, Namespace: "bench", Name: "batch", Class: qos.ClassBatch,
			Cgroup: g.Path(), Containers: map[string]string{reactionBatchPod.ContainerID: "trainer"}},
	}
	node := gpumock.New()
	batch := gpumock.Proc{PID: reactionPIDBatch, SMUtil: reactionBatchUtl, MemUtil: 30, MemUsed: 8 << 30}
	ls := gpumock.Proc{PID: reactionPIDLS, SMUtil: reactionLSUtil, MemUtil: 40, MemUsed: 2 << 30}
	node.Set(reactionGPU, batch)
	src, err := node.Collector(procRoot)
	if err != nil {
		return nil, err
	}

	log := slog.New(slog.NewTextHandler(printfWriter(printf), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cyc, err := duty.New(cfg.Period, log)
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	m, err := gpu.NewManager(gpu.Options{Source: src, Pods: func() gpu.PodView { return pods }, Groups: h,
		Cycler: cyc, Policy: cfg.Policy, Period: cfg.LoopPeriod, Log: log, ProcRoot: procRoot})
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }() // Run closes src
	defer func() {
		cancel()
		if rerr := <-done; rerr != nil && err == nil {
			err = rerr
		}
	}()

	samples := make([]float64, 0, cfg.Trials)
	var restore []float64
	since := time.Now()
	for trial := range cfg.Trials {
		if err := waitIdle(ctx, m, g, since); err != nil {
			return nil, fmt.Errorf("trial %d: %w", trial+1, err)
		}
		// Land T0 anywhere in the loop period: trials must not lock onto the ticker.
		if err := sleepUntil(ctx, time.Now().Add(rand.N(cfg.LoopPeriod))); err != nil {
			return nil, err
		}
		t0 := time.Now()
		node.Set(reactionGPU, batch, ls)
		took, err := waitFrozen(ctx, g, t0)
		if err != nil {
			return nil, fmt.Errorf("trial %d: %w", trial+1, err)
		}
		samples = append(samples, ms(took))
		since = time.Now()
		node.Set(reactionGPU, batch)
		if err := waitIdle(ctx, m, g, since); err != nil {
			return nil, fmt.Errorf("trial %d: %w", trial+1, err)
		}
		restore = append(restore, ms(time.Since(since)))
	}
	res = &reactionResult{Freezer: freezer, Trials: cfg.Trials, Samples: samples}
	sorted := slices.Sorted(slices.Values(samples))
	res.P50, res.P99, res.Max = percentile(sorted, 0.50), percentile(sorted, 0.99), sorted[len(sorted)-1]
	slices.Sort(restore)
	res.RestoreP50 = percentile(restore, 0.50)
	printf("reaction (%s freezer, loop %v, duty period %v, %d trials): p50 %.1f ms, p99 %.1f ms, max %.1f ms; "+
		"back to duty 0 and thawed in %.0f ms (p50)\n", freezer, cfg.LoopPeriod, cfg.Period, cfg.Trials,
		res.P50, res.P99, res.Max, res.RestoreP50)
	return res, nil
}

// waitFrozen polls g's freezer state every millisecond until it is FROZEN and returns the
// time since t0.
func waitFrozen(ctx context.Context, g *cgroups.Group, t0 time.Time) (time.Duration, error) {
	for {
		f, err := g.Frozen()
		if err != nil {
			return 0, err
		}
		if f {
			return time.Since(t0), nil
		}
		if time.Since(t0) > reactionWait {
			return 0, fmt.Errorf("cgroup %s not frozen %v after the LS step", g.Path(), reactionWait)
		}
		if err := sleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
			return 0, err
		}
	}
}

// waitIdle waits until a manager step after since has decided duty 0 for the GPU, with
// the batch pod seen on it, and the group is thawed.
func waitIdle(ctx context.Context, m *gpu.Manager, g *cgroups.Group, since time.Time) error {
	deadline := time.Now().Add(reactionWait)
	for {
		st := m.Status()
		var gs *gpu.GPUStatus
		for i := range st.GPUs {
			if st.GPUs[i].Index == reactionGPU {
				gs = &st.GPUs[i]
			}
		}
		if !st.Time.Before(since) && gs != nil && gs.Decision.Duty == 0 && len(gs.BatchPods) > 0 {
			f, err := g.Frozen()
			if err != nil {
				return err
			}
			if !f {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GPU %d not back to duty 0 with the batch pod on it and its cgroup thawed %v "+
				"after LS left (status at %s: %s; GPUs %+v)", reactionGPU, reactionWait,
				st.Time.Format(time.RFC3339Nano), st.Error, st.GPUs)
		}
		if err := sleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
			return err
		}
	}
}

// printfWriter writes the manager's warnings to the bench's progress output.
type printfWriter func(string, ...any)

func (w printfWriter) Write(p []byte) (int, error) {
	w("%s", p)
	return len(p), nil
}
