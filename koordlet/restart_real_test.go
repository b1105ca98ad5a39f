package koordlet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/config"
)

// killLoopIterations is how many times TestKill9LoopLeavesNothingFrozen kills the agent
// with batch frozen.
const killLoopIterations = 50

// thawDeadline is how long after a restart the batch cgroups may still be frozen.
const thawDeadline = 5 * time.Second

// TestKill9LoopLeavesNothingFrozen runs the real agent binary on this machine's cgroups
// (a fake node under a unique kubelet --cgroup-root) with the tier, a pod below it, two
// in-place batch pods and a container of one frozen on its own, each with a live
// sleeping process, frozen as the agent freezes them (cgroups.Group.Freeze, the
// actuator's call: a real freeze episode needs LS to starve batch for freezeAfter, which
// a shared test machine cannot stage on cue), and kills it with SIGKILL; 50 times. After each restart nothing may
// be frozen within 5 s; the sleepers, never killed, must then die on SIGKILL (a frozen
// v1 task cannot).
func TestKill9LoopLeavesNothingFrozen(t *testing.T) {
	h := realHierarchy(t)
	bin := buildAgent(t)
	base := fmt.Sprintf("understory-test-%d-%d", os.Getpid(), rand.Uint32())
	tier := path.Join(base, "kubepods", config.DefaultTierName)
	tierPod := path.Join(tier, "pod"+string(batchUID2))
	inPlace := path.Join(base, "kubepods/besteffort/pod"+string(batchUID1))
	inPlaceCtr := path.Join(inPlace, "ctr")
	inPlace2 := path.Join(base, "kubepods/burstable/pod"+string(invalidUID))
	t.Cleanup(func() {
		// The sleepers' and the agent's cleanups ran first (registered later); thaw what a
		// failure left frozen, then remove the node from every hierarchy.
		if _, err := h.ThawTree(context.Background(), base); err != nil {
			t.Errorf("cleanup thaw: %v", err)
		}
		if err := h.RemoveEmpty(base); err != nil {
			t.Errorf("cleanup %s: %v", base, err)
		}
	})
	for _, rel := range []string{base, path.Join(base, "kubepods"), path.Join(base, "kubepods/besteffort"),
		path.Join(base, "kubepods/burstable"), tier, tierPod, inPlace, inPlaceCtr, inPlace2} {
		if _, err := h.Create(rel); err != nil {
			t.Fatal(err)
		}
	}
	var sleepers []*exec.Cmd
	for _, rel := range []string{tierPod, inPlaceCtr, inPlace2} {
		sleepers = append(sleepers, sleeper(t, h, rel))
	}
	// Cleanups run last first: this thaw comes before the sleepers' kills, which a
	// frozen v1 task would not answer.
	t.Cleanup(func() { _, _ = h.ThawTree(context.Background(), base) })

	dir := t.TempDir()
	manifests := filepath.Join(dir, "pods")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name string
		uid  string
		res  string
	}{
		{"batch-inplace", string(batchUID1), ""},
		{"batch-tier", string(batchUID2), ""},
		{"batch-inplace-burstable", string(invalidUID), "\n    resources: {requests: {cpu: 100m}}"},
	} {
		m := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + p.name + "\n  uid: " + p.uid +
			"\n  annotations:\n    understory.io/qos-class: batch\nspec:\n  containers:\n  - name: c\n    image: busybox" + p.res + "\n"
		if err := os.WriteFile(filepath.Join(manifests, p.name+".yaml"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(dir, "koordlet.yaml")
	// freezeAfter 0: the agent never freezes on its own here (this machine's load could
	// make it, at any moment): what is frozen after a restart is what the killed run
	// left, and only the start-up thaw may clear it.
	cfg := "kubeletCgroupRoot: /" + base + "\nsignals: {mode: sampling}\ngpu: {mode: disabled}\nescalation: {freezeAfter: 0s}\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	start := func(i int) (*exec.Cmd, string) {
		t.Helper()
		logPath := filepath.Join(dir, fmt.Sprintf("agent-%02d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-config", cfgPath, "-pod-manifests", manifests, "-listen", "127.0.0.1:0",
			"-cgroup-root", config.DefaultCgroupRoot)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		_ = logf.Close()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd, logPath
	}
	started := func(logPath string) bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "koordlet started")
	}
	freeze := func() {
		t.Helper()
		// As the agent freezes: the tier (and with it the pod below it) and each
		// in-place pod; the container on its own, as a thaw of the pod that did not reach
		// it would leave it (a child's own freeze outlives its parent's thaw).
		for _, rel := range []string{inPlaceCtr, tier, inPlace, inPlace2} {
			g, err := h.Load(rel)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Freeze(); err != nil {
				t.Fatalf("freezing %s: %v", rel, err)
			}
		}
	}

	var maxThaw, sumThaw time.Duration
	agent, logPath := start(0)
	testenv.WaitFor(t, 30*time.Second, "the agent to start", func() bool { return started(logPath) })
	for i := 1; i <= killLoopIterations; i++ {
		// A running agent thaws a tier it did not decide to freeze (it reads the freezer
		// back every period): stop it first, so that the kill finds batch frozen as a
		// crash in the middle of a freeze would.
		if err := agent.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the agent to stop", func() bool { return stopped(agent.Process.Pid) })
		freeze()
		if got := frozenBelow(t, h, base); len(got) < 5 {
			t.Fatalf("iteration %d: frozen before the kill %q, want the tier, its pod, both in-place pods and the container", i, got)
		}
		if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = agent.Wait()
		if got := frozenBelow(t, h, base); len(got) < 5 {
			t.Fatalf("iteration %d: the kill thawed %q: nothing to test", i, got)
		}
		t0 := time.Now()
		agent, logPath = start(i)
		var left []string
		if !testenv.PollEvery(thawDeadline, time.Millisecond, func() bool {
			left = frozenBelow(t, h, base)
			return len(left) == 0
		}) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("iteration %d: %d cgroups still frozen %v after the restart: %q\nagent log:\n%s",
				i, len(left), thawDeadline, left, b)
		}
		d := time.Since(t0)
		maxThaw, sumThaw = max(maxThaw, d), sumThaw+d
		// The next kill hits a running agent, as a crash would.
		testenv.WaitFor(t, 30*time.Second, "the agent to start", func() bool { return started(logPath) })
	}
	t.Logf("%d kills with batch frozen: 0 cgroups frozen after each restart; time to thaw max %v, mean %v",
		killLoopIterations, maxThaw.Round(time.Millisecond), (sumThaw / killLoopIterations).Round(time.Millisecond))
	// The sleepers were frozen 50 times and never killed: they die now.
	for _, s := range sleepers {
		_ = s.Process.Signal(syscall.SIGKILL)
		done := make(chan struct{})
		go func() { _ = s.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(thawDeadline):
			t.Fatalf("sleeper %d did not die on SIGKILL: still frozen", s.Process.Pid)
		}
	}
}

// sleeper starts a sleeping process in the cgroup rel; it is killed at cleanup.
func sleeper(t *testing.T, h *cgroups.Hierarchy, rel string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if cmd.ProcessState == nil {
			_ = cmd.Wait()
		}
	})
	g, err := h.Load(rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// frozenBelow lists the cgroups at or below rel that a freezer of the machine reports
// frozen or freezing: v1 freezer.state not THAWED, cgroup2 cgroup.freeze 1 or
// cgroup.events "frozen 1".
func frozenBelow(t *testing.T, h *cgroups.Hierarchy, rel string) []string {
	t.Helper()
	var out []string
	check := func(mount, file string, frozen func(string) bool) {
		top := filepath.Join(mount, rel)
		err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			b, err := os.ReadFile(filepath.Join(p, file))
			if err != nil {
				return nil // removed, or no such file at this level
			}
			if frozen(strings.TrimSpace(string(b))) {
				r, _ := filepath.Rel(mount, p)
				out = append(out, r+" "+file+"="+strings.TrimSpace(string(b)))
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	root := h.Root()
	if h.Layout() != cgroups.LayoutV2 {
		check(filepath.Join(root, "freezer"), "freezer.state", func(s string) bool { return s != "THAWED" })
	}
	unified := root
	if h.Layout() == cgroups.LayoutHybrid {
		unified = filepath.Join(root, "unified")
	}
	if h.Layout() != cgroups.LayoutV1 {
		check(unified, "cgroup.freeze", func(s string) bool { return s == "1" })
		check(unified, "cgroup.events", func(s string) bool { return strings.Contains(s, "frozen 1") })
	}
	return out
}

// stopped reports whether every thread of process pid is stopped (state T): a SIGSTOP has
// taken effect and none of them can write a cgroup file any more.
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
