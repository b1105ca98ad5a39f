package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// RemoveEmpty removes the empty cgroup rel and its empty descendants, deepest first, from
// EVERY hierarchy mounted under the root — not only the ones the agent uses. It is for
// cgroups someone else created in all hierarchies: runc creates a container's parents
// with mkdir -p in each of blkio, cpuset, devices, memory, pids, … and removes only the
// container's own directory, so a pod cgroup the runtime made below the tier outlives
// the pod everywhere. Only empty groups go (rmdir); a group still holding tasks is left
// and the error wraps ErrBusy. A group missing somewhere is fine.
func (h *Hierarchy) RemoveEmpty(rel string) error {
	rel, err := CleanPath(rel)
	if err != nil {
		return err
	}
	var errs []error
	for _, mount := range h.mounts() {
		errs = append(errs, removeTree(filepath.Join(mount, rel)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing cgroup %s: %w", rel, err)
	}
	return nil
}

// mounts lists the hierarchy roots under the root: the unified root on v2; every
// controller directory (each co-mount once, symlinks skipped) and unified/ on v1 and
// hybrid.
func (h *Hierarchy) mounts() []string {
	if h.layout == LayoutV2 {
		return []string{h.root}
	}
	entries, err := os.ReadDir(h.root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() { // symlinks (cpu -> cpu,cpuacct) report false here
			out = append(out, filepath.Join(h.root, e.Name()))
		}
	}
	return out
}

// removeTree rmdirs dir's subdirectories deepest first, then dir.
func removeTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.ENOTEMPTY) {
				return fmt.Errorf("%s: %w: %w", d, ErrBusy, err)
			}
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return nil
}
