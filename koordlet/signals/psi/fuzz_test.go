package psi

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
)

// FuzzParse checks ParseBytes against cgroups.ParsePSI, the agent's other
// parser of the same files: both must accept the same inputs with the same
// result, and every failure must wrap ErrFormat.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		sampleNodeCPU, sampleNodeMemory, sampleGroupCPU, sampleOldCPU,
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=100.00 avg60=1e2 avg300=0x1p-2 total=18446744073709551615\n",
		"some avg10=0 avg60=0 avg300=0 total=9223372036854775\n",
		"some avg10=NaN avg60=0 avg300=0 total=0\n",
		"some avg10=-0 avg60=+5 avg300=0 total=0 x=\n",
		"some\u00a0avg10=0 avg60=0 avg300=0 total=0\n",
		"some avg10=0\u0085avg60=0 avg300=0 total=0\n",
		"\xffsome avg10=0 avg60=0 avg300=0 total=0\n",
		"full avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\r\n",
		"some avg10=0 avg60=0 avg300=0 total=1\nsome avg10=0 avg60=0 avg300=0 total=1\n",
		"some avg10 avg60=0 avg300=0 total=0\n",
		"", "\n\n", "some", "some ", "garbage\n", "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseBytes(b)
		lib, libErr := cgroups.ParsePSI(bytes.NewReader(b))
		if (err == nil) != (libErr == nil) {
			t.Fatalf("ParseBytes err = %v, cgroups.ParsePSI err = %v", err, libErr)
		}
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if got != lib {
			t.Fatalf("ParseBytes %+v != cgroups.ParsePSI %+v", got, lib)
		}
		for _, l := range []Line{got.Some, got.Full} {
			if l.Total < 0 || l.Avg10 < 0 || l.Avg10 > 100 || l.Avg60 < 0 || l.Avg60 > 100 ||
				l.Avg300 < 0 || l.Avg300 > 100 {
				t.Fatalf("out of range: %+v", got)
			}
		}
		viaReader, err := Parse(bytes.NewReader(b))
		if err != nil || viaReader != got {
			t.Fatalf("Parse = %+v, %v; ParseBytes = %+v", viaReader, err, got)
		}
	})
}

// FuzzParseThrottle checks ParseThrottle against a plain strings.Fields
// reading of the same rules, and that a parsed result prints back to the
// same values.
func FuzzParseThrottle(f *testing.F) {
	for _, s := range []string{
		sampleV1Stat, sampleV2Stat, sampleUnifiedStat,
		"nr_periods 1\nnr_throttled 1\nthrottled_time 18446744073709551615\n",
		"nr_periods 1\nnr_throttled 1\nthrottled_usec 9223372036854775\n",
		"nr_periods 1\nnr_throttled 1\nthrottled_usec 9223372036854776\n",
		"nr_periods 1\nnr_throttled 1\nthrottled_time 1\nthrottled_usec 1\n",
		"nr_periods 1\nnr_periods 1\nnr_throttled 1\nthrottled_time 1\n",
		"nr_periods\t1\r\nnr_throttled  2 \nthrottled_time 3",
		"nr_periods 1 2\n", "nr_periods -1\n", "nr_periods x\n", "wait_sum\n",
		"", "\n", "nr_periods 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseThrottle(b)
		want, wantErr := referenceThrottle(string(b))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("ParseThrottle err = %v, reference err = %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrNoThrottle) {
				t.Fatalf("error %v wraps neither ErrFormat nor ErrNoThrottle", err)
			}
			if errors.Is(err, ErrNoThrottle) != errors.Is(wantErr, ErrNoThrottle) {
				t.Fatalf("ParseThrottle err = %v, reference err = %v", err, wantErr)
			}
			return
		}
		if got != want {
			t.Fatalf("ParseThrottle %+v != reference %+v", got, want)
		}
		if got.Time < 0 {
			t.Fatalf("negative time %+v", got)
		}
		again, err := ParseThrottle(fmt.Appendf(nil, "nr_periods %d\nnr_throttled %d\nthrottled_time %d\n",
			got.Periods, got.Throttled, int64(got.Time)))
		if err != nil || again != got {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, got)
		}
	})
}

// referenceThrottle is ParseThrottle's rules written the obvious way.
func referenceThrottle(s string) (Throttle, error) {
	if len(s) > maxStatBytes {
		return Throttle{}, ErrFormat
	}
	var (
		t    Throttle
		seen = map[string]bool{}
	)
	for _, line := range strings.Split(s, "\n") {
		f := strings.FieldsFunc(line, func(r rune) bool { return strings.ContainsRune(asciiSpace, r) })
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return Throttle{}, ErrFormat
		}
		switch f[0] {
		case "nr_periods", "nr_throttled", "throttled_time", "throttled_usec":
		default:
			continue
		}
		if seen[f[0]] {
			return Throttle{}, ErrFormat
		}
		seen[f[0]] = true
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return Throttle{}, ErrFormat
		}
		switch f[0] {
		case "nr_periods":
			t.Periods = v
		case "nr_throttled":
			t.Throttled = v
		case "throttled_time":
			if v > 1<<63-1 {
				return Throttle{}, ErrFormat
			}
			t.Time = time.Duration(v)
		case "throttled_usec":
			if v > (1<<63-1)/1000 {
				return Throttle{}, ErrFormat
			}
			t.Time = time.Duration(v) * time.Microsecond
		}
	}
	switch {
	case len(seen) == 0:
		return Throttle{}, ErrNoThrottle
	case seen["throttled_time"] && seen["throttled_usec"]:
		return Throttle{}, ErrFormat
	case !seen["nr_periods"] || !seen["nr_throttled"] || !(seen["throttled_time"] || seen["throttled_usec"]):
		return Throttle{}, ErrFormat
	}
	return t, nil
}

// FuzzHarm checks Harm's bounds for any counters.
func FuzzHarm(f *testing.F) {
	ms := int64(time.Millisecond)
	f.Add(2000*ms, 1805*ms, 1763*ms, 200*ms)
	f.Add(1000*ms, 950*ms, 1900*ms, 100*ms)
	f.Add(int64(0), int64(time.Second), int64(-1), int64(1<<62))
	f.Add(int64(1<<62), int64(1<<62), int64(1<<62), int64(1<<62))
	f.Fuzz(func(t *testing.T, wall, stall, thr, usage int64) {
		w := Window{Wall: time.Duration(wall), Stall: time.Duration(stall), Throttled: time.Duration(thr),
			Usage: time.Duration(usage)}
		e, h := Explained(w), Harm(w)
		s := max(w.Stall, 0)
		if e < 0 || e > s || e > max(w.Throttled, 0) || h < 0 || h > s || e+h != s {
			t.Fatalf("%+v: explained %v, harm %v", w, e, h)
		}
		if w.Wall > 0 && e > w.Wall {
			t.Fatalf("%+v: explained %v exceeds the wall time", w, e)
		}
	})
}
