package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/understory/understory/koordlet/collect"
)

// ErrMalformed is wrapped by every error about a proc file's content.
var ErrMalformed = errors.New("malformed proc file")

// tick is one clock tick of /proc/<pid>/stat's utime and stime.
const tick = time.Second / collect.UserHZ

// ReadCPU returns a process's user+system CPU time (all its threads, live
// and exited) from <procRoot>/<pid>/stat.
func ReadCPU(procRoot string, pid int) (time.Duration, error) {
	p := filepath.Join(procRoot, strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	d, err := ParseCPU(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return d, nil
}

// ParseCPU parses a /proc/<pid>/stat line: utime + stime (fields 14 and 15).
// The command name may hold spaces and parentheses, so fields count from its last ')'.
func ParseCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("no ')' after the command: %w", ErrMalformed)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state).
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command: %w", len(f), ErrMalformed)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil || ut > 1<<40 || st > 1<<40 {
		return 0, fmt.Errorf("utime %q stime %q: %w", f[11], f[12], ErrMalformed)
	}
	return time.Duration(ut+st) * tick, nil
}

// ReadRSS returns a process's current (VmRSS) and peak (VmHWM) resident set
// size in bytes from <procRoot>/<pid>/status.
func ReadRSS(procRoot string, pid int) (rss, peak uint64, err error) {
	p := filepath.Join(procRoot, strconv.Itoa(pid), "status")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, 0, err
	}
	rss, peak, err = ParseRSS(b)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", p, err)
	}
	return rss, peak, nil
}

// ParseRSS parses /proc/<pid>/status for VmRSS and VmHWM (kB), in bytes.
func ParseRSS(b []byte) (rss, peak uint64, err error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		var dst *uint64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst = &rss
		case strings.HasPrefix(line, "VmHWM:"):
			dst = &peak
		default:
			continue
		}
		if fs := strings.Fields(line); len(fs) >= 2 {
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil || kb > 1<<50 {
				return 0, 0, fmt.Errorf("%q: %w", line, ErrMalformed)
			}
			*dst = kb * 1024
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS: %w", ErrMalformed)
	}
	return rss, peak, nil
}

// ReadThreadsCPU returns the on-CPU time, summed, of the processes under procRoot whose
// command name (<pid>/comm) begins with prefix, and how many there are: kernel threads
// such as the kernel's DAMON workers ("kdamond"), whose work is charged to no cgroup.
// It reads <pid>/schedstat (nanoseconds). A process that exits during the walk is
// skipped; a malformed schedstat is an error.
func ReadThreadsCPU(procRoot, prefix string) (time.Duration, int, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, 0, err
	}
	var sum time.Duration
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		b, gone, err := readLive(filepath.Join(procRoot, e.Name(), "schedstat"))
		if err != nil {
			return 0, 0, err
		}
		if gone {
			continue
		}
		d, err := ParseSchedstat(b)
		if err != nil {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %w", procRoot, e.Name(), err)
		}
		sum += d
		n++
	}
	return sum, n, nil
}

// ParseSchedstat parses /proc/<pid>/schedstat: its first field, the time spent on a CPU
// (nanoseconds).
func ParseSchedstat(b []byte) (time.Duration, error) {
	d, err := schedstatFields(b, 1)
	if err != nil {
		return 0, err
	}
	return d[0], nil
}

// ParseSchedstatWait parses /proc/<pid>/task/<tid>/schedstat: the time spent on a
// CPU and the time spent runnable, waiting on a run queue (its first two fields,
// nanoseconds).
func ParseSchedstatWait(b []byte) (run, wait time.Duration, err error) {
	d, err := schedstatFields(b, 2)
	if err != nil {
		return 0, 0, err
	}
	return d[0], d[1], nil
}

// schedstatFields parses the first n fields of a schedstat line (nanoseconds, at
// most 2^62).
func schedstatFields(b []byte, n int) ([]time.Duration, error) {
	f := strings.Fields(string(b))
	if len(f) < n {
		return nil, fmt.Errorf("%d fields, want at least %d: %w", len(f), n, ErrMalformed)
	}
	out := make([]time.Duration, n)
	for i := range out {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil || v > 1<<62 {
			return nil, fmt.Errorf("field %d %q: %w", i+1, f[i], ErrMalformed)
		}
		out[i] = time.Duration(v)
	}
	return out, nil
}

// readLive reads path of a process or thread that may exit meanwhile: gone is
// true (and err nil) when it has.
func readLive(path string) (b []byte, gone bool, err error) {
	b, err = os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return nil, true, nil
	}
	return b, false, err
}

// ReadSchedWait sums ParseSchedstatWait over the live threads of process pid
// (<procRoot>/<pid>/task/*/schedstat): how long they ran and how long they waited
// for a CPU while runnable. Threads that exit during the walk are skipped (and so
// are exited threads' times: compare two reads of a process whose threads live on,
// as the Go runtime's do).
func ReadSchedWait(procRoot string, pid int) (run, wait time.Duration, err error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		b, gone, err := readLive(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			return 0, 0, err
		}
		if gone {
			continue
		}
		r, w, err := ParseSchedstatWait(b)
		if err != nil {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %w", dir, e.Name(), err)
		}
		run, wait = run+r, wait+w
	}
	return run, wait, nil
}
