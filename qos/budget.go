package qos

import (
	"fmt"
	"math"
	"strings"
)

// Reasons reported in Budget.Reason.
const (
	// ReasonInitial: first call after NewBudgeter or Reset; Applied = Target.
	ReasonInitial = "initial"
	// ReasonCut: Target is below the last applied value; applied at once.
	ReasonCut = "cut"
	// ReasonRestore: Target is above the last applied value and within one
	// restore step of it; Applied = Target.
	ReasonRestore = "restore"
	// ReasonRestoreLimited: Target is more than one restore step above the
	// last applied value; Applied grows by one step only.
	ReasonRestoreLimited = "restore-limited"
	// ReasonHold: Target equals the last applied value.
	ReasonHold = "hold"
)

// BudgetInput is what the agent measured over the last control period, in
// CPU cores.
type BudgetInput struct {
	NodeCPUs    float64 // allocatable-to-pods or online CPUs of the node, > 0
	LSUsage     float64 // CPU used by LS pods
	SystemUsage float64 // CPU used outside pods (kernel, kubelet, daemons), >= 0
}

// Budget is one decision of the Budgeter with every term that led to it, so
// the agent can show why batch got what it got. All values are cores.
type Budget struct {
	NodeCPUs    float64 `json:"nodeCPUs"`
	Threshold   float64 `json:"threshold"`
	LSUsage     float64 `json:"lsUsage"`
	SystemUsage float64 `json:"systemUsage"`
	// Raw = NodeCPUs*Threshold - LSUsage - SystemUsage; may be negative.
	Raw float64 `json:"raw"`
	// Min and Max are the effective clamp bounds (Max = MaxBatchCPU, or the
	// node's CPUs when that is 0 or larger; Min = MinBatchCPU capped to Max).
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	// Target = clamp(Raw, Min, Max).
	Target float64 `json:"target"`
	// Previous is what was applied last period (Max on the first call).
	Previous float64 `json:"previous"`
	// Applied is what to apply now, after the restore limit.
	Applied float64 `json:"applied"`
	// Reason is one of ReasonInitial, ReasonCut, ReasonRestore,
	// ReasonRestoreLimited, ReasonHold.
	Reason string `json:"reason"`
	// Sanitized is empty when every input was usable; otherwise it says which
	// inputs were NaN, infinite or negative and what was used instead (the
	// fields above hold the replacement values).
	Sanitized string `json:"sanitized,omitempty"`
}

// Budgeter turns measurements into the batch CPU budget, one call of Next per
// control period. It remembers the value it applied last. It is not safe for
// concurrent use.
type Budgeter struct {
	policy  Policy
	last    float64
	hasLast bool
}

// NewBudgeter returns a Budgeter for p. p should have passed Validate; as the
// constructor cannot fail, out-of-range fields are forced into range instead
// (NaN or non-positive threshold -> 0, i.e. batch held at its minimum;
// threshold > 1 -> 1; NaN, negative or infinite MinBatchCPU -> 0 and
// MaxBatchCPU -> 0 (all node CPUs); NaN or non-positive RestoreStepPercent ->
// 0, i.e. never grow; RestoreStepPercent > 100 -> 100), so Next never yields
// NaN.
func NewBudgeter(p Policy) *Budgeter {
	return &Budgeter{policy: forceRange(p)}
}

// Policy returns the policy in use, after NewBudgeter forced it into range.
func (b *Budgeter) Policy() Policy { return b.policy }

// Reset forgets the last applied value: the next call to Next is "initial".
func (b *Budgeter) Reset() {
	b.last, b.hasLast = 0, false
}

// Next computes the budget for this period and remembers Applied.
//
// Target = clamp(NodeCPUs*Threshold - LSUsage - SystemUsage, Min, Max). A
// Target below the last applied value is applied at once; a higher one is
// approached by at most RestoreStepPercent% of NodeCPUs per call.
//
// The first call applies Target, not Max: an agent that restarts while LS is
// busy must not hand batch the whole node for a period.
//
// Bad inputs are made safe, never generous: a NaN, infinite or non-positive
// NodeCPUs holds batch at MinBatchCPU (Max becomes MaxBatchCPU, or Min when
// that is 0); a NaN, infinite or negative usage is taken to be the whole node.
func (b *Budgeter) Next(in BudgetInput) Budget {
	p := b.policy
	var notes []string
	out := Budget{Threshold: p.Threshold}

	if isFinite(in.NodeCPUs) && in.NodeCPUs > 0 {
		out.NodeCPUs = in.NodeCPUs
		out.LSUsage = usage("lsUsage", in.LSUsage, in.NodeCPUs, &notes)
		out.SystemUsage = usage("systemUsage", in.SystemUsage, in.NodeCPUs, &notes)
		out.Max = out.NodeCPUs
		if p.MaxBatchCPU > 0 && p.MaxBatchCPU < out.Max {
			out.Max = p.MaxBatchCPU
		}
		out.Min = math.Min(p.MinBatchCPU, out.Max)
	} else {
		// Without the node size nothing can be computed: report NodeCPUs as 0
		// (so Raw <= 0 and Target = Min) and the usages only when finite, so
		// that the Budget stays JSON-encodable.
		notes = append(notes, fmt.Sprintf("nodeCPUs=%v unusable: assumed 0, batch held at minBatchCPU", in.NodeCPUs))
		out.LSUsage = nonNegFiniteOrZero(in.LSUsage)
		out.SystemUsage = nonNegFiniteOrZero(in.SystemUsage)
		out.Min = p.MinBatchCPU
		out.Max = math.Max(out.Min, p.MaxBatchCPU)
	}
	// Finite inputs can still overflow to -Inf (JSON cannot encode it).
	out.Raw = math.Max(out.NodeCPUs*out.Threshold-out.LSUsage-out.SystemUsage, -math.MaxFloat64)
	out.Target = math.Max(out.Min, math.Min(out.Raw, out.Max))
	out.Sanitized = strings.Join(notes, "; ")

	if !b.hasLast {
		out.Previous = out.Max
		out.Applied = out.Target
		out.Reason = ReasonInitial
	} else {
		out.Previous = b.last
		switch {
		case out.Target < out.Previous:
			out.Applied = out.Target
			out.Reason = ReasonCut
		case out.Target == out.Previous:
			out.Applied = out.Target
			out.Reason = ReasonHold
		default:
			step := p.RestoreStepPercent / 100 * out.NodeCPUs
			if out.Target-out.Previous <= step {
				out.Applied = out.Target
				out.Reason = ReasonRestore
			} else {
				// Never below Min: the floor holds even while restoring
				// (Previous < Min only after the node size changed).
				out.Applied = math.Max(out.Min, out.Previous+step)
				out.Reason = ReasonRestoreLimited
				if out.Applied >= out.Target {
					out.Applied = out.Target
					out.Reason = ReasonRestore
				}
			}
		}
	}
	b.last, b.hasLast = out.Applied, true
	return out
}

// usage returns v when it is a finite number >= 0, else the whole node.
func usage(name string, v, node float64, notes *[]string) float64 {
	if isFinite(v) && v >= 0 {
		return v
	}
	*notes = append(*notes, fmt.Sprintf("%s=%v unusable: assumed %v (whole node)", name, v, node))
	return node
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func nonNegFiniteOrZero(v float64) float64 {
	if isFinite(v) && v >= 0 {
		return v
	}
	return 0
}

// forceRange maps every out-of-range Policy field to a safe in-range value.
func forceRange(p Policy) Policy {
	switch {
	case !(p.Threshold > 0): // NaN too
		p.Threshold = 0
	case p.Threshold > 1:
		p.Threshold = 1
	}
	if !isFinite(p.MinBatchCPU) || p.MinBatchCPU < 0 {
		p.MinBatchCPU = 0
	}
	if !isFinite(p.MaxBatchCPU) || p.MaxBatchCPU < 0 {
		p.MaxBatchCPU = 0
	}
	switch {
	case !(p.RestoreStepPercent > 0):
		p.RestoreStepPercent = 0
	case p.RestoreStepPercent > 100:
		p.RestoreStepPercent = 100
	}
	return p
}
