package testenv

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// ciEnv is the variable CI systems set; CI=true means every test must run.
const ciEnv = "CI"

// InCI reports whether the tests run in CI (CI=true), where nothing may be skipped. It
// reads the environment on every call.
func InCI() bool { return os.Getenv(ciEnv) == "true" }

// SkipOrFailInCI skips tb with the formatted reason, or, in CI (CI=true), fails it with
// that reason: a test CI must run never passes over a missing dependency silently. Like
// Skipf and Fatalf it stops the test; call it from the test's goroutine.
func SkipOrFailInCI(tb testing.TB, format string, args ...any) {
	tb.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		tb.Fatalf("CI=true, and this test cannot run here (CI must run it): %s", why)
		return
	}
	tb.Skip(why)
}

// WaitFor polls cond until it holds, or fails tb after timeout with what it waited for.
// cond is checked at once, then every few milliseconds (at most 10 ms, about a
// hundredth of the timeout); it runs on the caller's goroutine and may call tb.Fatal.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, cond) {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Poll is WaitFor without the test: it reports whether cond held within timeout, for a
// caller that fails with its own message (the last value it saw, say).
func Poll(timeout time.Duration, cond func() bool) bool {
	return PollEvery(timeout, min(max(timeout/100, time.Millisecond), 10*time.Millisecond), cond)
}

// PollEvery is Poll checking every interval: for a cond that costs something each
// time (it reads the API server, say).
func PollEvery(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

// Hold is WaitFor's complement, for a "nothing happens" window: cond must hold for the
// whole of d, checked at once and then as often as WaitFor checks; tb fails as soon as
// it does not, naming what should have held and when it stopped. It returns after d.
func Hold(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	interval := min(max(d/100, time.Millisecond), 10*time.Millisecond)
	start := time.Now()
	for {
		if !cond() {
			tb.Fatalf("%s stopped holding after %v of %v", what, time.Since(start).Round(time.Millisecond), d)
			return
		}
		if time.Since(start) >= d {
			return
		}
		time.Sleep(interval)
	}
}
