package qos

import (
	"errors"
	"fmt"
	"math"
)

// Defaults of [Policy].
const (
	// DefaultThreshold is the fraction of node CPU that LS, system and batch
	// may use together. Placeholder until benchmarks tune it.
	DefaultThreshold = 0.9
	// DefaultMinBatchCPU keeps batch from starving completely (cores).
	DefaultMinBatchCPU = 0.1
	// DefaultMaxBatchCPU 0 means "all node CPUs".
	DefaultMaxBatchCPU = 0.0
	// DefaultRestoreStepPercent is how fast batch may grow back, in percent of
	// node CPUs per control period.
	DefaultRestoreStepPercent = 10.0
)

// ErrInvalidConfig is wrapped by every Policy validation error.
var ErrInvalidConfig = errors.New("invalid QoS policy")

// Policy is the CPU budget policy of the batch tier. It is plain data with
// JSON/YAML tags (sigs.k8s.io/yaml) so a larger config can hold it under a
// named key (a field Policy with tag json:"policy", as the agent's does): fill
// the field with DefaultPolicy() before unmarshalling (absent fields then keep
// their defaults), use yaml.UnmarshalStrict, then call Validate.
type Policy struct {
	// Threshold is the fraction of node CPU that LS + system + batch may use
	// together, in (0, 1].
	Threshold float64 `json:"threshold"`
	// MinBatchCPU is the floor of the batch budget in cores, >= 0.
	MinBatchCPU float64 `json:"minBatchCPU"`
	// MaxBatchCPU is the ceiling of the batch budget in cores, >= 0; 0 means
	// all node CPUs. A value above the node's CPUs is capped to them.
	MaxBatchCPU float64 `json:"maxBatchCPU"`
	// RestoreStepPercent bounds how much the budget may grow per control
	// period, in percent of node CPUs, in (0, 100]. Cuts are never limited.
	RestoreStepPercent float64 `json:"restoreStepPercent"`
}

// DefaultPolicy returns the default policy. It passes Validate.
func DefaultPolicy() Policy {
	return Policy{
		Threshold:          DefaultThreshold,
		MinBatchCPU:        DefaultMinBatchCPU,
		MaxBatchCPU:        DefaultMaxBatchCPU,
		RestoreStepPercent: DefaultRestoreStepPercent,
	}
}

// Validate reports every out-of-range field; each error names the field by
// its YAML key and wraps ErrInvalidConfig (several are joined with
// errors.Join). A zero Policy is invalid: start from DefaultPolicy.
func (p Policy) Validate() error {
	var errs []error
	bad := func(field string, v float64, rule string) {
		errs = append(errs, fmt.Errorf("%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	if !(p.Threshold > 0 && p.Threshold <= 1) { // also catches NaN
		bad("threshold", p.Threshold, "must be in (0, 1]")
	}
	if !(p.MinBatchCPU >= 0) || math.IsInf(p.MinBatchCPU, 0) {
		bad("minBatchCPU", p.MinBatchCPU, "must be a finite number of cores >= 0")
	}
	if !(p.MaxBatchCPU >= 0) || math.IsInf(p.MaxBatchCPU, 0) {
		bad("maxBatchCPU", p.MaxBatchCPU, "must be a finite number of cores >= 0 (0 = all node CPUs)")
	} else if p.MaxBatchCPU > 0 && p.MinBatchCPU > p.MaxBatchCPU {
		bad("minBatchCPU", p.MinBatchCPU, fmt.Sprintf("must not exceed maxBatchCPU (%v)", p.MaxBatchCPU))
	}
	if !(p.RestoreStepPercent > 0 && p.RestoreStepPercent <= 100) {
		bad("restoreStepPercent", p.RestoreStepPercent, "must be in (0, 100]")
	}
	return errors.Join(errs...)
}
