// Package gang is the scheduler extender's gang admission: pods of one gang
// (a scheduler-plugins PodGroup, a Volcano group, Koordinator's annotations)
// are placed all-or-nothing. It plans against a small interface of the
// extender's index, which it owns and the index implements: Index (the
// index's lock and its pods, each a Pod), Ledger (copies of the nodes to plan
// on, holding and releasing members, the serving policy) and Outbox (Events
// and nudges, sent after the lock). The index tells it what happens to pods
// (Gangs.PodUpdated, PodBound, PodReleasing, PodDeleted) and keeps each pod's
// Member, the gangs' part of it, which a pod's Record fills.
//
//   - Gangs (gangs.go) keeps the registry (gangBook, book.go: members,
//     PodGroups from podgroup.go, plan ids) and decides a member's filter
//     (filter.go): it follows the gang's plan, resumes one recorded before a
//     restart (resume.go), or plans the gang outside the index lock (gangJob,
//     plan.go: placeAll puts each member where placement.Select would), then
//     commits the plan, fails or expires it.
//   - Binds (bind.go) binds a plan's members together: each waits at bind
//     until the last arrives, whose caller commits them all (FinishBind).
//   - Constraints (constraints.go): a member's node selector, required
//     affinity and tolerations, for the members kube-scheduler did not filter.
//
// Traps:
//   - Every method but the PodGroup feed is called with the index lock held;
//     Filter drops it while it plans, and FinishBind, BindTimeout and Result
//     take it. Planning reads only its copies (gangJob, everJob).
//   - A committed gang plan is recorded on every member (contract.AnnotationGangState,
//     resume.go) and resumed after a restart; plan ids must stay unique
//     across restarts (planIDBase), and a plan this process released must never
//     be resumed from its records (gangBook.finished). A record is outside
//     input (the tenant's pod): resumableRecord bounds what it may claim.
//   - A gang plan places its members greedily, largest first, each where
//     placement.Select would send it. placeAll keeps each node's score between
//     members (placement.Ranking) and scores again only the node a member was
//     placed on: valid only while a score is a function of the node and the
//     request, so never for the random policy (Ledger.Policy says whether it
//     is rankable), and every change of a planning copy must be reported to the
//     rankings (rankings.changed).
//   - "Can never fit" verdicts are keyed by the index's capacity generation
//     (Ledger.Generations), which must move with the node set and each node's
//     capacity, labels and taints.
package gang
