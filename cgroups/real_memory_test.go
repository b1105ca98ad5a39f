package cgroups

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
)

// Real memory-cgroup tests: the v1 memory hierarchy on v1 and hybrid (hybrid
// keeps PSI in unified), memory.max and memory.high on v2. A helper process
// (the test binary, memHogEnv) is moved into the group with AddProcMemory
// before it allocates.

// memHelper is a started helper waiting for its go.
type memHelper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startMemHelper(t *testing.T, spec string) *memHelper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memHogEnv+"="+spec, "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting memory helper: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &memHelper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
}

// run lets the helper allocate and reports whether it said "ready" (false:
// it died first, e.g. OOM-killed).
func (m *memHelper) run(t *testing.T) bool {
	t.Helper()
	return <-m.start(t)
}

// start lets the helper allocate; the channel receives run's answer.
func (m *memHelper) start(t *testing.T) <-chan bool {
	t.Helper()
	if _, err := io.WriteString(m.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() {
		line, err := m.out.ReadString('\n')
		done <- err == nil && strings.TrimSpace(line) == "ready"
	}()
	return done
}

// setMemoryLimitWithin is g.SetMemoryLimit, failing t when it has not returned
// within d: a write the kernel answers with EAGAIN must not wait for ever.
func setMemoryLimitWithin(t *testing.T, g *Group, max, high int64, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- g.SetMemoryLimit(max, high) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("SetMemoryLimit(%d, %d) on %s has not returned after %v", max, high, g.Path(), d)
		return nil
	}
}

// realMemoryGroup is a new group with a memory controller: its own v1 memory
// group, or on v2 the memory controller enabled in the root's
// cgroup.subtree_control (Create does not: on a node kubelet and systemd enable
// it above the pods, as the test does here for its group at the top).
func realMemoryGroup(t *testing.T) (*Hierarchy, *Group) {
	t.Helper()
	h := realHierarchy(t)
	if h.Layout() != LayoutV2 && h.memoryDir == "" {
		t.Skipf("no v1 memory hierarchy at %s (layout %v)", realRoot, h.Layout())
	}
	if h.Layout() == LayoutV2 {
		enableMemoryV2(t, h.Root())
	}
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	g, err := h.Create(base)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	dir, _, _, err := g.memoryFiles()
	if err != nil {
		t.Fatal(err)
	}
	want := "memory.limit_in_bytes"
	if h.Layout() == LayoutV2 {
		want = "memory.max"
	}
	if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
		t.Fatalf("Create made no memory group: %v", err)
	}
	return h, g
}

// enableMemoryV2 enables the memory controller for root's children, unless it is.
func enableMemoryV2(t *testing.T, root string) {
	t.Helper()
	file := filepath.Join(root, "cgroup.subtree_control")
	if slices.Contains(strings.Fields(mustRead(t, file)), "memory") {
		return
	}
	if err := os.WriteFile(file, []byte("+memory"), 0); err != nil {
		t.Fatalf("enabling the memory controller in %s: %v", file, err)
	}
}

// memUsage is the group's memory usage: v2 memory.current, v1
// memory.usage_in_bytes.
func memUsage(t *testing.T, g *Group) int64 {
	t.Helper()
	dir, file, _, err := g.memoryFiles()
	if err != nil {
		t.Fatal(err)
	}
	v, err := readInt(dir, file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRealMemoryOOM: a helper allocating past the group's limit is
// OOM-killed and MemoryEvents counts it; PSI for memory is readable. On v2
// memory.high below max holds the helper first without killing it (highHolds).
func TestRealMemoryOOM(t *testing.T) {
	t.Parallel()
	h, g := realMemoryGroup(t)
	const limit, high = 48 << 20, 40 << 20
	if err := g.SetMemoryLimit(limit, high); err != nil {
		t.Fatalf("SetMemoryLimit: %v", err)
	}
	if max, hi, err := g.MemoryLimit(); err != nil || max != limit || hi != high {
		t.Fatalf("MemoryLimit = %d, %d, %v; want %d, %d", max, hi, err, limit, high)
	}
	before, err := g.MemoryEvents()
	if err != nil {
		t.Fatalf("MemoryEvents: %v", err)
	}
	if before.OOMKill != 0 || before.UnderOOM {
		t.Fatalf("fresh group has events %+v", before)
	}
	hog := startMemHelper(t, "anon:512")
	pid := hog.cmd.Process.Pid
	if err := g.AddProcMemory(pid); err != nil {
		t.Fatalf("AddProcMemory: %v", err)
	}
	ctrl := "memory"
	if h.Layout() == LayoutV2 {
		ctrl = "" // the one hierarchy's "0::" line
	}
	if got := procCgroup(t, pid, ctrl); got != "/"+g.Path() {
		t.Fatalf("helper's memory cgroup %q, want /%s", got, g.Path())
	}
	ran := hog.start(t)
	if h.Layout() == LayoutV2 {
		highHolds(t, g, ran, limit)
	}
	if <-ran {
		t.Fatal("helper touched 512 MiB under a 48 MiB limit and lived")
	}
	err = hog.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v; want SIGKILL from the OOM killer", err)
	}
	var ev MemoryEvents
	for range 50 { // the counter is bumped as the victim is chosen; be patient anyway
		if ev, err = g.MemoryEvents(); err != nil || ev.OOMKill > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || ev.OOMKill != 1 || ev.Max == 0 {
		t.Fatalf("MemoryEvents = %+v, %v; want one OOM kill and failcnt > 0", ev, err)
	}
	// v2 also counts the OOMs and the breaches of memory.high on the way to max.
	if h.Layout() == LayoutV2 && (ev.OOM == 0 || ev.High == 0) {
		t.Fatalf("v2 MemoryEvents = %+v; want oom and high events too", ev)
	}
	t.Logf("events after the OOM kill: %+v", ev)
	if h.Layout() != LayoutV1 {
		p, err := g.MemoryPressure()
		if err != nil {
			t.Fatalf("MemoryPressure: %v", err)
		}
		t.Logf("memory pressure %+v", p)
	} else if _, err := g.MemoryPressure(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("v1 MemoryPressure = %v; want ErrUnsupported", err)
	}
}

// highHolds is TestRealMemoryOOM's v2 part before the OOM kill: memory.high
// throttles the helper, which has no memory it could give back, and never kills
// it: usage goes past high (a high event), the helper lives on below max. Then
// high is lifted with max kept (SetMemoryLimit), and the helper runs into max.
func highHolds(t *testing.T, g *Group, ran <-chan bool, max int64) {
	t.Helper()
	var ev MemoryEvents
	if !testenv.PollEvery(30*time.Second, 20*time.Millisecond, func() bool {
		var err error
		if ev, err = g.MemoryEvents(); err != nil {
			t.Fatal(err)
		}
		if ev.OOMKill != 0 {
			t.Fatalf("events %+v: OOM-killed while memory.high was below max", ev)
		}
		return ev.High > 0
	}) {
		t.Fatalf("no memory.high event within 30 s: %+v, usage %d", ev, memUsage(t, g))
	}
	t.Logf("throttled at memory.high: events %+v, usage %d", ev, memUsage(t, g))
	select {
	case ok := <-ran:
		t.Fatalf("the helper ended (ready %v) while throttled at memory.high", ok)
	default:
	}
	if err := setMemoryLimitWithin(t, g, max, UnlimitedMemory, time.Minute); err != nil {
		t.Fatalf("lifting memory.high: %v", err)
	}
}

// TestRealMemoryLimitBelowUsage: lowering the limit below usage reclaims
// clean page cache, but fails with ErrBusy (old limit kept, never
// unlimited) when the usage is anonymous memory and there is no swap.
func TestRealMemoryLimitBelowUsage(t *testing.T) {
	t.Parallel()
	t.Run("page cache is reclaimed", func(t *testing.T) {
		t.Parallel()
		_, g := realMemoryGroup(t)
		hog := startMemHelper(t, "file:96:"+filepath.Join(t.TempDir(), "cache"))
		if err := g.AddProcMemory(hog.cmd.Process.Pid); err != nil {
			t.Fatalf("AddProcMemory: %v", err)
		}
		if !hog.run(t) {
			t.Fatal("helper died writing its file")
		}
		usage := memUsage(t, g)
		if usage < 64<<20 {
			t.Fatalf("only %d bytes charged after writing 96 MiB: no page cache to reclaim", usage)
		}
		const limit = 32 << 20
		if err := setMemoryLimitWithin(t, g, limit, UnlimitedMemory, time.Minute); err != nil {
			t.Fatalf("SetMemoryLimit below %d bytes of page cache: %v", usage, err)
		}
		if after := memUsage(t, g); after > limit {
			t.Fatalf("usage %d above the new limit %d", after, limit)
		}
		if max, _, err := g.MemoryLimit(); err != nil || max != limit {
			t.Fatalf("MemoryLimit = %d, %v; want %d", max, err, limit)
		}
	})
	t.Run("anonymous memory is busy", func(t *testing.T) {
		t.Parallel()
		h, g := realMemoryGroup(t)
		if b, err := os.ReadFile("/proc/swaps"); err == nil && strings.Count(string(b), "\n") > 1 {
			// The kernel could swap the helper out instead of refusing.
			if h.Layout() != LayoutV2 {
				t.Skip("swap is on, and v1 has no per-group switch this test may turn off")
			}
			if err := os.WriteFile(filepath.Join(h.Root(), g.Path(), "memory.swap.max"), []byte("0"), 0); err != nil {
				t.Fatalf("turning swap off for the group: %v", err)
			}
		}
		const old = 512 << 20
		if err := g.SetMemoryLimit(old, old); err != nil {
			t.Fatal(err)
		}
		hog := startMemHelper(t, "anon:96")
		if err := g.AddProcMemory(hog.cmd.Process.Pid); err != nil {
			t.Fatalf("AddProcMemory: %v", err)
		}
		if !hog.run(t) {
			t.Fatal("helper died allocating 96 MiB under a 512 MiB limit")
		}
		const cut = 32 << 20
		err := setMemoryLimitWithin(t, g, cut, cut, time.Minute)
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("SetMemoryLimit below 96 MiB of anonymous memory = %v; want ErrBusy", err)
		}
		// v1 refuses the limit and keeps both; v2 keeps memory.max (writing it would
		// OOM-kill) but memory.high is lowered first and stays, reclaiming.
		wantHigh := int64(old)
		if h.Layout() == LayoutV2 {
			wantHigh = cut
		}
		if max, high, err := g.MemoryLimit(); err != nil || max != old || high != wantHigh {
			t.Fatalf("after ErrBusy MemoryLimit = %d, %d, %v; want the old max %d, high %d", max, high, err, old, wantHigh)
		}
		if ev, err := g.MemoryEvents(); err != nil || ev.OOMKill != 0 {
			t.Fatalf("a refused cut OOM-killed: %+v, %v", ev, err)
		}
		// Raising and unlimiting work with the helper still there.
		if err := g.SetMemoryLimit(UnlimitedMemory, UnlimitedMemory); err != nil {
			t.Fatal(err)
		}
		if max, high, err := g.MemoryLimit(); err != nil || max != UnlimitedMemory || high != UnlimitedMemory {
			t.Fatalf("MemoryLimit after unlimiting = %d, %d, %v", max, high, err)
		}
	})
}
