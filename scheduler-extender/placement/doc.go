// Package placement is the extender's pure placement core: what a pod asks
// (Request), what a node has and holds (Node and its per-device ledger), whether
// a request fits (Node.Fit, Node.Check, Node.Place), the target workload and its
// fragmentation (Workload), and the policies that rank nodes (random, bestfit,
// fgd, understory) with Select on top, and Ranking for many Selects of one
// request over nodes that change one at a time (a gang's members).
// docs/scoring.md has the formulas.
//
// The same code serves live placement (package extender) and the openb replay
// (bench/openb), so the replay measures what the extender serves.
//
// Traps:
//   - Pure: no client-go, no net/http, no locks but the random policy's own
//     rng guard, no clock, no I/O (TestImports checks the imports). Whoever
//     calls it owns the nodes and their synchronisation; placement never calls
//     back.
//   - Policies and Select read nodes and never change them; Place, Charge and
//     Discharge are the only writers of a ledger. Charge does not check: the
//     extender mirrors observed reality with it, which may over-commit a node.
//   - Ranking keeps scores between Selects: its caller must report every
//     changed node (Ranking.Update), and it is exact only for policies whose
//     score is a function of node and request (Concurrent: never random).
//   - A nil Node.Usage means unknown (never reported, stale, or from the
//     future), never idle; the caller decides what is fresh.
//   - A share prefers the devices whose agent-reported LS-free SM share holds
//     it (lsFitSet), in every policy; without Usage (the replay) nothing
//     changes. A device with GPUFree 0 from the start is one the extender
//     books nothing on (an unhealthy GPU): policies need no other mark.
//   - A change of any scoring detail moves both the extender's placements and
//     the replay's published results (make bench-openb-short must stay identical
//     for a refactoring).
package placement
