// Package extender is Understory's kube-scheduler HTTP extender (served by
// cmd/scheduler-extender, described in docs/extender.md). For pods asking for
// whole GPUs, GPU shares or the node agent's batch resources it filters,
// prioritizes and binds: it picks the devices on a node, accounts batch
// capacity, and admits gangs (scheduler-plugins PodGroups, Volcano and
// Koordinator annotations) all-or-nothing. It also serves /healthz, /readyz,
// /syncz, /metrics and /status, and runs leader election among replicas
// (leader.go).
//
// Types and their one job (docs/extender.md has the map with files and
// method counts):
//   - Server (server*.go) serves HTTP: decodes (a hand-written scanner with
//     the decoded-pod and node-list caches, server_decode.go: docs/extender.md
//     says why it is not a JSON library),
//     calls the type below whose job it is, encodes; it wires them (NewServer)
//     and runs informers and housekeeping (Run, Housekeep).
//   - State (state.go, state_score.go, state_status.go) is the cluster index:
//     nodes and pods as the informers (or request bodies) show them; it takes
//     the informers' upserts and deletes, follows node metrics and kubelet's
//     GPU allocation, answers Prioritize and /status, and holds the one lock.
//   - ledger (ledger.go, gpualloc.go, gpuslots.go) is the capacity the index
//     accounts: the node entries and their device ledgers (placement.Node),
//     its only charger: hold, place, release, chargeBound, reconcileGPUs,
//     orphans, and the copies planning reads (candidates, emptyNodes).
//   - scoring (scoring.go) scores requests with the serving policy, its
//     verdicts cached per node (judge, evaluate, recheck).
//   - reservations (reserve.go) holds a pod's capacity from its filter to its
//     binding: reserve on filter, binding and assumed on bind, unconfirmed
//     holds after a lost Binding answer, expiry.
//   - Gangs (gangs.go, gang_plan.go, gang_resume.go) admits gangs: gangBook
//     (gangbook.go, podgroup.go) registers members, PodGroups and plan ids; a
//     member's filter plans the gang outside the lock (gangJob, placeAll in
//     gang.go), commits, fails, expires and resumes plans. It reaches the index
//     only through gangIndex, gangLedger and policySource, which it owns; the
//     index tells it what happens to pods through podObserver, which the index
//     owns.
//   - gangBinds (gang_bind.go) binds a plan's members together: each waits at
//     bind until the last arrives, which commits them all.
//   - binder (bind.go) binds: Bindings, the read back of a lost answer, and
//     the refusal while informers are stale (apiContact, contact.go).
//   - informers (informers.go) feed the index and the gangs; outbox
//     (outbox.go) sends the Events and nudges decided under the lock after
//     it (muted on a standby); leadership (leader.go) runs leader election
//     among replicas (Deps.Leader) and gates serving on it; shapeTable and resolvedLists (verdicts.go) key and resolve what
//     filters score; placement (its own package) decides.
//
// One lock: State's sync.RWMutex guards the index, the ledger, scoring, the
// reservations' phases and the gangs; reservations, Gangs and gangBinds take
// it through the index (lock, rlock) and call each other's lower-case methods
// with it held, each keeping its own fields. Scoring runs under the read lock,
// every change under the write lock, and a filter that scored optimistically
// re-checks the node's generation before it commits. Gang planning runs on
// copies without the lock (gangJob) and commits under it. Nothing does I/O
// under the lock: Events and gang nudges are queued (outbox) and flushed
// afterwards, and a gang member's bind waits on a channel with no lock held.
//
// Traps:
//   - With leader election (Deps.Leader) only the leader serves: a standby
//     runs the same informers and housekeeping but refuses filter, prioritize
//     and bind (503, ErrStandby) and writes nothing (its outbox is muted). It
//     competes for the lease only once synced; when it takes the lease it
//     catches up before it serves (every pod the API shows bound must be bound
//     in its index: podBarrier, a write on its own pod that its informer must
//     deliver, relying on client-go's in-order informers; else catchUp, a list
//     of every bound pod; then Housekeep resumes recorded gang plans) and
//     points the Service at itself (publishLeader, an EndpointSlice). A leader
//     that loses its lease refuses at once and Run returns ErrLeadershipLost:
//     the process must exit (kubelet restarts it as a fresh standby). That is
//     the simplest safe behaviour: a replica never serves twice, so no state
//     of an earlier reign (reservations, plans, finished plan ids) can leak
//     into a later one. The lease duration must exceed the renew deadline by
//     more than the clocks can drift apart in that time, and be whole seconds
//     (the Lease records seconds: 800 ms would be 0 s, always expired).
//   - Readiness for the kubelet is /syncz (synced, leader or standby), not
//     /readyz (serving): a never-Ready standby would stall Deployment rollouts
//     and PodDisruptionBudgets. kube-scheduler reaches the leader through the
//     EndpointSlice, never through readiness.
//   - Until the informers have synced (Server.Ready) filter, prioritize and
//     bind answer 503: the index does not yet know which devices bound pods
//     hold. A request body is never a witness of a binding (its spec.nodeName
//     is ignored), and what only bodies show (pods; nodes, only without
//     Config.NodeCacheCapable) expires.
//   - A failed Binding may have been applied with its answer lost: read the
//     pod back (confirmBinding) before releasing anything. If that fails too
//     the hold stays (podEntry.unconfirmed), and a filter must not release it.
//   - Binds are refused once the node or pod informer is stale beyond
//     Config.MaxCacheStaleness (apiContact: 0 while a watch is open).
//   - The informers keep only what the index reads (transform.go): a new field
//     the index reads must be kept there too. The pod informer stores a
//     podRecord, not a *corev1.Pod: its handlers (and tombstones) carry records.
//   - A bound pod's devices annotation is trusted only where the devices are
//     free: the first pod the index charged keeps a device (chargeBound).
//   - Filter passes exactly one node and reserves the pod's request on it,
//     devices included, so two quick filters can never book the same GPU. The
//     reservation expires after Config.AssumedTTL if no bind comes; a bound pod
//     stays assumed until the informer shows it bound. With one node left,
//     kube-scheduler skips scoring: prioritize is not called after such a filter.
//   - Bind is one API write per pod: the devices annotation travels in the
//     Binding's metadata, which kube-apiserver copies onto the pod in the update
//     that sets spec.nodeName. Never split it into a patch and a Binding again:
//     that doubles the writes per bind.
//   - A gang member's bind blocks until every planned member has reached bind
//     (at most Config.GangBindTimeout). That must stay below kube-scheduler's
//     extender httpTimeout, and the HTTP write timeout above it plus the API
//     calls of the commit (Config.Validate checks the latter).
//   - A committed gang plan is recorded on every member (AnnotationGangState,
//     gang_resume.go) and resumed after a restart; plan ids must stay unique
//     across restarts (planIDBase), and a plan this process released must never
//     be resumed from its records (gangBook.finished).
//   - A gang plan places its members greedily, largest first, each where
//     placement.Select would send it. placeAll keeps each node's score between
//     members (placement.Ranking) and scores again only the node a member was
//     placed on: valid only while a score is a function of the node and the
//     request, so never for the random policy (rankable), and every change of
//     a planning copy must be reported to the rankings (rankings.changed).
//   - Verdicts are cached per node, keyed by the node's generation, the policy
//     epoch and the request shape. Every change of a node's placement state
//     must go through ledger.bump, and cached device slices are shared: never
//     modify them. Gang "can never fit" verdicts are keyed by capGen, which
//     moves with the node set and each node's capacity, labels and taints.
//   - A node-metrics annotation that is stale, missing or undecodable makes
//     Node.Usage nil, which means unknown, never idle.
//   - Device slots are NVML indices of the physical GPUs the agent lists in
//     node-metrics v2 (gpuslots.go), never slots of allocatable nvidia.com/gpu
//     (time-slicing replicas inflate it, an unhealthy GPU's removal renumbers
//     it): an unhealthy or unlisted GPU has capacity 0, reservations follow
//     their GPU's UUID when the list changes (gpuTable.rekey; written
//     annotations keep their index: the agent resolves it at container
//     creation), and the allocatable
//     count over nvidia.com/gpu.replicas is only the fallback without agent
//     data. The annotation is written and read with package contract's codec,
//     the one the agent's NRI plugin reads it with.
//   - Whole-GPU devices are kubelet's (the device plugin's) choice: once the
//     agent's node-metrics v2 reports them, the ledger follows (gpualloc.go),
//     whatever the pod's devices annotation says; shares keep the annotation.
//   - Node names in a filter's verdicts alias the request body and per-request
//     scratch is pooled: nothing may keep them past the request.
//   - The placement core is package placement (Policy and its implementations,
//     Workload, Select, Node and Request), shared with the openb replay
//     (bench/openb): it stays free of State, locks, clocks and I/O (its
//     TestImports checks), so the extender serialises the one policy that is
//     not safe for concurrent use (random, see lockedPolicy) and converts node
//     metrics into placement.Usage itself. A change there moves the replay's
//     published results as well as live placement.
package extender
