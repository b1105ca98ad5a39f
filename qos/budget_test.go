package qos_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/understory/understory/qos"
)

const eps = 1e-9

func near(a, b float64) bool { return math.Abs(a-b) <= eps*math.Max(1, math.Abs(b)) }

// step is one call of Next and what it must return.
type step struct {
	in          qos.BudgetInput
	wantApplied float64
	wantReason  string
	wantTarget  float64 // checked when not NaN
}

func TestBudgeterSequences(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	def := qos.DefaultPolicy() // 0.9, min 0.1, max node, restore 10%
	in := func(node, ls, sys float64) qos.BudgetInput {
		return qos.BudgetInput{NodeCPUs: node, LSUsage: ls, SystemUsage: sys}
	}
	tests := []struct {
		name   string
		policy qos.Policy
		steps  []step
	}{
		{
			name:   "initial uses target, not max",
			policy: def,
			steps: []step{
				// 16*0.9 - 10 - 1 = 3.4
				{in: in(16, 10, 1), wantApplied: 3.4, wantReason: qos.ReasonInitial, wantTarget: 3.4},
			},
		},
		{
			name:   "cut is immediate, restore limited to 10% of node per period",
			policy: def,
			steps: []step{
				{in: in(10, 1, 0), wantApplied: 8, wantReason: qos.ReasonInitial, wantTarget: 8},
				// LS spikes: 9 - 7 = 2, applied at once.
				{in: in(10, 7, 0), wantApplied: 2, wantReason: qos.ReasonCut, wantTarget: 2},
				// LS drops again: target 8, grow by 1 core per period.
				{in: in(10, 1, 0), wantApplied: 3, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 4, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				// A cut in the middle of restoring is still immediate.
				{in: in(10, 6, 0), wantApplied: 3, wantReason: qos.ReasonCut, wantTarget: 3},
				{in: in(10, 1, 0), wantApplied: 4, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 5, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 6, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 7, wantReason: qos.ReasonRestoreLimited, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 8, wantReason: qos.ReasonRestore, wantTarget: 8},
				{in: in(10, 1, 0), wantApplied: 8, wantReason: qos.ReasonHold, wantTarget: 8},
				// Small rise within one step: applied fully.
				{in: in(10, 0.5, 0), wantApplied: 8.5, wantReason: qos.ReasonRestore, wantTarget: 8.5},
			},
		},
		{
			name:   "clamped to min when LS uses everything",
			policy: def,
			steps: []step{
				{in: in(8, 8, 1), wantApplied: 0.1, wantReason: qos.ReasonInitial, wantTarget: 0.1},
				{in: in(8, 20, 5), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
			},
		},
		{
			name:   "clamped to maxBatchCPU",
			policy: qos.Policy{Threshold: 1, MinBatchCPU: 0.5, MaxBatchCPU: 3, RestoreStepPercent: 100},
			steps: []step{
				{in: in(32, 0, 0), wantApplied: 3, wantReason: qos.ReasonInitial, wantTarget: 3},
			},
		},
		{
			name:   "maxBatchCPU above node is capped to node",
			policy: qos.Policy{Threshold: 1, MinBatchCPU: 0, MaxBatchCPU: 64, RestoreStepPercent: 100},
			steps: []step{
				{in: in(4, 0, 0), wantApplied: 4, wantReason: qos.ReasonInitial, wantTarget: 4},
			},
		},
		{
			name:   "min above node is capped to node",
			policy: qos.Policy{Threshold: 0.5, MinBatchCPU: 8, MaxBatchCPU: 0, RestoreStepPercent: 10},
			steps: []step{
				{in: in(2, 2, 0), wantApplied: 2, wantReason: qos.ReasonInitial, wantTarget: 2},
			},
		},
		{
			name:   "NaN LS usage is taken as whole node",
			policy: def,
			steps: []step{
				{in: in(10, 1, 0), wantApplied: 8, wantReason: qos.ReasonInitial, wantTarget: 8},
				{in: in(10, nan, 0), wantApplied: 0.1, wantReason: qos.ReasonCut, wantTarget: 0.1},
			},
		},
		{
			name:   "negative and infinite usage are taken as whole node",
			policy: def,
			steps: []step{
				{in: in(10, -3, 0), wantApplied: 0.1, wantReason: qos.ReasonInitial, wantTarget: 0.1},
				{in: in(10, 0, math.Inf(1)), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
				{in: in(10, 0, math.Inf(-1)), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
			},
		},
		{
			name:   "unusable node size holds batch at min",
			policy: def,
			steps: []step{
				{in: in(nan, 1, 0), wantApplied: 0.1, wantReason: qos.ReasonInitial, wantTarget: 0.1},
				{in: in(0, 1, 0), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
				{in: in(-4, 1, 0), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
				{in: in(math.Inf(1), 1, 0), wantApplied: 0.1, wantReason: qos.ReasonHold, wantTarget: 0.1},
				// Node size back: restore from min, limited.
				{in: in(10, 0, 0), wantApplied: 1.1, wantReason: qos.ReasonRestoreLimited, wantTarget: 9},
			},
		},
		{
			name:   "unusable node after running cuts to min",
			policy: def,
			steps: []step{
				{in: in(10, 0, 0), wantApplied: 9, wantReason: qos.ReasonInitial, wantTarget: 9},
				{in: in(nan, 0, 0), wantApplied: 0.1, wantReason: qos.ReasonCut, wantTarget: 0.1},
			},
		},
		{
			name:   "node shrinks below previous: cut",
			policy: def,
			steps: []step{
				{in: in(16, 0, 0), wantApplied: 14.4, wantReason: qos.ReasonInitial, wantTarget: 14.4},
				{in: in(4, 0, 0), wantApplied: 3.6, wantReason: qos.ReasonCut, wantTarget: 3.6},
			},
		},
		{
			name:   "restore below min after node growth jumps to min",
			policy: qos.Policy{Threshold: 1, MinBatchCPU: 2, MaxBatchCPU: 0, RestoreStepPercent: 1},
			steps: []step{
				// Node of 1 CPU: min capped to 1, LS uses all.
				{in: in(1, 1, 0), wantApplied: 1, wantReason: qos.ReasonInitial, wantTarget: 1},
				// Node of 64: min 2 applies at once even though a step is 0.64.
				{in: in(64, 0, 0), wantApplied: 2, wantReason: qos.ReasonRestoreLimited, wantTarget: 64},
				{in: in(64, 0, 0), wantApplied: 2.64, wantReason: qos.ReasonRestoreLimited, wantTarget: 64},
			},
		},
		{
			name:   "invalid policy is forced into range, never NaN",
			policy: qos.Policy{Threshold: nan, MinBatchCPU: nan, MaxBatchCPU: -1, RestoreStepPercent: nan},
			steps: []step{
				{in: in(8, 0, 0), wantApplied: 0, wantReason: qos.ReasonInitial, wantTarget: 0},
				{in: in(8, 0, 0), wantApplied: 0, wantReason: qos.ReasonHold, wantTarget: 0},
			},
		},
		{
			name:   "threshold above 1 forced to 1, huge restore step forced to 100",
			policy: qos.Policy{Threshold: 3, MinBatchCPU: 0, MaxBatchCPU: 0, RestoreStepPercent: 1e6},
			steps: []step{
				{in: in(8, 8, 0), wantApplied: 0, wantReason: qos.ReasonInitial, wantTarget: 0},
				{in: in(8, 0, 0), wantApplied: 8, wantReason: qos.ReasonRestore, wantTarget: 8},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := qos.NewBudgeter(tt.policy)
			var prevApplied float64
			for i, s := range tt.steps {
				got := b.Next(s.in)
				if !near(got.Applied, s.wantApplied) || got.Reason != s.wantReason {
					t.Fatalf("step %d: Applied=%v Reason=%q, want %v %q (budget %+v)",
						i, got.Applied, got.Reason, s.wantApplied, s.wantReason, got)
				}
				if !math.IsNaN(s.wantTarget) && !near(got.Target, s.wantTarget) {
					t.Errorf("step %d: Target=%v, want %v", i, got.Target, s.wantTarget)
				}
				if i > 0 && got.Previous != prevApplied {
					t.Errorf("step %d: Previous=%v, want last Applied %v", i, got.Previous, prevApplied)
				}
				checkBudgetInvariants(t, got)
				prevApplied = got.Applied
			}
		})
	}
}

func TestBudgeterReportsTerms(t *testing.T) {
	t.Parallel()
	b := qos.NewBudgeter(qos.Policy{Threshold: 0.8, MinBatchCPU: 0.5, MaxBatchCPU: 6, RestoreStepPercent: 25})
	got := b.Next(qos.BudgetInput{NodeCPUs: 10, LSUsage: 2, SystemUsage: 0.5})
	want := qos.Budget{
		NodeCPUs: 10, Threshold: 0.8, LSUsage: 2, SystemUsage: 0.5,
		Raw: 5.5, Min: 0.5, Max: 6, Target: 5.5, Previous: 6, Applied: 5.5,
		Reason: qos.ReasonInitial,
	}
	if got != want {
		t.Fatalf("Next = %+v\nwant   %+v", got, want)
	}
	// Raw may be negative and is reported as such.
	got = b.Next(qos.BudgetInput{NodeCPUs: 10, LSUsage: 9, SystemUsage: 1})
	if !near(got.Raw, -2) || got.Target != 0.5 || got.Applied != 0.5 || got.Reason != qos.ReasonCut {
		t.Fatalf("Next = %+v, want Raw -2, Target/Applied 0.5, cut", got)
	}
	if got.Sanitized != "" {
		t.Errorf("Sanitized = %q for clean inputs", got.Sanitized)
	}
}

func TestBudgeterSanitizedNote(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   qos.BudgetInput
		want []string
	}{
		{"NaN LS", qos.BudgetInput{NodeCPUs: 4, LSUsage: math.NaN()}, []string{"lsUsage=NaN", "whole node"}},
		{"negative system", qos.BudgetInput{NodeCPUs: 4, SystemUsage: -1}, []string{"systemUsage=-1"}},
		{"both", qos.BudgetInput{NodeCPUs: 4, LSUsage: -2, SystemUsage: math.Inf(1)}, []string{"lsUsage=-2", "systemUsage=+Inf"}},
		{"node", qos.BudgetInput{NodeCPUs: math.NaN(), LSUsage: 1}, []string{"nodeCPUs=NaN", "minBatchCPU"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := qos.NewBudgeter(qos.DefaultPolicy()).Next(tt.in)
			for _, s := range tt.want {
				if !strings.Contains(got.Sanitized, s) {
					t.Errorf("Sanitized = %q, want it to contain %q", got.Sanitized, s)
				}
			}
			checkBudgetInvariants(t, got)
		})
	}
}

func TestBudgeterReset(t *testing.T) {
	t.Parallel()
	b := qos.NewBudgeter(qos.DefaultPolicy())
	b.Next(qos.BudgetInput{NodeCPUs: 10, LSUsage: 8})                    // 1
	got := b.Next(qos.BudgetInput{NodeCPUs: 10, LSUsage: 0})             // limited to 2
	if got.Reason != qos.ReasonRestoreLimited || !near(got.Applied, 2) { // sanity
		t.Fatalf("before Reset: %+v", got)
	}
	b.Reset()
	got = b.Next(qos.BudgetInput{NodeCPUs: 10, LSUsage: 0})
	if got.Reason != qos.ReasonInitial || !near(got.Applied, 9) || got.Previous != 10 {
		t.Fatalf("after Reset: %+v, want initial, Applied 9, Previous = Max 10", got)
	}
	if b.Policy() != qos.DefaultPolicy() {
		t.Errorf("Policy() = %+v", b.Policy())
	}
}

// TestBudgeterRandomWalk drives the Budgeter with random (including invalid)
// inputs and checks the invariants every period.
func TestBudgeterRandomWalk(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, 1e308}
	pick := func(scale float64) float64 {
		if r.IntN(10) == 0 {
			return specials[r.IntN(len(specials))]
		}
		return r.Float64() * scale
	}
	for range 50 {
		p := qos.Policy{
			Threshold:          0.05 + 0.95*r.Float64(),
			MinBatchCPU:        r.Float64(),
			MaxBatchCPU:        float64(r.IntN(3)) * 4 * r.Float64(),
			RestoreStepPercent: 1 + 99*r.Float64(),
		}
		b := qos.NewBudgeter(p)
		var last qos.Budget
		for i := range 200 {
			node := 1 + float64(r.IntN(64))
			if r.IntN(20) == 0 {
				node = pick(64)
			}
			got := b.Next(qos.BudgetInput{NodeCPUs: node, LSUsage: pick(node), SystemUsage: pick(2)})
			checkBudgetInvariants(t, got)
			if i > 0 {
				if got.Previous != last.Applied {
					t.Fatalf("Previous %v != last Applied %v", got.Previous, last.Applied)
				}
				if got.Applied > got.Previous && got.Applied > got.Min {
					step := p.RestoreStepPercent / 100 * got.NodeCPUs
					if got.Applied-got.Previous > step*(1+eps)+eps {
						t.Fatalf("grew by %v > step %v: %+v", got.Applied-got.Previous, step, got)
					}
				}
			}
			last = got
		}
	}
}

// checkBudgetInvariants holds for every Budget Next returns.
func checkBudgetInvariants(t *testing.T, b qos.Budget) {
	t.Helper()
	for name, v := range map[string]float64{
		"NodeCPUs": b.NodeCPUs, "Threshold": b.Threshold, "LSUsage": b.LSUsage, "SystemUsage": b.SystemUsage,
		"Raw": b.Raw, "Min": b.Min, "Max": b.Max, "Target": b.Target, "Previous": b.Previous, "Applied": b.Applied,
	} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("%s = %v not finite: %+v", name, v, b)
		}
	}
	if _, err := json.Marshal(b); err != nil {
		t.Fatalf("Budget not JSON-encodable: %v", err)
	}
	if b.Min < 0 || b.Min > b.Max {
		t.Fatalf("bounds Min=%v Max=%v: %+v", b.Min, b.Max, b)
	}
	if b.Target < b.Min || b.Target > b.Max {
		t.Fatalf("Target %v outside [%v, %v]: %+v", b.Target, b.Min, b.Max, b)
	}
	if b.Applied < b.Min || b.Applied > b.Max {
		t.Fatalf("Applied %v outside [%v, %v]: %+v", b.Applied, b.Min, b.Max, b)
	}
	if b.Applied > b.Target {
		t.Fatalf("Applied %v above Target %v: %+v", b.Applied, b.Target, b)
	}
	switch b.Reason {
	case qos.ReasonInitial, qos.ReasonHold, qos.ReasonCut, qos.ReasonRestore:
		if b.Applied != b.Target {
			t.Fatalf("reason %q but Applied %v != Target %v", b.Reason, b.Applied, b.Target)
		}
	case qos.ReasonRestoreLimited:
		if !(b.Applied < b.Target && b.Applied >= b.Previous) {
			t.Fatalf("restore-limited but Applied %v, Previous %v, Target %v", b.Applied, b.Previous, b.Target)
		}
	default:
		t.Fatalf("unknown reason %q", b.Reason)
	}
}

// FuzzBudgeter feeds arbitrary floats (NaN, Inf, negatives, huge) and checks
// the invariants over two periods.
func FuzzBudgeter(f *testing.F) {
	f.Add(0.9, 0.1, 0.0, 10.0, 16.0, 4.0, 1.0, 16.0, 12.0, 0.5)
	f.Add(math.NaN(), -1.0, math.Inf(1), 0.0, math.NaN(), -5.0, math.Inf(1), 1e308, 1e308, 1e308)
	f.Fuzz(func(t *testing.T, th, minB, maxB, restore, n1, ls1, sys1, n2, ls2, sys2 float64) {
		b := qos.NewBudgeter(qos.Policy{Threshold: th, MinBatchCPU: minB, MaxBatchCPU: maxB, RestoreStepPercent: restore})
		first := b.Next(qos.BudgetInput{NodeCPUs: n1, LSUsage: ls1, SystemUsage: sys1})
		checkBudgetInvariants(t, first)
		second := b.Next(qos.BudgetInput{NodeCPUs: n2, LSUsage: ls2, SystemUsage: sys2})
		checkBudgetInvariants(t, second)
		if second.Previous != first.Applied {
			t.Fatalf("Previous %v != first Applied %v", second.Previous, first.Applied)
		}
	})
}
