// Package quota holds the Kueue quota follower's decisions, pure: each
// ClusterQueue's nominalQuota as its weighted part of the batch capacity the agents
// publish on their Nodes (Decide: falling at once, rising damped with a deadband,
// never above what is published), and which admitted Workloads to deactivate when
// the quotas fall below what the cohort admitted by more than the eviction tolerance
// (Over says whether they do, SelectEvictions which). The follower (package
// kueuequota) reads the cluster and writes what these decide.
package quota
