package qos

import (
	"fmt"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// LoadPolicy parses a YAML (or JSON) document whose top level is the policy
// itself (threshold, minBatchCPU, ...) the way Policy's doc asks a larger config
// to: fields that are absent or null keep their DefaultPolicy value; unknown
// fields, duplicate keys and wrong types are errors naming the field. The result
// is validated. Every error wraps ErrInvalidConfig. It exists for the tests of
// Policy's YAML form (no production code reads a policy on its own; the agent's
// configuration holds it as a field).
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
