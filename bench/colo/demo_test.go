package colo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/config"
)

// TestMain lets the test binary play the LS server, the batch workers and the memory
// scenario's pods, which the scenarios start by re-executing themselves.
func TestMain(m *testing.M) {
	if IsChild(os.Args[1:]) {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		err := Child(ctx, os.Args[1:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemoEndToEnd runs `make demo`'s scenario with short phases on this machine and
// checks it prints every phase and leaves nothing behind.
func TestDemoEndToEnd(t *testing.T) {
	sc := realScenarioConfig(t, "the demo")
	sc.batchPods, sc.threads, sc.rounds, sc.rate, sc.workers = 2, 1, 100, 200, 16
	dc := demoConfig{phase: time.Second, warmup: 300 * time.Millisecond, threshold: 0.9, period: 100 * time.Millisecond,
		rounds: 2}
	var out bytes.Buffer
	if err := runDemo(context.Background(), sc, dc, func(f string, a ...any) { fmt.Fprintf(&out, f, a...) }); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, row := range []string{"LS alone", "LS + batch, no agent", "LS + batch, agent tier", "LS + batch, agent in-place",
		"round 2/2: no agent → tier → alone → in-place", "The agent against no agent"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("output lacks the %q row:\n%s", row, out.String())
		}
	}
	base := fmt.Sprintf("understory-demo-%d", os.Getpid())
	for _, c := range []string{"cpu", "cpuacct", "freezer", "unified"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, base)); err == nil {
			t.Errorf("the demo left /sys/fs/cgroup/%s/%s behind", c, base)
		}
	}
}

// realScenarioConfig is the configuration of a scenario that runs on this machine's
// cgroups, as root, with a freshly built koordlet and this test binary as its pods
// (see TestMain); what names the test in messages. It skips with -short, and without
// root outside CI.
func realScenarioConfig(t *testing.T, what string) scenarioConfig {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "%s creates cgroups: needs root", what)
	}
	if testing.Short() {
		t.Skip("-short")
	}
	cgroupstest.LockCPU(t)
	bin := filepath.Join(t.TempDir(), "koordlet")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/understory/understory/cmd/koordlet").CombinedOutput(); err != nil {
		t.Fatalf("building koordlet: %v\n%s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return scenarioConfig{cgroupRoot: "/sys/fs/cgroup", koordlet: bin, self: self, lsCPU: "1",
		tierParent: config.TierParentKubepods}
}

func TestDemoRefusesWithoutCgroupfs(t *testing.T) {
	t.Parallel()
	_, err := checkMachine(t.TempDir())
	if os.Geteuid() != 0 {
		if err == nil || !strings.Contains(err.Error(), "root") {
			t.Fatalf("not root: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "no cgroup filesystem") {
		t.Fatalf("empty cgroup root: %v; want a clear message", err)
	}
}
