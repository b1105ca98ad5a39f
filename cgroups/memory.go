package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"syscall"
)

// MemoryUsage returns the group's memory working set in bytes, as kubelet and
// cAdvisor count it: usage minus inactive file cache (v1 memory.usage_in_bytes −
// total_inactive_file; v2 memory.current − inactive_file). ErrUnsupported when the
// memory controller is absent for this group (v2 without memory enabled in the
// parent's subtree_control, or no v1 memory hierarchy).
func (g *Group) MemoryUsage() (uint64, error) {
	dir, usageFile, inactiveKey, err := g.memoryFiles()
	if err != nil {
		return 0, err
	}
	usage, err := readInt(dir, usageFile)
	if err != nil {
		return 0, err
	}
	stat, err := readFile(dir, fileMemoryStat)
	if err != nil {
		return 0, err
	}
	inactive, err := statValue(stat, inactiveKey)
	if err != nil {
		return 0, classifyMalformed(dir, fileMemoryStat, err)
	}
	if usage < 0 {
		return 0, classifyMalformed(dir, usageFile, fmt.Errorf("negative usage %d", usage))
	}
	return workingSet(uint64(usage), inactive), nil
}

// fileMemoryStat is the memory statistics file of both versions.
const fileMemoryStat = "memory.stat"

// memoryFiles are the group's memory directory, its usage file and the memory.stat key
// of its inactive file cache.
func (g *Group) memoryFiles() (dir, usageFile, inactiveKey string, err error) {
	switch {
	case g.h.layout == LayoutV2:
		return filepath.Join(g.h.unifiedDir, g.rel), "memory.current", "inactive_file", nil
	case g.h.memoryDir != "":
		return filepath.Join(g.h.memoryDir, g.rel), "memory.usage_in_bytes", "total_inactive_file", nil
	}
	return "", "", "", fmt.Errorf("reading memory of cgroup %s: no memory hierarchy: %w", g.rel, ErrUnsupported)
}

// workingSet is usage minus the inactive file cache, as kubelet counts it; 0 when the
// cache exceeds the usage (the two files are not read atomically).
func workingSet(usage, inactive uint64) uint64 {
	if inactive > usage {
		return 0
	}
	return usage - inactive
}

// statValue returns the value of key in a "key value" per line file; a missing key is
// 0. It does not allocate: the agent reads memory.stat of every batch pod each second.
func statValue(b []byte, key string) (uint64, error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, ok := parseDecimal(bytes.TrimSpace(v))
		if !ok {
			return 0, fmt.Errorf("%s: %q is not a decimal number", key, v)
		}
		return n, nil
	}
	return 0, nil
}

// UnlimitedMemory is the limit MemoryLimit reports (and SetMemoryLimit
// accepts, as any negative value) for "no limit" (v1 -1, v2 "max").
const UnlimitedMemory int64 = -1

// MinMemoryLimit is the smallest limit SetMemoryLimit accepts: below it no
// process can start, so a smaller value is a caller's unit mistake.
const MinMemoryLimit int64 = 1 << 20

// v1 reports "no limit" as PAGE_COUNTER_MAX pages in bytes (9223372036854771712
// with 4 KiB pages): anything this close to MaxInt64 is unlimited, whatever
// the page size.
const memUnlimitedAbove = math.MaxInt64 - 1<<20

const (
	fileMemLimit     = "memory.limit_in_bytes"
	fileMemSoftLimit = "memory.soft_limit_in_bytes"
	fileMemHierarchy = "memory.use_hierarchy"
	fileMemUsage     = "memory.usage_in_bytes"
	fileMemOOM       = "memory.oom_control"
	fileMemFailcnt   = "memory.failcnt"
	fileMemMax       = "memory.max"
	fileMemHigh      = "memory.high"
	fileMemCurrent   = "memory.current"
	fileMemReclaim   = "memory.reclaim"
	fileMemEvents    = "memory.events"
	fileMemPressure  = "memory.pressure"
)

// memDir returns the directory holding the group's memory controller files
// and whether it is a v2 one: root/rel on v2, the v1 memory hierarchy on v1
// and hybrid (the unified hierarchy there has no controllers).
func (g *Group) memDir(op string) (string, bool, error) {
	switch {
	case g.h.layout == LayoutV2:
		return filepath.Join(g.h.unifiedDir, g.rel), true, nil
	case g.h.memoryDir == "":
		return "", false, fmt.Errorf("%s cgroup %s: no memory hierarchy: %w", op, g.rel, ErrUnsupported)
	}
	dir := filepath.Join(g.h.memoryDir, g.rel)
	if !isDir(dir) {
		if g.h.Exists(g.rel) {
			return "", false, fmt.Errorf("%s cgroup %s: no memory cgroup (call Create): %w", op, g.rel, ErrNotExist)
		}
		return "", false, fmt.Errorf("%s cgroup %s: %w", op, g.rel, ErrNotExist)
	}
	return dir, false, nil
}

// SetMemoryLimit sets the group's memory limit (max) and the level where
// reclaim starts (high), in bytes; negative = unlimited. Each must be
// unlimited or at least MinMemoryLimit, and a limited high not above a
// limited max (high unlimited = no early reclaim). The kernel
// rounds both down to whole pages. Unchanged values are not written.
//
// v2: memory.max and memory.high. memory.high throttles and reclaims the
// group above it but never OOM-kills; pass a high a little below max so
// reclaim starts before the OOM killer. When lowering, high is written
// first (the write itself reclaims down to it).
//
// v1 (and hybrid): memory.limit_in_bytes; v1 has no memory.high, so high
// goes to memory.soft_limit_in_bytes, which only acts under node-wide
// memory pressure (global reclaim takes from groups above their soft limit
// first): it makes the group the first to lose page cache, it does not
// reclaim before the group hits its own limit. A v1 group whose
// memory.use_hierarchy is 0 (kernels before 5.11 under a non-hierarchical
// parent) is refused with ErrUnsupported: its limit would not bound its
// child groups (the pods or containers below it).
//
// Lowering max below the group's usage makes the kernel reclaim. If it
// cannot get below (anonymous memory without swap), the error wraps ErrBusy
// and the old max stays: v1's write fails with EBUSY; v2 would OOM-kill
// instead, so SetMemoryLimit first asks for the reclaim (memory.reclaim)
// and does not write memory.max while usage stays above it (memory.high is
// then already lowered, which keeps reclaiming). The limit never passes
// through "unlimited". No memory.memsw (swap) limit is touched: where one
// is set below the new max, v1 refuses the write (ErrInvalidValue).
func (g *Group) SetMemoryLimit(max, high int64) error {
	max, high = normMem(max), normMem(high)
	for _, v := range []int64{max, high} {
		if v >= 0 && v < MinMemoryLimit {
			return fmt.Errorf("setting memory limit on %s: %d bytes below %d (negative = unlimited): %w", g.rel, v, MinMemoryLimit, ErrInvalidValue)
		}
	}
	if max >= 0 && high > max {
		return fmt.Errorf("setting memory limit on %s: high %d above max %d: %w", g.rel, high, max, ErrInvalidValue)
	}
	dir, v2, err := g.memDir("setting memory limit on")
	if err != nil {
		return err
	}
	if v2 {
		return g.setMemoryV2(dir, max, high)
	}
	if b, err := readFile(dir, fileMemHierarchy); err == nil && string(bytes.TrimSpace(b)) == "0" {
		return fmt.Errorf("setting memory limit on %s: memory.use_hierarchy is 0, a limit would not bound its children: %w", g.rel, ErrUnsupported)
	}
	oldMax, err := readMemValue(dir, fileMemLimit)
	if err != nil {
		return err
	}
	oldHigh, err := readMemValue(dir, fileMemSoftLimit)
	if err != nil {
		return err
	}
	if max != oldMax {
		if err := writeFile(dir, fileMemLimit, strconv.FormatInt(max, 10)); err != nil {
			return busy(g.rel, max, err)
		}
	}
	if high != oldHigh {
		return writeFile(dir, fileMemSoftLimit, strconv.FormatInt(high, 10))
	}
	return nil
}

func (g *Group) setMemoryV2(dir string, max, high int64) error {
	if err := requireFile(dir, fileMemMax); err != nil {
		return fmt.Errorf("setting memory limit on %s (memory controller not enabled by the parent?): %w", g.rel, err)
	}
	oldMax, err := readMemValue(dir, fileMemMax)
	if err != nil {
		return err
	}
	oldHigh, err := readMemValue(dir, fileMemHigh)
	if err != nil {
		return err
	}
	lowering := max >= 0 && (oldMax < 0 || max < oldMax)
	writeHigh := func() error {
		if high == oldHigh {
			return nil
		}
		return writeFile(dir, fileMemHigh, memString(high))
	}
	if lowering {
		if err := writeHigh(); err != nil {
			return err
		}
		cur, err := readInt(dir, fileMemCurrent)
		if err != nil {
			return err
		}
		if cur > max {
			// memory.reclaim (5.19+) fails with EAGAIN when it cannot reclaim
			// the whole amount; either way usage is read again.
			_ = writeFile(dir, fileMemReclaim, strconv.FormatInt(cur-max, 10))
			if cur, err = readInt(dir, fileMemCurrent); err != nil {
				return err
			}
			if cur > max {
				return fmt.Errorf("setting memory.max %d on %s: usage %d stays above it after reclaim "+
					"(memory.max would OOM-kill); memory.max unchanged: %w", max, g.rel, cur, ErrBusy)
			}
		}
		if max != oldMax {
			return busy(g.rel, max, writeFile(dir, fileMemMax, memString(max)))
		}
		return nil
	}
	if max != oldMax {
		if err := writeFile(dir, fileMemMax, memString(max)); err != nil {
			return err
		}
	}
	return writeHigh()
}

// busy maps the kernel's EBUSY (v1: could not reclaim below a new limit) to
// ErrBusy.
func busy(rel string, max int64, err error) error {
	if err != nil && errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("setting memory limit %d on %s: usage stays above it after reclaim; old limit kept: %w: %w", max, rel, ErrBusy, err)
	}
	return err
}

func normMem(v int64) int64 {
	if v < 0 {
		return UnlimitedMemory
	}
	return v
}

func memString(v int64) string {
	if v < 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// parseMemValue parses a memory limit file: v2 "max" or bytes, v1 bytes
// (PAGE_COUNTER_MAX pages for "no limit"). Unlimited is UnlimitedMemory.
func parseMemValue(b []byte) (int64, error) {
	s := string(bytes.TrimSpace(b))
	if s == "max" || s == "-1" {
		return UnlimitedMemory, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory limit %q: %w", s, err)
	}
	if v > memUnlimitedAbove {
		return UnlimitedMemory, nil
	}
	return int64(v), nil
}

func readMemValue(dir, name string) (int64, error) {
	b, err := readFile(dir, name)
	if err != nil {
		return 0, err
	}
	v, err := parseMemValue(b)
	if err != nil {
		return 0, classifyMalformed(dir, name, err)
	}
	return v, nil
}

// MemoryLimit returns what SetMemoryLimit sets: max (v2 memory.max, v1
// memory.limit_in_bytes) and high (v2 memory.high, v1
// memory.soft_limit_in_bytes), in bytes; UnlimitedMemory for none.
func (g *Group) MemoryLimit() (max, high int64, err error) {
	dir, v2, err := g.memDir("reading memory limit of")
	if err != nil {
		return 0, 0, err
	}
	maxFile, highFile := fileMemLimit, fileMemSoftLimit
	if v2 {
		maxFile, highFile = fileMemMax, fileMemHigh
	}
	if max, err = readMemValue(dir, maxFile); err != nil {
		return 0, 0, err
	}
	if high, err = readMemValue(dir, highFile); err != nil {
		return 0, 0, err
	}
	return max, high, nil
}

// MemoryEvents are a group's cumulative memory limit events, counted for
// the group and its descendants (v2 memory.events; v1 oom_kill likewise
// since it shares the counter code).
type MemoryEvents struct {
	// OOMKill counts processes the OOM killer killed (v2 oom_kill; v1
	// memory.oom_control oom_kill, kernel >= 4.13).
	OOMKill uint64
	// OOM counts times the group hit its limit and the OOM killer was
	// invoked (v2 only; 0 on v1).
	OOM uint64
	// Max counts times usage hit the limit (v2 max; v1 memory.failcnt,
	// which counts failed charges that then reclaimed or OOM-killed).
	Max uint64
	// High counts times usage went above memory.high and was throttled
	// (v2 only; 0 on v1).
	High uint64
	// UnderOOM is v1's memory.oom_control under_oom: the group is in an
	// OOM state right now (it stays there while oom_kill_disable is 1).
	UnderOOM bool
}

// MemoryEvents reads the group's OOM and limit counters, for counting OOM
// kills per group. ErrUnsupported without a memory controller.
func (g *Group) MemoryEvents() (MemoryEvents, error) {
	dir, v2, err := g.memDir("reading memory events of")
	if err != nil {
		return MemoryEvents{}, err
	}
	if v2 {
		b, err := readFile(dir, fileMemEvents)
		if err != nil {
			return MemoryEvents{}, err
		}
		ev, err := parseMemoryEventsV2(b)
		if err != nil {
			return MemoryEvents{}, classifyMalformed(dir, fileMemEvents, err)
		}
		return ev, nil
	}
	b, err := readFile(dir, fileMemOOM)
	if err != nil {
		return MemoryEvents{}, err
	}
	ev, err := parseOOMControl(b)
	if err != nil {
		return MemoryEvents{}, classifyMalformed(dir, fileMemOOM, err)
	}
	fc, err := readInt(dir, fileMemFailcnt)
	if err != nil {
		return MemoryEvents{}, err
	}
	if fc < 0 {
		return MemoryEvents{}, classifyMalformed(dir, fileMemFailcnt, fmt.Errorf("negative failcnt %d", fc))
	}
	ev.Max = uint64(fc)
	return ev, nil
}

// parseKeyValues parses "key value" lines with unsigned values; a key seen
// twice or a malformed line is an error, unknown keys are kept.
func parseKeyValues(b []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("line %q: want \"key value\"", bytes.TrimSpace(line))
		}
		v, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", bytes.TrimSpace(line), err)
		}
		if _, dup := out[string(f[0])]; dup {
			return nil, fmt.Errorf("key %q repeated", f[0])
		}
		out[string(f[0])] = v
	}
	return out, nil
}

// parseMemoryEventsV2 parses v2 memory.events; oom_kill is required (it
// exists since 4.13), the others default to 0.
func parseMemoryEventsV2(b []byte) (MemoryEvents, error) {
	kv, err := parseKeyValues(b)
	if err != nil {
		return MemoryEvents{}, err
	}
	if _, ok := kv["oom_kill"]; !ok {
		return MemoryEvents{}, errors.New("no oom_kill")
	}
	return MemoryEvents{OOMKill: kv["oom_kill"], OOM: kv["oom"], Max: kv["max"], High: kv["high"]}, nil
}

// parseOOMControl parses v1 memory.oom_control (oom_kill_disable,
// under_oom, oom_kill); under_oom is required, oom_kill is absent before
// 4.13 (then 0).
func parseOOMControl(b []byte) (MemoryEvents, error) {
	kv, err := parseKeyValues(b)
	if err != nil {
		return MemoryEvents{}, err
	}
	u, ok := kv["under_oom"]
	if !ok || u > 1 {
		return MemoryEvents{}, fmt.Errorf("under_oom missing or not 0/1")
	}
	return MemoryEvents{OOMKill: kv["oom_kill"], UnderOOM: u == 1}, nil
}
