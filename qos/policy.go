package qos

import (
	"errors"
	"fmt"
	"math"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
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

// ErrInvalidConfig is wrapped by every Policy validation or parse error.
var ErrInvalidConfig = errors.New("invalid QoS policy")

// Policy is the CPU budget policy of the batch tier. It is plain data with
// JSON/YAML tags (sigs.k8s.io/yaml) so a larger config can hold it under a
// named key (a field Policy with tag json:"policy"); see LoadPolicy for how
// defaults work then.
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

// LoadPolicy parses a YAML (or JSON) document whose top level is the policy
// itself (threshold, minBatchCPU, ...). Fields that are absent or null keep
// their DefaultPolicy value; unknown fields, duplicate keys and wrong types are
// errors naming the field. The result is validated. Every error wraps
// ErrInvalidConfig.
//
// When Policy is a field of a larger config, do the same there: fill the field
// with DefaultPolicy() before unmarshalling (absent fields then keep their
// defaults), use yaml.UnmarshalStrict, then call Validate.
func LoadPolicy(data []byte) (Policy, error) {
	p := DefaultPolicy()
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		if key := nonFiniteKey(data); key != "" {
			// The YAML-to-JSON step fails on .nan/.inf without naming the key.
			return Policy{}, fmt.Errorf("parsing QoS policy: %s: not a finite number: %w", key, ErrInvalidConfig)
		}
		return Policy{}, fmt.Errorf("parsing QoS policy: %w: %w", err, ErrInvalidConfig)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// nonFiniteKey returns the first top-level key (in document order) whose value
// is a YAML .nan or .inf, or "" if there is none or data is not a mapping.
func nonFiniteKey(data []byte) string {
	var m yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &m) != nil {
		return ""
	}
	for _, kv := range m {
		if f, ok := kv.Value.(float64); ok && !isFinite(f) {
			return fmt.Sprint(kv.Key)
		}
	}
	return ""
}
