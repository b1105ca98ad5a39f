package duty

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// Real-cgroup tests: CPU burners (a one-thread shell busy loop, so that the kernel's
// per-task run and run-queue wait times describe it exactly) in uniquely named groups
// stand in for GPU processes, on the v1 freezer (/sys/fs/cgroup/freezer, via the hybrid
// hierarchy) and on cgroup2's cgroup.freeze (/sys/fs/cgroup/unified on this hybrid
// machine, /sys/fs/cgroup on a pure v2 one). Groups are removed in t.Cleanup, after a
// thaw (a frozen v1 task does not die) and the burner's kill.

const (
	realRoot = "/sys/fs/cgroup"
	// cyclerEnv turns the test binary into an agent stand-in: "<root>\n<rel>" runs a
	// Cycler freezing rel for whole periods, prints "frozen" once it is, and waits to be
	// killed (at most childMaxLife).
	cyclerEnv    = "UNDERSTORY_DUTY_TEST_CYCLER"
	childMaxLife = 2 * time.Minute
	// burnerScript is the CPU burner; it runs until killed (Pdeathsig kills it with the
	// test process).
	burnerScript = "while :; do :; done"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(cyclerEnv); spec != "" {
		if err := cyclerChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "cycler child:", err)
			os.Exit(2)
		}
		return
	}
	os.Exit(m.Run())
}

func cyclerChild(spec string) error {
	root, rel, ok := strings.Cut(spec, "\n")
	if !ok {
		return fmt.Errorf("bad spec %q", spec)
	}
	h, err := cgroups.Open(root)
	if err != nil {
		return err
	}
	g, err := h.Load(rel)
	if err != nil {
		return err
	}
	c, err := New(100*time.Millisecond, nil)
	if err != nil {
		return err
	}
	if err := c.Set("gpu0", []*cgroups.Group{g}, 1); err != nil {
		return err
	}
	go func() { _ = c.Run(context.Background()) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if f, _ := g.Frozen(); f {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("group never froze")
		}
	}
	fmt.Println("frozen")
	time.Sleep(childMaxLife)
	return nil
}

// realKind is one freezer implementation on this machine.
type realKind struct {
	name string
	open func(t *testing.T) (h *cgroups.Hierarchy, root string)
	// mk creates rel under h.
	mk func(t *testing.T, h *cgroups.Hierarchy, root, rel string) *cgroups.Group
}

var realKinds = []realKind{
	{name: "v1-freezer", open: func(t *testing.T) (*cgroups.Hierarchy, string) {
		h, err := cgroups.Open(realRoot)
		if err != nil {
			t.Skipf("no cgroup hierarchy at %s: %v", realRoot, err)
		}
		if h.Layout() == cgroups.LayoutV2 || !isDir(filepath.Join(realRoot, "freezer")) {
			t.Skipf("no v1 freezer hierarchy at %s/freezer (layout %v)", realRoot, h.Layout())
		}
		return h, realRoot
	}, mk: func(t *testing.T, h *cgroups.Hierarchy, _, rel string) *cgroups.Group {
		g, err := h.Create(rel)
		if err != nil {
			t.Fatalf("Create(%s): %v", rel, err)
		}
		return g
	}},
	{name: "v2-cgroup.freeze", open: func(t *testing.T) (*cgroups.Hierarchy, string) {
		root := filepath.Join(realRoot, "unified")
		if isFile(filepath.Join(realRoot, "cgroup.controllers")) {
			root = realRoot
		}
		if !isFile(filepath.Join(root, "cgroup.controllers")) {
			t.Skipf("no cgroup2 hierarchy at %s", root)
		}
		h, err := cgroups.Open(root)
		if err != nil || h.Layout() != cgroups.LayoutV2 {
			t.Fatalf("Open(%s) = %v, %v; want a v2 layout", root, h, err)
		}
		return h, root
	}, mk: func(t *testing.T, h *cgroups.Hierarchy, root, rel string) *cgroups.Group {
		// Not Create: it enables +cpu along the path, which a hybrid's controller-less
		// unified hierarchy refuses. cgroup.freeze needs no controller.
		if err := os.Mkdir(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
		g, err := h.Load(rel)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}},
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "real-cgroup tests need root")
	}
}

func uniqueName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "understory-duty-test-" + hex.EncodeToString(b)
}

// burnerGroup creates a unique group of kind k with a CPU burner in it. Cleanup thaws the
// group, kills the burner and removes the group.
func burnerGroup(t *testing.T, k realKind) (g *cgroups.Group, pid int, h *cgroups.Hierarchy, root string) {
	t.Helper()
	h, root = k.open(t)
	rel := uniqueName(t)
	g = k.mk(t, h, root, rel)
	cmd := exec.Command("/bin/sh", "-c", burnerScript)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting burner: %v", err)
	}
	t.Cleanup(func() {
		dirs := []string{filepath.Join(root, "freezer", rel), filepath.Join(root, "unified", rel), filepath.Join(root, rel)}
		for _, dir := range dirs {
			_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
			_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		var err error
		for range 100 {
			if err = g.Delete(); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("removing %s: %v", rel, err)
		}
		if isDir(filepath.Join(root, rel)) || isDir(filepath.Join(root, "freezer", rel)) {
			t.Errorf("cleanup left %s behind", rel)
		}
	})
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	return g, cmd.Process.Pid, h, root
}

// procSched returns the CPU time of all of pid's threads and the time they spent
// runnable on a run queue without running, from /proc/<pid>/task/*/schedstat
// (nanoseconds; /proc/<pid>/stat counts only in 10 ms ticks).
func procSched(t *testing.T, pid int) (run, wait time.Duration) {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(files) == 0 {
		t.Fatalf("no schedstat for pid %d: %v", pid, err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that exited
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			t.Fatalf("%s: %q", p, b)
		}
		r, err1 := strconv.ParseInt(f[0], 10, 64)
		w, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %q", p, b)
		}
		run += time.Duration(r)
		wait += time.Duration(w)
	}
	return run, wait
}

func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	run, _ := procSched(t, pid)
	return run
}

func waitFrozen(t *testing.T, g *cgroups.Group, want bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := g.Frozen()
		if err != nil {
			t.Fatalf("Frozen: %v", err)
		}
		if f == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: Frozen() = %v for 5 s, want %v", g.Path(), f, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// dutyMeasure is what measureFrozen found.
type dutyMeasure struct {
	// Frozen is 1 - (CPU rate in the cycled windows / CPU rate in the baseline windows):
	// the share of its unfrozen CPU the burner lost.
	Frozen float64
	// Runnable is the frozen fraction seen by the scheduler: 1 - (run + run-queue wait) /
	// wall time in the cycled windows. A busy loop is runnable whenever it is not frozen,
	// so this is the CPU it got relative to the CPU it would have got unfrozen under the
	// same contention, whatever other load the machine has.
	Runnable float64
	// BaseRate is the burner's CPUs in the baseline windows; Contention the share of its
	// runnable time it spent waiting for a CPU (baseline and cycled windows together).
	BaseRate, Contention float64
}

// measureFrozen runs rounds of a baseline window (unfrozen) and a cycled window (duty d),
// alternating which comes first (ABBA) so that a trend in the machine's load cancels.
// Cycled windows are whole periods (window must be a multiple of the period).
func measureFrozen(t *testing.T, c *Cycler, g *cgroups.Group, pid int, d float64, window time.Duration,
	rounds int) dutyMeasure {
	t.Helper()
	var baseRun, baseWait, baseWall, cycRun, cycWait, cycWall time.Duration
	baseline := func() {
		waitFrozen(t, g, false)
		r0, w0 := procSched(t, pid)
		t0 := time.Now()
		time.Sleep(window)
		r1, w1 := procSched(t, pid)
		baseWall += time.Since(t0)
		baseRun, baseWait = baseRun+r1-r0, baseWait+w1-w0
	}
	cycled := func() {
		if err := c.Set("gpu0", []*cgroups.Group{g}, d); err != nil {
			t.Fatal(err)
		}
		// The rise from 0 froze at once, off the period clock: measure from the next
		// period start, over whole periods.
		start := c.NextPeriod(time.Now())
		time.Sleep(time.Until(start))
		r0, w0 := procSched(t, pid)
		t0 := time.Now()
		time.Sleep(time.Until(start.Add(window)))
		r1, w1 := procSched(t, pid)
		cycWall += time.Since(t0)
		cycRun, cycWait = cycRun+r1-r0, cycWait+w1-w0
		if err := c.Set("gpu0", nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	for r := range rounds {
		if r%2 == 0 {
			baseline()
			cycled()
		} else {
			cycled()
			baseline()
		}
	}
	m := dutyMeasure{BaseRate: baseRun.Seconds() / baseWall.Seconds()}
	m.Frozen = 1 - (cycRun.Seconds()/cycWall.Seconds())/m.BaseRate
	m.Runnable = 1 - (cycRun+cycWait).Seconds()/cycWall.Seconds()
	if all := baseRun + baseWait + cycRun + cycWait; all > 0 {
		m.Contention = (baseWait + cycWait).Seconds() / all.Seconds()
	}
	return m
}

// At a 50 % duty cycle a burner gets 50 % ± 5 % of its unfrozen CPU, on both freezers.
//
// Unfrozen CPU is measured two ways: baseline windows interleaved with the cycled ones,
// and the scheduler's own account (run + run-queue wait). The second must hold always;
// the first only when the machine leaves the burner a CPU of its own (run-queue wait
// under 10 %): with other load the burner's share varies from window to window, and after
// a thaw the tasks that ran meanwhile compete with it, which the baseline cannot show.
func TestRealDutyCycle(t *testing.T) {
	needRoot(t)
	for _, k := range realKinds {
		t.Run(k.name, func(t *testing.T) {
			cgroupstest.LockCPU(t)
			g, pid, _, _ := burnerGroup(t, k)
			c := newCycler(t, 100*time.Millisecond)
			startRun(t, c)
			const duty, tolerance, quiet = 0.5, 0.05, 0.10
			within := func(f float64) bool { return f-duty >= -tolerance && f-duty <= tolerance }
			var errs []string
			for attempt := range 3 {
				m := measureFrozen(t, c, g, pid, duty, 500*time.Millisecond, 4)
				t.Logf("attempt %d: burner lost %.1f %% of its unfrozen CPU (baseline %.2f CPUs), frozen %.1f %% "+
					"by the scheduler's account, %.1f %% run-queue wait (target %.0f %%)",
					attempt, m.Frozen*100, m.BaseRate, m.Runnable*100, m.Contention*100, duty*100)
				switch {
				case !within(m.Runnable):
					errs = append(errs, fmt.Sprintf("scheduler's account %.1f %%", m.Runnable*100))
				case m.Contention < quiet && !within(m.Frozen):
					errs = append(errs, fmt.Sprintf("against the baseline %.1f %%", m.Frozen*100))
				default:
					if m.Contention >= quiet {
						t.Logf("the machine is busy (%.0f %% run-queue wait): the baseline comparison is not "+
							"checked", m.Contention*100)
					}
					return
				}
			}
			t.Fatalf("duty %.0f %% never within ±%.0f points: %s", duty*100, tolerance*100, strings.Join(errs, "; "))
		})
	}
}

// When Run's ctx ends, every group it froze is thawed, mid-cycle or at duty 1.
func TestRealShutdownThaws(t *testing.T) {
	needRoot(t)
	for _, k := range realKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			g, pid, _, _ := burnerGroup(t, k)
			for _, duty := range []float64{0.5, 1} {
				c := newCycler(t, 100*time.Millisecond)
				stop := startRun(t, c)
				if err := c.Set("gpu0", []*cgroups.Group{g}, duty); err != nil {
					t.Fatal(err)
				}
				waitFrozen(t, g, true)
				if duty == 1 {
					// A deliberate window: the burner's CPU counter must stay still over it.
					c0 := procCPU(t, pid)
					time.Sleep(200 * time.Millisecond)
					if used := procCPU(t, pid) - c0; used > 5*time.Millisecond {
						t.Fatalf("a burner frozen at duty 1 used %v in 200 ms", used)
					}
				} else {
					time.Sleep(230 * time.Millisecond) // somewhere in a cycle
				}
				if err := stop(); err != nil {
					t.Fatalf("Run = %v", err)
				}
				if f, err := g.Frozen(); err != nil || f {
					t.Fatalf("duty %v: Frozen after Run ended = %v, %v", duty, f, err)
				}
				waitCPU(t, pid)
			}
		})
	}
}

// waitCPU waits (up to 5 s) until pid uses CPU again.
func waitCPU(t *testing.T, pid int) {
	t.Helper()
	c0 := procCPU(t, pid)
	deadline := time.Now().Add(5 * time.Second)
	for ; procCPU(t, pid)-c0 < 10*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the burner got no CPU within 5 s of the thaw")
		}
	}
}

// An agent killed with SIGKILL while it has a group frozen leaves it frozen; ThawStale,
// run by the next agent at start, thaws it.
func TestRealKillRestart(t *testing.T) {
	needRoot(t)
	for _, k := range realKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			g, pid, _, root := burnerGroup(t, k)
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), cyclerEnv+"="+root+"\n"+g.Path())
			child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			child.Stderr = os.Stderr
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = child.Process.Kill()
				_ = child.Wait()
			})
			line := make(chan string, 1)
			go func() {
				s, _ := bufio.NewReader(out).ReadString('\n')
				line <- strings.TrimSpace(s)
			}()
			select {
			case s := <-line:
				if s != "frozen" {
					t.Fatalf("cycler child said %q", s)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("cycler child never froze the group")
			}
			if err := child.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := child.Wait(); err == nil {
				t.Fatal("the killed child exited cleanly")
			}
			// The freeze outlived the killed agent: that is what recovery is for.
			if f, err := g.Frozen(); err != nil || !f {
				t.Fatalf("after kill -9: Frozen = %v, %v; want still frozen", f, err)
			}
			// A deliberate window: the frozen burner's CPU counter must stay still over it.
			c0 := procCPU(t, pid)
			time.Sleep(100 * time.Millisecond)
			if used := procCPU(t, pid) - c0; used > 5*time.Millisecond {
				t.Fatalf("the frozen burner used %v", used)
			}

			stale, err := ThawStale(context.Background(), []*cgroups.Group{g})
			if err != nil || len(stale) != 1 || stale[0] != g.Path() {
				t.Fatalf("ThawStale = %v, %v; want [%s]", stale, err, g.Path())
			}
			if f, err := g.Frozen(); err != nil || f {
				t.Fatalf("after ThawStale: Frozen = %v, %v", f, err)
			}
			waitCPU(t, pid)
			// A second start finds nothing to thaw.
			if stale, err := ThawStale(context.Background(), []*cgroups.Group{g}); err != nil || len(stale) != 0 {
				t.Fatalf("second ThawStale = %v, %v", stale, err)
			}
		})
	}
}
