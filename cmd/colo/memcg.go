package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/understory/understory/cgroups"
)

// memHier is the memory controller of the fake node, written the way kubelet writes it
// (pod cgroups, the kubepods limit). Package cgroups deliberately never writes the memory
// hierarchy (the agent only reads it there), so the scenario does it itself, in files:
// v1 (and hybrid) memory.limit_in_bytes, memory.usage_in_bytes, memory.oom_control; v2
// memory.max, memory.current, memory.events. Memory pressure comes from the cgroup2
// group (root/unified/<rel>/memory.pressure on hybrid), whose tasks are the same.
//
// Trap: a v1 process keeps its memory cgroup when it moves in the other controllers, and
// its charges stay where they were made (move_charge_at_immigrate is deprecated), so a
// process joins its pod's memory cgroup first thing, before it allocates.
type memHier struct {
	dir    string // the memory hierarchy: root/memory (v1, hybrid) or root (v2)
	psiDir string // the cgroup2 hierarchy holding memory.pressure ("" on pure v1)
	v2     bool
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
		return memHier{dir: root, psiDir: root, v2: true}, nil
	case cgroups.LayoutV1, cgroups.LayoutHybrid:
		dir := filepath.Join(root, "memory")
		if _, err := os.Stat(filepath.Join(dir, "memory.limit_in_bytes")); err != nil {
			return memHier{}, fmt.Errorf("%s: no v1 memory hierarchy: %w", dir, errNoMemcg)
		}
		m := memHier{dir: dir}
		if h.Layout() == cgroups.LayoutHybrid {
			m.psiDir = filepath.Join(root, "unified")
		}
		return m, nil
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

// create makes rel (and its parents) in the memory hierarchy. On v2 it enables the
// memory controller in every parent's subtree_control on the way, as kubelet's layout has.
func (m memHier) create(rel string) error {
	dir, err := m.path(rel)
	if err != nil {
		return err
	}
	if !m.v2 {
		return os.MkdirAll(dir, 0o755)
	}
	parent := m.dir
	for _, part := range strings.Split(strings.Trim(filepath.ToSlash(strings.TrimPrefix(dir, m.dir)), "/"), "/") {
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
			return fmt.Errorf("enabling memory in %s: %w", parent, err)
		}
		parent = filepath.Join(parent, part)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// setLimit sets rel's memory limit in bytes (< 0: no limit).
func (m memHier) setLimit(rel string, limit int64) error {
	dir, err := m.path(rel)
	if err != nil {
		return err
	}
	file, v := "memory.limit_in_bytes", "-1"
	if m.v2 {
		file, v = "memory.max", "max"
	}
	if limit >= 0 {
		v = strconv.FormatInt(limit, 10)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
		return fmt.Errorf("setting %s of %s: %w", file, rel, err)
	}
	return nil
}

// limit returns rel's memory limit in bytes, -1 when unlimited. v1 shows "no limit" as
// a huge page-rounded number.
func (m memHier) limit(rel string) (int64, error) {
	dir, err := m.path(rel)
	if err != nil {
		return 0, err
	}
	file := "memory.limit_in_bytes"
	if m.v2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %w", file, rel, err)
	}
	if v >= 1<<62 {
		return -1, nil
	}
	return v, nil
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
			dir, err := m.path(rel)
			if err != nil {
				return 0, err
			}
			stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
			if err != nil {
				return 0, err
			}
			h, err := keyedValue(stat, "hierarchical_memory_limit")
			if err != nil {
				return 0, fmt.Errorf("memory.stat of %s: %w", rel, err)
			}
			if h < 1<<62 {
				lim = int64(h)
			}
		}
	}
	if lim >= 0 {
		return lim, nil
	}
	b, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if f := strings.Fields(string(line)); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb <= 0 || kb > 1<<50 {
				return 0, fmt.Errorf("%s/meminfo: MemTotal %q", procRoot, f[1])
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("%s/meminfo: no MemTotal", procRoot)
}

// addProc moves pid into rel's memory cgroup.
func (m memHier) addProc(rel string, pid int) error {
	dir, err := m.path(rel)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("moving pid %d into memory cgroup %s: %w", pid, rel, err)
	}
	return nil
}

// memStats is one memory cgroup's state, hierarchical (its descendants included).
type memStats struct {
	Usage        uint64 // charged memory: anonymous, page cache, kernel
	InactiveFile uint64
	Anon         uint64
	File         uint64
	RefaultFile  uint64 // page-cache refaults: evicted pages read again (counter)
}

// WorkingSet is usage minus inactive page cache, as kubelet and cAdvisor count it.
func (s memStats) WorkingSet() uint64 {
	if s.InactiveFile > s.Usage {
		return 0
	}
	return s.Usage - s.InactiveFile
}

func (m memHier) stats(rel string) (memStats, error) {
	dir, err := m.path(rel)
	if err != nil {
		return memStats{}, err
	}
	usageFile := "memory.usage_in_bytes"
	keys := [...]string{"total_inactive_file", "total_rss", "total_cache", "total_workingset_refault_file"}
	if m.v2 {
		usageFile = "memory.current"
		keys = [...]string{"inactive_file", "anon", "file", "workingset_refault_file"}
	}
	b, err := os.ReadFile(filepath.Join(dir, usageFile))
	if err != nil {
		return memStats{}, err
	}
	var s memStats
	if s.Usage, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return memStats{}, fmt.Errorf("%s of %s: %w", usageFile, rel, err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return memStats{}, err
	}
	for i, dst := range []*uint64{&s.InactiveFile, &s.Anon, &s.File, &s.RefaultFile} {
		if *dst, err = keyedValue(stat, keys[i]); err != nil {
			return memStats{}, fmt.Errorf("memory.stat of %s: %w", rel, err)
		}
	}
	return s, nil
}

// oomKills is how many processes the kernel's OOM killer killed in rel's memory cgroup
// (v1 memory.oom_control oom_kill, v2 memory.events oom_kill). Read here until
// package cgroups has a reader for memory events.
func (m memHier) oomKills(rel string) (uint64, error) {
	dir, err := m.path(rel)
	if err != nil {
		return 0, err
	}
	file := "memory.oom_control"
	if m.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	v, err := keyedValue(b, "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %w", file, rel, err)
	}
	return v, nil
}

// pressure reads rel's memory.pressure from the cgroup2 hierarchy.
func (m memHier) pressure(rel string) (cgroups.PSI, error) {
	if m.psiDir == "" {
		return cgroups.PSI{}, fmt.Errorf("memory pressure of %s: no cgroup2 hierarchy: %w", rel, cgroups.ErrUnsupported)
	}
	clean, err := cgroups.CleanPath(rel)
	if err != nil {
		return cgroups.PSI{}, err
	}
	f, err := os.Open(filepath.Join(m.psiDir, clean, "memory.pressure"))
	if err != nil {
		return cgroups.PSI{}, err
	}
	defer f.Close()
	return cgroups.ParsePSI(f)
}

// removeTree removes rel and every memory cgroup below it, deepest first (also those
// the agent created). The processes must be gone; what they left in the page cache
// moves to the parent, as on any pod deletion.
func (m memHier) removeTree(rel string) error {
	top, err := m.path(rel)
	if err != nil {
		return err
	}
	var dirs []string
	err = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var first error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
			first = fmt.Errorf("removing memory cgroup %s: %w", dirs[i], err)
		}
	}
	return first
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
