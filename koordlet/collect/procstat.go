package collect

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// UserHZ is the tick rate of /proc/stat counters (see the package doc).
const UserHZ = 100

// tick is the duration of one USER_HZ tick.
const tick = time.Second / UserHZ

// ErrMalformed is wrapped by every parse error: the kernel file did not
// have the expected format.
var ErrMalformed = errors.New("malformed proc file")

// CPUTimes is the node-wide CPU time from /proc/stat, summed over all CPUs.
type CPUTimes struct {
	// Busy is user+nice+system+irq+softirq+steal (guest time is part of
	// user and nice already).
	Busy time.Duration
	// Total is Busy+idle+iowait.
	Total time.Duration
	// CPUs is the number of "cpuN" lines (online CPUs).
	CPUs int
}

const (
	procStatInitialBuf = 16 << 10
	procStatMaxBuf     = 64 << 20
)

// ProcStat reads <proc>/stat repeatedly through one open file. It is not
// safe for concurrent use.
type ProcStat struct {
	path string
	f    *os.File
	buf  []byte
}

// NewProcStat opens <procRoot>/stat and checks that it parses.
func NewProcStat(procRoot string) (*ProcStat, error) {
	path := filepath.Join(procRoot, "stat")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening cpu statistics: %w", err)
	}
	p := &ProcStat{path: path, f: f, buf: make([]byte, procStatInitialBuf)}
	if _, err := p.Read(); err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

// Read re-reads the file (pread at offset 0 into a reused buffer, so the
// kernel regenerates it) and parses the CPU lines. In steady state it makes
// one syscall and no allocations.
func (p *ProcStat) Read() (CPUTimes, error) {
	for {
		n, err := p.pread()
		if err != nil {
			return CPUTimes{}, fmt.Errorf("reading %s: %w", p.path, err)
		}
		// A short read is the whole file. A full buffer may have cut the
		// CPU section short: accept it only if the section ended inside.
		full := n == len(p.buf)
		t, complete, err := parseProcStat(p.buf[:n], full)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("%s: %w", p.path, err)
		}
		if !full || complete {
			return t, nil
		}
		if len(p.buf) >= procStatMaxBuf {
			return CPUTimes{}, fmt.Errorf("%s: cpu lines exceed %d bytes: %w", p.path, procStatMaxBuf, ErrMalformed)
		}
		p.buf = make([]byte, 2*len(p.buf))
	}
}

func (p *ProcStat) pread() (int, error) {
	fd := int(p.f.Fd())
	for {
		n, err := unix.Pread(fd, p.buf, 0)
		if err == unix.EINTR {
			continue
		}
		runtime.KeepAlive(p.f)
		return n, err
	}
}

// Close closes the file.
func (p *ProcStat) Close() error { return p.f.Close() }

// ParseProcStat parses the CPU lines of a complete /proc/stat.
func ParseProcStat(b []byte) (CPUTimes, error) {
	t, _, err := parseProcStat(b, false)
	return t, err
}

// parseProcStat parses the leading "cpu"/"cpuN" lines. With partial set, b
// may end mid-line; the unterminated tail is ignored and complete reports
// whether a later, non-CPU line was reached (so no CPU line was cut off).
// It does not allocate unless it fails.
func parseProcStat(b []byte, partial bool) (t CPUTimes, complete bool, err error) {
	sawAggregate := false
	for len(b) > 0 {
		line := b
		nl := bytes.IndexByte(b, '\n')
		if nl >= 0 {
			line, b = b[:nl], b[nl+1:]
		} else {
			if partial {
				// Cut off by the buffer. Its first bytes still tell
				// whether the CPU section ended before it.
				complete = len(line) >= 3 && string(line[:3]) != "cpu" && (sawAggregate || t.CPUs > 0)
				break
			}
			b = nil
		}
		switch {
		case len(line) >= 4 && string(line[:4]) == "cpu ":
			if sawAggregate {
				return CPUTimes{}, false, fmt.Errorf("repeated aggregate cpu line: %w", ErrMalformed)
			}
			sawAggregate = true
			if t.Busy, t.Total, err = parseCPULine(line[4:]); err != nil {
				return CPUTimes{}, false, err
			}
		case len(line) >= 4 && string(line[:3]) == "cpu" && isDigit(line[3]):
			t.CPUs++
		case sawAggregate || t.CPUs > 0:
			complete = true // the CPU section is over
		}
		if complete {
			break
		}
	}
	if !complete && partial {
		return t, false, nil // caller grows the buffer; nothing to judge yet
	}
	if !sawAggregate {
		return CPUTimes{}, false, fmt.Errorf("no aggregate \"cpu\" line: %w", ErrMalformed)
	}
	if t.CPUs == 0 {
		return CPUTimes{}, false, fmt.Errorf("no per-CPU \"cpuN\" lines: %w", ErrMalformed)
	}
	return t, complete, nil
}

// Column indexes of the aggregate line.
const (
	colUser = iota
	colNice
	colSystem
	colIdle
	colIOWait
	colIRQ
	colSoftIRQ
	colSteal
	colGuest
	colGuestNice
	numCols
)

// parseCPULine parses the numbers after "cpu ". At least user, nice,
// system and idle are required (older kernels have fewer columns, newer
// ones may have more; extra columns are ignored).
func parseCPULine(b []byte) (busy, total time.Duration, err error) {
	var v [numCols]uint64
	n := 0
	for {
		for len(b) > 0 && b[0] == ' ' {
			b = b[1:]
		}
		if len(b) == 0 {
			break
		}
		end := 0
		for end < len(b) && b[end] != ' ' {
			end++
		}
		x, ok := parseUint(b[:end])
		if !ok {
			return 0, 0, fmt.Errorf("aggregate cpu line: column %d %q is not a counter: %w", n+1, b[:end], ErrMalformed)
		}
		if n < numCols {
			v[n] = x
		}
		n++
		b = b[end:]
	}
	if n < colIOWait {
		return 0, 0, fmt.Errorf("aggregate cpu line has %d columns, want at least 4: %w", n, ErrMalformed)
	}
	// Wrapping uint64 sums and products are intended: see the package doc.
	busyTicks := v[colUser] + v[colNice] + v[colSystem] + v[colIRQ] + v[colSoftIRQ] + v[colSteal]
	totalTicks := busyTicks + v[colIdle] + v[colIOWait]
	return time.Duration(busyTicks * uint64(tick)), time.Duration(totalTicks * uint64(tick)), nil
}

// parseUint parses a non-empty decimal uint64, rejecting overflow.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var x uint64
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		d := uint64(c - '0')
		if x > (1<<64-1-d)/10 {
			return 0, false
		}
		x = x*10 + d
	}
	return x, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
