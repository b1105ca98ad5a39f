package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

func TestMemoryUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		kind    fakeKind
		usage   string
		stat    string
		want    uint64
		wantErr error
	}{
		{"v1 working set", fakeV1Separate, "1000000\n", "cache 5\ntotal_inactive_file 250000\n", 750000, nil},
		{"hybrid reads v1 memory", fakeHybrid, "4096\n", "total_inactive_file 0\n", 4096, nil},
		{"v2 working set", fakeV2, "2000000\n", "anon 1\ninactive_file 500000\n", 1500000, nil},
		{"inactive above usage", fakeV2, "10\n", "inactive_file 20\n", 0, nil},
		{"no inactive line", fakeV2, "77\n", "anon 77\n", 77, nil},
		{"malformed stat", fakeV2, "77\n", "inactive_file x\n", 0, ErrMalformed},
		{"malformed usage", fakeV1Separate, "lots\n", "total_inactive_file 0\n", 0, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := newFake(t, tc.kind)
			h := OpenLayout(root, tc.kind.layout())
			rel := "kubepods/burstable/podm"
			g := fakeCreate(t, h, rel)
			dir := filepath.Join(root, "memory", rel)
			usageFile := "memory.usage_in_bytes"
			if tc.kind == fakeV2 {
				dir, usageFile = filepath.Join(root, rel), "memory.current"
			}
			mustWrite(t, filepath.Join(dir, usageFile), tc.usage)
			mustWrite(t, filepath.Join(dir, "memory.stat"), tc.stat)
			got, err := g.MemoryUsage()
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("MemoryUsage = %d, %v; want %d, %v", got, err, tc.want, tc.wantErr)
			}
			// The reader keeps the files open and gives the same answers.
			r, err := g.MemoryReader()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("MemoryReader: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = r.Close() })
			if got, err := r.Read(); err != nil || got != tc.want {
				t.Fatalf("MemoryReader.Read = %d, %v; want %d", got, err, tc.want)
			}
			// Rewritten in place (as the kernel regenerates it): the next Read sees it.
			mustWrite(t, filepath.Join(dir, usageFile), "99999999\n")
			if got, err := r.Read(); err != nil || got < tc.want {
				t.Fatalf("after a rewrite: Read = %d, %v", got, err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Read(); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
			}
		})
	}
}

func TestMemoryUsageUnsupported(t *testing.T) {
	t.Parallel()
	root := newFake(t, fakeV1Separate)
	if err := os.RemoveAll(filepath.Join(root, "memory")); err != nil {
		t.Fatal(err)
	}
	h := OpenLayout(root, LayoutV1)
	g := fakeCreate(t, h, "kubepods/x")
	if _, err := g.MemoryUsage(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("without a memory hierarchy: %v, want ErrUnsupported", err)
	}
	// v2 without the memory controller: the files are absent.
	root2 := newFake(t, fakeV2)
	g2 := fakeCreate(t, OpenLayout(root2, LayoutV2), "kubepods/y")
	if _, err := g2.MemoryUsage(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("v2 without memory files: %v, want ErrUnsupported", err)
	}
}

func TestMemoryUsageReal(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("reads the machine's memory cgroup: needs root")
	}
	h, err := Open("/sys/fs/cgroup")
	if err != nil {
		t.Skipf("no cgroupfs: %v", err)
	}
	root, err := h.LoadRoot()
	if err != nil {
		t.Fatal(err)
	}
	got, err := root.MemoryUsage()
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("no memory controller here: %v", err)
	}
	if err != nil || got == 0 {
		t.Fatalf("root memory working set = %d, %v", got, err)
	}
	// A reader of a real group: reads while it exists, ErrNotExist once it is removed.
	g, err := h.Create(fmt.Sprintf("understory-memreader-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Delete() })
	r, err := g.MemoryReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Read(); err != nil {
		t.Fatalf("reading a live group: %v", err)
	}
	if err := g.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); !errors.Is(err, ErrNotExist) {
		t.Fatalf("reading a removed group: %v, want ErrNotExist", err)
	}
}

func FuzzStatValue(f *testing.F) {
	for _, s := range []string{"cache 5\ntotal_inactive_file 250000\n", "inactive_file x\n", "", "\n\n",
		"inactive_file 18446744073709551616\n", "inactive_file  7 \n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := statValue(b, "inactive_file")
		if err != nil && v != 0 {
			t.Fatalf("error %v with value %d", err, v)
		}
	})
}

// memFake is a fake group with memory controller files (cgroupstest.AddMemory).
func memFake(t *testing.T, k fakeKind) (string, *Group, string) {
	t.Helper()
	root := newFake(t, k)
	h := OpenLayout(root, k.layout())
	rel := "kubepods/besteffort/understory-batch"
	g := fakeCreate(t, h, rel)
	cgroupstest.AddMemory(t, root, cgroupstest.Kind(k), rel)
	return root, g, cgroupstest.MemoryDir(root, cgroupstest.Kind(k), rel)
}

func TestSetMemoryLimit(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			_, g, dir := memFake(t, k)
			maxFile, highFile, unl := "memory.limit_in_bytes", "memory.soft_limit_in_bytes", "-1"
			if k.layout() == LayoutV2 {
				maxFile, highFile, unl = "memory.max", "memory.high", "max"
			}
			for _, tc := range []struct {
				max, high         int64
				wantMax, wantHigh string
				readMax, readHigh int64
				err               error
			}{
				{2 << 30, 1 << 30, "2147483648", "1073741824", 2 << 30, 1 << 30, nil},
				{1 << 30, 1 << 30, "1073741824", "1073741824", 1 << 30, 1 << 30, nil},
				{1 << 30, -1, "1073741824", unl, 1 << 30, UnlimitedMemory, nil},
				{-1, 1 << 30, unl, "1073741824", UnlimitedMemory, 1 << 30, nil},
				{-5, -1, unl, unl, UnlimitedMemory, UnlimitedMemory, nil},
				{MinMemoryLimit, MinMemoryLimit, "1048576", "1048576", MinMemoryLimit, MinMemoryLimit, nil},
				{MinMemoryLimit - 1, -1, "", "", 0, 0, ErrInvalidValue},
				{0, -1, "", "", 0, 0, ErrInvalidValue},
				{-1, 4096, "", "", 0, 0, ErrInvalidValue},
				{1 << 30, 2 << 30, "", "", 0, 0, ErrInvalidValue},
			} {
				err := g.SetMemoryLimit(tc.max, tc.high)
				if !errors.Is(err, tc.err) {
					t.Fatalf("SetMemoryLimit(%d, %d) = %v, want %v", tc.max, tc.high, err, tc.err)
				}
				if tc.err != nil {
					continue
				}
				if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, maxFile))); got != tc.wantMax {
					t.Errorf("SetMemoryLimit(%d, %d): %s = %q, want %q", tc.max, tc.high, maxFile, got, tc.wantMax)
				}
				if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, highFile))); got != tc.wantHigh {
					t.Errorf("SetMemoryLimit(%d, %d): %s = %q, want %q", tc.max, tc.high, highFile, got, tc.wantHigh)
				}
				if m, h, err := g.MemoryLimit(); err != nil || m != tc.readMax || h != tc.readHigh {
					t.Errorf("MemoryLimit = %d, %d, %v; want %d, %d", m, h, err, tc.readMax, tc.readHigh)
				}
			}
		})
	}
}

// The kernel's own "no limit" reads back as unlimited whatever the page size.
func TestMemoryLimitKernelUnlimited(t *testing.T) {
	t.Parallel()
	for _, in := range []string{cgroupstest.Unlimited64, "9223372036854710272", "max", "-1"} {
		if v, err := parseMemValue([]byte(in + "\n")); err != nil || v != UnlimitedMemory {
			t.Errorf("parseMemValue(%q) = %d, %v; want unlimited", in, v, err)
		}
	}
	for _, in := range []string{"", "x", "-2", "1.5", "18446744073709551616"} {
		if _, err := parseMemValue([]byte(in)); err == nil {
			t.Errorf("parseMemValue(%q) accepted", in)
		}
	}
}

// v2: a cut below usage that reclaim cannot reach is refused before
// memory.max (which would OOM-kill) is written; memory.high is lowered.
func TestSetMemoryLimitV2Busy(t *testing.T) {
	t.Parallel()
	_, g, dir := memFake(t, fakeV2)
	if err := g.SetMemoryLimit(1<<30, 900<<20); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "memory.current"), "734003200\n") // 700 MiB, the fake never reclaims
	err := g.SetMemoryLimit(500<<20, 450<<20)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("cut below usage = %v; want ErrBusy", err)
	}
	if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, "memory.max"))); got != "1073741824" {
		t.Fatalf("memory.max = %q after ErrBusy; want the old 1 GiB", got)
	}
	if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, "memory.high"))); got != "471859200" {
		t.Fatalf("memory.high = %q; want the new 450 MiB (it keeps reclaiming)", got)
	}
	if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, "memory.reclaim"))); got != "209715200" {
		t.Fatalf("memory.reclaim = %q; want the 200 MiB excess asked for", got)
	}
	mustWrite(t, filepath.Join(dir, "memory.current"), "104857600\n")
	if err := g.SetMemoryLimit(500<<20, 450<<20); err != nil {
		t.Fatalf("cut above usage: %v", err)
	}
	if m, _, err := g.MemoryLimit(); err != nil || m != 500<<20 {
		t.Fatalf("MemoryLimit = %d, %v", m, err)
	}
}

func TestSetMemoryLimitUnsupported(t *testing.T) {
	t.Parallel()
	// v2 without the memory controller enabled by the parent.
	g2 := fakeCreate(t, OpenLayout(newFake(t, fakeV2), LayoutV2), "x")
	if err := g2.SetMemoryLimit(1<<30, -1); !errors.Is(err, ErrUnsupported) {
		t.Errorf("v2 without memory.max: %v; want ErrUnsupported", err)
	}
	// v1 without a memory hierarchy.
	root := newFake(t, fakeV1Separate)
	if err := os.RemoveAll(filepath.Join(root, "memory")); err != nil {
		t.Fatal(err)
	}
	g1 := fakeCreate(t, OpenLayout(root, LayoutV1), "x")
	for name, err := range map[string]error{
		"SetMemoryLimit": g1.SetMemoryLimit(1<<30, -1),
		"MemoryLimit":    func() error { _, _, err := g1.MemoryLimit(); return err }(),
		"MemoryEvents":   func() error { _, err := g1.MemoryEvents(); return err }(),
	} {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s without a memory hierarchy: %v; want ErrUnsupported", name, err)
		}
	}
	// v1 non-hierarchical memory: a limit would not bound the children.
	_, g, dir := memFake(t, fakeHybrid)
	mustWrite(t, filepath.Join(dir, "memory.use_hierarchy"), "0\n")
	if err := g.SetMemoryLimit(1<<30, -1); !errors.Is(err, ErrUnsupported) {
		t.Errorf("use_hierarchy=0: %v; want ErrUnsupported", err)
	}
	if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, "memory.limit_in_bytes"))); got != cgroupstest.Unlimited64 {
		t.Errorf("use_hierarchy=0: limit written anyway (%s)", got)
	}
}

// A group an older agent created without a memory directory: ErrNotExist
// that says to call Create, and Create repairs it.
func TestMemoryGroupMissing(t *testing.T) {
	t.Parallel()
	root := newFake(t, fakeHybrid)
	h := OpenLayout(root, LayoutHybrid)
	rel := "kubepods/besteffort/understory-batch"
	fakeCreate(t, h, rel)
	if err := os.RemoveAll(filepath.Join(root, "memory", rel)); err != nil {
		t.Fatal(err)
	}
	g, err := h.Load(rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetMemoryLimit(1<<30, -1); !errors.Is(err, ErrNotExist) || !strings.Contains(err.Error(), "call Create") {
		t.Fatalf("SetMemoryLimit without a memory dir = %v; want ErrNotExist", err)
	}
	if err := g.AddProcMemory(4242); !errors.Is(err, ErrNotExist) {
		t.Fatalf("AddProcMemory without a memory dir = %v; want ErrNotExist", err)
	}
	if g, err = h.Create(rel); err != nil {
		t.Fatal(err)
	}
	cgroupstest.AddMemory(t, root, cgroupstest.Hybrid, rel)
	if err := g.SetMemoryLimit(1<<30, -1); err != nil {
		t.Fatalf("after Create repaired it: %v", err)
	}
	// Delete removes the memory group too; afterwards memory calls say ErrNotExist.
	if err := g.Delete(); err != nil {
		t.Fatal(err)
	}
	if isDir(filepath.Join(root, "memory", rel)) {
		t.Fatal("Delete left the memory group")
	}
	if _, err := g.MemoryEvents(); !errors.Is(err, ErrNotExist) {
		t.Fatalf("MemoryEvents after Delete = %v; want ErrNotExist", err)
	}
}

func TestMemoryEvents(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		kind    fakeKind
		files   map[string]string
		want    MemoryEvents
		wantErr error
	}{
		{"v2", fakeV2, map[string]string{"memory.events": "low 1\nhigh 7\nmax 5\noom 3\noom_kill 2\noom_group_kill 0\n"},
			MemoryEvents{OOMKill: 2, OOM: 3, Max: 5, High: 7}, nil},
		{"v2 no oom_kill", fakeV2, map[string]string{"memory.events": "low 0\nhigh 0\nmax 0\noom 0\n"}, MemoryEvents{}, ErrMalformed},
		{"v2 malformed", fakeV2, map[string]string{"memory.events": "oom_kill x\n"}, MemoryEvents{}, ErrMalformed},
		{"v1", fakeV1Separate, map[string]string{"memory.oom_control": "oom_kill_disable 0\nunder_oom 1\noom_kill 4\n", "memory.failcnt": "98\n"},
			MemoryEvents{OOMKill: 4, Max: 98, UnderOOM: true}, nil},
		{"v1 before 4.13", fakeHybrid, map[string]string{"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "0\n"},
			MemoryEvents{}, nil},
		{"v1 repeated key", fakeHybrid, map[string]string{"memory.oom_control": "under_oom 0\nunder_oom 0\n"}, MemoryEvents{}, ErrMalformed},
		{"v1 bad failcnt", fakeV1Separate, map[string]string{"memory.failcnt": "-3\n"}, MemoryEvents{}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, g, dir := memFake(t, tc.kind)
			writeFiles(t, dir, tc.files)
			got, err := g.MemoryEvents()
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("MemoryEvents = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestMemoryPressure(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			g := fakeCreate(t, OpenLayout(newFake(t, k), k.layout()), "kubepods/x")
			p, err := g.MemoryPressure()
			if k.layout() == LayoutV1 {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("v1 MemoryPressure = %v; want ErrUnsupported", err)
				}
				return
			}
			want, _ := ParsePSI(strings.NewReader(cgroupstest.MemoryPressure))
			if err != nil || p != want {
				t.Fatalf("MemoryPressure = %+v, %v; want %+v", p, err, want)
			}
		})
	}
}
