package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Layout is how cgroups are mounted under a root.
type Layout int

// Layouts. LayoutUnknown is the zero value and never returned with a nil error.
const (
	LayoutUnknown Layout = iota
	// LayoutV1: only v1 controller hierarchies (root/cpu, root/cpuacct, ...).
	LayoutV1
	// LayoutHybrid: v1 controllers plus a controller-less cgroup2 at
	// root/unified (systemd "hybrid"); the agent uses unified only for
	// cpu.pressure (and cgroup.freeze when there is no v1 freezer).
	LayoutHybrid
	// LayoutV2: a single cgroup2 hierarchy at root.
	LayoutV2
)

// String returns "v1", "hybrid", "v2" or "unknown".
func (l Layout) String() string {
	switch l {
	case LayoutV1:
		return "v1"
	case LayoutHybrid:
		return "hybrid"
	case LayoutV2:
		return "v2"
	default:
		return "unknown"
	}
}

const (
	unifiedDirName  = "unified"
	controllersFile = "cgroup.controllers"
)

// DetectLayout inspects root (e.g. /sys/fs/cgroup or a host mount of it):
//
//   - v2: root/cgroup.controllers exists;
//   - hybrid: a v1 cpu controller directory (root/cpu, or a co-mount such as
//     root/cpu,cpuacct) and root/unified/cgroup.controllers;
//   - v1: the cpu controller directory only.
//
// It returns ErrNoCgroupFS when none of these is present.
func DetectLayout(root string) (Layout, error) {
	if isFile(filepath.Join(root, controllersFile)) {
		return LayoutV2, nil
	}
	if controllerDir(root, "cpu") != "" {
		if isFile(filepath.Join(root, unifiedDirName, controllersFile)) {
			return LayoutHybrid, nil
		}
		return LayoutV1, nil
	}
	return LayoutUnknown, fmt.Errorf("detecting cgroup layout under %q: %w", root, ErrNoCgroupFS)
}

// controllerDir returns the directory of v1 controller name under root:
// root/name when it is a directory (possibly a symlink to a co-mount, as
// systemd creates for cpu,cpuacct), otherwise a co-mounted directory whose
// comma-separated name lists the controller. "" when there is none.
func controllerDir(root, name string) string {
	p := filepath.Join(root, name)
	if isDir(p) {
		return p
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if !strings.Contains(e.Name(), ",") {
			continue
		}
		for _, part := range strings.Split(e.Name(), ",") {
			if part == name && isDir(filepath.Join(root, e.Name())) {
				return filepath.Join(root, e.Name())
			}
		}
	}
	return ""
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
