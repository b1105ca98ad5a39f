package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// ShmStartArg is the hidden first argument with which the agent's own binary runs
// StartWithPrivateShm: mode run starts the control daemon through it, so that the
// daemon and its servers see ShmDirectory as /dev/shm, as their clients do.
const ShmStartArg = "__understory-mps-start"

// selfExe is the agent's own binary, re-executed with ShmStartArg.
const selfExe = "/proc/self/exe"

// privateShmCommand is `<self> ShmStartArg <shmDir> <target> <binary> <args...>` in a
// mount namespace of its own (CLONE_NEWNS): the mounts it makes never reach the host.
func privateShmCommand(ctx context.Context, self, shmDir, target, binary string, args ...string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, self, append([]string{ShmStartArg, shmDir, target, binary}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	return cmd, nil
}

// ErrPrivateShm wraps every failure of StartWithPrivateShm.
var ErrPrivateShm = errors.New("cannot start the MPS control daemon with a private /dev/shm")

// StartWithPrivateShm is the agent binary's hidden entry (its arguments after
// ShmStartArg: SHM_DIR TARGET BINARY ARGS...). It runs in a mount namespace of its
// own, made by its parent (it refuses to run in its parent's): it marks every mount
// private (nothing it mounts reaches the host), binds SHM_DIR over TARGET (/dev/shm)
// without setuid, device or exec rights, and executes BINARY ARGS in its place. The
// daemon BINARY -d forks, and its servers, live in this namespace. It returns only on
// failure.
func StartWithPrivateShm(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("want SHM_DIR TARGET BINARY [ARGS...], got %q: %w", args, ErrPrivateShm)
	}
	shmDir, target, binary := args[0], args[1], args[2]
	for _, p := range []string{shmDir, target} {
		if err := absClean(p); err != nil {
			return fmt.Errorf("%q: %w: %w", p, err, ErrPrivateShm)
		}
	}
	if shmDir == target {
		return fmt.Errorf("shm directory %q is the target itself: %w", shmDir, ErrPrivateShm)
	}
	if fi, err := os.Lstat(shmDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("shm directory %q is no directory (%v): %w", shmDir, err, ErrPrivateShm)
	}
	path, err := exec.LookPath(binary)
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrPrivateShm)
	}
	// Run by hand, in its parent's mount namespace, it would bind over the host's own
	// /dev/shm: refuse.
	own, oerr := os.Readlink("/proc/self/ns/mnt")
	parent, perr := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if oerr != nil || perr != nil || own == parent {
		return fmt.Errorf("not in a mount namespace of its own (%s, parent's %s; %v): %w", own, parent,
			errors.Join(oerr, perr), ErrPrivateShm)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w: %w", err, ErrPrivateShm)
	}
	if err := unix.Mount(shmDir, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s on %s: %w: %w", shmDir, target, err, ErrPrivateShm)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		""); err != nil {
		return fmt.Errorf("remounting %s nosuid,nodev,noexec: %w: %w", target, err, ErrPrivateShm)
	}
	if err := unix.Exec(path, append([]string{binary}, args[3:]...), os.Environ()); err != nil {
		return fmt.Errorf("executing %s: %w: %w", path, err, ErrPrivateShm)
	}
	return nil
}
