package gpubridge

import (
	"context"
	"testing"
	"time"
)

// StepForTest runs one period of the GPU loop at now (gpu.Manager.StepForTest), for the
// agent's tests that drive the clock themselves; false with GPU features off. Not for
// use while Start's loop runs.
func (b *Bridge) StepForTest(tb testing.TB, ctx context.Context, now time.Time) bool {
	tb.Helper()
	if !b.On() {
		return false
	}
	b.mgr.StepForTest(tb, ctx, now)
	return true
}
