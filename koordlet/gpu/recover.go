package gpu

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// ErrStepPanic is wrapped by the /status error of a GPU loop step that panicked.
var ErrStepPanic = errors.New("GPU loop step panicked")

// panicLogEvery bounds how often a panicking step is logged with its stack: a step that
// panics every period would log 20 stacks a second.
const panicLogEvery = time.Minute

// panicThawTimeout bounds the thaw after a panic (each write is bounded by the cycler's
// own timeout too).
const panicThawTimeout = 5 * time.Second

// stepRecovery is the Manager's record of panicking steps.
type stepRecovery struct {
	// panics counts the steps that panicked; atomic, as it may be read while Run goes.
	panics atomic.Uint64
	// logged is when a panic was last logged with its stack, and unlogged how many
	// panics came since (Run goroutine only).
	logged   time.Time
	unlogged uint64
}

// recoverStep is deferred by step. A panic in a step (a go-nvml binding, a bug) must
// neither kill the agent nor leave batch frozen by a loop that no longer runs: it is
// logged with its stack, counted (the error says how many so far), every group the
// cycler froze is thawed (the next step freezes again what still needs it), the GPUs
// are read in full at the next step, the step's /status carries the error, and the
// loop goes on.
func (m *Manager) recoverStep(ctx context.Context, now time.Time) {
	r := recover()
	if r == nil {
		return
	}
	n := m.rec.panics.Add(1)
	err := fmt.Errorf("%w (%d so far): %v", ErrStepPanic, n, r)
	if m.rec.logged.IsZero() || now.Sub(m.rec.logged) >= panicLogEvery || now.Before(m.rec.logged) {
		m.log.Error("GPU loop step panicked; thawing what it froze and going on", "err", err,
			"unlogged", m.rec.unlogged, "stack", string(debug.Stack()))
		m.rec.logged, m.rec.unlogged = now, 0
	} else {
		m.rec.unlogged++
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), panicThawTimeout)
	defer cancel()
	if terr := m.o.Cycler.ThawAll(tctx); terr != nil {
		m.log.Error("thawing batch after a panicking GPU step", "err", terr)
	}
	clear(m.keyed) // ThawAll removed every key
	m.cad = m.cad[:0]
	m.fast = true
	m.status.Store(&stepState{time: now, err: err.Error()})
}
