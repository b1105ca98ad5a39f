// Package metrics holds Understory's Prometheus metric sets: the node agent's (Agent,
// GPU, Escalation for its freezes and evictions, ConfigReload for reloads of its
// configuration file) and the scheduler extender's, each
// built on a caller-supplied registry (no global registry, no init registration).
//
// What the two binaries say to each other, the node-metrics document included, is
// package contract's, not this one's.
//
// Traps: a metric's name, labels and help are read by dashboards and alerts
// (manifests/grafana, manifests/monitoring), and the tests compare their exposition
// text; a renamed label breaks a dashboard silently. Label values come from pods and
// GPUs: bounded sets only (no request IDs, no timestamps), or the series count grows
// without end.
package metrics
