package psi

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/understory/understory/cgroups"
)

// Real samples from this project's machines.
const (
	sampleNodeCPU = "some avg10=17.20 avg60=16.62 avg300=17.65 total=7252394025\n" +
		"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
	sampleNodeMemory = "some avg10=0.00 avg60=0.00 avg300=0.00 total=53039572\n" +
		"full avg10=0.00 avg60=0.00 avg300=0.00 total=32718171\n"
	sampleGroupCPU = "some avg10=16.12 avg60=2.91 avg300=0.60 total=1805081\n" +
		"full avg10=16.12 avg60=2.91 avg300=0.60 total=1805081\n"
	sampleOldCPU = "some avg10=1.50 avg60=0.41 avg300=0.64 total=5862914\n" // before 5.13: no full line
)

func TestParseBytes(t *testing.T) {
	t.Parallel()
	us := time.Microsecond
	tests := []struct {
		name string
		in   string
		want Pressure
		err  string // substring of the error; "" for success
	}{
		{name: "node cpu", in: sampleNodeCPU,
			want: Pressure{Some: Line{Avg10: 17.20, Avg60: 16.62, Avg300: 17.65, Total: 7252394025 * us}}},
		{name: "node memory", in: sampleNodeMemory,
			want: Pressure{Some: Line{Total: 53039572 * us}, Full: Line{Total: 32718171 * us}}},
		{name: "group cpu", in: sampleGroupCPU, want: Pressure{
			Some: Line{Avg10: 16.12, Avg60: 2.91, Avg300: 0.60, Total: 1805081 * us},
			Full: Line{Avg10: 16.12, Avg60: 2.91, Avg300: 0.60, Total: 1805081 * us}}},
		{name: "no full line", in: sampleOldCPU,
			want: Pressure{Some: Line{Avg10: 1.5, Avg60: 0.41, Avg300: 0.64, Total: 5862914 * us}}},
		{name: "no trailing newline, CRLF, blank lines, extra fields",
			in:   "\r\n  some avg10=1.00 avg60=2.00 avg300=3.00 total=4 future=x\r\n\n",
			want: Pressure{Some: Line{Avg10: 1, Avg60: 2, Avg300: 3, Total: 4 * us}}},
		{name: "fields in any order", in: "some total=9 avg300=0.01 avg60=0.02 avg10=0.03",
			want: Pressure{Some: Line{Avg10: 0.03, Avg60: 0.02, Avg300: 0.01, Total: 9 * us}}},
		{name: "100 percent", in: "some avg10=100.00 avg60=100 avg300=1e2 total=1",
			want: Pressure{Some: Line{Avg10: 100, Avg60: 100, Avg300: 100, Total: us}}},
		{name: "largest total", in: "some avg10=0 avg60=0 avg300=0 total=9223372036854775",
			want: Pressure{Some: Line{Total: 9223372036854775 * us}}},

		{name: "empty", in: "", err: `no "some" line`},
		{name: "only full", in: "full avg10=0 avg60=0 avg300=0 total=0", err: `no "some" line`},
		{name: "repeated some", in: sampleOldCPU + sampleOldCPU, err: `repeated "some"`},
		{name: "repeated full", in: sampleNodeCPU + "full avg10=0 avg60=0 avg300=0 total=0", err: `repeated "full"`},
		{name: "unknown kind", in: "most avg10=0 avg60=0 avg300=0 total=0", err: "unknown line kind"},
		{name: "tab after kind", in: "some\tavg10=0 avg60=0 avg300=0 total=0", err: "unknown line kind"},
		{name: "bare kind", in: "some", err: "avg10 missing"},
		{name: "missing total", in: "some avg10=0 avg60=0 avg300=0", err: "total missing"},
		{name: "missing avg60", in: "some avg10=0 avg300=0 total=0", err: "avg60 missing"},
		{name: "repeated field", in: "some avg10=0 avg10=0 avg60=0 avg300=0 total=0", err: "repeated"},
		{name: "no equals", in: "some avg10 avg60=0 avg300=0 total=0", err: "want key=value"},
		{name: "negative total", in: "some avg10=0 avg60=0 avg300=0 total=-1", err: "not an unsigned decimal"},
		{name: "signed total", in: "some avg10=0 avg60=0 avg300=0 total=+1", err: "not an unsigned decimal"},
		{name: "empty total", in: "some avg10=0 avg60=0 avg300=0 total=", err: "not an unsigned decimal"},
		{name: "total overflows uint64", in: "some avg10=0 avg60=0 avg300=0 total=18446744073709551616",
			err: "not an unsigned decimal"},
		{name: "total overflows Duration", in: "some avg10=0 avg60=0 avg300=0 total=9223372036854776",
			err: "overflows"},
		{name: "avg above 100", in: "some avg10=100.01 avg60=0 avg300=0 total=0", err: "outside 0..100"},
		{name: "avg negative", in: "some avg10=-1 avg60=0 avg300=0 total=0", err: "outside 0..100"},
		{name: "avg NaN", in: "some avg10=NaN avg60=0 avg300=0 total=0", err: "outside 0..100"},
		{name: "avg Inf", in: "some avg10=inf avg60=0 avg300=0 total=0", err: "outside 0..100"},
		{name: "avg not a number", in: "some avg10=x avg60=0 avg300=0 total=0", err: "invalid syntax"},
		{name: "too long", in: sampleOldCPU + strings.Repeat(" ", maxBytes), err: "longer than 4096"},
		{name: "binary", in: "\x00\x01\x02", err: "unknown line kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBytes([]byte(tc.in))
			if tc.err != "" {
				if !errors.Is(err, ErrFormat) || !errors.Is(err, cgroups.ErrMalformed) {
					t.Fatalf("err = %v, want ErrFormat (and cgroups.ErrMalformed)", err)
				}
				if !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %q, want it to mention %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
			// The reader form and cgroups' parser agree.
			viaReader, err := Parse(strings.NewReader(tc.in))
			if err != nil || viaReader != got {
				t.Fatalf("Parse = %+v, %v; ParseBytes = %+v", viaReader, err, got)
			}
			lib, err := cgroups.ParsePSI(strings.NewReader(tc.in))
			if err != nil || lib != got {
				t.Fatalf("cgroups.ParsePSI = %+v, %v; ParseBytes = %+v", lib, err, got)
			}
		})
	}
}

func TestParseReadError(t *testing.T) {
	t.Parallel()
	cause := errors.New("disk on fire")
	_, err := Parse(io.MultiReader(strings.NewReader("some "), iotest.ErrReader(cause)))
	if !errors.Is(err, cause) || errors.Is(err, ErrFormat) {
		t.Fatalf("err = %v, want the read error and not ErrFormat", err)
	}
}

// TestParseBytesNoAlloc: the agent parses one file per LS pod every period.
func TestParseBytesNoAlloc(t *testing.T) {
	b := []byte(sampleNodeCPU)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseBytes(b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ParseBytes allocates %.1f times per call, want 0", allocs)
	}
}
