package psi

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Throttle is a group's cumulative CFS bandwidth accounting from cpu.stat.
type Throttle struct {
	// Periods is nr_periods: CFS periods in which the group had runnable
	// tasks and a quota.
	Periods uint64
	// Throttled is nr_throttled: periods in which the group ran out of quota.
	Throttled uint64
	// Time is the time the group's run queues spent throttled, summed over
	// CPUs (v1 throttled_time in ns, v2 throttled_usec). The kernel adds a
	// run queue's throttled time when it is unthrottled, i.e. at the next
	// period refill: it lags the stall by up to one CFS period.
	Time time.Duration
}

// Sub returns the growth from prev to t. A counter that went backwards (a
// group removed and made again under the same path) counts as no growth.
func (t Throttle) Sub(prev Throttle) Throttle {
	var d Throttle
	if t.Periods >= prev.Periods {
		d.Periods = t.Periods - prev.Periods
	}
	if t.Throttled >= prev.Throttled {
		d.Throttled = t.Throttled - prev.Throttled
	}
	if t.Time >= prev.Time {
		d.Time = t.Time - prev.Time
	}
	return d
}

// maxStatBytes bounds a cpu.stat read; real ones are 100 to 300 bytes.
const maxStatBytes = 64 << 10

// ParseThrottle parses the throttling fields of a cpu.stat file: v1
// (nr_periods, nr_throttled, throttled_time in ns) or v2 (nr_periods,
// nr_throttled, throttled_usec in µs); the unit comes from the key. Every
// non-blank line must be "key value"; other keys are ignored. A cpu.stat
// with none of the three fields (a cgroup2 group without the cpu
// controller, as on a hybrid node's unified hierarchy) wraps ErrNoThrottle;
// a partial set, a repeated field, both time fields, a non-decimal value or
// an overflow wraps ErrFormat. It does not allocate unless it fails.
func ParseThrottle(b []byte) (Throttle, error) {
	if len(b) > maxStatBytes {
		return Throttle{}, fmt.Errorf("cpu.stat longer than %d bytes: %w", maxStatBytes, ErrFormat)
	}
	var (
		t    Throttle
		seen [4]bool // nr_periods, nr_throttled, throttled_time, throttled_usec
	)
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		key, val, blank, ok := keyValue(line)
		if blank {
			continue
		}
		if !ok {
			return Throttle{}, fmt.Errorf("cpu.stat line %q: want \"key value\": %w", line, ErrFormat)
		}
		idx := -1
		switch string(key) {
		case "nr_periods":
			idx = 0
		case "nr_throttled":
			idx = 1
		case "throttled_time":
			idx = 2
		case "throttled_usec":
			idx = 3
		default:
			continue
		}
		if seen[idx] {
			return Throttle{}, fmt.Errorf("cpu.stat: %s repeated: %w", key, ErrFormat)
		}
		seen[idx] = true
		// string(val) stays on the stack: strconv copies the input before an error keeps it.
		v, err := strconv.ParseUint(string(val), 10, 64)
		if err != nil {
			return Throttle{}, fmt.Errorf("cpu.stat %s %q: not an unsigned decimal: %w", key, val, ErrFormat)
		}
		switch idx {
		case 0:
			t.Periods = v
		case 1:
			t.Throttled = v
		case 2:
			t.Time, err = nsDuration(v)
		case 3:
			t.Time, err = usDuration(v)
		}
		if err != nil {
			return Throttle{}, fmt.Errorf("cpu.stat %s %q: %w: %w", key, val, ErrFormat, err)
		}
	}
	switch {
	case seen == [4]bool{}:
		return Throttle{}, fmt.Errorf("cpu.stat: no nr_periods, nr_throttled, throttled_time/usec: %w", ErrNoThrottle)
	case seen[2] && seen[3]:
		return Throttle{}, fmt.Errorf("cpu.stat: both throttled_time and throttled_usec: %w", ErrFormat)
	case !seen[0] || !seen[1] || !(seen[2] || seen[3]):
		return Throttle{}, fmt.Errorf("cpu.stat: incomplete throttling fields (nr_periods %t, nr_throttled %t, "+
			"throttled time %t): %w", seen[0], seen[1], seen[2] || seen[3], ErrFormat)
	}
	return t, nil
}

// asciiSpace separates cpu.stat fields (the kernel writes one space).
const asciiSpace = " \t\v\f\r"

// keyValue splits "key value" at ASCII white space. blank: nothing but
// white space; ok: exactly two fields.
func keyValue(line []byte) (key, val []byte, blank, ok bool) {
	line = bytes.Trim(line, asciiSpace)
	if len(line) == 0 {
		return nil, nil, true, false
	}
	i := bytes.IndexAny(line, asciiSpace)
	if i < 0 {
		return nil, nil, false, false
	}
	key, val = line[:i], bytes.TrimLeft(line[i:], asciiSpace)
	if bytes.ContainsAny(val, asciiSpace) {
		return nil, nil, false, false
	}
	return key, val, false, true
}

// ThrottleReader reads a group's cpu.stat throttling fields repeatedly
// through one open file (pread at offset 0: one syscall, no allocation). On
// a hybrid node pass the v1 cpu hierarchy's cpu.stat; the unified one has
// no throttling (ErrNoThrottle). It is safe for concurrent use; Close it.
type ThrottleReader struct {
	mu sync.Mutex
	pr preader
}

// OpenThrottleReader opens path (a group's cpu.stat) and reads it once.
func OpenThrottleReader(path string) (*ThrottleReader, error) {
	r := &ThrottleReader{}
	if err := r.pr.open(path, 512, maxStatBytes+1); err != nil {
		return nil, err
	}
	if _, err := r.Read(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// Read returns the group's current throttling counters. A removed group
// gives an error wrapping ErrNotExist.
func (r *ThrottleReader) Read() (Throttle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.pr.read()
	if err != nil {
		return Throttle{}, err
	}
	t, err := ParseThrottle(b)
	if err != nil {
		return Throttle{}, fmt.Errorf("%s: %w", r.pr.path, err)
	}
	return t, nil
}

// Path is the file the reader reads.
func (r *ThrottleReader) Path() string { return r.pr.path }

// Close releases the file. Read after Close fails with os.ErrClosed.
func (r *ThrottleReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pr.close()
}

// ReadThrottle reads a cpu.stat once. For a file read every period use a
// ThrottleReader.
func ReadThrottle(path string) (Throttle, error) {
	r, err := OpenThrottleReader(path)
	if err != nil {
		return Throttle{}, err
	}
	t, err := r.Read()
	if cerr := r.Close(); err == nil && cerr != nil {
		return Throttle{}, fmt.Errorf("closing %s: %w", path, cerr)
	}
	return t, err
}
