package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
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
	var (
		p                PSI
		haveSome, haveFl bool
	)
	b, err := io.ReadAll(io.LimitReader(r, maxPSIBytes+1))
	if err != nil {
		return PSI{}, fmt.Errorf("reading pressure: %w", err)
	}
	if len(b) > maxPSIBytes {
		return PSI{}, fmt.Errorf("pressure data longer than %d bytes: %w", maxPSIBytes, ErrMalformed)
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		kind, rest, _ := strings.Cut(line, " ")
		var dst *PSILine
		switch kind {
		case "some":
			if haveSome {
				return PSI{}, fmt.Errorf("pressure: repeated \"some\" line: %w", ErrMalformed)
			}
			haveSome, dst = true, &p.Some
		case "full":
			if haveFl {
				return PSI{}, fmt.Errorf("pressure: repeated \"full\" line: %w", ErrMalformed)
			}
			haveFl, dst = true, &p.Full
		default:
			return PSI{}, fmt.Errorf("pressure: unknown line kind %q: %w", kind, ErrMalformed)
		}
		l, err := parsePSILine(rest)
		if err != nil {
			return PSI{}, fmt.Errorf("pressure %q line: %w: %w", kind, ErrMalformed, err)
		}
		*dst = l
	}
	if err := sc.Err(); err != nil {
		return PSI{}, fmt.Errorf("pressure: %w: %w", ErrMalformed, err)
	}
	if !haveSome {
		return PSI{}, fmt.Errorf("pressure: no \"some\" line: %w", ErrMalformed)
	}
	return p, nil
}

func parsePSILine(s string) (PSILine, error) {
	var (
		l    PSILine
		seen [4]bool
	)
	for _, kv := range strings.Fields(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return PSILine{}, fmt.Errorf("field %q: want key=value", kv)
		}
		idx := -1
		switch k {
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
			us, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return PSILine{}, fmt.Errorf("total %q: %w", v, err)
			}
			if l.Total, err = usDuration(us); err != nil {
				return PSILine{}, fmt.Errorf("total %q: %w", v, err)
			}
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return PSILine{}, fmt.Errorf("%s %q: %w", k, v, err)
		}
		if math.IsNaN(f) || f < 0 || f > 100 {
			return PSILine{}, fmt.Errorf("%s %q: outside 0..100", k, v)
		}
		switch idx {
		case 0:
			l.Avg10 = f
		case 1:
			l.Avg60 = f
		case 2:
			l.Avg300 = f
		}
	}
	for i, ok := range seen {
		if !ok {
			return PSILine{}, errors.New([]string{"avg10", "avg60", "avg300", "total"}[i] + " missing")
		}
	}
	return l, nil
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
	p, err := ParsePSI(strings.NewReader(string(b)))
	if err != nil {
		return PSI{}, fmt.Errorf("%s/%s: %w", dir, file, err)
	}
	return p, nil
}
