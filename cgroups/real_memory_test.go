package cgroups

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Real memory-cgroup tests (v1 memory hierarchy here; hybrid keeps PSI in
// unified). A helper process (the test binary, memHogEnv) is moved into
// the group with AddProcMemory before it allocates.

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
	if _, err := io.WriteString(m.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, err := m.out.ReadString('\n')
	return err == nil && strings.TrimSpace(line) == "ready"
}

func realMemoryGroup(t *testing.T) (*Hierarchy, *Group) {
	t.Helper()
	h := realHierarchy(t)
	if h.Layout() == LayoutV2 {
		t.Skip("v2 memory files are tested on fake roots; this machine's memory controller is v1")
	}
	if h.memoryDir == "" {
		t.Skip("no v1 memory hierarchy")
	}
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	g, err := h.Create(base)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !isDir(filepath.Join(h.memoryDir, base)) {
		t.Fatal("Create made no memory group")
	}
	return h, g
}

// TestRealMemoryOOM: a helper allocating past the group's limit is
// OOM-killed and MemoryEvents counts it; PSI for memory is readable.
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
	if got := procCgroup(t, pid, "memory"); got != "/"+g.Path() {
		t.Fatalf("helper's memory cgroup %q, want /%s", got, g.Path())
	}
	if hog.run(t) {
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
	t.Logf("events after the OOM kill: %+v", ev)
	if h.Layout() == LayoutHybrid {
		p, err := g.MemoryPressure()
		if err != nil {
			t.Fatalf("MemoryPressure: %v", err)
		}
		t.Logf("memory pressure %+v", p)
	} else if _, err := g.MemoryPressure(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("v1 MemoryPressure = %v; want ErrUnsupported", err)
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
		usage := readMemInt(t, g, "memory.usage_in_bytes")
		if usage < 64<<20 {
			t.Skipf("only %d bytes charged after writing 96 MiB (page cache dropped already?)", usage)
		}
		const limit = 32 << 20
		if err := g.SetMemoryLimit(limit, UnlimitedMemory); err != nil {
			t.Fatalf("SetMemoryLimit below %d bytes of page cache: %v", usage, err)
		}
		if after := readMemInt(t, g, "memory.usage_in_bytes"); after > limit {
			t.Fatalf("usage %d above the new limit %d", after, limit)
		}
		if max, _, err := g.MemoryLimit(); err != nil || max != limit {
			t.Fatalf("MemoryLimit = %d, %v; want %d", max, err, limit)
		}
	})
	t.Run("anonymous memory is busy", func(t *testing.T) {
		t.Parallel()
		if b, err := os.ReadFile("/proc/swaps"); err == nil && strings.Count(string(b), "\n") > 1 {
			t.Skip("swap is on: the kernel could swap the helper out instead of refusing")
		}
		_, g := realMemoryGroup(t)
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
		err := g.SetMemoryLimit(32<<20, 32<<20)
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("SetMemoryLimit below 96 MiB of anonymous memory = %v; want ErrBusy", err)
		}
		if max, _, err := g.MemoryLimit(); err != nil || max != old {
			t.Fatalf("after ErrBusy MemoryLimit = %d, %v; want the old %d", max, err, old)
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

func readMemInt(t *testing.T, g *Group, file string) int64 {
	t.Helper()
	v, err := readInt(filepath.Join(g.h.memoryDir, g.Path()), file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
