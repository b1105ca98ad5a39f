package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ThawTree thaws every cgroup at or below rel that is frozen or asked to freeze, in
// every freezer the hierarchy has (the v1 freezer hierarchy, and the cgroup2 one: v2, or
// hybrid's unified mount), and waits, bounded by ctx, until the kernel reports none of
// them frozen. It returns the groups it found frozen (relative paths, parents first,
// each once).
//
// The freezer is per cgroup, so thawing a parent is not enough: on v1 a child frozen on
// its own reads FROZEN after its parent thaws (freezer.self_freezing 1), and on v2 a
// child's cgroup.freeze 1 keeps it frozen. Each pass walks the tree parents first and
// writes a thaw to every group that asks to be frozen, then reads them all again; a
// pass repeats until nothing reads frozen (v1 freezer.state THAWED, v2 cgroup.events
// "frozen 0") or ctx ends (ErrTimeout, naming the groups still frozen). A rel that no
// hierarchy holds wraps ErrNotExist; a hierarchy without any freezer thaws nothing.
func (h *Hierarchy) ThawTree(ctx context.Context, rel string) ([]string, error) {
	rel, err := CleanPath(rel)
	if err != nil {
		return nil, err
	}
	var trees []freezerTree
	if h.freezerDir != "" {
		trees = append(trees, freezerTree{dir: h.freezerDir, v1: true})
	}
	if h.unifiedDir != "" {
		trees = append(trees, freezerTree{dir: h.unifiedDir})
	}
	seen := map[string]bool{}
	var thawed []string
	first := true
	err = poll(ctx, func() (bool, string, error) {
		var still []string
		present := false
		for _, t := range trees {
			th, st, err := t.pass(rel)
			if errors.Is(err, fs.ErrNotExist) {
				continue // not in this hierarchy (or removed since the last pass)
			}
			if err != nil {
				return false, "", err
			}
			present = true
			for _, p := range th {
				if !seen[p] {
					seen[p] = true
					thawed = append(thawed, p)
				}
			}
			still = append(still, st...)
		}
		if first && !present && len(trees) > 0 {
			return false, "", fmt.Errorf("thawing below cgroup %s: %w", rel, ErrNotExist)
		}
		first = false
		return len(still) == 0, "frozen: " + strings.Join(still, ", "), nil
	}, "thawing below", rel)
	return thawed, err
}

// freezerTree is one hierarchy's freezer: a v1 freezer mount or a cgroup2 mount.
type freezerTree struct {
	dir string
	v1  bool
}

// pass walks the groups at and below rel parents first, thawing each that asks to be
// frozen, then reads them all again. thawed are the groups it wrote a thaw to; still
// those that read frozen afterwards. A rel missing in this hierarchy wraps
// fs.ErrNotExist; groups removed during the walk (a pod deleted) are skipped.
func (t freezerTree) pass(rel string) (thawed, still []string, err error) {
	top := filepath.Join(t.dir, rel)
	if _, err := os.Stat(top); err != nil {
		return nil, nil, err
	}
	var dirs []string
	werr := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed under the walk
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		dirs = append(dirs, p)
		asked, err := t.asked(p)
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if asked {
			if err := writeSmall(p, t.freezeFile(), t.thawValue()); err != nil && !gone(err) {
				return err
			}
			r, _ := filepath.Rel(t.dir, p)
			thawed = append(thawed, r)
		}
		return nil
	})
	if werr != nil {
		return thawed, nil, fmt.Errorf("thawing below %s: %w", top, werr)
	}
	for _, p := range dirs {
		frozen, err := t.frozen(p)
		if err != nil {
			continue // removed since, or no freezer state to read
		}
		if frozen {
			r, _ := filepath.Rel(t.dir, p)
			still = append(still, r)
		}
	}
	return thawed, still, nil
}

func (t freezerTree) freezeFile() string {
	if t.v1 {
		return fileFreezerState
	}
	return fileFreeze
}

func (t freezerTree) thawValue() string {
	if t.v1 {
		return v1State(false)
	}
	return v2Freeze(false)
}

// asked reports whether the group at dir is frozen or asked to freeze: v1
// freezer.state FROZEN or FREEZING (a child of a frozen parent reads so too; the write
// that thaws it is then a no-op, and the parent's thaw, earlier in the walk, frees it),
// v2 cgroup.freeze 1.
func (t freezerTree) asked(dir string) (bool, error) {
	if t.v1 {
		s, err := readV1FreezerState(dir)
		return err == nil && s != v1State(false), err
	}
	var buf [16]byte
	n, err := readSmall(dir, fileFreeze, buf[:])
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(buf[:n])) == v2Freeze(true), nil
}

// frozen reports whether the kernel reports the group at dir frozen: v1 freezer.state
// not THAWED, v2 cgroup.events "frozen 1" (its own request or an ancestor's).
func (t freezerTree) frozen(dir string) (bool, error) {
	if t.v1 {
		return t.asked(dir)
	}
	return readEventsFrozen(dir)
}

// gone reports whether err means there is nothing to thaw at a group: it was removed
// (a pod deleted during the walk), or it has no freezer file (the cgroup2 root, a
// kernel before 5.2).
func gone(err error) bool {
	return errors.Is(err, ErrNotExist) || errors.Is(err, ErrUnsupported)
}
