// Package cgroupstest builds fake cgroup filesystems in a test's temp dir, for tests of
// code that drives package cgroups without touching the machine's real cgroups.
//
// The kernel creates a cgroup's control files on mkdir; a directory tree cannot, so a
// fake is "the kernel's part": NewRoot lays out the mount points and kubelet's QoS-level
// cgroups, and AddGroup creates a group's directories with the files the kernel would
// put in them. Tests then change those files (SetUsage) to play the kernel over time.
//
// It deliberately does not import package cgroups, so that package's own tests use it.
package cgroupstest

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Kind is a shape of cgroup mount tree.
type Kind int

const (
	V1Separate      Kind = iota // cpu and cpuacct each their own mount
	V1Combined                  // cpu,cpuacct co-mount with cpu and cpuacct symlinks
	V1CombinedBare              // cpu,cpuacct co-mount without symlinks
	V1NoFreezer                 // v1 without a freezer hierarchy
	Hybrid                      // v1 controllers + controller-less cgroup2 at unified/
	HybridNoFreezer             // hybrid without a v1 freezer
	V2                          // unified cgroup2 at the root
)

// Kinds lists every kind.
var Kinds = []Kind{V1Separate, V1Combined, V1CombinedBare, V1NoFreezer, Hybrid, HybridNoFreezer, V2}

func (k Kind) String() string {
	return [...]string{"v1-separate", "v1-combined", "v1-combined-bare", "v1-nofreezer", "hybrid", "hybrid-nofreezer", "v2"}[k]
}

// IsV2 reports whether the root is a unified cgroup2 mount.
func (k Kind) IsV2() bool { return k == V2 }

// IsHybrid reports whether the root has a controller-less cgroup2 at unified/.
func (k Kind) IsHybrid() bool { return k == Hybrid || k == HybridNoFreezer }

// HasFreezer reports whether the root has a v1 freezer hierarchy.
func (k Kind) HasFreezer() bool { return !k.IsV2() && k != V1NoFreezer && k != HybridNoFreezer }

// Pressure is the content of every fake cpu.pressure file.
const Pressure = "some avg10=1.50 avg60=0.75 avg300=0.25 total=123456\nfull avg10=0.50 avg60=0.25 avg300=0.05 total=6543\n"

// MemoryPressure is the content of every fake memory.pressure file (cgroup2 groups, hybrid too).
const MemoryPressure = "some avg10=2.00 avg60=1.00 avg300=0.50 total=222222\nfull avg10=1.00 avg60=0.50 avg300=0.25 total=111111\n"

// Unlimited64 is what v1 memory limit files read when there is no limit (PAGE_COUNTER_MAX
// pages of 4 KiB).
const Unlimited64 = "9223372036854771712"

// Memory controller files of a new group: V1MemoryFiles in the v1 memory hierarchy (v1,
// hybrid), V2MemoryFiles next to the cpu files on v2 (present when the parent enabled the
// memory controller). Callers must not modify them.
var (
	V1MemoryFiles = map[string]string{
		"memory.limit_in_bytes": Unlimited64 + "\n", "memory.soft_limit_in_bytes": Unlimited64 + "\n",
		"memory.use_hierarchy": "1\n", "memory.usage_in_bytes": "0\n", "memory.failcnt": "0\n",
		"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
		"memory.stat":        "cache 0\nrss 0\ntotal_inactive_file 0\n", "cgroup.procs": "", "tasks": "",
	}
	V2MemoryFiles = map[string]string{
		"memory.max": "max\n", "memory.high": "max\n", "memory.current": "0\n", "memory.reclaim": "",
		"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
		"memory.stat":   "anon 0\nfile 0\ninactive_file 0\n",
	}
)

// The files the kernel creates in a new group, per hierarchy. Callers must not modify them.
var (
	V1CPUFiles = map[string]string{
		"cpu.shares": "1024\n", "cpu.cfs_period_us": "100000\n", "cpu.cfs_quota_us": "-1\n",
		"cpu.idle": "0\n", "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n",
		"cgroup.procs": "", "tasks": "",
	}
	V1CPUAcctFiles = map[string]string{"cpuacct.usage": "0\n", "cgroup.procs": "", "tasks": ""}
	V1FreezerFiles = map[string]string{"freezer.state": "THAWED\n", "cgroup.procs": "", "tasks": ""}
	HybridFiles    = map[string]string{
		"cgroup.procs": "", "cgroup.freeze": "0\n", "cgroup.events": "populated 0\nfrozen 0\n",
		"cgroup.subtree_control": "", "cgroup.type": "domain\n", "cpu.pressure": Pressure,
		"memory.pressure": MemoryPressure,
	}
	V2Files = map[string]string{
		"cgroup.procs": "", "cgroup.freeze": "0\n", "cgroup.events": "populated 0\nfrozen 0\n",
		"cgroup.subtree_control": "", "cgroup.type": "domain\n", "cpu.pressure": Pressure,
		"memory.pressure": MemoryPressure,
		"cpu.weight":      "100\n", "cpu.max": "max 100000\n", "cpu.idle": "0\n",
		"cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
	}
)

// kubeletQOS are kubelet's QoS-level cgroups for both drivers.
var kubeletQOS = []string{
	"kubepods", "kubepods/burstable", "kubepods/besteffort",
	"kubepods.slice", "kubepods.slice/kubepods-burstable.slice", "kubepods.slice/kubepods-besteffort.slice",
}

// NewRoot builds a fake root of kind k in a new temp dir, with kubelet's QoS-level
// cgroups for both drivers, and memory and cpuset hierarchies (AddGroup puts no files in
// memory; AddMemory does).
func NewRoot(t testing.TB, k Kind) string {
	t.Helper()
	root := t.TempDir()
	if k.IsV2() {
		write(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory pids\n")
		writeFiles(t, root, map[string]string{"cgroup.subtree_control": "", "cgroup.procs": "", "cpu.pressure": Pressure})
	} else {
		switch k {
		case V1Combined, V1CombinedBare:
			mkdir(t, filepath.Join(root, "cpu,cpuacct"))
			if k == V1Combined {
				for _, l := range []string{"cpu", "cpuacct"} {
					if err := os.Symlink("cpu,cpuacct", filepath.Join(root, l)); err != nil {
						t.Fatal(err)
					}
				}
			}
		default:
			mkdir(t, filepath.Join(root, "cpu"))
			mkdir(t, filepath.Join(root, "cpuacct"))
		}
		if k.HasFreezer() {
			mkdir(t, filepath.Join(root, "freezer"))
		}
		mkdir(t, filepath.Join(root, "memory"))
		mkdir(t, filepath.Join(root, "cpuset"))
		if k.IsHybrid() {
			write(t, filepath.Join(root, "unified", "cgroup.controllers"), "")
			writeFiles(t, filepath.Join(root, "unified"), map[string]string{"cgroup.subtree_control": "", "cgroup.procs": ""})
		}
	}
	for _, q := range kubeletQOS {
		AddGroup(t, root, k, q)
	}
	return root
}

// cpuDir and cpuacctDir are where the v1 cpu and cpuacct hierarchies are.
func cpuDir(root string, k Kind) string {
	if k == V1CombinedBare {
		return filepath.Join(root, "cpu,cpuacct")
	}
	return filepath.Join(root, "cpu")
}

func cpuacctDir(root string, k Kind) string {
	if k == V1CombinedBare {
		return filepath.Join(root, "cpu,cpuacct")
	}
	return filepath.Join(root, "cpuacct")
}

// Dir is rel's directory in the hierarchy holding CPU control files (cpu.max or cpu.shares).
func Dir(root string, k Kind, rel string) string {
	if k.IsV2() {
		return filepath.Join(root, rel)
	}
	return filepath.Join(cpuDir(root, k), rel)
}

// AddGroup creates rel's directories and the files the kernel would put in them, in
// every hierarchy of the root. Existing files are reset.
func AddGroup(t testing.TB, root string, k Kind, rel string) {
	t.Helper()
	if k.IsV2() {
		writeFiles(t, filepath.Join(root, rel), V2Files)
		return
	}
	if k.IsHybrid() {
		writeFiles(t, filepath.Join(root, "unified", rel), HybridFiles)
	}
	writeFiles(t, filepath.Join(cpuDir(root, k), rel), V1CPUFiles)
	writeFiles(t, filepath.Join(cpuacctDir(root, k), rel), V1CPUAcctFiles)
	if k.HasFreezer() {
		writeFiles(t, filepath.Join(root, "freezer", rel), V1FreezerFiles)
	}
}

// AddMemory gives rel its memory controller files, as the kernel does for a group in the v1
// memory hierarchy (v1, hybrid; the directory is created too) or for a v2 group whose parent
// enabled the memory controller. Existing files are reset.
func AddMemory(t testing.TB, root string, k Kind, rel string) {
	t.Helper()
	files := V1MemoryFiles
	if k.IsV2() {
		files = V2MemoryFiles
	}
	writeFiles(t, MemoryDir(root, k, rel), files)
}

// MemoryDir is rel's directory holding memory controller files: root/memory/rel on v1 and
// hybrid, root/rel on v2.
func MemoryDir(root string, k Kind, rel string) string {
	if k.IsV2() {
		return filepath.Join(root, rel)
	}
	return filepath.Join(root, "memory", rel)
}

// RemoveGroup removes rel from every hierarchy, as if the cgroup vanished.
func RemoveGroup(t testing.TB, root string, k Kind, rel string) {
	t.Helper()
	dirs := []string{filepath.Join(root, rel)}
	if !k.IsV2() {
		dirs = []string{filepath.Join(cpuDir(root, k), rel), filepath.Join(cpuacctDir(root, k), rel), filepath.Join(root, "freezer", rel), filepath.Join(root, "unified", rel), filepath.Join(root, "memory", rel)}
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
}

// SetUsage sets rel's cumulative CPU usage (v1 cpuacct.usage, v2 cpu.stat usage_usec).
func SetUsage(t testing.TB, root string, k Kind, rel string, usage time.Duration) {
	t.Helper()
	if k.IsV2() {
		write(t, filepath.Join(root, rel, "cpu.stat"), fmt.Sprintf(
			"usage_usec %d\nuser_usec %d\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
			usage.Microseconds(), usage.Microseconds()))
		return
	}
	write(t, filepath.Join(cpuacctDir(root, k), rel, "cpuacct.usage"), fmt.Sprintf("%d\n", usage.Nanoseconds()))
}

// Read returns a control file of rel, from the CPU hierarchy (or the unified root).
func Read(t testing.TB, root string, k Kind, rel, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(root, k, rel), file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		write(t, filepath.Join(dir, name), content)
	}
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

// LockCPU serialises tests that run CPU burners on the machine's real cgroups and
// measure what the kernel gives them: `go test ./...` runs packages in parallel, and
// one package's busy loops would starve another's idle-class burner. It holds an
// exclusive flock on a file in the temp dir until the test ends.
func LockCPU(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "understory-cpu-tests.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("opening the CPU test lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		t.Fatalf("taking the CPU test lock: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	})
}

// Burn spins the calling goroutine on the CPU until d has passed: the CPU burner of the
// tests' re-executed helper processes (checked against the clock every ~million steps,
// so it never sleeps).
func Burn(d time.Duration) {
	deadline := time.Now().Add(d)
	x := uint64(1)
	for i := 0; ; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		if i%(1<<20) == 0 && time.Now().After(deadline) {
			break
		}
	}
	if x == 0 {
		println(x)
	}
}
