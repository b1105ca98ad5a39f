package gpureal

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	sysunix "golang.org/x/sys/unix"

	"github.com/understory/understory/cgroups"
)

// Sub-commands this binary runs itself as.
const (
	launcherCmd  = "launch"
	fakeLSCmd    = "fake-ls"
	fakeBatchCmd = "fake-batch"
)

// launchMount is one of NRI's bind mounts as the launcher makes it.
type launchMount struct {
	Source, Destination string
	ReadOnly            bool
}

// String is the launcher's -mount value: SOURCE:DESTINATION[:ro].
func (m launchMount) String() string {
	s := m.Source + ":" + m.Destination
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// mountFlags collects repeated -mount values.
type mountFlags []launchMount

func (f *mountFlags) String() string { return fmt.Sprint(*f) }

func (f *mountFlags) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "ro") {
		return fmt.Errorf("-mount %q: want SOURCE:DESTINATION[:ro]", v)
	}
	m := launchMount{Source: parts[0], Destination: parts[1], ReadOnly: len(parts) == 3}
	for _, p := range []string{m.Source, m.Destination} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("-mount %q: %q is not a clean absolute path", v, p)
		}
	}
	*f = append(*f, m)
	return nil
}

// runLauncher joins its container cgroup (every hierarchy the agent reads, v1 memory
// too), makes NRI's bind mounts (its driver started it in a mount namespace of its own
// when there are any), switches to the container's user, then executes argv: the
// stand-in is in its pod, with its mounts and user, from its first instruction, as a
// runtime's container process is.
func runLauncher(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(launcherCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup filesystem mount")
	rel := fs.String("cgroup", "", "container cgroup, relative to -cgroup-root")
	uid := fs.Int("uid", -1, "user and group ID to run argv as (-1: the launcher's)")
	var mounts mountFlags
	fs.Var(&mounts, "mount", "SOURCE:DESTINATION[:ro] bind mount, in the launcher's own mount namespace (repeated)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if *rel == "" || len(argv) == 0 {
		return errors.New("usage: launch -cgroup-root ROOT -cgroup REL [-uid N] [-mount SRC:DST[:ro]]... -- ARGV")
	}
	h, err := cgroups.Open(*root)
	if err != nil {
		return err
	}
	g, err := h.Load(*rel)
	if err != nil {
		return err
	}
	if err := g.AddProcMemory(os.Getpid()); err != nil {
		return fmt.Errorf("joining cgroup %s: %w", *rel, err)
	}
	if err := bindMounts(mounts); err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	if *uid >= 0 {
		if err := switchUser(*uid); err != nil {
			return err
		}
	}
	return syscall.Exec(path, argv, os.Environ())
}

// bindMounts makes ms, after checking that this process has a mount namespace of its
// own (its parent's would be the host's).
func bindMounts(ms []launchMount) error {
	if len(ms) == 0 {
		return nil
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return err
	}
	if own == parent {
		return errors.New("-mount needs a mount namespace of the launcher's own (started with CLONE_NEWNS)")
	}
	if err := sysunix.Mount("", "/", "", sysunix.MS_REC|sysunix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	for _, m := range ms {
		if err := sysunix.Mount(m.Source, m.Destination, "", sysunix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m, err)
		}
		flags := uintptr(sysunix.MS_BIND | sysunix.MS_REMOUNT | sysunix.MS_NOSUID | sysunix.MS_NODEV | sysunix.MS_NOEXEC)
		if m.ReadOnly {
			flags |= sysunix.MS_RDONLY
		}
		if err := sysunix.Mount("", m.Destination, "", flags, ""); err != nil {
			return fmt.Errorf("remount %s: %w", m, err)
		}
	}
	return nil
}

// procUID is the real user ID of process pid (/proc/<pid>/status); -1 when unknown.
func procUID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if uid, err := strconv.Atoi(f[0]); err == nil {
					return uid
				}
			}
		}
	}
	return -1
}

// switchUser drops to uid (group uid, no supplementary groups) in every thread.
func switchUser(uid int) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresgid %d: %w", uid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	return nil
}
