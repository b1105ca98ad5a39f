package koordlet

import (
	"sync/atomic"
	"time"
)

// liveConfig is how a reloaded configuration reaches the control loop: the Reloader's
// goroutine offers it (Agent.ApplyConfig), Run's takes it at the start of a period and
// applies its live fields to the loop's state, which only Run's goroutine touches; the
// status that goes with it is published then, for /status.
type liveConfig struct {
	pending atomic.Pointer[configUpdate]
	status  atomic.Pointer[ConfigStatus]
}

// configUpdate is one configuration offered, immutable once offered.
type configUpdate struct {
	cfg    Config
	status ConfigStatus
}

var _ configApplier = (*Agent)(nil)

// ApplyConfig hands the agent a configuration to run with and its status for /status.
// Only its live fields (liveFields) are applied, at the start of the next period; the
// others keep the value the agent started with. A later offer replaces one not taken
// yet. Safe for concurrent use.
func (a *Agent) ApplyConfig(cfg Config, st ConfigStatus) {
	a.live.pending.Store(&configUpdate{cfg: cfg, status: st})
}

// apply applies the configuration offered last, if any, to a's control loop. Called by
// Run's goroutine only (or a test driving tick).
func (l *liveConfig) apply(a *Agent, now time.Time) {
	u := l.pending.Swap(nil)
	if u == nil {
		return
	}
	old := a.cfg
	// Field by field: Healthy reads the period from other goroutines.
	copyLive(&a.cfg, u.cfg)
	a.ctl.reconfigure(old, a.cfg, now)
	a.act.setPolicy(writePolicy(a.cfg))
	st := u.status
	st.InForce = a.cfg
	l.status.Store(&st)
}

// configStatus is the status of the configuration applied last; nil before the first.
func (l *liveConfig) configStatus() *ConfigStatus { return l.status.Load() }
