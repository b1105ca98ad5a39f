package cgroups

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

// Every layout x driver: Create makes the tier in exactly the hierarchies
// the agent uses (v1 memory included), never cpuset, is idempotent, and
// Load/Exists agree.
func TestCreateLoadExists(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		for _, d := range []Driver{DriverCgroupfs, DriverSystemd} {
			t.Run(k.String()+"/"+string(d), func(t *testing.T) {
				t.Parallel()
				root := newFake(t, k)
				h := OpenLayout(root, k.layout())
				rel, err := Naming{Driver: d}.TierPathIn(QOSBestEffort, DefaultTierName)
				if err != nil {
					t.Fatal(err)
				}
				if h.Exists(rel) {
					t.Fatal("tier exists before Create")
				}
				if _, err := h.Load(rel); !errors.Is(err, ErrNotExist) || !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("Load(missing) = %v; want ErrNotExist and fs.ErrNotExist", err)
				}
				g := fakeCreate(t, h, rel)
				if g.Path() != rel {
					t.Fatalf("Path() = %q, want %q", g.Path(), rel)
				}
				for _, dir := range groupDirs(h, rel) {
					if !isDir(dir) {
						t.Errorf("missing %s", dir)
					}
				}
				switch k.layout() {
				case LayoutV1, LayoutHybrid:
					if _, err := os.Stat(filepath.Join(root, "cpuset", rel)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("cpuset hierarchy touched: %v", err)
					}
					if !isDir(filepath.Join(root, "memory", rel)) {
						t.Error("no v1 memory group")
					}
					if k.layout() == LayoutHybrid && !isDir(filepath.Join(root, "unified", rel)) {
						t.Error("hybrid: no unified group")
					}
				case LayoutV2:
					if !isDir(filepath.Join(root, rel)) {
						t.Error("v2: no group at root/rel")
					}
					// cpu enabled in the parent (a no-op where kubelet already did).
					parent := filepath.Join(root, filepath.Dir(rel), "cgroup.subtree_control")
					if got := mustRead(t, parent); !strings.Contains(got, "+cpu") {
						t.Errorf("v2 parent subtree_control = %q, want +cpu", got)
					}
				}
				if _, err := h.Create(rel); err != nil {
					t.Fatalf("second Create: %v", err)
				}
				if !h.Exists(rel) {
					t.Fatal("Exists = false after Create")
				}
				l, err := h.Load(rel)
				if err != nil || l.Path() != rel {
					t.Fatalf("Load = %v, %v", l, err)
				}
			})
		}
	}
}

func TestCreateRejectsEscapes(t *testing.T) {
	t.Parallel()
	root := newFake(t, fakeHybrid)
	h := OpenLayout(root, LayoutHybrid)
	for _, rel := range []string{"", ".", "..", "../escape", "a/../../escape", "/abs", "a//b", "a\x00b", "a/"} {
		if _, err := h.Create(rel); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("Create(%q) = %v; want ErrInvalidPath", rel, err)
		}
		if _, err := h.Load(rel); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("Load(%q) = %v; want ErrInvalidPath", rel, err)
		}
		if h.Exists(rel) {
			t.Errorf("Exists(%q) = true", rel)
		}
	}
	// A path containerd/cgroups refuses for cgroup2 is refused before any
	// v1 directory is made.
	if _, err := h.Create("sys/fs/cgroup/x"); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("Create(sys/fs/cgroup/x) = %v; want ErrInvalidPath", err)
	}
	if _, err := os.Stat(filepath.Join(root, "cpu", "sys")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("refused Create left a v1 directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escape")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("something was created outside the root: %v", err)
	}
}

func TestCreateUnknownLayout(t *testing.T) {
	t.Parallel()
	h := OpenLayout(t.TempDir(), LayoutUnknown)
	if _, err := h.Create("x"); !errors.Is(err, ErrNoCgroupFS) {
		t.Fatalf("Create on unknown layout = %v; want ErrNoCgroupFS", err)
	}
	if h.Exists("x") {
		t.Fatal("Exists on unknown layout")
	}
}

func TestAddProcAndProcs(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			h := OpenLayout(root, k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			if err := g.AddProc(4242); err != nil {
				t.Fatalf("AddProc: %v", err)
			}
			memDir := filepath.Join(root, "memory", g.Path())
			for _, dir := range groupDirs(h, g.Path()) {
				if dir == memDir {
					continue
				}
				if got := mustRead(t, filepath.Join(dir, "cgroup.procs")); strings.TrimSpace(got) != "4242" {
					t.Errorf("%s/cgroup.procs = %q, want 4242", dir, got)
				}
			}
			// AddProc never moves a task between v1 memory cgroups...
			if k.layout() != LayoutV2 {
				if _, err := os.Stat(filepath.Join(memDir, "cgroup.procs")); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("AddProc wrote the memory hierarchy: %v", err)
				}
			}
			procs, err := g.Procs()
			if err != nil || !slices.Equal(procs, []int{4242}) {
				t.Fatalf("Procs = %v, %v; want [4242]", procs, err)
			}
			for _, bad := range []int{0, -1} {
				if err := g.AddProc(bad); !errors.Is(err, ErrInvalidValue) {
					t.Errorf("AddProc(%d) = %v; want ErrInvalidValue", bad, err)
				}
				if err := g.AddProcMemory(bad); !errors.Is(err, ErrInvalidValue) {
					t.Errorf("AddProcMemory(%d) = %v; want ErrInvalidValue", bad, err)
				}
			}
			// ...AddProcMemory does (v2: the one hierarchy AddProc already wrote).
			if k.layout() != LayoutV2 {
				mustWrite(t, filepath.Join(memDir, "cgroup.procs"), "")
			}
			if err := g.AddProcMemory(4343); err != nil {
				t.Fatalf("AddProcMemory: %v", err)
			}
			for _, dir := range groupDirs(h, g.Path()) {
				if got := mustRead(t, filepath.Join(dir, "cgroup.procs")); strings.TrimSpace(got) != "4343" {
					t.Errorf("after AddProcMemory %s/cgroup.procs = %q, want 4343", dir, got)
				}
			}
		})
	}
}

func TestDelete(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			h := OpenLayout(root, k.layout())
			tier := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			child := fakeCreate(t, h, "kubepods/besteffort/understory-batch/job-1")

			// A task in a descendant blocks the delete, and nothing is removed.
			mustWrite(t, filepath.Join(groupDirs(h, child.Path())[0], "cgroup.procs"), "77\n")
			if err := tier.Delete(); !errors.Is(err, ErrBusy) {
				t.Fatalf("Delete with task = %v; want ErrBusy", err)
			}
			for _, dir := range groupDirs(h, child.Path()) {
				if !isDir(dir) {
					t.Fatalf("busy Delete removed %s", dir)
				}
			}
			mustWrite(t, filepath.Join(groupDirs(h, child.Path())[0], "cgroup.procs"), "")

			if err := tier.Delete(); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			for _, dir := range groupDirs(h, tier.Path()) {
				if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still there: %v", dir, err)
				}
			}
			// kubelet's parent is untouched.
			if !h.Exists("kubepods/besteffort") {
				t.Fatal("Delete removed the QoS parent")
			}
			if h.Exists(tier.Path()) {
				t.Fatal("Exists after Delete")
			}
			// Gone already: fine.
			if err := tier.Delete(); err != nil {
				t.Fatalf("second Delete: %v", err)
			}
			// Operations on the stale handle report ErrNotExist.
			if _, err := tier.Stats(); !errors.Is(err, ErrNotExist) {
				t.Errorf("Stats after Delete = %v; want ErrNotExist", err)
			}
			if err := tier.SetCPUShares(2); !errors.Is(err, ErrNotExist) {
				t.Errorf("SetCPUShares after Delete = %v; want ErrNotExist", err)
			}
			if err := tier.AddProc(1); !errors.Is(err, ErrNotExist) {
				t.Errorf("AddProc after Delete = %v; want ErrNotExist", err)
			}
			// ...and never resurrect the directory.
			for _, dir := range groupDirs(h, tier.Path()) {
				if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s resurrected: %v", dir, err)
				}
			}
		})
	}
}

// A group that exists in some hierarchies only (e.g. created by hand in cpu
// alone) is still deleted everywhere without error.
func TestDeletePartial(t *testing.T) {
	t.Parallel()
	root := newFake(t, fakeHybrid)
	h := OpenLayout(root, LayoutHybrid)
	rel := "partial"
	writeFiles(t, filepath.Join(root, "cpu", rel), fakeCPUFiles)
	g, err := h.Load(rel)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if _, err := g.Pressure(); !errors.Is(err, ErrNotExist) {
		t.Errorf("Pressure without unified group = %v; want ErrNotExist", err)
	}
	if err := g.Delete(); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if h.Exists(rel) {
		t.Fatal("still exists")
	}
}

func TestLoadRootMovesBack(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			h := OpenLayout(root, k.layout())
			g, err := h.LoadRoot()
			if err != nil {
				t.Fatal(err)
			}
			if g.Path() != "" {
				t.Fatalf("root path %q", g.Path())
			}
			if err := g.AddProc(4242); err != nil {
				t.Fatal(err)
			}
			procs := filepath.Join(root, "cgroup.procs")
			if k.layout() != LayoutV2 {
				procs = filepath.Join(h.cpuDir, "cgroup.procs")
			}
			if got := mustRead(t, procs); !strings.Contains(got, "4242") {
				t.Fatalf("%s = %q, want the pid", procs, got)
			}
		})
	}
}

func TestListChildren(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			h := OpenLayout(root, k.layout())
			parent := "kubepods/besteffort"
			for _, c := range []string{"podb", "poda", "understory-batch", "podc"} {
				fakeCreate(t, h, parent+"/"+c)
			}
			fakeCreate(t, h, parent+"/poda/container1") // grandchildren are not listed
			got, err := h.ListChildren(parent)
			if want := []string{"poda", "podb", "podc", "understory-batch"}; err != nil || !slices.Equal(got, want) {
				t.Fatalf("ListChildren = %v, %v; want %v (files such as cpu.max left out)", got, err, want)
			}
			if got, err := h.ListChildren(parent + "/podb"); err != nil || len(got) != 0 {
				t.Fatalf("ListChildren(leaf) = %v, %v; want none", got, err)
			}
			cgroupstest.RemoveGroup(t, root, cgroupstest.Kind(k), parent+"/podc")
			if got, _ := h.ListChildren(parent); slices.Contains(got, "podc") {
				t.Fatalf("a removed child is still listed: %v", got)
			}
			if _, err := h.ListChildren("kubepods/gone"); !errors.Is(err, ErrNotExist) {
				t.Fatalf("ListChildren(missing) = %v; want ErrNotExist", err)
			}
			if _, err := h.ListChildren("../x"); !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("ListChildren(../x) = %v; want ErrInvalidPath", err)
			}
		})
	}
}
