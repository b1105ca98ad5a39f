// Package kueuequota is the Kueue quota follower: it keeps the nominalQuota of
// Kueue ClusterQueues following the batch capacity Understory's agents publish on
// the Nodes, and brings the cohort's admitted work back within those quotas through
// Kueue when they fall. cmd/kueue-quota runs it; docs/kueue.md explains the design.
//
// One pass (Follower.Step, every Config.Interval):
//
//  1. Published: the sum of allocatable Config.Resources
//     (understory.io/batch-cpu, understory.io/batch-memory, understory.io/gpu-milli,
//     nvidia.com/gpu by default) over the live Nodes (a Node informer): schedulable,
//     Ready, without the unreachable or not-ready taint, with an agent node-metrics
//     document fresh within Config.MetricsMaxAge and MetricsMaxSkew (the extender's
//     bounds). Any other Node counts 0: it keeps the capacity it last published.
//  2. The ClusterQueues labelled understory.io/quota-follower=true, each with its
//     weight (annotation understory.io/quota-weight, default 1) and current
//     nominalQuota of those resources in flavor Config.Flavor.
//  3. quota.Decide: each queue's weighted part of what is published,
//     falling at once, rising by half the gap per pass, a 5 % deadband on rises;
//     never above what is published. Changed queues are updated (read, modify,
//     update with the resourceVersion; only those nominalQuota values change) and
//     get an Event (QuotaFollowed).
//  4. Over quota (Config.EvictOverQuota): Kueue does not evict admitted Workloads
//     when a nominalQuota falls (it preempts only to admit pending work: v0.17.0,
//     pkg/scheduler/preemption). When the queues' reservations (status
//     flavorsReservation) sum above the new quotas by more than
//     Params.EvictTolerance of them (quota.Over), the follower lists the admitted
//     Workloads and quota.SelectEvictions ranks the lowest-priority, latest
//     admitted Workloads of the queues furthest over their quota. Damped: nothing
//     is deactivated until the excess has lasted Config.EvictAfter (every pass
//     seeing it; 2 min by default), then only the first pick, one per pass, each
//     pass counting again what is still admitted. It is
//     deactivated through the Workload API (spec.active=false, label
//     understory.io/quota-evicted=true, Event QuotaEvicted): Kueue evicts it itself
//     (condition Evicted, reason Deactivated), suspends its Job (which deletes the
//     pods) and releases its quota. Nothing is killed behind Kueue's back.
//  5. Requeue: a labelled Workload that Kueue has evicted (no QuotaReserved) is
//     reactivated (spec.active=true, label removed, Event QuotaRequeued): Kueue
//     puts it back in its queue (condition Requeued, reason Reactivated) and admits
//     it again when quota allows.
//
// Replicas (Follower.RunElected, LeaderConfig): every replica runs the Node
// informer (Synced, the readiness probe, is the same on all), but only the one
// holding the coordination.k8s.io Lease (default understory-kueue-quota; lease
// 15 s, renew deadline 10 s, retry 2 s) runs passes. Cancelling the context
// releases a held Lease, so a standby takes over within RetryPeriod; a leader
// that cannot renew within RenewDeadline stops its passes and RunElected returns
// ErrLeadershipLost: cmd/kueue-quota then exits 1 and kubelet restarts it as a
// standby. Follower.Run is the single-replica mode, without a Lease.
//
// Metrics (client_golang, Registerer of New): understory_kueue_quota_published,
// understory_kueue_quota_nominal, understory_kueue_quota_target,
// understory_kueue_quota_updates_total, understory_kueue_quota_evictions_total,
// understory_kueue_quota_requeues_total, understory_kueue_quota_errors_total,
// understory_kueue_quota_last_pass_timestamp_seconds, understory_kueue_quota_leader
// (1 while this replica runs passes; a standby has run none, so its pass metrics
// are empty or 0: read the leader's).
//
// Traps:
//   - The follower owns the nominalQuota of the resources it follows: a client-side
//     `kubectl apply` of the ClusterQueues resets them until the next pass. Other
//     resources, flavors and fields of the queue are left as they are; a resource the
//     queue's flavor does not list is not added (the decision is made, not written).
//   - The weights split the published total between the queues the follower sees;
//     queues of the cohort without the label keep their own quotas, and the total
//     can then exceed what is published. Label every queue of the cohort.
//   - Published is a sum over Nodes: a pod still has to fit one node. Quota that
//     fits but cannot be placed (a gang larger than any node's share) is released by
//     Kueue's waitForPodsReady (manifests/components/kueue/kueue-config.yaml), not
//     by the follower.
//   - A pass that fails part-way (a conflict, an API error) counts an error and is
//     retried whole on the next pass; decisions depend only on what is read then.
//   - Only the storage version kueue.x-k8s.io/v1beta2 is used.
//   - Leader election bounds, it does not exclude, overlap: a leader cut off from
//     the API server keeps passing until RenewDeadline (10 s) while a standby may
//     take the Lease only after LeaseDuration (15 s) from its last renewal; a pass
//     already sent when the Lease is lost can still land. Each pass decides from
//     what it reads, so a late pass of the old leader is corrected by the next.
package kueuequota
