package gpubench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// TestMain runs the agent_cpu part's agent process when the part re-executes the test
// binary as "agent-node", as it does the bench binary.
func TestMain(m *testing.M) {
	if IsChild(os.Args[1:]) {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := Child(ctx, os.Args[1:], os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent-node:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The bench end to end with a short setting, on this machine's real freezers: it writes
// the JSON with every point and removes its cgroups. Accuracy is the duty package's test
// (and the bench's own output), not checked here.
func TestBenchShort(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "the duty bench creates cgroups: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "sub", "gpu.json"), func(c *Config) {
		c.Parts, c.Duty.Point, c.Duty.Window, c.Duty.Duties = []string{partDuty}, 400*time.Millisecond,
			200*time.Millisecond, []float64{0.25, 0.75}
	})
	if len(res.Duty) == 0 || len(res.DutyErrorPct) != 2 {
		t.Fatalf("result %s", b)
	}
	for _, key := range []string{"25", "75"} {
		if v, ok := res.DutyErrorPct[key]; !ok || math.IsNaN(v) || v < 0 || v > 100 {
			t.Fatalf("duty_error_pct[%s] = %v, %v in %s", key, v, ok, b)
		}
	}
	for _, r := range res.Duty {
		if len(r.Points) != 2 || r.Points[0].Windows != 2 || r.Points[0].BaselineCPUs <= 0 {
			t.Fatalf("%s points %+v", r.Freezer, r.Points)
		}
	}
	for _, want := range []string{`"period_ms": 100`, `"window_ms": 200`, `"duty_error_max_pct"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s", want)
		}
	}
	if strings.Contains(string(b), "reaction_ms") || strings.Contains(string(b), "collect_us_per_device") {
		t.Errorf("parts that did not run appear in %s", b)
	}
	checkNoLeftovers(t)
}

// runShort runs the bench with DefaultConfig changed by set, writing out, and returns the
// result and its JSON.
func runShort(t *testing.T, out string, set func(*Config)) (result, []byte) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Out = out
	set(&cfg)
	var stdout bytes.Buffer
	if err := Run(context.Background(), cfg, func(f string, a ...any) { fmt.Fprintf(&stdout, f, a...) }); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	t.Log(stdout.String())
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return res, b
}

// checkNoLeftovers fails t if a bench cgroup is left behind.
func checkNoLeftovers(t *testing.T) {
	t.Helper()
	for _, c := range []string{"freezer", "unified", "cpu", "memory", ""} {
		dir := filepath.Join("/sys/fs/cgroup", c)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "understory-gpu-bench-") {
				t.Errorf("left behind %s/%s", dir, e.Name())
			}
		}
	}
}

// The reaction and collect parts end to end, briefly: two LS steps through the real
// pipeline (NVML mock, collector, manager, cycler, this machine's freezer) each freeze
// the batch cgroup, and the collector's cost is measured. Timing targets are the
// bench's output, not checked here.
func TestReactionAndCollectShort(t *testing.T) {
	if !haveCgo {
		t.Skip("the reaction and collect parts need NVML, which needs cgo (CGO_ENABLED=1)")
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "the reaction bench creates a cgroup: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "gpu.json"), func(c *Config) {
		c.Parts, c.Reaction.Trials, c.Collect.Iterations = []string{partReaction, partCollect}, 2, 50
	})
	r := res.ReactionMs
	if r == nil || len(r.Samples) != 2 || r.Trials != 2 || r.Freezer == "" {
		t.Fatalf("reaction_ms %+v in %s", r, b)
	}
	for _, v := range r.Samples {
		if !(v > 0 && v < 10_000) {
			t.Errorf("reaction sample %v ms", v)
		}
	}
	if !(r.P50 <= r.P99 && r.P99 <= r.Max) || r.Max != max(r.Samples[0], r.Samples[1]) {
		t.Errorf("reaction percentiles %+v", r)
	}
	c := res.Collect
	if res.CollectUSPerDevice == nil || c == nil || !(*res.CollectUSPerDevice > 0) || c.GPUs != 8 ||
		c.Scrapes != 50 || c.ProcsPerGPU != 4 || *res.CollectUSPerDevice != c.USPerDevice {
		t.Fatalf("collect %+v, collect_us_per_device %v in %s", c, res.CollectUSPerDevice, b)
	}
	for _, want := range []string{`"parts": [`, `"reaction",`, `"loop_period_ms": 50`, `"lsUtilOnPercent": 2`,
		`"hold": "100ms"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s", want)
		}
	}
	if res.DutyErrorPct != nil || res.Duty != nil || strings.Contains(string(b), "duty_error_max_pct") {
		t.Errorf("the duty part did not run but appears in %s", b)
	}
	checkNoLeftovers(t)
}

// The agent_cpu part end to end, briefly: the agent runs in its own process (this test
// binary, re-executed) over 110 pods on real cgroups and the 8-GPU mock, with GPU
// features on and off; the JSON has both figures and what the agent saw of each GPU. The
// 1 % target is the bench's output, not checked here.
func TestAgentCPUShort(t *testing.T) {
	if !haveCgo {
		t.Skip("the agent_cpu part needs NVML, which needs cgo (CGO_ENABLED=1)")
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "the agent_cpu bench creates cgroups and runs the agent: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "gpu.json"), func(c *Config) {
		c.Parts, c.AgentCPU.Duration, c.AgentCPU.Warmup, c.AgentCPU.ProcsPerPod = []string{partAgentCPU}, time.Second, 0, 1
	})
	a := res.AgentCPU
	if a == nil || res.AgentCPUPctOfCore == nil || res.AgentRSSMiB == nil || a.GPUOff == nil ||
		a.GPUShareOfCorePct == nil {
		t.Fatalf("agent_cpu missing in %s", b)
	}
	if !(*res.AgentCPUPctOfCore > 0 && *res.AgentCPUPctOfCore < 100) || !(a.RSSMiB > 1) || !(a.GPUOff.RSSMiB > 1) ||
		a.Pods != 110 || a.GPUs != 8 || a.GPUProcesses != 8 || a.Included == "" {
		t.Fatalf("agent_cpu %+v in %s", a, b)
	}
	want := map[string]string{roleShared: "frozen", roleLS: "probe", roleBatch: "probe", roleIdle: "probe"}
	if len(a.GPUsSeen) != 8 {
		t.Fatalf("GPU status %+v", a.GPUsSeen)
	}
	for _, g := range a.GPUsSeen {
		if g.Cadence != want[g.Role] {
			t.Errorf("GPU %d (%s): cadence %q, want %q", g.Index, g.Role, g.Cadence, want[g.Role])
		}
	}
	for _, s := range []string{`"agent_cpu_pct_of_core"`, `"full_scrape_period_ms": 1000`, `"gpu_off"`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("JSON lacks %s", s)
		}
	}
	checkNoLeftovers(t)
}
