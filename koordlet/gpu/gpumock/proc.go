package gpumock

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GPUs is the number of GPUs of the mock node (go-nvml's DGX A100).
const GPUs = 8

// HybridProcCgroup is /proc/<pid>/cgroup of a process in cgroup path on a hybrid host
// (every v1 controller kubelet manages, then the unified line), as long as the kernel
// writes it: the collector reads it once per process.
func HybridProcCgroup(path string) string {
	return strings.NewReplacer("%s", path).Replace(`12:hugetlb:%s
11:pids:%s
10:net_cls,net_prio:%s
9:perf_event:%s
8:devices:%s
7:cpu,cpuacct:%s
6:blkio:%s
5:memory:%s
4:rdma:/
3:freezer:%s
2:cpuset:%s
1:name=systemd:%s
0::/
`)
}

// WriteProc writes <procRoot>/<pid>/cgroup (cgroup, e.g. from HybridProcCgroup) and
// <procRoot>/<pid>/stat, a python3 process started at tick pid, for the collector's
// attribution (it reads the stat line at most once a second per process).
func WriteProc(procRoot string, pid uint32, cgroup string) error {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		return err
	}
	stat := fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 4194560 52021 0 12 0 9121 1412 0 0 20 0 64 0 %d "+
		"21474836480 1048576 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 0 0 0 0 0\n",
		pid, pid, pid, pid)
	return os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
}
