// Package evict evicts batch pods through the Kubernetes Eviction API
// (policy/v1), the last step of the graded actions decided by
// qos.Escalator (throttle, freeze, evict). Posting an Eviction rather than
// deleting the pod makes the API server honour the pod's
// PodDisruptionBudgets (Koordinator issue 1757: its evictions ignore them).
//
// The control loop calls Submit with the escalator's EvictionRequest and the
// node's batch pods; Submit never blocks and the latest request wins. Run
// (its own goroutine) works through the candidates in
// qos.OrderEvictionCandidates order: lowest priority, then the largest
// memory user, then the most recently started. For memory pressure it evicts
// until the evicted pods' memory covers the amount to free (at least one
// pod); for CPU starvation, one pod. Each attempt is a metric
// (understory_evictions_total{reason,result}), a log line and, except for a
// pod already gone, a Warning event on the pod.
//
// Results: accepted -> "evicted"; 429 (a PDB refuses) -> "blocked_pdb", the
// next candidate is tried and the pod is backed off (evictionBackoff,
// doubling up to maxEvictionBackoff); 404 naming the pod or 409 (the UID
// precondition failed) -> "not_found", the next candidate; 403, 405, or a
// 404 of the endpoint itself -> "unavailable": reported once (Error log,
// event, metric, Status.Unavailable) and evictions pause for
// UnavailableRetry; anything else -> "error", backed off like a PDB refusal.
// Without an API server (static mode) or with DryRun the Evictor only
// reports ("dry_run").
//
// Traps:
//   - The API server needs RBAC "create" on pods/eviction for the agent's
//     service account; without it every attempt is a 403 ("unavailable").
//     A 403 for another cause (an admission webhook, a terminating namespace)
//     also pauses evictions for UnavailableRetry; errors are not told apart
//     by their text.
//   - Evictions are rate-limited per node (a token bucket of
//     maxEvictionsPerMinute, refilled at that rate); only accepted (or
//     dry-run) evictions take a token, so refusals never starve the budget.
//     Refusals are bounded by the per-pod backoff instead.
//   - An evicted pod stays listed while it terminates (its grace period may
//     be long); its UID is remembered for an hour and never evicted twice.
//     The caller should still leave out pods with a deletionTimestamp.
//   - Every Eviction carries the pod's UID as a precondition, so a new pod
//     of the same name (a StatefulSet) is never evicted in its place.
//   - A frozen pod cannot act on SIGTERM, and on a v1 freezer not even die
//     from SIGKILL: the agent must thaw a pod it evicts (or the tier).
//   - Events and logs run on the Run goroutine and must not block; the
//     agent's podsource sinks do not.
package evict
