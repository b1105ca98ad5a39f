package qos

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// LoadPolicy parses a YAML (or JSON) document whose top level is the policy
// itself (threshold, minBatchCPU, ...) the way Policy's doc asks a larger config
// to: fields that are absent or null keep their DefaultPolicy value; unknown
// fields, duplicate keys and wrong types are errors naming the field. The result
// is validated. Every error wraps ErrInvalidConfig. It exists for the tests of
// Policy's YAML form (no production code reads a policy on its own; the agent's
// configuration holds it as a field, and config.Load names a bad value's path).
func LoadPolicy(data []byte) (Policy, error) {
	p := DefaultPolicy()
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return Policy{}, fmt.Errorf("parsing QoS policy: %w: %w", err, ErrInvalidConfig)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}
