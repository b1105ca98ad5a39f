package metrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// AnnotationNodeMetrics is the Node annotation holding the agent's NodeMetrics.
const AnnotationNodeMetrics = "understory.io/node-metrics"

// NodeMetricsVersion is the only version this build writes and reads.
const NodeMetricsVersion = 1

// Sentinel errors returned (wrapped) by DecodeNodeMetrics.
var (
	// ErrUnsupportedVersion means the annotation was written in a version this build does not read.
	ErrUnsupportedVersion = errors.New("unsupported node-metrics version")
	// ErrInvalidNodeMetrics means the annotation is not well-formed or holds impossible values.
	ErrInvalidNodeMetrics = errors.New("invalid node-metrics")
)

// maxNodeMetricsBytes bounds what DecodeNodeMetrics accepts; a real value is a few hundred bytes.
const maxNodeMetricsBytes = 16 << 10

// NodeMetrics is the node-level utilisation snapshot the agent publishes for the scheduler.
// CPU quantities are millicores averaged over Window; memory is in bytes.
type NodeMetrics struct {
	Version   int       `json:"v"`
	Timestamp time.Time `json:"ts"`
	// Window is the averaging window of the usage figures, in milliseconds.
	WindowMillis int64         `json:"win"`
	CPU          CPUMetrics    `json:"cpu"`
	Memory       MemoryMetrics `json:"mem"`
	// Batch is what the agent has published as the batch extended resources on the
	// Node (status.capacity and status.allocatable); nil when it publishes none (yet),
	// and in annotations written before the field existed. A pointer, so that "none"
	// and "zero" differ: trap, == on NodeMetrics then compares the pointer, and a
	// shallow copy shares it (treat it as immutable).
	Batch *BatchResources `json:"batch,omitempty"`
}

// BatchResources are the batch extended resources on the Node, in the units of the
// resources: understory.io/batch-cpu in millicores, understory.io/batch-memory in bytes.
type BatchResources struct {
	CPU    int64 `json:"cpu"`
	Memory int64 `json:"mem"`
}

// CPUMetrics are the node's CPU figures in millicores.
type CPUMetrics struct {
	// Capacity is the node's CPU count × 1000.
	Capacity int64 `json:"cap"`
	// Used is everything the node ran: pods and system.
	Used int64 `json:"used"`
	// LS is what latency-sensitive pods used.
	LS int64 `json:"ls"`
	// Batch is what batch pods used.
	Batch int64 `json:"batch"`
	// BatchBudget is the CPU the agent currently lets batch pods use.
	BatchBudget int64 `json:"budget"`
}

// MemoryMetrics are the node's memory figures in bytes.
type MemoryMetrics struct {
	Capacity int64 `json:"cap"`
	Used     int64 `json:"used"`
	LS       int64 `json:"ls"`
	Batch    int64 `json:"batch"`
}

// Encode validates m and returns its compact JSON form.
func (m NodeMetrics) Encode() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// Validate checks that m is a value a reader can trust.
func (m NodeMetrics) Validate() error {
	if m.Version != NodeMetricsVersion {
		return fmt.Errorf("version %d: %w", m.Version, ErrUnsupportedVersion)
	}
	if m.Timestamp.IsZero() {
		return fmt.Errorf("ts: missing: %w", ErrInvalidNodeMetrics)
	}
	if m.WindowMillis <= 0 {
		return fmt.Errorf("win: %d must be > 0: %w", m.WindowMillis, ErrInvalidNodeMetrics)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"cpu.cap", m.CPU.Capacity}, {"cpu.used", m.CPU.Used}, {"cpu.ls", m.CPU.LS},
		{"cpu.batch", m.CPU.Batch}, {"cpu.budget", m.CPU.BatchBudget},
		{"mem.cap", m.Memory.Capacity}, {"mem.used", m.Memory.Used}, {"mem.ls", m.Memory.LS},
		{"mem.batch", m.Memory.Batch},
		{"batch.cpu", m.Batch.cpu()}, {"batch.mem", m.Batch.mem()},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s: %d is negative: %w", f.name, f.v, ErrInvalidNodeMetrics)
		}
	}
	if m.CPU.Capacity == 0 {
		return fmt.Errorf("cpu.cap: must be > 0: %w", ErrInvalidNodeMetrics)
	}
	return nil
}

func (b *BatchResources) cpu() int64 {
	if b == nil {
		return 0
	}
	return b.CPU
}

func (b *BatchResources) mem() int64 {
	if b == nil {
		return 0
	}
	return b.Memory
}

// DecodeNodeMetrics parses and validates an annotation value.
func DecodeNodeMetrics(s string) (NodeMetrics, error) {
	var m NodeMetrics
	if len(s) > maxNodeMetricsBytes {
		return m, fmt.Errorf("%d bytes exceeds %d: %w", len(s), maxNodeMetricsBytes, ErrInvalidNodeMetrics)
	}
	var probe struct {
		Version int `json:"v"`
	}
	if err := json.Unmarshal([]byte(s), &probe); err != nil {
		return m, fmt.Errorf("json: %v: %w", err, ErrInvalidNodeMetrics)
	}
	if probe.Version != NodeMetricsVersion {
		return m, fmt.Errorf("version %d: %w", probe.Version, ErrUnsupportedVersion)
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return m, fmt.Errorf("json: %v: %w", err, ErrInvalidNodeMetrics)
	}
	if err := m.Validate(); err != nil {
		return NodeMetrics{}, err
	}
	return m, nil
}

// Age is how old m is at now. A timestamp in the future counts as age 0.
func (m NodeMetrics) Age(now time.Time) time.Duration {
	if d := now.Sub(m.Timestamp); d > 0 {
		return d
	}
	return 0
}

// Fresh reports whether m is no older than maxAge at now.
func (m NodeMetrics) Fresh(now time.Time, maxAge time.Duration) bool {
	return m.Age(now) <= maxAge
}
