package runqlat

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrNotCgroup2: the path is not a directory of a cgroup2 (unified) mount.
var ErrNotCgroup2 = errors.New("not a cgroup2 directory")

// CgroupID is the cgroup v2 id of the cgroup at path, a directory of a
// cgroup2 mount (/sys/fs/cgroup on v2 hosts, /sys/fs/cgroup/unified on hybrid
// ones): the inode number of the directory, which is the kernel's
// cgroup->kn->id that the probe keys by. A v1 hierarchy's directory has an
// unrelated inode and is refused (ErrNotCgroup2).
func CgroupID(path string) (uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("cgroup id of %s: filesystem type %#x: %w", path, fs.Type, ErrNotCgroup2)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, fmt.Errorf("cgroup id of %s: not a directory: %w", path, ErrNotCgroup2)
	}
	return st.Ino, nil
}
