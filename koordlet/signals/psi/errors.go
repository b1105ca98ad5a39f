package psi

import (
	"errors"
	"fmt"

	"github.com/understory/understory/cgroups"
)

// Sentinel errors. Callers branch with errors.Is; messages are not an API.
var (
	// ErrFormat: a pressure file or cpu.stat did not have the kernel's format.
	// It wraps cgroups.ErrMalformed, so either sentinel matches.
	ErrFormat = fmt.Errorf("psi: malformed kernel file: %w", cgroups.ErrMalformed)
	// ErrNoThrottle: cpu.stat has no CFS bandwidth fields. A cgroup2 group
	// without the cpu controller (every group of a hybrid node's unified
	// hierarchy) reports usage only; its throttling is in the v1 cpu
	// hierarchy's cpu.stat.
	ErrNoThrottle = errors.New("psi: cpu.stat has no throttling statistics (no cpu controller on this group)")
	// ErrNotExist is cgroups.ErrNotExist (it wraps fs.ErrNotExist): the group
	// is gone, or was never there. An open file of a removed group answers
	// ENODEV; readers map that here too.
	ErrNotExist = cgroups.ErrNotExist
	// ErrInvalid: a bad argument (trigger thresholds, key, file name,
	// resource, relative path).
	ErrInvalid = errors.New("psi: invalid argument")
	// ErrUnsupported: the kernel cannot give a trigger on this file: no PSI
	// (CONFIG_PSI off, psi=0, per-group PSI disabled with cgroup.pressure=0),
	// the file is missing although its directory exists, the kernel refused
	// the trigger (EINVAL, EOPNOTSUPP), or it is not a procfs/cgroup2 file
	// at all. It wraps errors.ErrUnsupported.
	ErrUnsupported = fmt.Errorf("psi: pressure triggers not supported here: %w", errors.ErrUnsupported)
	// ErrPermission: EPERM/EACCES, or a window that is not a multiple of 2 s
	// without CAP_SYS_RESOURCE (the kernel answers EINVAL; see Privileged).
	ErrPermission = errors.New("psi: not permitted")
	// ErrExists: Add with a key the watcher already has.
	ErrExists = errors.New("psi: trigger key already watched")
	// ErrUnknownKey: Remove with a key the watcher does not have (never
	// added, removed, or its group vanished and was reported Gone).
	ErrUnknownKey = errors.New("psi: unknown trigger key")
	// ErrClosed: the watcher was closed (Close, or Run returned).
	ErrClosed = errors.New("psi: watcher closed")
	// ErrRunning: Run called while another Run is active, or a second time.
	ErrRunning = errors.New("psi: watcher already ran")
)
