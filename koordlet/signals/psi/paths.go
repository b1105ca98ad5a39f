package psi

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/understory/understory/cgroups"
	"golang.org/x/sys/unix"
)

// Resources with pressure files. IRQ exists only with
// CONFIG_IRQ_TIME_ACCOUNTING (and has no "some" line on some kernels).
const (
	CPU    = "cpu"
	Memory = "memory"
	IO     = "io"
	IRQ    = "irq"
)

// Keys for the node's own triggers; pod triggers use caller-chosen keys
// (the pod UID).
const (
	KeyNodeCPU    = "node/cpu"
	KeyNodeMemory = "node/memory"
	KeyNodeIO     = "node/io"
)

func checkResource(resource string) error {
	switch resource {
	case CPU, Memory, IO, IRQ:
		return nil
	}
	return fmt.Errorf("pressure resource %q is not cpu, memory, io or irq: %w", resource, ErrInvalid)
}

// ProcFile returns <procRoot>/pressure/<resource>, the node's pressure file.
func ProcFile(procRoot, resource string) (string, error) {
	if err := checkResource(resource); err != nil {
		return "", err
	}
	return filepath.Join(procRoot, "pressure", resource), nil
}

// CgroupFile returns <cgroup2Root>/<rel>/<resource>.pressure. cgroup2Root
// is the cgroup2 mount: the cgroup root itself on a v2 node, root/unified
// on a hybrid node (where pressure is tracked per group although no
// controller is enabled there); a v1-only node has no per-group PSI. rel
// is checked with cgroups.CleanPath; "" is the root group.
func CgroupFile(cgroup2Root, rel, resource string) (string, error) {
	if err := checkResource(resource); err != nil {
		return "", err
	}
	if rel == "" {
		return filepath.Join(cgroup2Root, resource+".pressure"), nil
	}
	clean, err := cgroups.CleanPath(rel)
	if err != nil {
		return "", fmt.Errorf("pressure file of %q: %w: %w", rel, ErrInvalid, err)
	}
	return filepath.Join(cgroup2Root, clean, resource+".pressure"), nil
}

// checkTriggerFile accepts the names of pressure files only, so a wrong
// path never gets a trigger string written into it: <res>.pressure
// (cgroup2) or pressure/<res> (procfs), res one of the resources.
func checkTriggerFile(path string) error {
	base := filepath.Base(path)
	if res, ok := strings.CutSuffix(base, ".pressure"); ok && checkResource(res) == nil {
		return nil
	}
	if filepath.Base(filepath.Dir(path)) == "pressure" && checkResource(base) == nil {
		return nil
	}
	return fmt.Errorf("%q is not a pressure file (<cpu|memory|io|irq>.pressure or pressure/<resource>): %w",
		path, ErrInvalid)
}

// pressureFS reports whether fd is on a filesystem with PSI trigger
// support: procfs (/proc/pressure/*) or cgroup2.
func pressureFS(fd int) (bool, int64, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return false, 0, err
	}
	t := int64(st.Type) // int32 on some architectures
	return t == unix.PROC_SUPER_MAGIC || t == unix.CGROUP2_SUPER_MAGIC, t, nil
}

// Privileged reports whether this process has CAP_SYS_RESOURCE in its
// effective set. The kernel checks it (against the opener's credentials)
// when a trigger is written: with it, a trigger's window may be anything
// from 500 ms to 10 s and a kernel thread evaluates it every tenth of the
// window; without it, the window must be a multiple of 2 s and the trigger
// is evaluated only by the 2 s averaging work, so a wake-up comes up to 2 s
// (about 2 s for a group that was idle) after the stall.
func Privileged() (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	const c = unix.CAP_SYS_RESOURCE
	return data[c/32].Effective&(1<<(c%32)) != 0, nil
}
