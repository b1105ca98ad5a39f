package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Hierarchy is a mounted cgroup filesystem at an injected root. It is
// immutable after Open/OpenLayout and safe for concurrent use.
type Hierarchy struct {
	root   string
	layout Layout

	// v1 / hybrid controller directories ("" when the controller is absent).
	cpuDir, cpuacctDir, freezerDir string
	// v1 memory hierarchy (v1, hybrid); "" when absent. Create makes groups
	// there and SetMemoryLimit writes there, but AddProc never moves tasks
	// into it (AddProcMemory does).
	memoryDir string
	// cgroup2 directory: root (v2), root/unified (hybrid), "" (v1).
	unifiedDir string
	// v1 subsystems handed to containerd/cgroups, one per distinct
	// directory (co-mounted cpu,cpuacct appears once).
	subsystems []cgroup1.Subsystem
	// memSubsystems is the v1 memory controller on its own (empty when
	// absent, or co-mounted with one of subsystems): kept apart so that
	// AddProc and Procs, which act on every subsystem of a cgroup1.Cgroup,
	// never move tasks between memory cgroups.
	memSubsystems []cgroup1.Subsystem
}

// Open detects the layout under root and checks that the hierarchies the
// agent writes are not mounted read-only (ErrReadOnly, e.g. a read-only host
// mount in a DaemonSet).
//
// Trap: it checks the mount, not the mode of the hierarchy roots. Those are
// 0555 on some kernels and the agent never writes there (only below kubepods,
// which kubelet creates 0755): an agent running as uid 0 without
// CAP_DAC_OVERRIDE, as the shipped DaemonSet does, cannot write the roots but
// can do all it needs.
func Open(root string) (*Hierarchy, error) {
	l, err := DetectLayout(root)
	if err != nil {
		return nil, err
	}
	h := OpenLayout(root, l)
	for _, dir := range h.writableDirs() {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return nil, fmt.Errorf("opening cgroup hierarchy %s: %s: %w", root, dir, err)
		}
		if st.Flags&unix.ST_RDONLY != 0 {
			return nil, fmt.Errorf("opening cgroup hierarchy %s: %s is mounted read-only: %w", root, dir, ErrReadOnly)
		}
	}
	return h, nil
}

// OpenLayout trusts l without detection (tests, or a caller that already
// knows). Controller directories are still resolved (separate or co-mounted
// v1 controllers).
func OpenLayout(root string, l Layout) *Hierarchy {
	h := &Hierarchy{root: root, layout: l}
	switch l {
	case LayoutV2:
		h.unifiedDir = root
	case LayoutV1, LayoutHybrid:
		h.cpuDir = resolveController(root, "cpu")
		h.cpuacctDir = resolveController(root, "cpuacct")
		h.freezerDir = controllerDir(root, "freezer")
		h.memoryDir = controllerDir(root, "memory")
		if l == LayoutHybrid {
			h.unifiedDir = filepath.Join(root, unifiedDirName)
		}
		h.subsystems = h.buildSubsystems()
		h.memSubsystems = h.buildMemSubsystem()
	}
	return h
}

// resolveController is controllerDir with root/name as the fallback, so a
// hierarchy opened on an empty fake still has well-defined paths.
func resolveController(root, name string) string {
	if d := controllerDir(root, name); d != "" {
		return d
	}
	return filepath.Join(root, name)
}

// buildSubsystems returns containerd/cgroups v1 subsystems for cpu, cpuacct
// and freezer, never memory or cpuset. A controller reachable as root/<name>
// (its own mount, or systemd's symlink to a co-mount) uses the library's own
// controller; a co-mount without symlink is addressed as a named hierarchy.
// Directories that are the same inode are listed once.
func (h *Hierarchy) buildSubsystems() []cgroup1.Subsystem {
	type cand struct {
		name cgroup1.Name
		dir  string
		std  func(string) cgroup1.Subsystem
	}
	cands := []cand{
		{cgroup1.Cpu, h.cpuDir, func(r string) cgroup1.Subsystem { return cgroup1.NewCpu(r) }},
		{cgroup1.Cpuacct, h.cpuacctDir, func(r string) cgroup1.Subsystem { return cgroup1.NewCpuacct(r) }},
		{cgroup1.Freezer, h.freezerDir, func(r string) cgroup1.Subsystem { return cgroup1.NewFreezer(r) }},
	}
	var (
		out  []cgroup1.Subsystem
		seen []os.FileInfo
	)
	for _, c := range cands {
		if c.dir == "" {
			continue
		}
		if fi, err := os.Stat(c.dir); err == nil {
			dup := false
			for _, s := range seen {
				if os.SameFile(s, fi) {
					dup = true
					break
				}
			}
			if dup {
				continue
			}
			seen = append(seen, fi)
		}
		if c.dir == filepath.Join(h.root, string(c.name)) {
			out = append(out, c.std(h.root))
		} else {
			out = append(out, cgroup1.NewNamed(h.root, cgroup1.Name(filepath.Base(c.dir))))
		}
	}
	return out
}

// buildMemSubsystem returns the v1 memory controller as a one-element list,
// or nothing when there is no memory hierarchy or it shares a directory
// with cpu, cpuacct or freezer (then their subsystem already covers it).
func (h *Hierarchy) buildMemSubsystem() []cgroup1.Subsystem {
	if h.memoryDir == "" {
		return nil
	}
	if mi, err := os.Stat(h.memoryDir); err == nil {
		for _, d := range []string{h.cpuDir, h.cpuacctDir, h.freezerDir} {
			if fi, err := os.Stat(d); d != "" && err == nil && os.SameFile(mi, fi) {
				return nil
			}
		}
	}
	if h.memoryDir == filepath.Join(h.root, string(cgroup1.Memory)) {
		return []cgroup1.Subsystem{cgroup1.NewMemory(h.root)}
	}
	return []cgroup1.Subsystem{cgroup1.NewNamed(h.root, cgroup1.Name(filepath.Base(h.memoryDir)))}
}

func (h *Hierarchy) hierarchyFunc() cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) { return h.subsystems, nil }
}

func (h *Hierarchy) memHierarchyFunc() cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) { return h.memSubsystems, nil }
}

// allHierarchyFunc is every v1 subsystem the agent creates groups in (cpu,
// cpuacct, freezer, memory): for Delete and its task count.
func (h *Hierarchy) allHierarchyFunc() cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) {
		return append(slices.Clip(h.subsystems), h.memSubsystems...), nil
	}
}

// writableDirs are the controller roots the agent writes into.
func (h *Hierarchy) writableDirs() []string {
	var out []string
	for _, d := range []string{h.cpuDir, h.cpuacctDir, h.freezerDir, h.unifiedDir, h.memoryDir} {
		if d != "" {
			out = append(out, d)
		}
	}
	return out
}

// Root returns the injected root.
func (h *Hierarchy) Root() string { return h.root }

// Layout returns the layout the hierarchy was opened with.
func (h *Hierarchy) Layout() Layout { return h.layout }

// primaryDir is the directory whose existence defines "the group exists":
// the v1 cpu controller (v1, hybrid) or the cgroup2 directory (v2).
func (h *Hierarchy) primaryDir(rel string) string {
	if h.layout == LayoutV2 {
		return filepath.Join(h.unifiedDir, rel)
	}
	return filepath.Join(h.cpuDir, rel)
}

func (h *Hierarchy) checkLayout() error {
	switch h.layout {
	case LayoutV1, LayoutHybrid, LayoutV2:
		return nil
	}
	return fmt.Errorf("hierarchy at %s has layout %v: %w", h.root, h.layout, ErrNoCgroupFS)
}

// Create makes rel in every hierarchy the agent uses and returns its Group:
// v1/hybrid in cpu, cpuacct, freezer and memory (never cpuset); hybrid also
// under root/unified so cpu.pressure and memory.pressure exist; v2 at
// root/rel with the cpu controller enabled along the path (memory is not
// enabled: kubelet enables it on its QoS cgroups, and where it did not,
// SetMemoryLimit answers ErrUnsupported). Missing parents are created too.
// Create is idempotent and repairs a group missing from some hierarchy,
// e.g. a group an older agent made without its memory directory.
func (h *Hierarchy) Create(rel string) (*Group, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	if err := h.checkLayout(); err != nil {
		return nil, err
	}
	if h.unifiedDir != "" {
		// containerd/cgroups refuses some group paths (e.g. ones starting
		// with sys/fs/cgroup); refuse them before creating anything.
		if err := cgroup2.VerifyGroupPath("/" + rel); err != nil {
			return nil, fmt.Errorf("creating cgroup %s: %w: %w", rel, ErrInvalidPath, err)
		}
	}
	g := &Group{h: h, rel: rel}
	if h.layout != LayoutV2 {
		c, err := cgroup1.New(cgroup1.StaticPath("/"+rel), &specs.LinuxResources{}, cgroup1.WithHierarchy(h.hierarchyFunc()))
		if err != nil {
			return nil, classify("creating", filepath.Join(h.cpuDir, rel), "", err)
		}
		g.v1 = c
		if len(h.memSubsystems) > 0 {
			// Only mkdir: the library's memory Create writes nothing without
			// resources.Memory.
			m, err := cgroup1.New(cgroup1.StaticPath("/"+rel), &specs.LinuxResources{}, cgroup1.WithHierarchy(h.memHierarchyFunc()))
			if err != nil {
				return nil, classify("creating", filepath.Join(h.memoryDir, rel), "", err)
			}
			g.mem = m
		}
	}
	if h.unifiedDir != "" {
		res := &cgroup2.Resources{}
		if h.layout == LayoutV2 {
			// Enable cpu along the path so cpu.weight/cpu.max/cpu.idle exist.
			// A no-op where kubelet already enabled it.
			res.CPU = &cgroup2.CPU{}
		}
		m, err := cgroup2.NewManager(h.unifiedDir, "/"+rel, res)
		if err != nil {
			return nil, classify("creating", filepath.Join(h.unifiedDir, rel), "", err)
		}
		g.v2 = m
	}
	return g, nil
}

// Load returns the existing group rel. A missing group is an error wrapping
// ErrNotExist (and so fs.ErrNotExist).
func (h *Hierarchy) Load(rel string) (*Group, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	return h.load(rel)
}

// LoadRoot returns the root cgroup of every hierarchy the agent uses. It is
// only for moving processes back out of groups (AddProc) before deleting them:
// never set limits on it.
func (h *Hierarchy) LoadRoot() (*Group, error) { return h.load("") }

func (h *Hierarchy) load(rel string) (*Group, error) {
	if err := h.checkLayout(); err != nil {
		return nil, err
	}
	if !isDir(h.primaryDir(rel)) {
		return nil, fmt.Errorf("loading cgroup %s under %s: %w", rel, h.root, ErrNotExist)
	}
	g := &Group{h: h, rel: rel}
	if h.layout != LayoutV2 {
		c, err := cgroup1.Load(cgroup1.StaticPath("/"+rel), cgroup1.WithHierarchy(h.hierarchyFunc()))
		if err != nil {
			if errors.Is(err, cgroup1.ErrCgroupDeleted) {
				return nil, fmt.Errorf("loading cgroup %s under %s: %w", rel, h.root, ErrNotExist)
			}
			return nil, fmt.Errorf("loading cgroup %s under %s: %w", rel, h.root, err)
		}
		g.v1 = c
		if len(h.memSubsystems) > 0 && isDir(filepath.Join(h.memoryDir, rel)) {
			m, err := cgroup1.Load(cgroup1.StaticPath("/"+rel), cgroup1.WithHierarchy(h.memHierarchyFunc()))
			if err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
				return nil, fmt.Errorf("loading cgroup %s under %s: %w", rel, h.memoryDir, err)
			}
			g.mem = m
		}
	}
	if h.unifiedDir != "" && isDir(filepath.Join(h.unifiedDir, rel)) {
		m, err := cgroup2.Load("/"+rel, cgroup2.WithMountpoint(h.unifiedDir))
		if err != nil {
			return nil, fmt.Errorf("loading cgroup %s under %s: %w", rel, h.unifiedDir, err)
		}
		g.v2 = m
	}
	return g, nil
}

// Exists reports whether rel is a valid path and its group exists (in the
// cpu controller on v1/hybrid, at root/rel on v2).
func (h *Hierarchy) Exists(rel string) bool {
	rel, err := CleanPath(rel)
	if err != nil || h.checkLayout() != nil {
		return false
	}
	return isDir(h.primaryDir(rel))
}

// ListChildren returns the sorted names (not paths) of rel's child groups in
// the cpu hierarchy (v1, hybrid) or at root/rel (v2), e.g. to rediscover the
// pod cgroups below a QoS cgroup or the tier at start-up. Children that
// vanish while the directory is read are simply absent; a rel that is gone
// wraps ErrNotExist. Names are directory names: join them to rel and check
// them (CleanPath) before use.
func (h *Hierarchy) ListChildren(rel string) ([]string, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	if err := h.checkLayout(); err != nil {
		return nil, err
	}
	dir := h.primaryDir(rel)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, classify("listing children of", dir, "", err)
	}
	var out []string
	for _, e := range entries {
		// kernfs reports DT_DIR in the directory entry itself, so no stat
		// (which could race with a removal) is needed.
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}
