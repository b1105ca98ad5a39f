package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
}
