// Package metrics holds what Understory's two binaries publish about a node and share
// with each other without importing each other:
//
//   - NodeMetrics, the versioned JSON the node agent writes to its Node's
//     understory.io/node-metrics (version 1) and understory.io/node-metrics-v2
//     (version 2, with GPUs) annotations and the scheduler extender reads
//     (the contract is documented in docs/node-metrics.md);
//   - the Prometheus metric sets of the agent (Agent, and Escalation for its
//     freezes and evictions) and of the extender, each built on a caller-supplied
//     registry (no global registry, no init registration).
//
// Traps: the annotation is read by another binary that may be older or newer.
// New fields are optional (an older agent's document still decodes; LSFreeMilli nil
// is unknown, never free). GPU UUIDs are checked for NVML's shape: the extender keys
// its bookings by them.
// Decode rejects versions it does not know instead of guessing, and a reader
// must treat a stale or undecodable annotation as "unknown", never as "idle".
package metrics
