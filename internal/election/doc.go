// Package election is what the leader-elected components (the scheduler
// extender, the Kueue quota follower) share of client-go's leader election: the
// Lease a replica competes for and its timing (Config), their validation, and the
// elector built from them. Each component keeps its own callbacks: what leading
// means (serving after a catch-up, running passes) differs.
//
// Traps:
//   - LeaseDuration must be whole seconds: the Lease records seconds, so a
//     fraction would be cut and standbys would take over early.
//   - client-go's own rules (LeaseDuration > RenewDeadline > JitterFactor ×
//     RetryPeriod) are checked by Validate, so a bad flag fails at start with
//     ErrConfig rather than inside client-go.
//   - The elector releases the Lease when its context ends (ReleaseOnCancel):
//     a caller that cancels it to give leadership up lets a standby take over at
//     once, and a caller must not run leader work after that context ended.
package election
