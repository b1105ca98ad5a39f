package timeslice

import (
	"errors"
	"strings"
	"testing"
)

const (
	lineAllocSet = "tsg/1 t=1796650766559013391 pid=2843 ev=alloc mode=set drv=580.142 client=0xc1d00001 " +
		"object=0xcaf00002 asked=100 app=- rc=0 status=0x0 rb=100 rbrc=0 rbstatus=0x0"
	lineAppSet = "tsg/1 t=1 pid=7 ev=app-set mode=set drv=580.159.04 client=0xc1d00001 object=0xcaf00002 " +
		"asked=100 app=2048 rc=0 status=0x0 rb=100 rbrc=0 rbstatus=0x0"
	lineRefused = "tsg/1 t=1 pid=7 ev=alloc mode=set drv=580.142 client=0xc1d00001 object=0xcaf00002 " +
		"asked=100 app=- rc=0 status=0x56 rb=1024 rbrc=0 rbstatus=0x0"
	lineGetEINVAL = "tsg/1 t=1 pid=7 ev=alloc mode=set drv=580.142 client=0xc1d00001 object=0xcaf00002 " +
		"asked=100 app=- rc=0 status=0x0 rb=- rbrc=22 rbstatus=-"
	lineReport = "tsg/1 t=1 pid=7 ev=alloc mode=report drv=- client=0xc1d00001 object=0xcaf00002 " +
		"asked=- app=- rc=- status=- rb=- rbrc=- rbstatus=-"
	lineUnsupported = "tsg/1 t=1 pid=7 ev=app-set mode=unsupported drv=470.256.02 client=0xc1d00001 " +
		"object=0xcaf00002 asked=- app=2048 rc=0 status=0x0 rb=- rbrc=- rbstatus=-"
	lineSkip = "tsg/1 t=1 pid=7 ev=app-set mode=skip drv=- client=0xc1d00001 object=0xcaf00002 " +
		"asked=- app=- rc=0 status=0x0 rb=- rbrc=- rbstatus=-"
)

func TestParseLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		line    string
		want    Event
		applied bool
		err     error
	}{
		{name: "alloc, set and read back", line: lineAllocSet, applied: true, want: Event{
			UnixNano: 1796650766559013391, PID: 2843, Kind: KindAlloc, Mode: ModeSet, Driver: "580.142",
			Client: 0xc1d00001, Object: 0xcaf00002, AskedUS: 100, HasAsked: true,
			Set: Result{Done: true}, Readback: Result{Done: true, ValueUS: 100}}},
		{name: "application's own set rewritten", line: lineAppSet, applied: true, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAppSet, Mode: ModeSet, Driver: "580.159.04",
			Client: 0xc1d00001, Object: 0xcaf00002, AskedUS: 100, HasAsked: true, AppUS: 2048, HasApp: true,
			Set: Result{Done: true}, Readback: Result{Done: true, ValueUS: 100}}},
		{name: "driver refused the value", line: lineRefused, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAlloc, Mode: ModeSet, Driver: "580.142",
			Client: 0xc1d00001, Object: 0xcaf00002, AskedUS: 100, HasAsked: true,
			Set: Result{Done: true, Status: 0x56}, Readback: Result{Done: true, ValueUS: 1024}}},
		{name: "read-back refused by the sandbox", line: lineGetEINVAL, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAlloc, Mode: ModeSet, Driver: "580.142",
			Client: 0xc1d00001, Object: 0xcaf00002, AskedUS: 100, HasAsked: true,
			Set: Result{Done: true}, Readback: Result{Done: true, Errno: 22}}},
		{name: "report only", line: lineReport, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAlloc, Mode: ModeReport, Client: 0xc1d00001, Object: 0xcaf00002}},
		{name: "unsupported driver", line: lineUnsupported, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAppSet, Mode: ModeUnsupported, Driver: "470.256.02",
			Client: 0xc1d00001, Object: 0xcaf00002, AppUS: 2048, HasApp: true, Set: Result{Done: true}}},
		{name: "skipped", line: lineSkip, want: Event{
			UnixNano: 1, PID: 7, Kind: KindAppSet, Mode: ModeSkip, Client: 0xc1d00001, Object: 0xcaf00002,
			Set: Result{Done: true}}},

		{name: "another version", line: strings.Replace(lineAllocSet, "tsg/1", "tsg/2", 1), err: ErrVersion},
		{name: "no prefix", line: "hello", err: ErrMalformed},
		{name: "empty", line: "", err: ErrMalformed},
		{name: "field missing", line: strings.Replace(lineAllocSet, " rbstatus=0x0", "", 1), err: ErrMalformed},
		{name: "field extra", line: lineAllocSet + " x=1", err: ErrMalformed},
		{name: "fields swapped", line: strings.Replace(lineAllocSet, "ev=alloc mode=set", "mode=set ev=alloc", 1),
			err: ErrMalformed},
		{name: "double space", line: strings.Replace(lineAllocSet, " pid", "  pid", 1), err: ErrMalformed},
		{name: "unknown event", line: strings.Replace(lineAllocSet, "ev=alloc", "ev=free", 1), err: ErrMalformed},
		{name: "unknown mode", line: strings.Replace(lineAllocSet, "mode=set", "mode=force", 1), err: ErrMalformed},
		{name: "pid 0", line: strings.Replace(lineAllocSet, "pid=2843", "pid=0", 1), err: ErrMalformed},
		{name: "leading zero", line: strings.Replace(lineAllocSet, "asked=100", "asked=0100", 1), err: ErrMalformed},
		{name: "negative time", line: strings.Replace(lineAllocSet, "t=1796650766559013391", "t=-1", 1),
			err: ErrMalformed},
		{name: "time past int64", line: strings.Replace(lineAllocSet, "t=1796650766559013391",
			"t=9223372036854775808", 1), err: ErrMalformed},
		{name: "short handle", line: strings.Replace(lineAllocSet, "object=0xcaf00002", "object=0xcaf2", 1),
			err: ErrMalformed},
		{name: "upper-case handle", line: strings.Replace(lineAllocSet, "object=0xcaf00002", "object=0xCAF00002", 1),
			err: ErrMalformed},
		{name: "status with leading zero", line: strings.Replace(lineAllocSet, "status=0x0 rb", "status=0x00 rb", 1),
			err: ErrMalformed},
		{name: "driver with a space-free injection", line: strings.Replace(lineAllocSet, "drv=580.142", "drv=580;rm", 1),
			err: ErrMalformed},
		{name: "mode set on an unsupported driver", line: strings.Replace(lineAllocSet, "drv=580.142", "drv=470.1", 1),
			err: ErrMalformed},
		{name: "mode unsupported on a supported driver", line: strings.Replace(lineUnsupported, "drv=470.256.02",
			"drv=580.142", 1), err: ErrMalformed},
		{name: "asked without mode set", line: strings.Replace(lineReport, "asked=-", "asked=100", 1), err: ErrMalformed},
		{name: "asked past the bound", line: strings.Replace(lineAllocSet, "asked=100", "asked=100000001", 1),
			err: ErrMalformed},
		{name: "value after a failed status", line: strings.Replace(lineRefused, "rbstatus=0x0", "rbstatus=0x56", 1),
			err: ErrMalformed},
		{name: "no value after success", line: strings.Replace(lineAllocSet, "rb=100", "rb=-", 1), err: ErrMalformed},
		{name: "status after a failed ioctl", line: strings.Replace(lineGetEINVAL, "rbstatus=-", "rbstatus=0x0", 1),
			err: ErrMalformed},
		{name: "alloc with an application value", line: strings.Replace(lineAllocSet, "app=-", "app=5", 1),
			err: ErrMalformed},
		{name: "report mode that set", line: strings.Replace(lineReport, "rc=- status=-", "rc=0 status=0x0", 1),
			err: ErrMalformed},
		{name: "driver asked in report mode", line: strings.Replace(lineReport, "drv=-", "drv=580.142", 1),
			err: ErrMalformed},
		{name: "too long", line: lineAllocSet + strings.Repeat("x", MaxLineBytes), err: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseLine(tc.line)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ParseLine(%q) = %+v, %v; want %v", tc.line, got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseLine(%q): %v", tc.line, err)
			}
			if got != tc.want {
				t.Fatalf("ParseLine(%q) =\n  %+v\nwant\n  %+v", tc.line, got, tc.want)
			}
			if got.ClaimsApplied() != tc.applied {
				t.Errorf("ClaimsApplied = %t, want %t", got.ClaimsApplied(), tc.applied)
			}
			if s := got.String(); s != tc.line {
				t.Errorf("String() = %q, want the line back", s)
			}
		})
	}
}

func TestParseReport(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		in       string
		max      int64
		wantN    int
		wantBad  int
		firstPID int
	}{
		{name: "two good, one bad", in: lineAllocSet + "\ngarbage\n" + lineAppSet + "\n", max: 1 << 20,
			wantN: 2, wantBad: 1, firstPID: 2843},
		{name: "bounded: the cut line is bad", in: lineAllocSet + "\n" + lineAppSet + "\n",
			max: int64(len(lineAllocSet) + 10), wantN: 1, wantBad: 1, firstPID: 2843},
		{name: "a line past the line bound stops the read", in: strings.Repeat("y", 4*MaxLineBytes) + "\n" +
			lineAllocSet + "\n", max: 1 << 20, wantN: 0, wantBad: 1},
		{name: "empty", in: "", max: 1 << 20},
		{name: "no final newline", in: lineReport, max: 1 << 20, wantN: 1, firstPID: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			evs, bad, err := ParseReport(strings.NewReader(tc.in), tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != tc.wantN || bad != tc.wantBad {
				t.Fatalf("ParseReport: %d events, %d bad; want %d, %d", len(evs), bad, tc.wantN, tc.wantBad)
			}
			if tc.wantN > 0 && evs[0].PID != tc.firstPID {
				t.Errorf("first event's pid %d, want %d", evs[0].PID, tc.firstPID)
			}
		})
	}
}

// FuzzParseLine: no input panics; whatever parses formats back to the same line and
// keeps the format's rules (a claim of an applied slice only in mode set, on a
// supported driver, with the slice read back equal to the one asked).
func FuzzParseLine(f *testing.F) {
	for _, l := range []string{lineAllocSet, lineAppSet, lineRefused, lineGetEINVAL, lineReport, lineUnsupported,
		lineSkip, "", "tsg/1", "tsg/2 x", strings.Repeat("tsg/1 ", 20)} {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, err := ParseLine(line)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("ParseLine(%q): error %v is neither sentinel", line, err)
			}
			return
		}
		if s := e.String(); s != line {
			t.Fatalf("ParseLine(%q).String() = %q", line, s)
		}
		if e.ClaimsApplied() && (e.Mode != ModeSet || !DriverSupported(e.Driver) || e.Readback.ValueUS != e.AskedUS) {
			t.Fatalf("ParseLine(%q) claims an applied slice against the rules: %+v", line, e)
		}
		if e.Mode != ModeSet && (e.HasAsked || e.Readback.Done) {
			t.Fatalf("ParseLine(%q): mode %s with a slice asked or read back", line, e.Mode)
		}
	})
}
