package psi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cpu.stat samples from this machine (6.18, hybrid).
const (
	sampleV1Stat = "nr_periods 20\nnr_throttled 20\nthrottled_time 1763101239\nnr_bursts 0\nburst_time 0\n"
	sampleV2Stat = "usage_usec 211019\nuser_usec 211019\nsystem_usec 0\nnice_usec 0\n" +
		"core_sched.force_idle_usec 0\nnr_periods 20\nnr_throttled 19\nthrottled_usec 1763101\n" +
		"nr_bursts 0\nburst_usec 0\n"
	// The unified hierarchy of a hybrid node: no cpu controller, no throttling.
	sampleUnifiedStat = "usage_usec 211019\nuser_usec 211019\nsystem_usec 0\nnice_usec 0\n"
)

func TestParseThrottle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    Throttle
		wantErr error
	}{
		{name: "v1", in: sampleV1Stat, want: Throttle{Periods: 20, Throttled: 20, Time: 1763101239}},
		{name: "v1 with schedstats", in: "nr_periods 3\nnr_throttled 1\nthrottled_time 1500\nwait_sum 12\n",
			want: Throttle{Periods: 3, Throttled: 1, Time: 1500}},
		{name: "v2", in: sampleV2Stat,
			want: Throttle{Periods: 20, Throttled: 19, Time: 1763101 * time.Microsecond}},
		{name: "no trailing newline, tabs, CRLF", in: "nr_periods\t1\r\nnr_throttled  2 \nthrottled_time 3",
			want: Throttle{Periods: 1, Throttled: 2, Time: 3}},
		{name: "zeros", in: "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n"},
		{name: "largest v1", in: "nr_periods 1\nnr_throttled 1\nthrottled_time 9223372036854775807\n",
			want: Throttle{Periods: 1, Throttled: 1, Time: 1<<63 - 1}},

		{name: "unified (no controller)", in: sampleUnifiedStat, wantErr: ErrNoThrottle},
		{name: "empty", in: "", wantErr: ErrNoThrottle},
		{name: "no time", in: "nr_periods 1\nnr_throttled 1\n", wantErr: ErrFormat},
		{name: "no nr_throttled", in: "nr_periods 1\nthrottled_time 1\n", wantErr: ErrFormat},
		{name: "both units", in: "nr_periods 1\nnr_throttled 1\nthrottled_time 1\nthrottled_usec 1\n",
			wantErr: ErrFormat},
		{name: "repeated", in: sampleV1Stat + "nr_throttled 1\n", wantErr: ErrFormat},
		{name: "three fields", in: "nr_periods 1 2\n", wantErr: ErrFormat},
		{name: "key only", in: "usage_usec\n" + sampleV1Stat, wantErr: ErrFormat},
		{name: "negative", in: "nr_periods -1\nnr_throttled 1\nthrottled_time 1\n", wantErr: ErrFormat},
		{name: "ns overflow", in: "nr_periods 1\nnr_throttled 1\nthrottled_time 9223372036854775808\n",
			wantErr: ErrFormat},
		{name: "µs overflow", in: "nr_periods 1\nnr_throttled 1\nthrottled_usec 9223372036854776\n",
			wantErr: ErrFormat},
		{name: "uint64 overflow", in: "nr_periods 18446744073709551616\nnr_throttled 1\nthrottled_time 1\n",
			wantErr: ErrFormat},
		{name: "too long", in: sampleV1Stat + strings.Repeat("\n", maxStatBytes), wantErr: ErrFormat},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseThrottle([]byte(tc.in))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestThrottleSub(t *testing.T) {
	t.Parallel()
	a := Throttle{Periods: 10, Throttled: 5, Time: time.Second}
	b := Throttle{Periods: 30, Throttled: 20, Time: 3 * time.Second}
	if got, want := b.Sub(a), (Throttle{Periods: 20, Throttled: 15, Time: 2 * time.Second}); got != want {
		t.Errorf("Sub = %+v, want %+v", got, want)
	}
	if got := a.Sub(b); got != (Throttle{}) {
		t.Errorf("backwards Sub = %+v, want zero", got)
	}
}

func TestThrottleReader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu.stat")
	writeFile(t, path, sampleV1Stat)
	r, err := OpenThrottleReader(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if r.Path() != path {
		t.Errorf("Path = %q", r.Path())
	}
	got, err := r.Read()
	if err != nil || got != (Throttle{Periods: 20, Throttled: 20, Time: 1763101239}) {
		t.Fatalf("Read = %+v, %v", got, err)
	}
	// The kernel regenerates the file on each read; a fake is rewritten in place.
	writeFile(t, path, sampleV2Stat+strings.Repeat("x_padding 1\n", 200)) // grows the buffer
	if got, err = r.Read(); err != nil || got.Time != 1763101*time.Microsecond {
		t.Fatalf("Read after rewrite = %+v, %v", got, err)
	}
	writeFile(t, path, sampleUnifiedStat)
	if _, err := r.Read(); !errors.Is(err, ErrNoThrottle) || !strings.Contains(err.Error(), path) {
		t.Errorf("unified cpu.stat: err = %v, want ErrNoThrottle naming the file", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Read after Close: %v, want os.ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	if got, err := ReadThrottle(path); !errors.Is(err, ErrNoThrottle) {
		t.Errorf("ReadThrottle = %+v, %v; want ErrNoThrottle", got, err)
	}
	if _, err := OpenThrottleReader(filepath.Join(dir, "gone", "cpu.stat")); !errors.Is(err, ErrNotExist) {
		t.Errorf("missing group: %v, want ErrNotExist", err)
	}
	if _, err := OpenThrottleReader(filepath.Join(dir, "nostat")); !errors.Is(err, ErrUnsupported) {
		t.Errorf("missing file in an existing dir: %v, want ErrUnsupported", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
