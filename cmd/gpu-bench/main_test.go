package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

// TestMain runs the agent_cpu part's agent process when the part re-executes the test
// binary as "agent-node", as it does the bench binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == agentNodeCmd {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent-node:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-duties", "0.5,1"}, `-duties: "1" is not a fraction in (0, 1)`},
		{[]string{"-duties", "x"}, `-duties: "x"`},
		{[]string{"-duties", " , "}, "-duties: no duty given"},
		{[]string{"-period", "1ms"}, "-period 1ms not in [10ms, 1s]"},
		{[]string{"-window", "150ms"}, "-window 150ms must be a whole number of periods (100ms)"},
		{[]string{"-point", "100ms"}, "-point 100ms must be at least one window (500ms)"},
		{[]string{"-freezers", "v3"}, `-freezers: "v3" is neither v1 nor v2`},
		{[]string{"-freezers", "v1,v1"}, "-freezers: v1 given twice"},
		{[]string{"-freezers", ","}, "-freezers: none given"},
		{[]string{"-cgroup-root", ""}, "-cgroup-root: empty"},
		{[]string{"-parts", "duty,gpu"}, `-parts: "gpu" is not one of duty, reaction, collect, agent_cpu`},
		{[]string{"-parts", ","}, "-parts: no part given"},
		{[]string{"-trials", "0"}, "-trials 0 not in [1, 10000]"},
		{[]string{"-loop-period", "0s"}, "-loop-period 0s not in [1ms, 1s]"},
		{[]string{"-collect-scrapes", "0"}, "-collect-scrapes 0 not in [1, 1000000]"},
		{[]string{"-collect-procs", "-1"}, "-collect-procs -1 not in [0, 64]"},
		{[]string{"-agent-duration", "500ms"}, "-agent-duration 500ms not in [1s, 1h0m0s]"},
		{[]string{"-agent-warmup", "-1s"}, "-agent-warmup -1s not in [0s, 1h0m0s]"},
		{[]string{"-agent-procs", "0"}, "-agent-procs 0 not in [1, 16]"},
		{[]string{"-agent-gpus", "ls,ls"}, "-agent-gpus: 2 roles, want one for each of the mock's 8 GPUs"},
		{[]string{"-agent-gpus", "ls,ls,ls,ls,ls,ls,ls,train"}, `-agent-gpus: "train" is not one of shared`},
		{[]string{"-agent-full-scrape-period", "10ms"}, "-agent-full-scrape-period 10ms not in [-loop-period (50ms), 10s]"},
		{[]string{agentNodeCmd}, "usage: gpu-bench agent-node -spec FILE"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-nope"}, "flag provided but not defined"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// The bench end to end with a short setting, on this machine's real freezers: it writes
// the JSON with every point and removes its cgroups. Accuracy is the duty package's test
// (and the bench's own output), not checked here.
func TestBenchShort(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the bench test must run in CI, as root")
		}
		t.Skip("the duty bench creates cgroups: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "sub", "gpu.json"), "-parts", "duty", "-point", "400ms",
		"-window", "200ms", "-duties", "0.25,0.75")
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

// runShort runs the bench with args, writing out, and returns the result and its JSON.
func runShort(t *testing.T, out string, args ...string) (result, []byte) {
	t.Helper()
	var stdout bytes.Buffer
	if err := run(context.Background(), append([]string{"-out", out}, args...), &stdout, io.Discard); err != nil {
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
		if os.Getenv("CI") == "true" {
			t.Fatal("the bench test must run in CI, as root")
		}
		t.Skip("the reaction bench creates a cgroup: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "gpu.json"), "-parts", "collect,reaction", "-trials", "2",
		"-collect-scrapes", "50")
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
		if os.Getenv("CI") == "true" {
			t.Fatal("the bench test must run in CI, as root")
		}
		t.Skip("the agent_cpu bench creates cgroups and runs the agent: needs root")
	}
	cgroupstest.LockCPU(t)
	res, b := runShort(t, filepath.Join(t.TempDir(), "gpu.json"), "-parts", "agent_cpu", "-agent-duration", "1s",
		"-agent-warmup", "0s", "-agent-procs", "1")
	a := res.AgentCPU
	if a == nil || res.AgentCPUPctOfCore == nil || res.AgentRSSMiB == nil || a.GPUOff == nil ||
		a.GPUShareOfCorePct == nil {
		t.Fatalf("agent_cpu missing in %s", b)
	}
	if !(*res.AgentCPUPctOfCore > 0 && *res.AgentCPUPctOfCore < 100) || !(a.RSSMiB > 1) || !(a.GPUOff.RSSMiB > 1) ||
		a.Pods != 110 || a.GPUs != 8 || a.GPUProcesses != 8 || a.Included == "" {
		t.Fatalf("agent_cpu %+v in %s", a, b)
	}
	want := map[string]string{roleShared: "fast", roleLS: "probe", roleBatch: "probe", roleIdle: "probe"}
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
