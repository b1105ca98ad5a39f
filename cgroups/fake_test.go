package cgroups

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

// fakeKind is a shape of cgroup mount tree built from plain files in
// t.TempDir(). The kernel creates a group's files on mkdir; a fake cannot,
// so tests call fakeGroupFiles after Create to play that part.
type fakeKind cgroupstest.Kind

const (
	fakeV1Separate      = fakeKind(cgroupstest.V1Separate)      // cpu and cpuacct each their own mount (this machine)
	fakeV1Combined      = fakeKind(cgroupstest.V1Combined)      // cpu,cpuacct co-mount with systemd's cpu and cpuacct symlinks
	fakeV1CombinedBare  = fakeKind(cgroupstest.V1CombinedBare)  // cpu,cpuacct co-mount without symlinks
	fakeV1NoFreezer     = fakeKind(cgroupstest.V1NoFreezer)     // v1 without a freezer hierarchy
	fakeHybrid          = fakeKind(cgroupstest.Hybrid)          // v1 controllers + controller-less cgroup2 at unified/
	fakeHybridNoFreezer = fakeKind(cgroupstest.HybridNoFreezer) // hybrid without v1 freezer: freezing goes through unified
	fakeV2              = fakeKind(cgroupstest.V2)              // unified cgroup2 at root
)

func (k fakeKind) String() string { return cgroupstest.Kind(k).String() }

func (k fakeKind) layout() Layout {
	switch k {
	case fakeHybrid, fakeHybridNoFreezer:
		return LayoutHybrid
	case fakeV2:
		return LayoutV2
	}
	return LayoutV1
}

var allFakeKinds = []fakeKind{fakeV1Separate, fakeV1Combined, fakeV1CombinedBare, fakeV1NoFreezer, fakeHybrid, fakeHybridNoFreezer, fakeV2}

func mustWrite(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustMkdir(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

const fakePressure = cgroupstest.Pressure

// controller file sets a kernel would create in each new group.
var (
	fakeCPUFiles     = cgroupstest.V1CPUFiles
	fakeCPUAcctFiles = cgroupstest.V1CPUAcctFiles
	fakeFreezerFiles = cgroupstest.V1FreezerFiles
	fakeHybridFiles  = cgroupstest.HybridFiles
	fakeV2Files      = cgroupstest.V2Files
)

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mustWrite(t, filepath.Join(dir, name), content)
	}
}

// newFake builds a fake root of the given kind, with kubelet's QoS-level
// directories already present (as kubelet would have created them), plus
// memory and cpuset hierarchies that the package must never touch.
func newFake(t testing.TB, k fakeKind) string {
	t.Helper()
	return cgroupstest.NewRoot(t, cgroupstest.Kind(k))
}

// fakeGroupFiles creates rel's directories and the files the kernel would
// put in them, in every hierarchy of h.
func fakeGroupFiles(t testing.TB, h *Hierarchy, rel string) {
	t.Helper()
	switch h.layout {
	case LayoutV2:
		writeFiles(t, filepath.Join(h.unifiedDir, rel), fakeV2Files)
		return
	case LayoutHybrid:
		writeFiles(t, filepath.Join(h.unifiedDir, rel), fakeHybridFiles)
	}
	writeFiles(t, filepath.Join(h.cpuDir, rel), fakeCPUFiles)
	writeFiles(t, filepath.Join(h.cpuacctDir, rel), fakeCPUAcctFiles)
	if h.freezerDir != "" {
		writeFiles(t, filepath.Join(h.freezerDir, rel), fakeFreezerFiles)
	}
}

// fakeCreate is Create followed by the kernel's part.
func fakeCreate(t testing.TB, h *Hierarchy, rel string) *Group {
	t.Helper()
	g, err := h.Create(rel)
	if err != nil {
		t.Fatalf("Create(%q): %v", rel, err)
	}
	fakeGroupFiles(t, h, rel)
	return g
}

// groupDirs lists rel's directory in every hierarchy the package writes.
func groupDirs(h *Hierarchy, rel string) []string {
	var out []string
	for _, d := range h.writableDirs() {
		out = append(out, filepath.Join(d, rel))
	}
	return out
}
