package psi

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

	"github.com/understory/understory/cgroups"
)

// Pressure is one pressure file (cpu.pressure, /proc/pressure/memory, ...).
// It is cgroups.PSI, so values read here and by cgroups.Group.Pressure mix.
// Full is zero when the file has no "full" line.
type Pressure = cgroups.PSI

// Line is one "some" or "full" line: avg10/avg60/avg300 in percent and the
// cumulative stall Total (the kernel prints µs).
type Line = cgroups.PSILine

// maxBytes bounds a pressure file; real ones are about 110 bytes. It is the
// bound cgroups.ParsePSI applies, so both accept the same inputs.
const maxBytes = 4096

// Parse reads a pressure file's content from r (at most 4096 bytes) and
// parses it with ParseBytes. A read error is returned wrapped, not as
// ErrFormat.
func Parse(r io.Reader) (Pressure, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return Pressure{}, fmt.Errorf("reading pressure: %w", err)
	}
	return ParseBytes(b)
}

// ParseBytes parses the kernel's pressure format:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//
// "some" is required and "full" optional (cpu files before 5.13 have none;
// the node's cpu file has an all-zero one since). Each line needs avg10,
// avg60 and avg300 (finite, 0..100) and total (µs) exactly once; unknown
// key=value fields are ignored for forward compatibility; blank lines and
// surrounding white space are ignored. Anything else, or more than 4096
// bytes, wraps ErrFormat.
//
// It accepts exactly what cgroups.ParsePSI accepts, with the same result
// (FuzzParse checks both), but it does not allocate unless it fails: the
// agent parses one file per LS pod every period.
func ParseBytes(b []byte) (Pressure, error) {
	if len(b) > maxBytes {
		return Pressure{}, fmt.Errorf("pressure data longer than %d bytes: %w", maxBytes, ErrFormat)
	}
	var (
		p                  Pressure
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
		var dst *Line
		switch string(kind) {
		case "some":
			if haveSome {
				return Pressure{}, fmt.Errorf("pressure: repeated \"some\" line: %w", ErrFormat)
			}
			haveSome, dst = true, &p.Some
		case "full":
			if haveFull {
				return Pressure{}, fmt.Errorf("pressure: repeated \"full\" line: %w", ErrFormat)
			}
			haveFull, dst = true, &p.Full
		default:
			return Pressure{}, fmt.Errorf("pressure: unknown line kind %q: %w", kind, ErrFormat)
		}
		l, err := parseLine(rest)
		if err != nil {
			return Pressure{}, fmt.Errorf("pressure %q line: %w: %w", kind, ErrFormat, err)
		}
		*dst = l
	}
	if !haveSome {
		return Pressure{}, fmt.Errorf("pressure: no \"some\" line: %w", ErrFormat)
	}
	return p, nil
}

func parseLine(s []byte) (Line, error) {
	var (
		l    Line
		seen [4]bool // avg10, avg60, avg300, total
	)
	for {
		var f []byte
		if f, s = nextField(s); len(f) == 0 {
			break
		}
		eq := bytes.IndexByte(f, '=')
		if eq < 0 {
			return Line{}, fmt.Errorf("field %q: want key=value", f)
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
			return Line{}, fmt.Errorf("field %q repeated", k)
		}
		seen[idx] = true
		if idx == 3 {
			us, ok := parseDecimal(v)
			if !ok {
				return Line{}, fmt.Errorf("total %q: not an unsigned decimal", v)
			}
			d, err := usDuration(us)
			if err != nil {
				return Line{}, fmt.Errorf("total %q: %w", v, err)
			}
			l.Total = d
			continue
		}
		// string(v) does not allocate here: strconv copies the input before
		// an error keeps it, so the conversion stays on the stack.
		x, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return Line{}, fmt.Errorf("%s %q: %w", k, v, err)
		}
		if math.IsNaN(x) || x < 0 || x > 100 {
			return Line{}, fmt.Errorf("%s %q: outside 0..100", k, v)
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
			return Line{}, errors.New([...]string{"avg10", "avg60", "avg300", "total"}[i] + " missing")
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

// parseDecimal parses a non-empty unsigned decimal without allocating; it
// accepts what strconv.ParseUint(s, 10, 64) accepts.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

var errOverflow = errors.New("overflows a time.Duration")

func usDuration(us uint64) (time.Duration, error) {
	if us > math.MaxInt64/uint64(time.Microsecond) {
		return 0, errOverflow
	}
	return time.Duration(us) * time.Microsecond, nil
}

func nsDuration(ns uint64) (time.Duration, error) {
	if ns > math.MaxInt64 {
		return 0, errOverflow
	}
	return time.Duration(ns), nil
}
