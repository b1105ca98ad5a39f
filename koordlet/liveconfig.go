package koordlet

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
)

// liveConfig is how a reloaded configuration reaches the control loop: the Reloader's
// goroutine offers it (Agent.ApplyConfig), Run's takes it at the start of a period and
// applies its live fields to the loop's state, which only Run's goroutine touches; the
// status that goes with it is published then, for /status.
type liveConfig struct {
	pending atomic.Pointer[configUpdate]
	status  atomic.Pointer[config.Status]
}

// configUpdate is one configuration offered, immutable once offered.
type configUpdate struct {
	cfg    config.Config
	status config.Status
}

var _ config.Applier = (*Agent)(nil)

// ApplyConfig hands the agent a configuration to run with and its status for /status.
// Only its live fields (config.LiveFields) are applied, at the start of the next period; the
// others keep the value the agent started with. A later offer replaces one not taken
// yet. Safe for concurrent use.
func (a *Agent) ApplyConfig(cfg config.Config, st config.Status) {
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
	config.CopyLive(&a.cfg, u.cfg)
	a.ctl.reconfigure(old, a.cfg, now)
	st := u.status
	st.InForce = a.cfg
	l.status.Store(&st)
}

// configStatus is the status of the configuration applied last; nil before the first.
func (l *liveConfig) configStatus() *config.Status { return l.status.Load() }

// continueBudgeter returns a Budgeter for p that continues from last, the utilisation
// budget in force: its first decision paces a raise from last.Applied as the old one
// would have, instead of applying its target at once (the Budgeter's first decision).
func continueBudgeter(p qos.Policy, last qos.Budget) *qos.Budgeter {
	b := qos.NewBudgeter(p)
	thr := b.Policy().Threshold
	if !(last.NodeCPUs > 0) || !(last.Applied >= 0) || math.IsInf(last.Applied, 0) || !(thr > 0) {
		return b // nothing decided yet: the first decision is the target, as at start
	}
	// One decision whose target is last.Applied (within the new bounds): LS usage is
	// what leaves exactly that.
	b.Next(qos.BudgetInput{NodeCPUs: last.NodeCPUs, LSUsage: math.Max(0, last.NodeCPUs*thr-last.Applied)})
	return b
}

// continueGuard returns a Guard for c that continues from the budget g has in force:
// held there for c.RestoreHold (as at a restart, the new guard has seen no harm), never
// cut for the change itself. g without a decision yet: a fresh guard.
func continueGuard(c qos.GuardConfig, g *qos.Guard, now time.Time) *qos.Guard {
	ng := qos.NewGuard(c)
	applied, ok := g.Applied()
	if !ok {
		return ng
	}
	ng.StartFrom(applied)
	ng.Next(qos.GuardInput{Now: now, Budget: qos.Budget{Min: applied, Max: applied, Target: applied}})
	return ng
}
