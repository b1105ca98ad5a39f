// Package openb replays Alibaba's openb GPU-cluster trace through the extender's
// placement code (placement.Select and the policies the extender serves, never a
// copy), following the experiment of the FGD paper (Weng et al., USENIX ATC'23)
// so that our numbers can be compared with its published table. It is research code
// (the replay, its clairvoyant probes and the policy ablations): cmd/openb-replay is
// its command line (`make bench-openb`, bench/out/openb.json), and no production
// package imports it; it imports only the extender's pure placement core and the
// wire contract.
//
// A replay reads the node and pod lists (ParseNodes, ParsePods: every bad row is
// an error naming file:line and column), sorts the pods by name, builds the
// target workload from them, shuffles them with the seed, inflates them to a
// multiple of the cluster's GPU capacity by drawing trace pods with replacement,
// ranks the nodes by a seeded permutation, and places the pods one at a time;
// they never leave and a pod that fits nowhere fails. The GPU allocation ratio is
// averaged over the pods at each arrival level (alloc_at_100, alloc_at_130).
// RunTable runs every workload × policy × seed on a pool of goroutines and puts
// the paper's seed-means beside ours.
//
// Config.Lookahead turns a replay into a clairvoyant probe of how much any
// placement rule could still gain over a policy: from an arrival level on, each
// GPU pod tries the policy's best few distinct nodes, rolls each out over the
// next pods of the real order, and keeps the best. It reads the future, so its
// numbers bound what is left to win; they never describe a policy.
// Config.Search makes Run the same kind of probe over the whole
// replay: after the policy's own replay it hill-climbs over full replays, each
// try sending a few GPU pods of an arrival window to another of the policy's best
// distinct nodes, and keeps the best; what it finds is an allocation some
// placement sequence reaches, found after the fact.
//
// Traps:
//   - All randomness comes from one math/rand (v1) stream drawn in the
//     artifact's order: one Int, the shuffle, the inflation draws, the node
//     permutation, then the random policy. Changing that order changes every
//     per-seed number (seed-means stay within a few hundredths).
//   - Ties between equal scores go to the node that comes first in the seeded
//     permutation, as in the artifact (its scheduler picks the smallest node name
//     and prefixes names with the permutation); Select is called with a nil rng.
//   - The inflation stops before the first draw whose per-GPU milli (not
//     num_gpu × milli) would pass the target, as the artifact does, so an 8-GPU
//     draw may overshoot it; a trace without GPU pods is not inflated.
//   - Nodes get the artifact's pod capacity (DefaultMaxPods, 1001); a pod asking
//     for 0 CPU fits with 0 but scores as 100m.
//   - The multigpu pod lists have no gpu_spec column; it is optional.
//   - The lookahead's rollouts place and take back pods on the replay's own nodes
//     (Node.Place, then Node.Discharge), so a rollout that returned early would corrupt the replay;
//     its cost is candidates × horizon Selects per pod (minutes per replay); and
//     with the random policy its rollouts draw from the replay's stream, so the
//     probe's random replay is not the plain one plus changes.
//   - The search's changes are keyed by a pod's index in the replay's order and
//     by its rank among the policy's distinct candidates in the state that try
//     reaches, not by node: one change early moves every later state, so the
//     same rank vector means different nodes in different tries. Its cost is
//     one full replay per try (2-3 s per workload), and its best is a maximum
//     over noisy replays: part of what it finds is luck, not slack.
package openb
