package psi

import (
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

	"golang.org/x/sys/unix"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// Real-PSI tests. They need a kernel with PSI and, for groups, root and a
// cgroup2 hierarchy (this machine: hybrid, cgroup2 without controllers at
// /sys/fs/cgroup/unified, v1 cpu at /sys/fs/cgroup/cpu). They make uniquely
// named groups at the top of the hierarchies and remove them in t.Cleanup
// (helpers killed first, anything left moved to the parent). Outside CI they
// skip with the reason; in CI (CI=true) they must run.

const (
	realProc   = "/proc"
	realCgroup = "/sys/fs/cgroup"
)

type realEnv struct {
	cgroup2    string // the cgroup2 mount
	cpuV1      string // the v1 cpu hierarchy; "" on a v2 node
	privileged bool   // CAP_SYS_RESOURCE: any window from MinWindow
	window     time.Duration
}

// requireReal returns the machine's PSI setup or skips (fails in CI).
func requireReal(t *testing.T, needRoot bool) realEnv {
	t.Helper()
	if _, err := os.Stat(filepath.Join(realProc, "pressure", "cpu")); err != nil {
		testenv.SkipOrFailInCI(t, "kernel without PSI: %v", err)
	}
	priv, err := Privileged()
	if err != nil {
		t.Fatal(err)
	}
	env := realEnv{privileged: priv, window: UnprivilegedStep}
	if priv {
		env.window = MinWindow
	}
	if !needRoot {
		return env
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "needs root: creates cgroups and moves processes")
	}
	layout, err := cgroups.DetectLayout(realCgroup)
	if err != nil {
		testenv.SkipOrFailInCI(t, "no cgroup filesystem at %s: %v", realCgroup, err)
	}
	switch layout {
	case cgroups.LayoutHybrid:
		env.cgroup2, env.cpuV1 = filepath.Join(realCgroup, "unified"), filepath.Join(realCgroup, "cpu")
	case cgroups.LayoutV2:
		env.cgroup2 = realCgroup
	default:
		testenv.SkipOrFailInCI(t, "no cgroup2 hierarchy under %s (layout %v): no per-group PSI", realCgroup, layout)
	}
	if _, err := os.Stat(filepath.Join(env.cgroup2, "cpu.pressure")); err != nil {
		testenv.SkipOrFailInCI(t, "cgroup2 without PSI files: %v", err)
	}
	return env
}

func uniqueName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "understory-psi-test-" + hex.EncodeToString(b)
}

// makeGroup makes hierarchy/name and removes it at cleanup, moving any task
// still inside to the hierarchy's root first. Register it before starting
// helpers, so their cleanup (kill) runs first.
func makeGroup(t *testing.T, hierarchy, name string) string {
	t.Helper()
	dir := filepath.Join(hierarchy, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating cgroup: %v", err)
	}
	t.Cleanup(func() {
		var err error
		for range 100 {
			if b, rerr := os.ReadFile(filepath.Join(dir, "cgroup.procs")); rerr == nil {
				for _, pid := range strings.Fields(string(b)) {
					_ = os.WriteFile(filepath.Join(hierarchy, "cgroup.procs"), []byte(pid), 0)
				}
			}
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("removing cgroup %s: %v", dir, err)
	})
	return dir
}

// startHelper re-executes the test binary as a helper (see helperEnv), moves
// it into the groups (directories whose cgroup.procs take its pid) and
// kills it at cleanup.
func startHelper(t *testing.T, spec string, groups ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+spec, "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting helper: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for _, g := range groups {
		moveTo(t, g, cmd.Process.Pid)
	}
	return cmd
}

func moveTo(t *testing.T, group string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(group, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("moving %d to %s: %v", pid, group, err)
	}
}

// lockCPU takes the machine-wide lock of tests that run busy loops on real
// cgroups (other packages' tests would disturb the measurement) and logs
// how long that took, which is not the test's own time.
func lockCPU(t *testing.T) {
	t.Helper()
	start := time.Now()
	cgroupstest.LockCPU(t)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Logf("waited %v for the CPU test lock", d.Round(time.Millisecond))
	}
}

// lastCPU is the highest CPU this process may run on.
func lastCPU(t *testing.T) int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	for cpu := 1023; cpu >= 0; cpu-- {
		if set.IsSet(cpu) {
			return cpu
		}
	}
	t.Fatal("empty affinity mask")
	return -1
}

// TestRealTriggersFireUnderContention: triggers on the node's cpu pressure
// and on a group's fire when the group's task shares one CPU with two busy
// loops. It logs the latency from the start of the contention to the event.
func TestRealTriggersFireUnderContention(t *testing.T) {
	env := requireReal(t, true)
	lockCPU(t)
	name := uniqueName(t)
	group := makeGroup(t, env.cgroup2, name)
	nodeFile, err := ProcFile(realProc, CPU)
	if err != nil {
		t.Fatal(err)
	}
	groupFile, err := CgroupFile(env.cgroup2, name, CPU)
	if err != nil {
		t.Fatal(err)
	}
	const stall = 20 * time.Millisecond
	w := newTestWatcher(t)
	for key, file := range map[string]string{KeyNodeCPU: nodeFile, "pod": groupFile} {
		if err := w.Add(key, file, stall, env.window); err != nil {
			t.Fatalf("Add(%s, %s, %v, %v): %v", key, file, stall, env.window, err)
		}
	}
	stallReader, err := OpenReader(groupFile)
	if err != nil {
		t.Fatal(err)
	}
	defer stallReader.Close()
	p0, err := stallReader.Read()
	if err != nil {
		t.Fatal(err)
	}
	runWatcher(t, t.Context(), w)

	// Privileged triggers are checked every window/10 once the group stalls;
	// unprivileged ones by the 2 s averaging work (and the node's trigger may
	// have fired just before, and fires at most once per window).
	deadline := 1500 * time.Millisecond
	if !env.privileged {
		deadline = 4500 * time.Millisecond
	}
	cpu := lastCPU(t)
	nodeStart := time.Now()
	for range 2 {
		startHelper(t, fmt.Sprintf("burn:%d", cpu))
	}
	burner := startHelper(t, fmt.Sprintf("burn:%d", cpu))
	moveTo(t, group, burner.Process.Pid)
	groupStart := time.Now()

	got := map[string]time.Time{}
	timeout := time.After(time.Until(nodeStart.Add(deadline)))
	for len(got) < 2 {
		select {
		case ev := <-w.C():
			if ev.Gone {
				t.Fatalf("unexpected %+v", ev)
			}
			if _, seen := got[ev.Key]; seen {
				continue
			}
			start := nodeStart
			if ev.Key == "pod" {
				start = groupStart
			}
			if ev.Time.Before(start) { // the node was busy before the test's contention
				t.Logf("%s fired %v before the contention; waiting for the next", ev.Key, start.Sub(ev.Time))
				continue
			}
			got[ev.Key] = ev.Time
			t.Logf("%s: event %v after the contention started (count %d)", ev.Key, ev.Time.Sub(start), ev.Count)
		case <-timeout:
			p1, _ := stallReader.Read()
			t.Fatalf("after %v only %v fired (privileged %v, window %v); the group stalled %v meanwhile",
				deadline, got, env.privileged, env.window, p1.Some.Total-p0.Some.Total)
		}
	}
	p1, err := stallReader.Read()
	if err != nil {
		t.Fatal(err)
	}
	if grew := p1.Some.Total - p0.Some.Total; grew < stall {
		t.Fatalf("group's stall grew %v, below the trigger's %v: the event was not earned", grew, stall)
	}
	t.Logf("privileged %v, window %v: group stalled %v in %v", env.privileged, env.window,
		p1.Some.Total-p0.Some.Total, time.Since(groupStart))
}

// TestRealTriggerQuietOnIdleGroup: a sensitive trigger on a group whose only
// task sleeps does not fire within its window (and a bit more).
func TestRealTriggerQuietOnIdleGroup(t *testing.T) {
	t.Parallel()
	env := requireReal(t, true)
	name := uniqueName(t)
	group := makeGroup(t, env.cgroup2, name)
	if sleep, err := exec.LookPath("sleep"); err == nil {
		cmd := exec.Command(sleep, "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		waitAsleep(t, cmd.Process.Pid, "sleep") // asleep before it moves in
		moveTo(t, group, cmd.Process.Pid)
	} else {
		t.Logf("no sleep(1): the group stays empty (%v)", err)
	}
	file, err := CgroupFile(env.cgroup2, name, CPU)
	if err != nil {
		t.Fatal(err)
	}
	w := newTestWatcher(t)
	if err := w.Add("idle", file, 10*time.Millisecond, env.window); err != nil {
		t.Fatal(err)
	}
	runWatcher(t, t.Context(), w)
	if ev, ok := recv(t, w.C(), env.window+500*time.Millisecond); ok {
		t.Fatalf("idle group's trigger fired: %+v", ev)
	}
}

// waitAsleep waits until pid runs comm (its exec is done) and sleeps (state S in
// /proc/pid/stat).
func waitAsleep(t *testing.T, pid int, comm string) {
	t.Helper()
	var stat string
	if !testenv.Poll(5*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(realProc, strconv.Itoa(pid), "stat"))
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		stat = string(b)
		open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
		return open >= 0 && end > open && stat[open+1:end] == comm && strings.HasPrefix(stat[end+1:], " S ")
	}) {
		t.Fatalf("pid %d never slept as %s within 5 s: /proc/%d/stat %q", pid, comm, pid, stat)
	}
}

// TestRealGroupRemoved: rmdir of a watched group reports Gone once, drops the
// key, and the watcher does not spin on the POLLERR the fd keeps reporting.
func TestRealGroupRemoved(t *testing.T) {
	env := requireReal(t, true)
	name := uniqueName(t)
	group := makeGroup(t, env.cgroup2, name)
	file, err := CgroupFile(env.cgroup2, name, CPU)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(file)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := newTestWatcher(t)
	if err := w.Add("pod", file, 10*time.Millisecond, env.window); err != nil {
		t.Fatal(err)
	}
	runWatcher(t, t.Context(), w)
	removed := time.Now()
	if err := os.Remove(group); err != nil {
		t.Fatalf("rmdir while watched: %v", err)
	}
	rmdirTook := time.Since(removed)
	ev, ok := recv(t, w.C(), time.Second)
	if !ok || !ev.Gone || ev.Key != "pod" {
		t.Fatalf("got %+v, %v; want a Gone event for pod", ev, ok)
	}
	t.Logf("Gone reported %v after rmdir started (rmdir took %v)", ev.Time.Sub(removed), rmdirTook)
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	if ev, ok := recv(t, w.C(), 300*time.Millisecond); ok {
		t.Fatalf("extra event %+v", ev)
	}
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	if cpu > 100*time.Millisecond {
		t.Fatalf("the test process used %v of CPU in 300 ms after Gone: spinning on POLLERR?", cpu)
	}
	if keys := w.Keys(); len(keys) != 0 {
		t.Fatalf("Keys = %v", keys)
	}
	if err := w.Remove("pod"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Remove = %v, want ErrUnknownKey", err)
	}
	if _, err := r.Read(); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Read of a removed group = %v, want ErrNotExist", err)
	}
	if err := w.Add("pod", file, 10*time.Millisecond, env.window); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Add on a removed group = %v, want ErrNotExist", err)
	}
}

// TestRealAddErrors: a key is watched once; without CAP_SYS_RESOURCE a
// window that is not a multiple of 2 s is ErrPermission (the kernel's
// EINVAL), with it the shortest window works.
func TestRealAddErrors(t *testing.T) {
	t.Parallel()
	env := requireReal(t, false)
	file, err := ProcFile(realProc, Memory)
	if err != nil {
		t.Fatal(err)
	}
	w := newTestWatcher(t)
	if err := w.Add(KeyNodeMemory, file, 50*time.Millisecond, env.window); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(KeyNodeMemory, file, 50*time.Millisecond, env.window); !errors.Is(err, ErrExists) {
		t.Fatalf("second Add = %v, want ErrExists", err)
	}
	err = w.Add("short", file, 50*time.Millisecond, MinWindow)
	if env.privileged {
		if err != nil {
			t.Fatalf("privileged Add with a %v window: %v", MinWindow, err)
		}
	} else if !errors.Is(err, ErrPermission) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("unprivileged Add with a %v window = %v, want ErrPermission wrapping EINVAL", MinWindow, err)
	}
	t.Logf("privileged %v: %v", env.privileged, err)
	if err := w.Remove(KeyNodeMemory); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(KeyNodeMemory, file, 50*time.Millisecond, env.window); err != nil {
		t.Fatalf("Add after Remove: %v", err)
	}
}

// TestRealReaders reads this machine's files: the node's pressure, a group's
// (hybrid: in the unified hierarchy), and where throttling is and is not.
func TestRealReaders(t *testing.T) {
	t.Parallel()
	env := requireReal(t, true)
	for _, res := range []string{CPU, Memory, IO} {
		file, err := ProcFile(realProc, res)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ReadFile(file)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if p.Some.Total <= 0 && res == CPU {
			t.Errorf("%s: no stall since boot? %+v", file, p)
		}
	}
	name := uniqueName(t)
	makeGroup(t, env.cgroup2, name)
	file, err := CgroupFile(env.cgroup2, name, CPU)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ReadFile(file); err != nil || p != (Pressure{}) {
		t.Fatalf("new group's pressure = %+v, %v; want zeros", p, err)
	}
	unifiedStat := filepath.Join(env.cgroup2, name, "cpu.stat")
	_, err = ReadThrottle(unifiedStat)
	if env.cpuV1 != "" {
		// Hybrid: the unified cpu.stat has usage only.
		if !errors.Is(err, ErrNoThrottle) {
			t.Fatalf("hybrid unified cpu.stat: %v, want ErrNoThrottle", err)
		}
		v1 := makeGroup(t, env.cpuV1, name)
		if th, err := ReadThrottle(filepath.Join(v1, "cpu.stat")); err != nil || th != (Throttle{}) {
			t.Fatalf("new v1 group's throttling = %+v, %v; want zeros", th, err)
		}
	} else if err != nil && !errors.Is(err, ErrNoThrottle) {
		t.Fatalf("v2 cpu.stat: %v", err)
	}
}

// TestRealManyTriggers: a pod-sized number of triggers; Remove does not wait
// for the kernel's destruction of a trigger (an RCU grace period each),
// Close does, for all of them at once. The times are logged, not asserted.
func TestRealManyTriggers(t *testing.T) {
	t.Parallel()
	env := requireReal(t, false)
	file, err := ProcFile(realProc, Memory)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		if err := w.Add(fmt.Sprintf("pod-%d", i), file, 100*time.Millisecond, env.window); err != nil {
			_ = w.Close()
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := w.Remove("pod-0"); err != nil {
		t.Fatal(err)
	}
	removeTook := time.Since(start)
	if got := len(w.Keys()); got != n-1 {
		t.Fatalf("%d keys after Remove, want %d", got, n-1)
	}
	start = time.Now()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Remove took %v; Close of %d triggers took %v", removeTook, n-1, time.Since(start))
}
