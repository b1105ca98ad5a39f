package cgroups

import (
	"bufio"
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
)

// MemoryUsage returns the group's memory working set in bytes, as kubelet and
// cAdvisor count it: usage minus inactive file cache (v1 memory.usage_in_bytes −
// total_inactive_file; v2 memory.current − inactive_file). It only reads: the
// agent never writes or joins the memory hierarchy. ErrUnsupported when the
// memory controller is absent for this group (v2 without memory enabled in the
// parent's subtree_control, or no v1 memory hierarchy).
func (g *Group) MemoryUsage() (uint64, error) {
	var dir, usageFile, inactiveKey string
	switch {
	case g.h.layout == LayoutV2:
		dir, usageFile, inactiveKey = filepath.Join(g.h.unifiedDir, g.rel), "memory.current", "inactive_file"
	case g.h.memoryDir != "":
		dir, usageFile, inactiveKey = filepath.Join(g.h.memoryDir, g.rel), "memory.usage_in_bytes", "total_inactive_file"
	default:
		return 0, fmt.Errorf("reading memory of cgroup %s: no memory hierarchy: %w", g.rel, ErrUnsupported)
	}
	usage, err := readInt(dir, usageFile)
	if err != nil {
		return 0, err
	}
	stat, err := readFile(dir, "memory.stat")
	if err != nil {
		return 0, err
	}
	inactive, err := statValue(stat, inactiveKey)
	if err != nil {
		return 0, classifyMalformed(dir, "memory.stat", err)
	}
	if usage < 0 {
		return 0, classifyMalformed(dir, usageFile, fmt.Errorf("negative usage %d", usage))
	}
	if inactive > uint64(usage) {
		return 0, nil
	}
	return uint64(usage) - inactive, nil
}

// statValue returns the value of key in a "key value" per line file; a missing key is 0.
func statValue(b []byte, key string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		return n, nil
	}
	return 0, sc.Err()
}
