package cgroups

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
)

// Real-cgroup tests. They run as root against /sys/fs/cgroup (this machine:
// hybrid, v1 cpu/cpuacct/freezer + controller-less cgroup2 at unified),
// create uniquely named groups at the top of each hierarchy and remove them
// (after thawing and killing what they started) in t.Cleanup, even on
// failure. They never touch the cpuset hierarchy; Create makes memory
// groups, and only the memory tests move a (helper) task into one.

const realRoot = "/sys/fs/cgroup"

func realHierarchy(t *testing.T) *Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real cgroup tests need root")
	}
	h, err := Open(realRoot)
	if errors.Is(err, ErrNoCgroupFS) {
		t.Skipf("no cgroup filesystem at %s: %v", realRoot, err)
	}
	if err != nil {
		t.Fatalf("Open(%s): %v", realRoot, err)
	}
	cgroupstest.LockCPU(t)
	return h
}

func uniqueName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "understory-test-" + hex.EncodeToString(b)
}

// cleanupGroup removes base and everything below it from every hierarchy
// the package uses, thawing first (a frozen v1 task cannot die).
func cleanupGroup(t *testing.T, h *Hierarchy, base string) {
	t.Helper()
	t.Cleanup(func() {
		for _, dir := range groupDirs(h, base) {
			_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					_ = os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0)
					_ = os.WriteFile(filepath.Join(p, "cgroup.freeze"), []byte("0"), 0)
				}
				return nil
			})
		}
		g, err := h.Load(base)
		if errors.Is(err, ErrNotExist) {
			return
		}
		if err == nil {
			for range 50 {
				if err = g.Delete(); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if err != nil {
			t.Errorf("cleanup of %s: %v", base, err)
		}
		for _, dir := range groupDirs(h, base) {
			if _, serr := os.Stat(dir); serr == nil {
				t.Errorf("cleanup left %s behind", dir)
			}
		}
	})
}

// startBurner re-executes the test binary as a CPU burner; it is killed
// (and reaped) in t.Cleanup and dies with the test process (Pdeathsig).
func startBurner(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), burnerEnv+"=1", "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting burner: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// procCgroup returns pid's path in the v1 hierarchy named ctrl ("" key for
// cgroup2) from /proc/<pid>/cgroup.
func procCgroup(t *testing.T, pid int, ctrl string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), ctrl) {
			return parts[2]
		}
	}
	t.Fatalf("/proc/%d/cgroup has no %q line", pid, ctrl)
	return ""
}

// measure returns the CPUs used by g over d (usage delta / wall time) and
// the growth of NrThrottled.
func measure(t *testing.T, g *Group, d time.Duration) (cpus float64, throttled uint64) {
	t.Helper()
	s0, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(d)
	s1, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(t0)
	return float64(s1.Usage-s0.Usage) / float64(wall), s1.NrThrottled - s0.NrThrottled
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	return strings.TrimSpace(mustRead(t, path))
}

// TestRealTier drives a tier-like group end to end on the real kernel:
// shares=2 + idle + 0.2 CPU quota, a burner inside, throttling observed,
// freeze/thaw, PSI, the fast reader, and removal.
func TestRealTier(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	t.Logf("layout %v", h.Layout())
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	rel := base + "/" + DefaultTierName
	g, err := h.Create(rel)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	for _, dir := range groupDirs(h, rel) {
		if !isDir(dir) {
			t.Fatalf("Create did not make %s", dir)
		}
	}
	if _, err := os.Stat(filepath.Join(realRoot, "cpuset", base)); err == nil {
		t.Fatal("Create touched the cpuset hierarchy")
	}

	const quota, period = 20 * time.Millisecond, 100 * time.Millisecond
	if err := g.SetCPUShares(2); err != nil {
		t.Fatalf("SetCPUShares(2): %v", err)
	}
	idleSupported := true
	if err := g.SetIdle(true); errors.Is(err, ErrUnsupported) {
		idleSupported = false
		t.Logf("cpu.idle unsupported on this kernel: %v", err)
	} else if err != nil {
		t.Fatalf("SetIdle(true): %v", err)
	}
	if err := g.SetCPULimit(quota, period); err != nil {
		t.Fatalf("SetCPULimit: %v", err)
	}
	if q, p, err := g.CPULimit(); err != nil || q != quota || p != period {
		t.Fatalf("CPULimit = %v, %v, %v", q, p, err)
	}
	if idleSupported {
		if got := readTrim(t, filepath.Join(g.cpuDir(), "cpu.idle")); got != "1" {
			t.Fatalf("cpu.idle = %q", got)
		}
		// Kernel quirk: weight writes are refused while idle.
		if err := g.SetCPUShares(1024); !errors.Is(err, ErrIdle) {
			t.Fatalf("SetCPUShares while idle = %v; want ErrIdle", err)
		}
		if h.Layout() != LayoutV2 {
			t.Logf("cpu.shares while idle reads %s", readTrim(t, filepath.Join(g.cpuDir(), "cpu.shares")))
		}
	}

	burner := startBurner(t)
	pid := burner.Process.Pid
	if err := g.AddProc(pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	procs, err := g.Procs()
	if err != nil || !slices.Contains(procs, pid) {
		t.Fatalf("Procs = %v, %v; want %d in it", procs, err, pid)
	}
	if h.Layout() != LayoutV2 {
		if got, want := procCgroup(t, pid, "cpu"), "/"+rel; got != want {
			t.Fatalf("burner cpu cgroup %q, want %q", got, want)
		}
		if got, want := procCgroup(t, pid, "memory"), procCgroup(t, os.Getpid(), "memory"); got != want {
			t.Fatalf("burner memory cgroup moved to %q (test's is %q)", got, want)
		}
	}

	// Phase A, tier settings: never above the quota. Under load from
	// neighbours an idle group may get less than its quota; that is
	// SCHED_IDLE doing its job, so the lower bound is checked in phase B.
	cpus, thr := measure(t, g, 1500*time.Millisecond)
	t.Logf("idle tier: %.3f CPUs, %d throttled periods", cpus, thr)
	if cpus > 0.3 {
		t.Fatalf("tier used %.3f CPUs with a 0.2 CPU quota", cpus)
	}

	// Phase B: the same quota with a normal weight must run at ~quota and
	// throttle. Kernel quirk: idle=0 resets cpu.shares to 1024.
	if idleSupported {
		if err := g.SetIdle(false); err != nil {
			t.Fatalf("SetIdle(false): %v", err)
		}
		if h.Layout() != LayoutV2 {
			if got := readTrim(t, filepath.Join(g.cpuDir(), "cpu.shares")); got != "1024" {
				t.Errorf("cpu.shares after idle=0 = %s; kernel was expected to reset it to 1024", got)
			}
		}
	}
	if err := g.SetCPUShares(MaxShares); err != nil {
		t.Fatalf("SetCPUShares(max): %v", err)
	}
	var ok bool
	for try := 0; try < 3 && !ok; try++ {
		cpus, thr = measure(t, g, 1500*time.Millisecond)
		t.Logf("weighted tier: %.3f CPUs, %d throttled periods", cpus, thr)
		if cpus > 0.3 {
			t.Fatalf("tier used %.3f CPUs with a 0.2 CPU quota", cpus)
		}
		ok = cpus >= 0.1 && thr > 0
	}
	if !ok {
		t.Fatalf("burner never ran at ~quota while throttled (last %.3f CPUs, %d throttled)", cpus, thr)
	}
	// Back to tier settings: weight first, then idle.
	if err := g.SetCPUShares(2); err != nil {
		t.Fatalf("SetCPUShares(2): %v", err)
	}
	if idleSupported {
		if err := g.SetIdle(true); err != nil {
			t.Fatalf("SetIdle(true): %v", err)
		}
	}

	// Pressure: a throttled burner is runnable but not running.
	if h.Layout() == LayoutV1 {
		if _, err := g.Pressure(); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("v1 Pressure = %v; want ErrUnsupported", err)
		}
	} else {
		p, err := g.Pressure()
		if err != nil {
			t.Fatalf("Pressure: %v", err)
		}
		t.Logf("pressure %+v", p)
		if p.Some.Total <= 0 {
			t.Fatalf("no cpu pressure recorded for a throttled burner: %+v", p)
		}
	}

	r, err := g.UsageReader()
	if err != nil {
		t.Fatalf("UsageReader: %v", err)
	}
	defer r.Close()

	// Freeze: usage stops; the fast reader agrees exactly with Stats.
	if err := g.Freeze(); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if f, err := g.Frozen(); err != nil || !f {
		t.Fatalf("Frozen = %v, %v", f, err)
	}
	s0, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	fast, err := r.Read()
	if err != nil {
		t.Fatalf("UsageReader.Read: %v", err)
	}
	if fast != s0.Usage {
		t.Fatalf("UsageReader %v != Stats().Usage %v while frozen", fast, s0.Usage)
	}
	time.Sleep(400 * time.Millisecond)
	s1, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if d := s1.Usage - s0.Usage; d > time.Millisecond {
		t.Fatalf("frozen group used %v CPU in 400ms", d)
	}

	// Thaw: usage grows again.
	if err := g.Thaw(); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	if f, err := g.Frozen(); err != nil || f {
		t.Fatalf("Frozen after Thaw = %v, %v", f, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		u, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if u > s1.Usage {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("usage did not grow within 5s of Thaw")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A FreezeWriter's pwrites on its open file freeze and thaw like FreezeNoWait
	// (kernfs replaces the state on each write at offset 0).
	fw, err := g.FreezeWriter()
	if err != nil {
		t.Fatalf("FreezeWriter: %v", err)
	}
	defer fw.Close()
	for _, want := range []bool{true, false, true, false} {
		if err := fw.Request(want); err != nil {
			t.Fatalf("FreezeWriter.Request(%v): %v", want, err)
		}
		if f := waitFrozen(t, g, want); f != want {
			t.Fatalf("Frozen = %v after FreezeWriter.Request(%v)", f, want)
		}
	}

	// Delete refuses while the burner lives, then succeeds; the open
	// reader then reports ErrNotExist instead of crashing.
	if err := g.Delete(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Delete with a live task = %v; want ErrBusy", err)
	}
	_ = burner.Process.Kill()
	_ = burner.Wait()
	var derr error
	for range 50 {
		if derr = g.Delete(); derr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if derr != nil {
		t.Fatalf("Delete: %v", derr)
	}
	if h.Exists(rel) {
		t.Fatal("Exists after Delete")
	}
	if _, err := r.Read(); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Read on a deleted group = %v; want ErrNotExist", err)
	}
	if err := fw.Request(true); !errors.Is(err, ErrNotExist) {
		t.Fatalf("FreezeWriter.Request on a deleted group = %v; want ErrNotExist", err)
	}
	if _, err := g.Stats(); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Stats on a deleted group = %v; want ErrNotExist", err)
	}
}

// TestRealCFSOrdering proves the v1 write-order problem exists on this
// kernel and that SetCPULimit avoids it; on v2, that there is no order to get
// wrong (cfsOrderingV2).
func TestRealCFSOrdering(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	if h.Layout() == LayoutV2 {
		cfsOrderingV2(t, h, base)
		return
	}
	parent, err := h.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.SetCPULimit(60*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatalf("parent limit: %v", err)
	}
	child, err := h.Create(base + "/child")
	if err != nil {
		t.Fatal(err)
	}
	if err := child.SetCPULimit(40*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatalf("child 40/100: %v", err)
	}
	// The naive order (period first) passes through 40ms/10ms = 4 CPUs > 0.6.
	naive := os.WriteFile(filepath.Join(child.cpuDir(), "cpu.cfs_period_us"), []byte("10000"), 0)
	if !errors.Is(naive, syscall.EINVAL) {
		t.Fatalf("kernel accepted period 10ms with quota 40ms under a 0.6 CPU parent (%v); the ordering trap is gone?", naive)
	}
	steps := []struct{ q, p time.Duration }{
		{4 * time.Millisecond, 10 * time.Millisecond},
		{40 * time.Millisecond, 100 * time.Millisecond},
		{300 * time.Millisecond, 500 * time.Millisecond},
		{2 * time.Millisecond, 5 * time.Millisecond},
		{Unlimited, 20 * time.Millisecond},
		{50 * time.Millisecond, time.Second},
		{30 * time.Millisecond, 50 * time.Millisecond},
	}
	for _, s := range steps {
		if err := child.SetCPULimit(s.q, s.p); err != nil {
			t.Fatalf("SetCPULimit(%v, %v): %v", s.q, s.p, err)
		}
		q, p, err := child.CPULimit()
		if err != nil || q != s.q || p != s.p {
			t.Fatalf("after SetCPULimit(%v, %v): CPULimit = %v, %v, %v", s.q, s.p, q, p, err)
		}
	}
	// A grandchild at 0.55 CPU: moving the child from 30/50 (0.6) to
	// 60/100 (0.6) must not dip below 0.55 (quota first: 60/50 = 1.2 >
	// parent; period first: 30/100 = 0.3 < grandchild). Only a pass through
	// "unlimited" would get there, which SetCPULimit never does: the period
	// stays and ErrClamped says what is applied.
	grand, err := h.Create(base + "/child/grand")
	if err != nil {
		t.Fatal(err)
	}
	if err := grand.SetCPULimit(55*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatalf("grandchild limit: %v", err)
	}
	err = child.SetCPULimit(60*time.Millisecond, 100*time.Millisecond)
	var ce *ClampError
	if !errors.Is(err, ErrClamped) || !errors.As(err, &ce) {
		t.Fatalf("child 30/50 -> 60/100 with a 0.55 grandchild = %v; want ErrClamped", err)
	}
	if want := (CFSLimit{30 * time.Millisecond, 50 * time.Millisecond}); ce.Applied != want {
		t.Fatalf("Applied = %+v, want %+v", ce.Applied, want)
	}
	if q, p, err := child.CPULimit(); err != nil || q != 30*time.Millisecond || p != 50*time.Millisecond {
		t.Fatalf("after the clamp: CPULimit = %v, %v, %v; want 30ms/50ms", q, p, err)
	}
	// Above the parent: rejected with ErrInvalidValue, old value kept.
	err = child.SetCPULimit(90*time.Millisecond, 100*time.Millisecond)
	if !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("child above parent = %v; want ErrInvalidValue", err)
	}
	if q, p, err := child.CPULimit(); err != nil || q != 30*time.Millisecond || p != 50*time.Millisecond {
		t.Fatalf("after rejected change: CPULimit = %v, %v, %v; want the old 30ms/50ms", q, p, err)
	}
}

// TestRealDeleteNested checks that Delete removes a nested tree on the real
// cgroupfs (rmdir children first) and that Create/Load/Exists agree.
func TestRealDeleteNested(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	for _, rel := range []string{base + "/a/b/c", base + "/a/d", base + "/e"} {
		if _, err := h.Create(rel); err != nil {
			t.Fatalf("Create(%s): %v", rel, err)
		}
		if !h.Exists(rel) {
			t.Fatalf("Exists(%s) = false", rel)
		}
	}
	// Idempotent on a real kernel too.
	if _, err := h.Create(base + "/a/b/c"); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	g, err := h.Load(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for _, dir := range groupDirs(h, base) {
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("%s survived Delete", dir)
		}
	}
	if _, err := h.Load(base); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Load after Delete = %v; want ErrNotExist", err)
	}
}

// TestRealCFSClamp: cutting a group below a child's own quota. The kernel
// refuses it (EINVAL); SetCPULimit used to pass through quota -1 and, when
// -1 was the old value, leave the group there. Now the group is clamped to
// the child's ratio (normalised to its own period, grandchildren included)
// and the quota file never reads -1 while that happens.
//
// On v2 the kernel takes a parent below its children (cpu.max is min()ed along
// the path): cfsClampV2.
func TestRealCFSClamp(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	if h.Layout() == LayoutV2 {
		cfsClampV2(t, h, base)
		return
	}
	parent, err := h.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	child, err := h.Create(base + "/child")
	if err != nil {
		t.Fatal(err)
	}
	if err := child.SetCPULimit(50*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatalf("child 50ms/100ms: %v", err)
	}
	quotaFile := filepath.Join(parent.cpuDir(), "cpu.cfs_quota_us")
	if naive := os.WriteFile(quotaFile, []byte("10000"), 0); !errors.Is(naive, syscall.EINVAL) {
		t.Fatalf("kernel accepted a parent quota below its child's (%v); the trap is gone?", naive)
	}
	// Watch the parent's quota while cutting it: once limited it must never
	// read -1.
	watch := func(t *testing.T, f func()) {
		t.Helper()
		for v := range readsDuring(t, quotaFile, f) {
			if v == "-1" {
				t.Fatal("the parent's quota read -1 during the cut")
			}
		}
	}
	for _, tc := range []struct {
		name         string
		from         time.Duration // Unlimited: start unlimited (the quota file still must not end at -1)
		cut, period  time.Duration
		wantQ, wantP time.Duration
		limited      bool
	}{
		{"from unlimited", Unlimited, 10 * time.Millisecond, 100 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, false},
		{"from a limit", 80 * time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, true},
		// 0.5 CPU at a 20 ms period: 10 ms.
		{"with a period change", 80 * time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := parent.SetCPULimit(tc.from, 100*time.Millisecond); err != nil {
				t.Fatalf("parent start %v: %v", tc.from, err)
			}
			var err error
			cut := func() { err = parent.SetCPULimit(tc.cut, tc.period) }
			if tc.limited {
				watch(t, cut)
			} else {
				cut()
			}
			var ce *ClampError
			if !errors.Is(err, ErrClamped) || !errors.As(err, &ce) {
				t.Fatalf("cut to %v/%v = %v; want ErrClamped", tc.cut, tc.period, err)
			}
			if want := (CFSLimit{tc.wantQ, tc.wantP}); ce.Applied != want || ce.Wanted != (CFSLimit{tc.cut, tc.period}) {
				t.Fatalf("ClampError %+v; want Applied %+v", ce, want)
			}
			if q, p, err := parent.CPULimit(); err != nil || q != tc.wantQ || p != tc.wantP {
				t.Fatalf("parent after the cut: %v/%v, %v; want %v/%v", q, p, err, tc.wantQ, tc.wantP)
			}
			// Retrying the same cut (the agent does, every period) changes nothing.
			if err := parent.SetCPULimit(tc.cut, tc.period); !errors.Is(err, ErrClamped) {
				t.Fatalf("retried cut = %v; want ErrClamped", err)
			}
			if q, p, _ := parent.CPULimit(); q != tc.wantQ || p != tc.wantP {
				t.Fatalf("parent after a retried cut: %v/%v", q, p)
			}
		})
	}
	// A limited grandchild below an unlimited child constrains the parent too.
	if err := child.SetCPULimit(Unlimited, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	grand, err := h.Create(base + "/child/grand")
	if err != nil {
		t.Fatal(err)
	}
	if err := grand.SetCPULimit(3*time.Millisecond, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	err = parent.SetCPULimit(5*time.Millisecond, 100*time.Millisecond)
	var ce *ClampError
	if !errors.As(err, &ce) || ce.Applied != (CFSLimit{30 * time.Millisecond, 100 * time.Millisecond}) {
		t.Fatalf("cut below a grandchild = %v; want clamped to 30ms/100ms", err)
	}
	// A cut the children allow is no clamp.
	if err := parent.SetCPULimit(40*time.Millisecond, 100*time.Millisecond); err != nil {
		t.Fatalf("cut above the grandchild: %v", err)
	}
}

// readsDuring reads the file at path over and over while f runs, and returns the
// (trimmed) contents it saw, with how often.
func readsDuring(t *testing.T, path string, f func()) map[string]int {
	t.Helper()
	stop, seen := make(chan struct{}), make(chan map[string]int, 1)
	go func() {
		m := map[string]int{}
		for {
			select {
			case <-stop:
				seen <- m
				return
			default:
			}
			if b, err := os.ReadFile(path); err == nil {
				m[strings.TrimSpace(string(b))]++
			}
		}
	}()
	func() {
		defer close(stop)
		f()
	}()
	return <-seen
}

// cpuMax is what v2 cpu.max reads for the limit quota/period.
func cpuMax(quota, period time.Duration) string {
	if quota < 0 {
		return fmt.Sprintf("max %d", period.Microseconds())
	}
	return fmt.Sprintf("%d %d", quota.Microseconds(), period.Microseconds())
}

// cfsOrderingV2 is TestRealCFSOrdering on v2. cpu.max holds quota and period
// and is written at once, so there is no order of writes to get wrong: the
// steps that need one on v1 go straight through, a reader never sees a pair
// that was not set, and neither a parent below the new ratio nor a grandchild
// above it refuses or clamps it (the kernel min()s the limits along the path).
func cfsOrderingV2(t *testing.T, h *Hierarchy, base string) {
	t.Helper()
	const ms = time.Millisecond
	parent, err := h.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.SetCPULimit(60*ms, 100*ms); err != nil {
		t.Fatalf("parent limit: %v", err)
	}
	child, err := h.Create(base + "/child")
	if err != nil {
		t.Fatal(err)
	}
	if err := child.SetCPULimit(40*ms, 100*ms); err != nil {
		t.Fatalf("child 40/100: %v", err)
	}
	grand, err := h.Create(base + "/child/grand")
	if err != nil {
		t.Fatal(err)
	}
	if err := grand.SetCPULimit(55*ms, 100*ms); err != nil {
		t.Fatalf("grandchild limit: %v", err)
	}
	// The v1 steps, then what v1 clamps (30/50 -> 60/100 above a 0.55 grandchild,
	// here already below it) and refuses (above the 0.6 parent).
	steps := []CFSLimit{
		{4 * ms, 10 * ms}, {40 * ms, 100 * ms}, {300 * ms, 500 * ms}, {2 * ms, 5 * ms},
		{Unlimited, 20 * ms}, {50 * ms, time.Second}, {30 * ms, 50 * ms},
		{60 * ms, 100 * ms}, {90 * ms, 100 * ms},
	}
	set := map[string]bool{cpuMax(40*ms, 100*ms): true}
	for _, s := range steps {
		set[cpuMax(s.Quota, s.Period)] = true
	}
	maxFile := filepath.Join(child.cpuDir(), "cpu.max")
	seen := readsDuring(t, maxFile, func() {
		for _, s := range steps {
			if err := child.SetCPULimit(s.Quota, s.Period); err != nil {
				t.Errorf("SetCPULimit(%v, %v) on v2: %v; want it taken as written", s.Quota, s.Period, err)
				return
			}
			if got := cfsLimitOf(t, child); got != s {
				t.Errorf("after SetCPULimit(%v, %v): CPULimit = %+v", s.Quota, s.Period, got)
				return
			}
		}
	})
	for v, n := range seen {
		if !set[v] {
			t.Errorf("cpu.max read %q (%d times), a limit never set", v, n)
		}
	}
	t.Logf("cpu.max read %d distinct values during %d writes", len(seen), len(steps))
	if got := readTrim(t, maxFile); got != cpuMax(90*ms, 100*ms) {
		t.Fatalf("cpu.max = %q after the steps; want the last one", got)
	}
}

// cfsClampV2 is TestRealCFSClamp on v2: the kernel takes a parent's cpu.max
// below its child's, so SetCPULimit applies every cut as asked (no
// ClampError), never passes through "max" on the way, and a retried cut
// changes nothing. That the descendants are then held to the cut is
// TestRealLowerDescendantCPULimits's.
func cfsClampV2(t *testing.T, h *Hierarchy, base string) {
	t.Helper()
	const ms = time.Millisecond
	parent, err := h.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	child, err := h.Create(base + "/child")
	if err != nil {
		t.Fatal(err)
	}
	if err := child.SetCPULimit(50*ms, 100*ms); err != nil {
		t.Fatalf("child 50ms/100ms: %v", err)
	}
	maxFile := filepath.Join(parent.cpuDir(), "cpu.max")
	if err := os.WriteFile(maxFile, []byte("10000 100000"), 0); err != nil {
		t.Fatalf("kernel refused a parent cpu.max below its child's: %v", err)
	}
	for _, tc := range []struct {
		name        string
		from        time.Duration // Unlimited: start unlimited
		cut, period time.Duration
	}{
		{"from unlimited", Unlimited, 10 * ms, 100 * ms},
		{"from a limit", 80 * ms, 10 * ms, 100 * ms},
		{"with a period change", 80 * ms, 2 * ms, 20 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := parent.SetCPULimit(tc.from, 100*ms); err != nil {
				t.Fatalf("parent start %v: %v", tc.from, err)
			}
			var err error
			seen := readsDuring(t, maxFile, func() { err = parent.SetCPULimit(tc.cut, tc.period) })
			if err != nil {
				t.Fatalf("cut to %v/%v below a 0.5 CPU child = %v; want it applied", tc.cut, tc.period, err)
			}
			want := CFSLimit{tc.cut, tc.period}
			for v := range seen {
				if v != cpuMax(tc.from, 100*ms) && v != cpuMax(tc.cut, tc.period) {
					t.Fatalf("cpu.max read %q during the cut from %v to %v", v, tc.from, want)
				}
			}
			if got := cfsLimitOf(t, parent); got != want {
				t.Fatalf("parent after the cut: %+v; want %+v", got, want)
			}
			// Retrying the same cut (the agent does, every period) changes nothing.
			if err := parent.SetCPULimit(tc.cut, tc.period); err != nil {
				t.Fatalf("retried cut = %v", err)
			}
			if got := cfsLimitOf(t, parent); got != want {
				t.Fatalf("parent after a retried cut: %+v", got)
			}
			if got := cfsLimitOf(t, child); got != (CFSLimit{50 * ms, 100 * ms}) {
				t.Fatalf("child after the cut: %+v; want its own 50ms/100ms", got)
			}
		})
	}
	// Nor does a limited grandchild below an unlimited child.
	if err := child.SetCPULimit(Unlimited, 100*ms); err != nil {
		t.Fatal(err)
	}
	grand, err := h.Create(base + "/child/grand")
	if err != nil {
		t.Fatal(err)
	}
	if err := grand.SetCPULimit(3*ms, 10*ms); err != nil {
		t.Fatal(err)
	}
	if err := parent.SetCPULimit(5*ms, 100*ms); err != nil {
		t.Fatalf("cut below a grandchild on v2 = %v; want it applied", err)
	}
	if got := cfsLimitOf(t, parent); got != (CFSLimit{5 * ms, 100 * ms}) {
		t.Fatalf("parent after a cut below a grandchild: %+v", got)
	}
}

// waitFrozen polls g's freezer state for up to a second until it is want; it returns the
// last state read.
func waitFrozen(t *testing.T, g *Group, want bool) bool {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		f, err := g.Frozen()
		if err != nil {
			t.Fatalf("Frozen: %v", err)
		}
		if f == want || time.Now().After(deadline) {
			return f
		}
		time.Sleep(5 * time.Millisecond)
	}
}
