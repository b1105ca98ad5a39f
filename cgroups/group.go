package cgroups

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// Group is one cgroup, addressed by its path relative to the Hierarchy
// root, in every hierarchy the agent uses. A Group holds no open files; it
// stays valid (returning ErrNotExist) after the cgroup is removed.
type Group struct {
	h   *Hierarchy
	rel string
	v1  cgroup1.Cgroup   // cpu, cpuacct, freezer (v1, hybrid)
	mem cgroup1.Cgroup   // v1 memory (v1, hybrid); nil when the group has no memory directory
	v2  *cgroup2.Manager // v2 group, or the hybrid unified group
}

// Path returns the group's path relative to the hierarchy root.
func (g *Group) Path() string { return g.rel }

// cpuDir is the group's directory holding cpu.* files.
func (g *Group) cpuDir() string {
	if g.h.layout == LayoutV2 {
		return filepath.Join(g.h.unifiedDir, g.rel)
	}
	return filepath.Join(g.h.cpuDir, g.rel)
}

// cpuacctDir is the group's directory holding cpuacct.* files (v1, hybrid).
func (g *Group) cpuacctDir() string { return filepath.Join(g.h.cpuacctDir, g.rel) }

// unifiedDir is the group's cgroup2 directory ("" on v1).
func (g *Group) unifiedDir() string {
	if g.h.unifiedDir == "" {
		return ""
	}
	return filepath.Join(g.h.unifiedDir, g.rel)
}

// wrapLib maps an error from containerd/cgroups for this group.
func (g *Group) wrapLib(op string, err error) error {
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return fmt.Errorf("%s cgroup %s: %w", op, g.rel, ErrNotExist)
	}
	return classify(op+" cgroup", g.h.primaryDir(g.rel), "", err)
}

// AddProc moves process pid (all its threads) into the group in every
// hierarchy the agent uses: cpu, cpuacct, freezer and, on hybrid, unified.
// Never v1 memory or cpuset: the process keeps its memory cgroup (the
// caller may be moving itself, and its own memory cgroup is a sandbox's).
// On v2 there is one hierarchy, so the group's memory limit applies too.
// Use AddProcMemory for a process the group's memory limit must bound.
func (g *Group) AddProc(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("adding pid %d to cgroup %s: %w", pid, g.rel, ErrInvalidValue)
	}
	if g.v1 != nil {
		if err := g.v1.AddProc(uint64(pid)); err != nil {
			return g.wrapLib(fmt.Sprintf("adding pid %d to", pid), err)
		}
	}
	if g.v2 != nil {
		if err := g.v2.AddProc(uint64(pid)); err != nil {
			return g.wrapLib(fmt.Sprintf("adding pid %d to", pid), err)
		}
	}
	return nil
}

// AddProcMemory is AddProc plus, on v1 and hybrid, the group's v1 memory
// cgroup, so that SetMemoryLimit bounds the process and MemoryEvents counts
// its OOM kill. Memory already charged stays with the old memory cgroup
// (memory.move_charge_at_immigrate is left alone); only new allocations
// are charged here. A group without a memory directory (made before Create
// created one) wraps ErrNotExist: call Create to repair it.
func (g *Group) AddProcMemory(pid int) error {
	// Memory co-mounted with cpu has no subsystem of its own: AddProc moves it.
	needMem := g.h.layout != LayoutV2 && len(g.h.memSubsystems) > 0
	if needMem && g.mem == nil && pid > 0 {
		return fmt.Errorf("adding pid %d to memory cgroup %s: no memory directory (call Create): %w", pid, g.rel, ErrNotExist)
	}
	if err := g.AddProc(pid); err != nil || !needMem {
		return err
	}
	if err := g.mem.AddProc(uint64(pid)); err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return fmt.Errorf("adding pid %d to memory cgroup %s: %w", pid, g.rel, ErrNotExist)
		}
		return classify(fmt.Sprintf("adding pid %d to memory cgroup", pid), filepath.Join(g.h.memoryDir, g.rel), "", err)
	}
	return nil
}

// Procs returns the sorted process IDs in the group itself (its
// cgroup.procs in the cpu hierarchy, or at root/rel on v2), not in its
// descendants.
func (g *Group) Procs() ([]int, error) {
	var out []int
	switch {
	case g.v1 != nil:
		if len(g.h.subsystems) == 0 {
			return nil, fmt.Errorf("listing procs of cgroup %s: no v1 cpu hierarchy: %w", g.rel, ErrNoCgroupFS)
		}
		ps, err := g.v1.Processes(g.h.subsystems[0].Name(), false)
		if err != nil {
			return nil, g.wrapLib("listing procs of", err)
		}
		for _, p := range ps {
			out = append(out, p.Pid)
		}
	case g.v2 != nil:
		ps, err := g.v2.Procs(false)
		if err != nil {
			return nil, g.wrapLib("listing procs of", err)
		}
		for _, p := range ps {
			out = append(out, int(p))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Delete removes the group, its descendants first, from every hierarchy
// the agent uses (v1 memory included). A group that is already gone (anywhere or everywhere) is
// not an error. If any task remains in the group or a descendant, nothing
// is removed and the error wraps ErrBusy.
func (g *Group) Delete() error {
	if n, where, err := g.remainingTasks(); err != nil {
		return err
	} else if n > 0 {
		return fmt.Errorf("deleting cgroup %s: %d task(s) remain under %s: %w", g.rel, n, where, ErrBusy)
	}
	if g.h.layout != LayoutV2 {
		c, err := cgroup1.Load(cgroup1.StaticPath("/"+g.rel), cgroup1.WithHierarchy(g.h.allHierarchyFunc()))
		switch {
		case errors.Is(err, cgroup1.ErrCgroupDeleted):
		case err != nil:
			return fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
		default:
			if err := c.Delete(); err != nil {
				return fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
			}
		}
	}
	if d := g.unifiedDir(); d != "" && isDir(d) {
		m, err := cgroup2.Load("/"+g.rel, cgroup2.WithMountpoint(g.h.unifiedDir))
		if err != nil {
			return fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
		}
		if err := m.Delete(); err != nil && !isGone(err) {
			return fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
		}
	}
	return nil
}

// remainingTasks counts processes in the group and its descendants across
// all hierarchies the agent uses; missing directories count as empty.
func (g *Group) remainingTasks() (int, string, error) {
	if g.h.layout != LayoutV2 {
		c, err := cgroup1.Load(cgroup1.StaticPath("/"+g.rel), cgroup1.WithHierarchy(g.h.allHierarchyFunc()))
		switch {
		case errors.Is(err, cgroup1.ErrCgroupDeleted):
		case err != nil:
			return 0, "", fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
		default:
			for _, s := range c.Subsystems() {
				ps, err := c.Processes(s.Name(), true)
				if err != nil {
					if isGone(err) {
						continue
					}
					return 0, "", fmt.Errorf("deleting cgroup %s: listing %s tasks: %w", g.rel, s.Name(), err)
				}
				if len(ps) > 0 {
					return len(ps), string(s.Name()), nil
				}
			}
		}
	}
	if d := g.unifiedDir(); d != "" && isDir(d) {
		m, err := cgroup2.Load("/"+g.rel, cgroup2.WithMountpoint(g.h.unifiedDir))
		if err != nil {
			return 0, "", fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
		}
		ps, err := m.Procs(true)
		if err != nil && !isGone(err) {
			return 0, "", fmt.Errorf("deleting cgroup %s: listing unified tasks: %w", g.rel, err)
		}
		if len(ps) > 0 {
			return len(ps), "unified", nil
		}
	}
	return 0, "", nil
}
