package colo

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
)

// memHier is what the memory scenario needs of the memory controller beyond package
// cgroups, which creates, limits, moves into, counts OOM kills of, reads the working set
// and pressure of, and removes memory cgroups. Left here: enabling the memory controller
// along a v2 path (kubelet's job, which Hierarchy.Create leaves to it), the charged usage
// with page cache (cgroups reports only the working set), page-cache refaults and v1's
// hierarchical_memory_limit (memory.stat keys cgroups does not read).
//
// Trap: a v1 process keeps its memory cgroup when it moves in the other controllers, and
// its charges stay where they were made (move_charge_at_immigrate is deprecated), so a
// pod's process joins with AddProcMemory first thing, before it allocates.
type memHier struct {
	h   *cgroups.Hierarchy
	dir string // the memory hierarchy: root/memory (v1, hybrid) or root (v2)
	v2  bool
}

// errNoMemcg says the machine has no usable memory controller.
var errNoMemcg = errors.New("no memory cgroup controller")

// openMemHier finds the memory controller of the hierarchy h was opened on.
func openMemHier(h *cgroups.Hierarchy) (memHier, error) {
	root := h.Root()
	switch h.Layout() {
	case cgroups.LayoutV2:
		b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err != nil {
			return memHier{}, err
		}
		if !slices.Contains(strings.Fields(string(b)), "memory") {
			return memHier{}, fmt.Errorf("%s: cgroup2 without the memory controller: %w", root, errNoMemcg)
		}
		return memHier{h: h, dir: root, v2: true}, nil
	case cgroups.LayoutV1, cgroups.LayoutHybrid:
		dir := filepath.Join(root, "memory")
		if _, err := os.Stat(filepath.Join(dir, "memory.limit_in_bytes")); err != nil {
			return memHier{}, fmt.Errorf("%s: no v1 memory hierarchy: %w", dir, errNoMemcg)
		}
		return memHier{h: h, dir: dir}, nil
	}
	return memHier{}, fmt.Errorf("%s: layout %v: %w", root, h.Layout(), errNoMemcg)
}

func (m memHier) path(rel string) (string, error) {
	clean, err := cgroups.CleanPath(rel)
	if err != nil {
		return "", err
	}
	return filepath.Join(m.dir, clean), nil
}

// enableMemory enables the memory controller in the subtree_control of every parent of
// rel on v2, as kubelet's layout has (Hierarchy.Create enables only cpu there, and
// leaves memory to kubelet). A no-op on v1 and hybrid, where Create makes the memory
// directories.
func (m memHier) enableMemory(rel string) error {
	if !m.v2 {
		return nil
	}
	clean, err := cgroups.CleanPath(rel)
	if err != nil {
		return err
	}
	parent := m.dir
	for _, part := range strings.Split(clean, "/") {
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
			return fmt.Errorf("enabling memory in %s: %w", parent, err)
		}
		parent = filepath.Join(parent, part)
	}
	return nil
}

// limit returns rel's memory limit (max) in bytes, cgroups.UnlimitedMemory for none.
func (m memHier) limit(rel string) (int64, error) {
	g, err := m.h.Load(rel)
	if err != nil {
		return 0, err
	}
	l, _, err := g.MemoryLimit()
	return l, err
}

// oomKills is how many processes the kernel's OOM killer killed in rel's memory cgroup.
func (m memHier) oomKills(rel string) (uint64, error) {
	g, err := m.h.Load(rel)
	if err != nil {
		return 0, err
	}
	ev, err := g.MemoryEvents()
	return ev.OOMKill, err
}

// workingSet is rel's memory working set (usage minus inactive page cache), as kubelet
// and cAdvisor count it.
func (m memHier) workingSet(rel string) (uint64, error) {
	g, err := m.h.Load(rel)
	if err != nil {
		return 0, err
	}
	return g.MemoryUsage()
}

// pressure reads rel's memory.pressure (cgroup2; ErrUnsupported on pure v1).
func (m memHier) pressure(rel string) (cgroups.PSI, error) {
	g, err := m.h.Load(rel)
	if err != nil {
		return cgroups.PSI{}, err
	}
	return g.MemoryPressure()
}

// visibleLimit is the memory a process in rel can see as its own: rel's limit, else
// the nearest limit above it (v1 memory.stat hierarchical_memory_limit, v2 the smallest
// memory.max up the path), else the machine's memory. It is what runtimes that size
// their heap from "the container's memory" read: the JVM (MaxRAMPercentage; on v1 it
// falls back to hierarchical_memory_limit), Spark, Ray. In a BestEffort pod it is the
// whole node.
func (m memHier) visibleLimit(rel string, procRoot string) (int64, error) {
	lim := int64(-1)
	if m.v2 {
		for p := rel; p != "." && p != "/" && p != ""; p = filepath.Dir(p) {
			l, err := m.limit(p)
			if err != nil {
				return 0, err
			}
			if l >= 0 && (lim < 0 || l < lim) {
				lim = l
			}
		}
	} else {
		l, err := m.limit(rel)
		if err != nil {
			return 0, err
		}
		if lim = l; lim < 0 {
			h, err := m.statValue(rel, "hierarchical_memory_limit")
			if err != nil {
				return 0, err
			}
			if h < 1<<62 {
				lim = int64(h)
			}
		}
	}
	if lim >= 0 {
		return lim, nil
	}
	mi, err := collect.ReadMemInfo(procRoot)
	if err != nil {
		return 0, err
	}
	return int64(min(mi.Total, math.MaxInt64)), nil
}

// usage is the memory charged to rel and its descendants, page cache included (v1
// memory.usage_in_bytes, v2 memory.current): what the node's memory holds for it.
func (m memHier) usage(rel string) (uint64, error) {
	dir, err := m.path(rel)
	if err != nil {
		return 0, err
	}
	file := "memory.usage_in_bytes"
	if m.v2 {
		file = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %w", file, rel, err)
	}
	return v, nil
}

// refaults counts rel's page-cache refaults (evicted pages read again), hierarchical:
// v1 total_workingset_refault_file, v2 workingset_refault_file.
func (m memHier) refaults(rel string) (uint64, error) {
	key := "total_workingset_refault_file"
	if m.v2 {
		key = "workingset_refault_file"
	}
	return m.statValue(rel, key)
}

// statValue reads key from rel's memory.stat.
func (m memHier) statValue(rel, key string) (uint64, error) {
	dir, err := m.path(rel)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	v, err := keyedValue(b, key)
	if err != nil {
		return 0, fmt.Errorf("memory.stat of %s: %w", rel, err)
	}
	return v, nil
}

// keyedValue returns the value of key in a "key value" per line file; a missing key is
// an error (every kernel with the file has the keys read here).
func keyedValue(b []byte, key string) (uint64, error) {
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s", key)
}
