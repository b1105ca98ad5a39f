package qos_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/qos"
)

var guardT0 = time.Unix(1_800_000_000, 0)

// guardBudget is a Budgeter decision on a 4-CPU node with floor 0.1 and target t.
func guardBudget(t float64) qos.Budget {
	return qos.Budget{NodeCPUs: 4, Min: 0.1, Max: 4, Target: t, Raw: t}
}

// guardCall is one call of Guard.Next at ms milliseconds after guardT0.
type guardCall struct {
	ms        int
	target    float64
	harm      qos.Signal
	sinceMs   int // HarmSince, ms after guardT0
	blind     bool
	want      float64
	reason    string
	cause     qos.Signal
	maxCores  float64 // Budget.Max when not 0
	wantPrevi float64 // Previous when not 0
}

func TestGuardNext(t *testing.T) {
	t.Parallel()
	const r, hold = qos.ReasonRestoreLimited, qos.ReasonHarmHold
	tests := []struct {
		name  string
		calls []guardCall
	}{
		{"first call applies the utilisation target, never the ceiling", []guardCall{
			{ms: 0, target: 1, want: 1, reason: qos.ReasonInitial, wantPrevi: 4},
		}},
		{"no harm: utilisation alone never cuts; batch grows to the ceiling", []guardCall{
			{ms: 0, target: 3.9, want: 3.9, reason: qos.ReasonInitial},
			{ms: 100, target: 3.9, want: 3.94, reason: qos.ReasonRestore + "-limited"},
			{ms: 200, target: 0.2, want: 3.98, reason: r}, // LS rose: no cut without harm
			{ms: 300, target: 0.2, want: 4, reason: qos.ReasonRestore},
			{ms: 400, target: 0.2, want: 4, reason: qos.ReasonNoHarm},
		}},
		{"harm cuts at once by cutPercent when the target is higher", []guardCall{
			{ms: 0, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 30, target: 4, harm: qos.SignalRunqueueDelay, sinceMs: 10, want: 2, reason: qos.ReasonCut,
				cause: qos.SignalRunqueueDelay},
		}},
		{"harm cuts to the utilisation target when that is lower", []guardCall{
			{ms: 0, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 50, target: 0.5, harm: qos.SignalPSICPU, sinceMs: 0, want: 0.5, reason: qos.ReasonCut,
				cause: qos.SignalPSICPU},
		}},
		{"harm never cuts below the floor; at the floor it holds", []guardCall{
			{ms: 0, target: 0.15, want: 0.15, reason: qos.ReasonInitial},
			{ms: 20, target: 0.15, harm: qos.SignalPSIMemory, sinceMs: 10, want: 0.1, reason: qos.ReasonCut,
				cause: qos.SignalPSIMemory},
			{ms: 40, target: 0.15, harm: qos.SignalPSIMemory, sinceMs: 30, want: 0.1, reason: hold},
		}},
		{"evidence older than the last cut holds; fresh evidence cuts again", []guardCall{
			{ms: 0, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 20, target: 4, harm: qos.SignalRunqueueDelay, sinceMs: 0, want: 2, reason: qos.ReasonCut,
				cause: qos.SignalRunqueueDelay},
			{ms: 40, target: 4, harm: qos.SignalRunqueueDelay, sinceMs: 0, want: 2, reason: hold}, // window from before
			{ms: 60, target: 4, harm: qos.SignalRunqueueDelay, sinceMs: 40, want: 1, reason: qos.ReasonCut,
				cause: qos.SignalRunqueueDelay},
		}},
		{"restore waits restoreHold after the last harm, then grows per second", []guardCall{
			{ms: 0, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 100, target: 4, harm: qos.SignalPSICPU, sinceMs: 0, want: 2, reason: qos.ReasonCut, cause: qos.SignalPSICPU},
			{ms: 600, target: 4, want: 2, reason: hold},
			{ms: 1000, target: 4, want: 2, reason: hold},
			{ms: 1100, target: 4, want: 2.04, reason: r}, // 10 %/s of 4 CPUs over 100 ms
			{ms: 1150, target: 4, want: 2.06, reason: r}, // a harm wake-up in between: per second, not per call
			{ms: 3150, target: 4, want: 2.46, reason: r}, // a 2 s gap earns at most 1 s
		}},
		{"blind: utilisation cuts and bounds the raise", []guardCall{
			{ms: 0, target: 3, want: 3, reason: qos.ReasonInitial},
			{ms: 100, target: 1, blind: true, want: 1, reason: qos.ReasonCut, cause: qos.SignalUtilisation},
			{ms: 200, target: 1.02, blind: true, want: 1.02, reason: qos.ReasonRestore},
			{ms: 300, target: 3, want: 1.06, reason: r}, // signals back: restore at the slow rate
		}},
		{"a ceiling that moves down cuts, as utilisation", []guardCall{
			{ms: 0, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 100, target: 2, maxCores: 2, want: 2, reason: qos.ReasonCut, cause: qos.SignalUtilisation},
		}},
		{"a clock that goes back restarts the hold and earns nothing", []guardCall{
			{ms: 1000, target: 4, want: 4, reason: qos.ReasonInitial},
			{ms: 1100, target: 4, harm: qos.SignalPSICPU, sinceMs: 1000, want: 2, reason: qos.ReasonCut,
				cause: qos.SignalPSICPU},
			{ms: 500, target: 4, want: 2, reason: qos.ReasonHold},
			{ms: 600, target: 4, want: 2.04, reason: r},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := qos.NewGuard(qos.DefaultGuardConfig())
			for i, c := range tc.calls {
				b := guardBudget(c.target)
				if c.maxCores > 0 {
					b.Max = c.maxCores
				}
				d := g.Next(qos.GuardInput{Now: guardT0.Add(time.Duration(c.ms) * time.Millisecond), Budget: b,
					Harm: c.harm, HarmSince: guardT0.Add(time.Duration(c.sinceMs) * time.Millisecond), Blind: c.blind})
				if math.Abs(d.Applied-c.want) > 1e-9 || d.Reason != c.reason || d.Cause != c.cause {
					t.Fatalf("call %d: %+v, want applied %v reason %q cause %q", i, d, c.want, c.reason, c.cause)
				}
				if c.wantPrevi != 0 && d.Previous != c.wantPrevi {
					t.Fatalf("call %d: previous %v, want %v", i, d.Previous, c.wantPrevi)
				}
				if got, ok := g.Applied(); !ok || got != d.Applied {
					t.Fatalf("call %d: Applied() = %v, %v; want %v", i, got, ok, d.Applied)
				}
			}
		})
	}
}

// Whatever the inputs, the result stays within [min, max] and finite.
// A restarting agent continues from the limit it found in force: its first decision is
// at most that (not the utilisation target), held for restoreHold, then restored at the
// restore rate; a limit below the target wins, one above it does not, and none (NaN)
// leaves the target.
func TestGuardStartFrom(t *testing.T) {
	t.Parallel()
	cfg := qos.GuardConfig{CutPercent: 50, RestoreHold: metav1.Duration{Duration: time.Second}, RestorePercentPerSecond: 10}
	tests := []struct {
		name  string
		start float64
		first float64 // the first decision, target 2
		held  float64 // 0.9 s later: held when a limit was found, else restored (0.4 cores a second)
		after float64 // 1.4 s later: restored from the hold's end
	}{
		{"found below the target", 0.3, 0.3, 0.3, 0.5},
		{"found above the target", 3, 2, 2, 2.2},
		{"none found", math.NaN(), 2, 2.36, 2.56},
		{"below the floor", 0.05, 0.1, 0.1, 0.3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := qos.NewGuard(cfg)
			g.StartFrom(tc.start)
			for _, step := range []struct {
				ms   int
				want float64
			}{{0, tc.first}, {900, tc.held}, {1400, tc.after}} {
				target := 4.0 // LS went away: only the hold and the restore rate hold batch back
				if step.ms == 0 {
					target = 2
				}
				d := g.Next(qos.GuardInput{Now: guardT0.Add(time.Duration(step.ms) * time.Millisecond), Budget: guardBudget(target)})
				if math.Abs(d.Applied-step.want) > 1e-9 {
					t.Fatalf("at %d ms: %v (%s), want %v", step.ms, d.Applied, d.Reason, step.want)
				}
			}
			// Too late: a StartFrom after the first decision changes nothing.
			g.StartFrom(0)
			if d := g.Next(qos.GuardInput{Now: guardT0.Add(1500 * time.Millisecond), Budget: guardBudget(4)}); d.Applied < tc.after {
				t.Fatalf("StartFrom after the first decision cut the budget: %v -> %v", tc.after, d.Applied)
			}
		})
	}
}

func TestGuardBounds(t *testing.T) {
	t.Parallel()
	g := qos.NewGuard(qos.GuardConfig{CutPercent: 100, RestorePercentPerSecond: 1000})
	sigs := append([]qos.Signal{qos.SignalNone}, qos.Signals()...)
	for i := range 500 {
		b := qos.Budget{NodeCPUs: 8, Min: 0.5, Max: float64(1 + i%8), Target: float64(i%11) - 2}
		d := g.Next(qos.GuardInput{Now: guardT0.Add(time.Duration(i*37%1000) * time.Millisecond), Budget: b,
			Harm: sigs[i%len(sigs)], Blind: i%7 == 0})
		if math.IsNaN(d.Applied) || d.Applied < b.Min-1e-12 || d.Applied > math.Max(b.Min, b.Max)+1e-12 {
			t.Fatalf("call %d: applied %v outside [%v, %v]", i, d.Applied, b.Min, b.Max)
		}
	}
}

func TestGuardConfigValidate(t *testing.T) {
	t.Parallel()
	if err := qos.DefaultGuardConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		name  string
		mut   func(*qos.GuardConfig)
		field string
	}{
		{"cut zero", func(c *qos.GuardConfig) { c.CutPercent = 0 }, "cutPercent"},
		{"cut NaN", func(c *qos.GuardConfig) { c.CutPercent = math.NaN() }, "cutPercent"},
		{"cut over 100", func(c *qos.GuardConfig) { c.CutPercent = 101 }, "cutPercent"},
		{"negative hold", func(c *qos.GuardConfig) { c.RestoreHold = metav1.Duration{Duration: -1} }, "restoreHold"},
		{"hold over a minute", func(c *qos.GuardConfig) { c.RestoreHold = metav1.Duration{Duration: 2 * time.Minute} },
			"restoreHold"},
		{"restore zero", func(c *qos.GuardConfig) { c.RestorePercentPerSecond = 0 }, "restorePercentPerSecond"},
		{"restore inf", func(c *qos.GuardConfig) { c.RestorePercentPerSecond = math.Inf(1) }, "restorePercentPerSecond"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := qos.DefaultGuardConfig()
			tc.mut(&c)
			err := c.Validate()
			if !errors.Is(err, qos.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tc.field)
			}
		})
	}
}
