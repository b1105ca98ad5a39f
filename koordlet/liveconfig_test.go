package koordlet

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/qos"
)

// A configuration handed to the agent takes effect at the start of the next period: the
// live fields only, the budget continuing from the one in force.
func TestAgentAppliesLiveConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		start  func(*config.Config) // the configuration the agent starts with
		change func(*config.Config) // what the reloaded one changes
		check  func(t *testing.T, r *rig)
	}{
		{name: "lower threshold cuts at the next period", change: func(c *config.Config) { c.Policy.Threshold = 0.6 },
			check: func(t *testing.T, r *rig) {
				// 2 × 0.6 − LS 0.3 − system 0.1.
				if b := r.agent.Status().Budget; !near(b.Applied, 0.8) || b.Threshold != 0.6 {
					t.Fatalf("budget %+v, want 0.8 from threshold 0.6", b)
				}
			}},
		{name: "raised ceiling is restored at the policy's pace",
			start:  func(c *config.Config) { c.Policy.MaxBatchCPU = 0.5 },
			change: func(c *config.Config) { c.Policy.MaxBatchCPU = 0 },
			check: func(t *testing.T, r *rig) {
				// From 0.5, by restoreStepPercent (10) of 2 CPUs: 0.7, not the 1.4 target.
				if b := r.agent.Status().Budget; !near(b.Applied, 0.7) || b.Reason != qos.ReasonRestoreLimited {
					t.Fatalf("budget %+v, want 0.7 restore-limited", b)
				}
			}},
		{name: "write policy and shutdown budget", change: func(c *config.Config) {
			c.MinPodCPU = 0.05
			v := 0.2
			c.ShutdownBudgetCPU = &v
		}, check: func(t *testing.T, r *rig) {
			if r.agent.ctl.q.Writes.MinPodCPU != 0.05 {
				t.Fatalf("write policy %+v, want minPodCPU 0.05", r.agent.ctl.q.Writes)
			}
			if s := r.agent.cfg.ShutdownBudgetCPU; s == nil || *s != 0.2 {
				t.Fatalf("shutdown budget %v, want 0.2", s)
			}
		}},
		{name: "fields that need a restart keep their value", change: func(c *config.Config) {
			c.Period.Duration = time.Second
			c.ListenAddress = ":1"
			c.Escalation.FreezeAfter.Duration = time.Minute
		}, check: func(t *testing.T, r *rig) {
			c := r.agent.cfg
			if c.Period.Duration != 100*time.Millisecond || c.ListenAddress != config.DefaultListenAddress ||
				c.Escalation.FreezeAfter != config.Default().Escalation.FreezeAfter {
				t.Fatalf("config %+v: restart-only fields changed", c)
			}
			if st := r.agent.Status().Config; st == nil || st.InForce.Period.Duration != 100*time.Millisecond {
				t.Fatalf("/status config %+v, want the period in force", st)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, cgroupstest.V2, tc.start)
			busy := r.warmUp()
			next := r.agent.cfg
			tc.change(&next)
			r.agent.ApplyConfig(next, config.Status{Path: "/etc/understory/config.yaml", Hash: "abc"})
			if st := r.agent.Status().Config; st != nil {
				t.Fatalf("/status config before the period: %+v, want none", st)
			}
			r.agent.live.apply(r.agent, r.now)
			r.step(1.5, busy)
			if st := r.agent.Status().Config; st == nil || st.Hash != "abc" {
				t.Fatalf("/status config %+v, want hash abc", st)
			}
			tc.check(t, r)
		})
	}
}

// With a harm signal, a new guard configuration neither cuts nor raises for the change
// itself; harm then cuts by the new cutPercent.
func TestAgentAppliesGuardConfig(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModeEBPF)
	r := newSignalRig(t, src, nil)
	busy := r.warmUp()
	before := r.agent.Status().Budget.Applied
	next := r.agent.cfg
	next.Signals.GuardConfig = qos.GuardConfig{CutPercent: 20, RestoreHold: metav1.Duration{Duration: time.Second},
		RestorePercentPerSecond: 10}
	r.agent.ApplyConfig(next, config.Status{})
	r.agent.live.apply(r.agent, r.now)
	// LS busier, no harm: the budget in force holds.
	r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
	if got := r.agent.Status().Budget.Applied; got != before {
		t.Fatalf("budget after the change %v, want %v held", got, before)
	}
	src.report(qos.SignalRunqueueDelay, "default/ls")
	r.step(1.5, busy)
	got := r.agent.Status().Budget
	// A cut by 20 %, or to the utilisation target when that is lower.
	if got.Applied >= before || got.Applied < before*0.8-1e-9 && !near(got.Applied, got.Target) {
		t.Fatalf("budget after harm %+v, want %v cut by 20%% (or to its target)", got, before)
	}
}

// End to end: a running agent and its Reloader on a file in a temporary directory; a
// valid change shows in /status and the budget, an invalid one is refused and the old
// configuration stays.
func TestAgentReloadsItsConfigFile(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, func(c *config.Config) { c.Period.Duration = 10 * time.Millisecond })
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The file says what the rig's mutations say; flags (the override) say the rest.
	override := func(c config.Config) config.Config {
		c.CgroupRoot, c.ProcRoot = r.agent.cfg.CgroupRoot, r.agent.cfg.ProcRoot
		return c
	}
	base := "period: 10ms\nsignals: {mode: sampling}\n"
	write(base)
	events := &nodeWarnings{}
	rl, err := config.NewReloader(r.agent.cfg, []byte(base), r.agent, config.ReloaderOptions{Path: path, Interval: 5 * time.Millisecond,
		Override: override, Events: events, Registry: r.reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.agent.Run(ctx) }()
	go func() { done <- rl.Run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	inForce := func(hash string, threshold float64) func() bool {
		return func() bool {
			st := r.agent.Status()
			return st.Config != nil && st.Config.Hash == hash && st.Budget.Threshold == threshold
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the configuration at start in /status", inForce(config.Hash([]byte(base)), 0.9))
	valid := base + "policy: {threshold: 0.5}\n"
	write(valid)
	testenv.WaitFor(t, 10*time.Second, "threshold 0.5 in force", inForce(config.Hash([]byte(valid)), 0.5))
	write(base + "policy: {threshold: 5}\n")
	testenv.WaitFor(t, 10*time.Second, "the refusal in /status", func() bool {
		st := r.agent.Status().Config
		return st != nil && st.LastReload != nil && st.LastReload.Result == config.ReloadRejected
	})
	st := r.agent.Status()
	if st.Config.Hash != config.Hash([]byte(valid)) || st.Config.InForce.Policy.Threshold != 0.5 ||
		!strings.Contains(st.Config.LastReload.Error, "policy.threshold") {
		t.Fatalf("/status config %+v: want the valid file kept and the error named", st.Config)
	}
	if ev := events.all(); len(ev) != 1 || ev[0] != config.ReasonRejected {
		t.Fatalf("events %q, want one %s", ev, config.ReasonRejected)
	}
	// /status encodes it.
	b, err := json.Marshal(st)
	if err != nil || !strings.Contains(string(b), `"lastReload":{`) {
		t.Fatalf("/status JSON %s (%v): want the config section", b, err)
	}
}

// A new policy's Budgeter continues from the budget in force: a raise is paced as
// before, a lower ceiling cuts at once.
func TestContinueBudgeter(t *testing.T) {
	t.Parallel()
	last := qos.NewBudgeter(qos.DefaultPolicy()).Next(qos.BudgetInput{NodeCPUs: 4, LSUsage: 2.5})
	if last.Applied != 4*0.9-2.5 {
		t.Fatalf("setup: applied %v", last.Applied)
	}
	for _, tc := range []struct {
		name   string
		policy qos.Policy
		// want is the next decision with LS idle.
		want   float64
		reason string
	}{
		{"raise paced by the restore step", qos.Policy{Threshold: 0.95, MinBatchCPU: 0.1, RestoreStepPercent: 10},
			1.1 + 0.4, qos.ReasonRestoreLimited},
		// The new bounds apply to the budget in force already (the controller counts the
		// cut against the last budget it applied).
		{"lower ceiling cuts at once", qos.Policy{Threshold: 0.9, MinBatchCPU: 0.1, MaxBatchCPU: 0.5, RestoreStepPercent: 10},
			0.5, qos.ReasonHold},
		{"higher floor applies at once", qos.Policy{Threshold: 0.9, MinBatchCPU: 2, RestoreStepPercent: 1}, 2 + 0.04,
			qos.ReasonRestoreLimited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := continueBudgeter(tc.policy, last)
			got := b.Next(qos.BudgetInput{NodeCPUs: 4})
			if d := got.Applied - tc.want; d > 1e-9 || d < -1e-9 || got.Reason != tc.reason {
				t.Fatalf("next = %v (%s), want %v (%s)", got.Applied, got.Reason, tc.want, tc.reason)
			}
		})
	}
	// Nothing decided yet: a fresh Budgeter (its first decision is the target).
	if got := continueBudgeter(qos.DefaultPolicy(), qos.Budget{}).Next(qos.BudgetInput{NodeCPUs: 4}); got.Reason != qos.ReasonInitial {
		t.Fatalf("from nothing: %+v, want the initial decision", got)
	}
}

// A new guard configuration continues from the budget in force: no cut for the change
// itself (utilisation never cuts with a harm signal), a hold, then the new restore rate.
func TestContinueGuard(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	old := qos.NewGuard(qos.DefaultGuardConfig())
	b := qos.Budget{NodeCPUs: 4, Min: 0.1, Max: 4, Target: 2}
	old.Next(qos.GuardInput{Now: t0, Budget: b})
	if got, _ := old.Applied(); got != 2 {
		t.Fatalf("setup: applied %v", got)
	}
	c := qos.GuardConfig{CutPercent: 20, RestoreHold: metav1.Duration{Duration: time.Second}, RestorePercentPerSecond: 50}
	g := continueGuard(c, old, t0.Add(time.Second))
	// LS busy, no harm: the target fell to 0.5, the guard holds 2.
	busy := b
	busy.Target = 0.5
	if d := g.Next(qos.GuardInput{Now: t0.Add(1500 * time.Millisecond), Budget: busy}); d.Applied != 2 || d.Reason == qos.ReasonCut {
		t.Fatalf("after the change: %+v, want 2 held", d)
	}
	// Harm cuts by the new cutPercent.
	d := g.Next(qos.GuardInput{Now: t0.Add(1600 * time.Millisecond), Budget: busy, Harm: qos.SignalPSICPU,
		HarmSince: t0.Add(1580 * time.Millisecond)})
	if d.Reason != qos.ReasonCut || d.Applied != 0.5 {
		t.Fatalf("harm: %+v, want a cut to the utilisation target 0.5", d)
	}
	// Fresh guard when the old one decided nothing.
	if got, ok := continueGuard(c, qos.NewGuard(c), t0).Applied(); ok {
		t.Fatalf("from nothing: applied %v, want no decision yet", got)
	}
}

// nodeWarnings keeps the reasons of the Node events the Reloader records.
type nodeWarnings struct {
	mu      sync.Mutex
	reasons []string
}

func (w *nodeWarnings) Warn(reason, _ string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reasons = append(w.reasons, reason)
}

func (w *nodeWarnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reasons)
}
