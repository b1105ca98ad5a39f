package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// PSI is one pressure file (cpu.pressure, /proc/pressure/cpu, ...).
type PSI struct {
	Some PSILine
	// Full is zero when the kernel has no "full" line (cpu before 5.13).
	Full PSILine
}

// PSILine is one "some"/"full" line: the share of wall time (percent,
// 0..100) in which tasks were stalled, averaged over 10 s, 60 s and 300 s,
// and the total stall time since boot.
type PSILine struct {
	Avg10, Avg60, Avg300 float64
	Total                time.Duration
}

const filePressure = "cpu.pressure"

// maxPSIBytes bounds what ParsePSI reads; real files are ~110 bytes.
const maxPSIBytes = 4096

// ParsePSI parses the kernel's pressure format:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//
// "some" is required, "full" is optional (older kernels' cpu file). Each
// line must carry avg10, avg60, avg300 (finite, 0..100) and total (µs)
// exactly once; extra key=value fields are ignored for forward
// compatibility. Anything else wraps ErrMalformed.
func ParsePSI(r io.Reader) (PSI, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxPSIBytes+1))
	if err != nil {
		return PSI{}, fmt.Errorf("reading pressure: %w", err)
	}
	return ParsePSIBytes(b)
}

// ParsePSIBytes is ParsePSI of a file's content. It does not allocate unless it fails:
// the agent parses one pressure file per LS pod every period.
func ParsePSIBytes(b []byte) (PSI, error) {
	if len(b) > maxPSIBytes {
		return PSI{}, fmt.Errorf("pressure data longer than %d bytes: %w", maxPSIBytes, ErrMalformed)
	}
	var (
		p                  PSI
		haveSome, haveFull bool
	)
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		kind, rest := line, []byte(nil)
		if i := bytes.IndexByte(line, ' '); i >= 0 {
			kind, rest = line[:i], line[i+1:]
		}
		var dst *PSILine
		switch string(kind) {
		case "some":
			if haveSome {
				return PSI{}, fmt.Errorf("pressure: repeated \"some\" line: %w", ErrMalformed)
			}
			haveSome, dst = true, &p.Some
		case "full":
			if haveFull {
				return PSI{}, fmt.Errorf("pressure: repeated \"full\" line: %w", ErrMalformed)
			}
			haveFull, dst = true, &p.Full
		default:
			return PSI{}, fmt.Errorf("pressure: unknown line kind %q: %w", kind, ErrMalformed)
		}
		l, err := parsePSILine(rest)
		if err != nil {
			return PSI{}, fmt.Errorf("pressure %q line: %w: %w", kind, ErrMalformed, err)
		}
		*dst = l
	}
	if !haveSome {
		return PSI{}, fmt.Errorf("pressure: no \"some\" line: %w", ErrMalformed)
	}
	return p, nil
}

func parsePSILine(s []byte) (PSILine, error) {
	var (
		l    PSILine
		seen [4]bool // avg10, avg60, avg300, total
	)
	for {
		var f []byte
		if f, s = nextField(s); len(f) == 0 {
			break
		}
		eq := bytes.IndexByte(f, '=')
		if eq < 0 {
			return PSILine{}, fmt.Errorf("field %q: want key=value", f)
		}
		k, v := f[:eq], f[eq+1:]
		idx := -1
		switch string(k) {
		case "avg10":
			idx = 0
		case "avg60":
			idx = 1
		case "avg300":
			idx = 2
		case "total":
			idx = 3
		default:
			continue
		}
		if seen[idx] {
			return PSILine{}, fmt.Errorf("field %q repeated", k)
		}
		seen[idx] = true
		if idx == 3 {
			us, ok := parseDecimal(v)
			if !ok {
				return PSILine{}, fmt.Errorf("total %q: not an unsigned decimal", v)
			}
			d, err := usDuration(us)
			if err != nil {
				return PSILine{}, fmt.Errorf("total %q: %w", v, err)
			}
			l.Total = d
			continue
		}
		// string(v) does not allocate here: strconv copies the input before
		// an error keeps it, so the conversion stays on the stack.
		x, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return PSILine{}, fmt.Errorf("%s %q: %w", k, v, err)
		}
		if math.IsNaN(x) || x < 0 || x > 100 {
			return PSILine{}, fmt.Errorf("%s %q: outside 0..100", k, v)
		}
		switch idx {
		case 0:
			l.Avg10 = x
		case 1:
			l.Avg60 = x
		case 2:
			l.Avg300 = x
		}
	}
	for i, ok := range seen {
		if !ok {
			return PSILine{}, errors.New([...]string{"avg10", "avg60", "avg300", "total"}[i] + " missing")
		}
	}
	return l, nil
}

// nextField returns the first run of non-space runes of s and what follows
// it, with spaces as strings.Fields defines them (unicode.IsSpace; an
// invalid UTF-8 byte is not a space).
func nextField(s []byte) (field, rest []byte) {
	i := 0
	for i < len(s) {
		r, w := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, w = utf8.DecodeRune(s[i:])
		}
		if !unicode.IsSpace(r) {
			break
		}
		i += w
	}
	j := i
	for j < len(s) {
		r, w := rune(s[j]), 1
		if r >= utf8.RuneSelf {
			r, w = utf8.DecodeRune(s[j:])
		}
		if unicode.IsSpace(r) {
			break
		}
		j += w
	}
	return s[i:j], s[j:]
}

// Pressure returns the group's cpu.pressure: v2 root/rel/cpu.pressure,
// hybrid root/unified/rel/cpu.pressure (PSI is tracked per cgroup2 group even
// without controllers). v1 has no PSI per group: ErrUnsupported. A kernel
// booted with psi=0 also yields ErrUnsupported.
func (g *Group) Pressure() (PSI, error) { return g.pressure("cpu", filePressure) }

// MemoryPressure returns the group's memory.pressure ("full" = time every
// task of the group was stalled on memory: reclaim, refaults, swap-in), from
// the same place as Pressure: on hybrid it lives in the unified hierarchy,
// which tracks it without a memory controller. v1: ErrUnsupported. The
// node's /proc/pressure/memory is not a group file (collect reads it).
func (g *Group) MemoryPressure() (PSI, error) { return g.pressure("memory", fileMemPressure) }

func (g *Group) pressure(what, file string) (PSI, error) {
	dir := g.unifiedDir()
	if dir == "" {
		return PSI{}, fmt.Errorf("%s pressure of %s: v1 has no per-group PSI: %w", what, g.rel, ErrUnsupported)
	}
	b, err := readFile(dir, file)
	if err != nil {
		return PSI{}, err
	}
	p, err := ParsePSIBytes(b)
	if err != nil {
		return PSI{}, fmt.Errorf("%s/%s: %w", dir, file, err)
	}
	return p, nil
}
