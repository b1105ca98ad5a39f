package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Sentinel errors. Callers branch with errors.Is; messages are not an API.
var (
	// ErrNoCgroupFS: nothing usable (no cgroup2 root, no v1 cpu controller)
	// under the injected root.
	ErrNoCgroupFS = errors.New("cgroups: no usable cgroup filesystem")
	// ErrReadOnly: the hierarchy the agent writes is mounted read-only.
	ErrReadOnly = errors.New("cgroups: cgroup filesystem is not writable")
	// ErrInvalidPath: a relative cgroup path, pod UID or tier name was
	// rejected because it could escape the root or break kubelet naming.
	ErrInvalidPath = errors.New("cgroups: invalid cgroup path")
	// ErrInvalidDriver: not "cgroupfs" or "systemd".
	ErrInvalidDriver = errors.New("cgroups: invalid cgroup driver")
	// ErrInvalidValue: a numeric argument is outside what the kernel accepts,
	// or the kernel rejected a value (wrapped together with the errno).
	ErrInvalidValue = errors.New("cgroups: invalid value")
	// ErrUnsupported: the layout or kernel lacks the feature (cpu.idle before
	// 5.15, cpu.pressure on pure v1, no freezer, ...).
	ErrUnsupported = errors.New("cgroups: not supported by this layout or kernel")
	// ErrNotExist: the group (or the file read from it) is gone. It wraps
	// fs.ErrNotExist, so errors.Is(err, fs.ErrNotExist) also holds.
	ErrNotExist = fmt.Errorf("cgroups: group does not exist: %w", fs.ErrNotExist)
	// ErrIdle: cpu.shares / cpu.weight cannot be written while cpu.idle=1;
	// the kernel answers EINVAL. Clear idle first (SetIdle(false)) if the
	// weight really must change.
	ErrIdle = errors.New("cgroups: group is idle (cpu.idle=1); its weight cannot be written")
	// ErrBusy: Delete found tasks left in the group or a descendant; or
	// SetMemoryLimit could not lower the limit below the group's usage (v1
	// EBUSY after the kernel's reclaim; v2 refused before memory.max would
	// OOM-kill): the old limit stays, retry later.
	ErrBusy = errors.New("cgroups: group still has tasks or memory")
	// ErrClamped: SetCPULimit (v1) applied a higher quota than asked, the
	// lowest the kernel accepts under a child group's own quota. The error
	// is a *ClampError; errors.As gives the applied limit.
	ErrClamped = errors.New("cgroups: cpu limit clamped to what the kernel accepts")
	// ErrTimeout: a freeze or thaw did not settle before the deadline.
	ErrTimeout = errors.New("cgroups: timed out waiting for freezer state")
	// ErrMalformed: a kernel file did not have the expected format.
	ErrMalformed = errors.New("cgroups: malformed cgroup file")
)

// isGone reports whether err means the cgroup (or its file) vanished:
// ENOENT when opening, ENODEV when reading an fd whose kernfs node was
// removed, or the library's own "deleted" marker.
func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) ||
		errors.Is(err, syscall.ENOENT)
}

// classify turns a raw IO error on dir/file into an error that callers can
// branch on. dir is the group directory the file lives in: when the file is
// missing but the directory is there, the kernel simply lacks the file
// (ErrUnsupported); when the directory is gone, the group vanished
// (ErrNotExist). EINVAL/ERANGE from a write becomes ErrInvalidValue.
func classify(op, dir, file string, err error) error {
	if err == nil {
		return nil
	}
	path := filepath.Join(dir, file)
	if isGone(err) {
		if _, serr := os.Stat(dir); serr == nil {
			return fmt.Errorf("%s %s: file absent: %w: %w", op, path, ErrUnsupported, err)
		}
		return fmt.Errorf("%s %s: %w: %w", op, path, ErrNotExist, err)
	}
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ERANGE) {
		return fmt.Errorf("%s %s: rejected by kernel: %w: %w", op, path, ErrInvalidValue, err)
	}
	if errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("%s %s: %w: %w", op, path, ErrReadOnly, err)
	}
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return fmt.Errorf("%s %s: %w: %w", op, path, ErrUnsupported, err)
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}
