package gpu

import (
	"context"
	"testing"
	"time"
)

// StepForTest runs one period of the loop at now, as Run does on its own clock. It
// exists for tests in other packages (the agent's) that drive the loop's clock
// themselves; tests in this package call step. Not for use while Run goes: the loop's
// state is Run's goroutine's own.
func (m *Manager) StepForTest(tb testing.TB, ctx context.Context, now time.Time) {
	tb.Helper()
	m.step(ctx, now)
}
