// Package contract is the one home of what Understory's binaries say to each other
// without importing each other: the node agent (koordlet), the scheduler extender, the
// admission webhook, the Kueue quota follower and the kubectl plugin. Each such name is
// declared here once; TestNoCopies fails on a copy of one spelled as a string literal in
// the module's other non-test Go files.
//
//   - names.go: the extended resources, annotations, labels and pod conditions that
//     cross a binary boundary (batch-cpu, batch-memory, gpu-milli, gpu-devices,
//     qos-class, BatchSlowed, ...), and the gang keys of Volcano, Koordinator and
//     scheduler-plugins with their bound MaxGangSize;
//   - gpudevices.go: the understory.io/gpu-devices codec, one parser for the extender
//     that writes it and the agent that reads it (fuzzed);
//   - nodemetrics.go: the versioned node-metrics document the agent writes to its Node's
//     understory.io/node-metrics (version 1) and understory.io/node-metrics-v2 (version
//     2, with GPUs) annotations and the extender reads (docs/node-metrics.md), and the
//     bounds both sides share (MaxGPUsPerNode, MilliPerGPU);
//   - trusted.go: every key a component writes and later trusts (TrustedKeys), with its
//     writers as the admission policies name them, its fence and its reader's bound.
//
// It is pure: no IO, no clock (callers pass now), no Kubernetes client.
//
// Traps: every value here is read by another binary that may be older or newer. A name
// never changes; the document gains only optional fields (an older agent's document
// still decodes; LSFreeMilli nil is unknown, never free), and Decode rejects versions it
// does not know instead of guessing: a reader treats a stale, future-stamped or
// undecodable document as "unknown", never as "idle". GPU UUIDs are checked for NVML's
// shape: the extender keys its bookings by them.
package contract
