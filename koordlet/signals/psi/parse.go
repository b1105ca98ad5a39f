package psi

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"

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
// It is cgroups.ParsePSIBytes (no allocation unless it fails), its errors
// also wrapping ErrFormat.
func ParseBytes(b []byte) (Pressure, error) {
	p, err := cgroups.ParsePSIBytes(b)
	if err != nil {
		return Pressure{}, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return p, nil
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
