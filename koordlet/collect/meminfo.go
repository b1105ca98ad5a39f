package collect

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// Memory is the node memory from /proc/meminfo, in bytes.
type Memory struct {
	Total     uint64 // MemTotal
	Available uint64 // MemAvailable: the kernel's estimate of memory usable without swapping
}

// ReadMemInfo reads and parses <procRoot>/meminfo.
func ReadMemInfo(procRoot string) (Memory, error) {
	path := filepath.Join(procRoot, "meminfo")
	b, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, fmt.Errorf("reading memory statistics: %w", err)
	}
	m, err := ParseMemInfo(b)
	if err != nil {
		return Memory{}, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ParseMemInfo extracts MemTotal and MemAvailable ("Key:   123 kB" lines).
// Both are required, must be in kB and may appear only once; MemTotal must
// be positive. Other lines are ignored.
func ParseMemInfo(b []byte) (Memory, error) {
	var (
		m                    Memory
		haveTotal, haveAvail bool
	)
	for len(b) > 0 {
		line := b
		if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
			line, b = b[:nl], b[nl+1:]
		} else {
			b = nil
		}
		key, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		var seen *bool
		switch string(key) {
		case "MemTotal":
			dst, seen = &m.Total, &haveTotal
		case "MemAvailable":
			dst, seen = &m.Available, &haveAvail
		default:
			continue
		}
		if *seen {
			return Memory{}, fmt.Errorf("meminfo: repeated %s: %w", key, ErrMalformed)
		}
		*seen = true
		v, err := parseKB(rest)
		if err != nil {
			return Memory{}, fmt.Errorf("meminfo: %s: %w", key, err)
		}
		*dst = v
	}
	switch {
	case !haveTotal:
		return Memory{}, fmt.Errorf("meminfo: no MemTotal: %w", ErrMalformed)
	case !haveAvail:
		return Memory{}, fmt.Errorf("meminfo: no MemAvailable (kernel older than 3.14?): %w", ErrMalformed)
	case m.Total == 0:
		return Memory{}, fmt.Errorf("meminfo: MemTotal is 0: %w", ErrMalformed)
	}
	return m, nil
}

// parseKB parses "   16318712 kB" into bytes.
func parseKB(b []byte) (uint64, error) {
	f := bytes.Fields(b)
	if len(f) != 2 || string(f[1]) != "kB" {
		return 0, fmt.Errorf("value %q: want \"<number> kB\": %w", bytes.TrimSpace(b), ErrMalformed)
	}
	kb, ok := parseUint(f[0])
	if !ok || kb > (1<<64-1)/1024 {
		return 0, fmt.Errorf("value %q is not a byte count: %w", f[0], ErrMalformed)
	}
	return kb * 1024, nil
}
