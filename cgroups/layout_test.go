package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDetectLayout(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			got, err := DetectLayout(root)
			if err != nil || got != k.layout() {
				t.Fatalf("DetectLayout = %v, %v; want %v", got, err, k.layout())
			}
			h, err := Open(root)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if h.Layout() != k.layout() || h.Root() != root {
				t.Fatalf("Open: layout %v root %q", h.Layout(), h.Root())
			}
		})
	}
}

func TestDetectLayoutNothingUsable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		build func(t *testing.T, root string)
	}{
		{"empty", func(*testing.T, string) {}},
		{"missing root", func(t *testing.T, root string) {
			if err := os.Remove(root); err != nil {
				t.Fatal(err)
			}
		}},
		{"only memory", func(t *testing.T, root string) { mustMkdir(t, filepath.Join(root, "memory")) }},
		{"cpu is a file", func(t *testing.T, root string) { mustWrite(t, filepath.Join(root, "cpu"), "") }},
		{"unified only dir", func(t *testing.T, root string) { mustMkdir(t, filepath.Join(root, "unified")) }},
		{"cpuacct only co-mount", func(t *testing.T, root string) { mustMkdir(t, filepath.Join(root, "cpuacct,net_cls")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			tc.build(t, root)
			if l, err := DetectLayout(root); !errors.Is(err, ErrNoCgroupFS) || l != LayoutUnknown {
				t.Fatalf("DetectLayout = %v, %v; want ErrNoCgroupFS", l, err)
			}
			if _, err := Open(root); !errors.Is(err, ErrNoCgroupFS) {
				t.Fatalf("Open = %v; want ErrNoCgroupFS", err)
			}
		})
	}
}

// Other co-mount spellings resolve too (e.g. "cpuacct,cpu" on some distros).
func TestDetectLayoutOtherComount(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "cpuacct,cpu"))
	mustWrite(t, filepath.Join(root, "unified", "cgroup.controllers"), "")
	l, err := DetectLayout(root)
	if err != nil || l != LayoutHybrid {
		t.Fatalf("DetectLayout = %v, %v; want hybrid", l, err)
	}
	h := OpenLayout(root, l)
	want := filepath.Join(root, "cpuacct,cpu")
	if h.cpuDir != want || h.cpuacctDir != want {
		t.Fatalf("cpu dir %q cpuacct dir %q, want both %q", h.cpuDir, h.cpuacctDir, want)
	}
	if len(h.subsystems) != 1 {
		t.Fatalf("co-mounted cpu,cpuacct gave %d subsystems, want 1", len(h.subsystems))
	}
}

func TestLayoutString(t *testing.T) {
	t.Parallel()
	for l, want := range map[Layout]string{LayoutV1: "v1", LayoutHybrid: "hybrid", LayoutV2: "v2", LayoutUnknown: "unknown", Layout(42): "unknown"} {
		if got := l.String(); got != want {
			t.Errorf("Layout(%d).String() = %q, want %q", int(l), got, want)
		}
	}
}
