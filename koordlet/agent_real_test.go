package koordlet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
)

// realHierarchy opens the machine's cgroups or skips (fails in CI, where these tests
// must run) with the reason.
func realHierarchy(t *testing.T) *cgroups.Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "real-cgroup test needs root (creates cgroups and moves processes)")
	}
	h, err := cgroups.Open(config.DefaultCgroupRoot)
	if err != nil {
		testenv.SkipOrFailInCI(t, "real-cgroup test needs a writable cgroupfs at %s: %v", config.DefaultCgroupRoot, err)
	}
	cgroupstest.LockCPU(t)
	return h
}

// burner starts a busy loop in the cgroup rel and returns its PID; it is killed at cleanup.
func burner(t *testing.T, h *cgroups.Hierarchy, rel string) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	g, err := h.Load(rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestAgentRealCgroups runs the agent on this machine's cgroups: a fake node under a
// unique kubelet --cgroup-root with one busy LS pod, one busy batch pod held in place and
// one busy batch pod below the tier. The kernel must then hold batch to the budget.
func TestAgentRealCgroups(t *testing.T) {
	h := realHierarchy(t)
	base := fmt.Sprintf("understory-test-%d-%d", os.Getpid(), rand.Uint32())
	var created []string
	t.Cleanup(func() {
		// Deepest first; burners are killed by their own cleanups, which run before this one.
		sort.Slice(created, func(i, j int) bool { return strings.Count(created[i], "/") > strings.Count(created[j], "/") })
		for _, rel := range created {
			if g, err := h.Load(rel); err == nil {
				if err := g.Delete(); err != nil {
					t.Errorf("cleanup %s: %v", rel, err)
				}
			}
		}
	})
	mk := func(rel string) {
		t.Helper()
		if _, err := h.Create(rel); err != nil {
			t.Fatal(err)
		}
		created = append(created, rel)
	}
	lsCg := path.Join(base, "kubepods/burstable/pod"+string(lsUID))
	inPlace := path.Join(base, "kubepods/besteffort/pod"+string(batchUID1))
	tier := path.Join(base, "kubepods", config.DefaultTierName)
	inTier := path.Join(tier, "pod"+string(batchUID2))
	for _, rel := range []string{base, path.Join(base, "kubepods"), path.Join(base, "kubepods/burstable"),
		path.Join(base, "kubepods/besteffort"), lsCg, inPlace} {
		mk(rel)
	}
	created = append(created, tier) // the agent creates it
	// Weigh the fake node like kubelet weighs kubepods, so that whatever else this
	// machine runs does not starve the test's busy loops.
	if g, err := h.Load(base); err != nil || g.SetCPUShares(8192) != nil {
		t.Fatalf("weighting %s: %v", base, err)
	}

	cfg := config.Default()
	cfg.KubeletCgroupRoot = "/" + base
	cfg.Period.Duration = 50 * time.Millisecond
	// Every quota write refills a CFS period's runtime; with the 1 s default a 2 s
	// window cannot tell such refills from overuse. 100 ms periods keep the check below
	// about the kernel holding batch to the quotas.
	cfg.CFSPeriod.Duration = 100 * time.Millisecond
	// A fixed budget, so that what the kernel allows can be checked against it whatever
	// else this machine runs; the dynamic budget is tested on fake cgroups.
	cfg.Policy.MinBatchCPU, cfg.Policy.MaxBatchCPU = 0.3, 0.3
	pods := newFakePods(
		testPod("ls", lsUID, nil, "500m"),
		testPod("batch-inplace", batchUID1, map[string]string{"understory.io/qos-class": "batch"}, ""),
		testPod("batch-tier", batchUID2, map[string]string{"understory.io/qos-class": "batch"}, ""),
	)
	a, err := New(cfg, Deps{Pods: pods, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The tier exists, idle, bounded at the minimum before the first period.
	tg, err := h.Load(tier)
	if err != nil {
		t.Fatal(err)
	}
	if q, p, err := tg.CPULimit(); err != nil || q <= 0 || float64(q)/float64(p) > cfg.Policy.MinBatchCPU+1e-3 {
		t.Fatalf("tier limit before the first period = %v/%v, %v; want ≤ %v CPU", q, p, err, cfg.Policy.MinBatchCPU)
	}
	mk(inTier) // as the runtime would, for a container the NRI plugin placed
	burner(t, h, lsCg)
	burner(t, h, inPlace)
	burner(t, h, inTier)
	burner(t, h, inTier)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			stopped = true
		}
	}
	t.Cleanup(stop)

	var st Status
	maxLS := 0.0
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		st = a.Status()
		maxLS = max(maxLS, st.Usage.LS)
	}
	// Auto mode picks the best harm signal this machine allows: eBPF (root, BTF), and
	// watches the LS pod by its cgroup2 id.
	if st.Signals.Requested != signals.ModeAuto || st.Signals.Active != signals.ModeEBPF || st.Signals.WatchedPods != 1 {
		t.Errorf("signals %+v: want auto → ebpf watching the LS pod", st.Signals)
	}
	if maxLS < 0.2 {
		b, _ := json.MarshalIndent(st, "", " ")
		t.Errorf("LS usage at most %.2f: the busy LS pod was not seen; status:\n%s", maxLS, b)
	}
	placement := map[string]string{}
	for _, e := range st.Pods["batch"] {
		placement[e.Name] = e.Placement
		if e.Error != "" {
			t.Errorf("%s: %s", e.Name, e.Error)
		}
	}
	if placement["batch-inplace"] != "in-place" || placement["batch-tier"] != "tier" {
		t.Fatalf("placements %v", placement)
	}
	// The kernel holds batch to the quotas the agent wrote, and those add up to at most
	// the budget.
	pg, err := h.Load(inPlace)
	if err != nil {
		t.Fatal(err)
	}
	quota := func(g *cgroups.Group) float64 {
		q, p, err := g.CPULimit()
		if err != nil || q < 0 {
			t.Fatalf("%s limit %v/%v, %v: want a quota", g.Path(), q, p, err)
		}
		return q.Seconds() / p.Seconds()
	}
	u0t, _ := tg.Stats()
	u0p, _ := pg.Stats()
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	u1t, _ := tg.Stats()
	u1p, _ := pg.Stats()
	wall := time.Since(t0).Seconds()
	budget := a.Status().Budget.Applied
	qt, qp := quota(tg), quota(pg)
	if qt+qp > budget+0.02 {
		t.Errorf("tier %.3f + in-place %.3f quotas exceed the budget %.3f", qt, qp, budget)
	}
	used := (u1t.Usage - u0t.Usage + u1p.Usage - u0p.Usage).Seconds() / wall
	// The split between the tier and the in-place pod moves with their demand; their sum
	// is what the kernel must hold to the budget. A quota write refills the group's
	// runtime and the window is not aligned with CFS periods, hence an allowance.
	if used > 1.2*budget+0.05 {
		t.Errorf("batch used %.2f CPU over a budget of %.2f", used, budget)
	}
	if idle, err := os.ReadFile(path.Join(config.DefaultCgroupRoot, "cpu", inPlace, "cpu.idle")); err == nil && strings.TrimSpace(string(idle)) != "1" {
		t.Errorf("in-place batch pod cpu.idle = %q, want 1", idle)
	}
	t.Logf("LS %.2f, system %.2f → budget %.2f; tier quota %.2f + in-place %.2f; batch used %.2f",
		st.Usage.LS, st.Usage.System, budget, qt, qp, used)

	// A batch pod cgroup removed under the agent is skipped, not fatal.
	stop()
	if q := quota(tg); q > cfg.Policy.MinBatchCPU+1e-3 {
		t.Errorf("tier quota after shutdown %.3f, want ≤ %.3f", q, cfg.Policy.MinBatchCPU)
	}
	if _, err := h.Load(path.Join(base, "does-not-exist")); !errors.Is(err, cgroups.ErrNotExist) {
		t.Errorf("Load of a missing group: %v", err)
	}
}

// TestAgentRealCutBelowContainerLimit: an in-place batch pod whose container has its own
// CFS limit (2 CPUs, as kubelet writes it) is cut below that limit, and the cut is in
// force: the kernel holds a busy loop in the container to the pod's share, and the cut is
// not clamped. On cgroup v1, which refuses a parent below its children, the container's
// limit is lowered too; on v2 the kernel min()s cpu.max along the path and the
// container keeps its own. Once in force nothing is rewritten while the share is
// unchanged, and when the pod leaves batch the pod is unlimited again and the container
// has its own limit.
func TestAgentRealCutBelowContainerLimit(t *testing.T) {
	h := realHierarchy(t)
	base := fmt.Sprintf("understory-test-%d-%d", os.Getpid(), rand.Uint32())
	inPlace := path.Join(base, "kubepods/besteffort/pod"+string(batchUID1))
	container := path.Join(inPlace, "ctr")
	tier := path.Join(base, "kubepods", config.DefaultTierName)
	created := []string{base, path.Join(base, "kubepods"), path.Join(base, "kubepods/besteffort"), inPlace, container}
	t.Cleanup(func() {
		for i := len(created); i >= 0; i-- {
			rel := tier
			if i < len(created) {
				rel = created[i]
			}
			if g, err := h.Load(rel); err == nil {
				if err := g.Delete(); err != nil {
					t.Errorf("cleanup %s: %v", rel, err)
				}
			}
		}
	})
	for _, rel := range created {
		if _, err := h.Create(rel); err != nil {
			t.Fatal(err)
		}
	}
	ctr, err := h.Load(container)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctr.SetCPULimit(200*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.KubeletCgroupRoot = "/" + base
	cfg.CFSPeriod.Duration = 100 * time.Millisecond
	cfg.Policy.MinBatchCPU, cfg.Policy.MaxBatchCPU = 0.1, 0.1
	cfg.Signals.Mode = string(signals.ModeSampling)
	pods := newFakePods(testPod("batch-inplace", batchUID1, map[string]string{"understory.io/qos-class": "batch"}, ""))
	cpu := &fakeCPU{times: collect.CPUTimes{CPUs: 2}}
	a, err := New(cfg, Deps{Pods: pods, NodeCPU: cpu, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.shutdown)
	a.syncPods(pods.List())
	now := time.Now()
	tick := func() {
		now = now.Add(100 * time.Millisecond)
		cpu.add(20*time.Millisecond, 200*time.Millisecond)
		a.tick(context.Background(), now)
	}
	limit := func(rel string) float64 {
		t.Helper()
		g, err := h.Load(rel)
		if err != nil {
			t.Fatal(err)
		}
		q, p, err := g.CPULimit()
		if err != nil {
			t.Fatal(err)
		}
		if q < 0 {
			return -1
		}
		return q.Seconds() / p.Seconds()
	}
	for range 5 {
		tick()
	}
	st := a.pods[batchUID1]
	pod, c := limit(inPlace), limit(container)
	if pod < 0 || pod > cfg.Policy.MaxBatchCPU+1e-6 {
		t.Fatalf("in-place pod %.3f CPUs; want within the %.2f budget", pod, cfg.Policy.MaxBatchCPU)
	}
	if h.Layout() == cgroups.LayoutV2 {
		if c != 2 {
			t.Fatalf("container %.3f CPUs on v2; want its own 2 (the pod's cpu.max bounds it)", c)
		}
	} else if c < 0 || c > pod+1e-6 {
		t.Fatalf("in-place pod %.3f, its container %.3f CPUs; want the container lowered to the pod's share", pod, c)
	}
	if st.act.quota.Clamped != 0 || st.lastErr != nil {
		t.Fatalf("pod quota %+v, error %v; want the cut in force, not clamped", st.act.quota.CPULimit, st.lastErr)
	}
	// The kernel holds the container's busy loop to the pod's share.
	burner(t, h, container)
	pg, err := h.Load(inPlace)
	if err != nil {
		t.Fatal(err)
	}
	u0, err := pg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Measure over 15 CFS periods (100 ms each here) in which the loop was runnable: the
	// kernel's own count, not a sleep.
	var u1 cgroups.CPUStats
	testenv.WaitFor(t, 30*time.Second, "15 CFS periods of the busy loop", func() bool {
		if u1, err = pg.Stats(); err != nil {
			t.Fatal(err)
		}
		return u1.NrPeriods >= u0.NrPeriods+15
	})
	used := (u1.Usage - u0.Usage).Seconds() / time.Since(t0).Seconds()
	t.Logf("pod cut to %.2f CPU, container limit %.2f: a busy loop in the container used %.3f CPUs", pod, c, used)
	// As in TestAgentRealCgroups: the window is not aligned with CFS periods.
	if used > 1.2*pod+0.05 {
		t.Fatalf("a busy loop in the container used %.3f CPUs under a pod cut to %.3f", used, pod)
	}
	written := st.act.quota.Written
	for range 20 {
		tick()
	}
	if st.act.quota.Written != written {
		t.Fatalf("pod quota rewritten at %v (first %v) although its share did not change", st.act.quota.Written, written)
	}
	// The pod leaves batch: kubelet's values come back, the container's 2 CPUs included.
	pods.pods[0].Annotations = nil
	a.syncPods(pods.List())
	if pod, c := limit(inPlace), limit(container); pod != -1 || c != 2 {
		t.Fatalf("after leaving batch: pod %.3f, container %.3f CPUs; want unlimited and 2", pod, c)
	}
}
