package testenv

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records Skip and Fatalf instead of stopping.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestSkipOrFailInCI(t *testing.T) {
	tests := []struct {
		ci                string
		wantCI            bool
		wantSkip, wantErr string
	}{
		{ci: "", wantSkip: "needs root: uid 1000"},
		{ci: "false", wantSkip: "needs root: uid 1000"},
		{ci: "1", wantSkip: "needs root: uid 1000"}, // only CI=true, as every check before it
		{ci: "true", wantCI: true, wantErr: "needs root: uid 1000"},
	}
	for _, tc := range tests {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv(ciEnv, tc.ci) // read at call time: no t.Parallel with Setenv
			if got := InCI(); got != tc.wantCI {
				t.Errorf("InCI() = %v, want %v", got, tc.wantCI)
			}
			r := &recorder{TB: t}
			SkipOrFailInCI(r, "needs root: uid %d", 1000)
			if r.skipped != tc.wantSkip {
				t.Errorf("skipped %q, want %q", r.skipped, tc.wantSkip)
			}
			if (r.failed == "") != (tc.wantErr == "") || !strings.Contains(r.failed, tc.wantErr) {
				t.Errorf("failed %q, want it to name %q", r.failed, tc.wantErr)
			}
		})
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		trueFrom int32 // cond holds from this call on; 0: never
		wantFail bool
	}{
		{name: "at once", trueFrom: 1},
		{name: "after some polls", trueFrom: 5},
		{name: "never", wantFail: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			r := &recorder{TB: t}
			start := time.Now()
			WaitFor(r, 100*time.Millisecond, "the flag", func() bool {
				n := calls.Add(1)
				return tc.trueFrom > 0 && n >= tc.trueFrom
			})
			if tc.wantFail {
				if !strings.Contains(r.failed, "the flag") || !strings.Contains(r.failed, "100ms") {
					t.Errorf("failed %q, want it to name the condition and the timeout", r.failed)
				}
				if el := time.Since(start); el < 100*time.Millisecond {
					t.Errorf("gave up after %v, before the timeout", el)
				}
				return
			}
			if r.failed != "" {
				t.Errorf("failed %q", r.failed)
			}
			if n := calls.Load(); n != tc.trueFrom {
				t.Errorf("cond called %d times, want %d (stop once it holds)", n, tc.trueFrom)
			}
		})
	}
}

func TestHold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		falseFrom int32 // cond fails from this call on; 0: never
		wantFail  bool
	}{
		{name: "holds throughout"},
		{name: "breaks at once", falseFrom: 1, wantFail: true},
		{name: "breaks later", falseFrom: 4, wantFail: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			r := &recorder{TB: t}
			start := time.Now()
			Hold(r, 50*time.Millisecond, "the flag", func() bool {
				n := calls.Add(1)
				return tc.falseFrom == 0 || n < tc.falseFrom
			})
			el := time.Since(start)
			if tc.wantFail {
				if !strings.Contains(r.failed, "the flag") || calls.Load() != tc.falseFrom {
					t.Errorf("failed %q after %d calls, want it to name the flag at call %d", r.failed, calls.Load(), tc.falseFrom)
				}
				return
			}
			if r.failed != "" || el < 50*time.Millisecond || calls.Load() < 3 {
				t.Errorf("failed %q after %v and %d checks, want it to hold for 50ms, checked throughout", r.failed, el,
					calls.Load())
			}
		})
	}
}

// TestPollEvery: cond is checked at once and then every interval, not more often.
func TestPollEvery(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	if PollEvery(100*time.Millisecond, 40*time.Millisecond, func() bool { calls.Add(1); return false }) {
		t.Fatal("PollEvery of a cond that never holds reported true")
	}
	// At 0, 40, 80 and (past the deadline) 120 ms: 4 calls, far below Poll's 10 ms rate.
	if n := calls.Load(); n < 2 || n > 5 {
		t.Fatalf("cond called %d times in 100 ms at a 40 ms interval", n)
	}
	if !PollEvery(time.Second, time.Hour, func() bool { return true }) {
		t.Fatal("PollEvery of a cond that holds at once reported false")
	}
}
