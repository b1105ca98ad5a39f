// Package extender is Understory's kube-scheduler HTTP extender (served by
// cmd/scheduler-extender, described in docs/extender.md). For pods asking for
// whole GPUs, GPU shares or the node agent's batch resources it filters,
// prioritizes and binds: it picks the devices on a node, accounts batch
// capacity, and admits gangs (scheduler-plugins PodGroups, Volcano and
// Koordinator annotations) all-or-nothing. It also serves /healthz, /readyz,
// /syncz, /metrics and /status, and runs leader election among replicas
// (leader.go).
//
// It is cut along its three jobs: package wire turns bodies into arguments
// and results into bodies (pure and fuzzed: the ExtenderArgs decoder with its
// pod and candidate-list caches, the encoders, PodRequest, /status's types);
// package gang admits gangs against a small interface of the index it owns
// (gang.Index, gang.Ledger, gang.Outbox: gangport.go implements them); this
// package keeps the cluster index and all that talks to the API. One type per
// job (docs/extender.md has the map with files and method counts):
//   - Server (server.go) serves HTTP, wires the types below (NewServer) and runs
//     informers and housekeeping (Run, Housekeep); status.go answers /status.
//   - reservations (filter.go) answers filter and prioritize side by side:
//     Filter reserves the best node (gang members go to the gangs first);
//     its bind half (beginBind, finishBind, settle) is in bind.go.
//   - State (state.go) is the cluster index and holds the one lock; a pod's
//     record is made once, outside the lock, by podRecordOf (transform.go).
//   - ledger (ledger.go, gpus.go) is the capacity the index accounts and its
//     only charger; scoring (scoring.go) scores with the serving policy, its
//     verdicts cached per node.
//   - binder (bind.go) binds; informers (informers.go) feed the index and the
//     gangs and report their contact with the API (apiContact); outbox
//     (outbox.go) sends after the lock what was decided under it; leadership
//     (leader.go) runs leader election and gates serving on it.
//
// One lock: State's sync.RWMutex guards the index, the ledger, scoring, the
// reservations' phases and the gangs; reservations and the gangs take it
// through the index (lock, rlock; gang.Index) and call each other with it
// held, each keeping its own fields. Scoring runs under the read lock, every
// change under the write lock, and a filter that scored optimistically
// re-checks the node's generation before it commits. Gang planning runs on
// copies without the lock and commits under it. Nothing does I/O under the
// lock: Events and gang nudges are queued (outbox) and flushed afterwards, and
// a gang member's bind waits on a channel with no lock held.
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
//   - Verdicts are cached per node, keyed by the node's generation, the policy
//     epoch and the request shape. Every change of a node's placement state
//     must go through ledger.bump, and cached device slices are shared: never
//     modify them. Gang "can never fit" verdicts are keyed by capGen, which
//     moves with the node set and each node's capacity, labels and taints
//     (ledger.capGen; the gangs read it through gang.Ledger.Generations).
//   - A node-metrics annotation that is stale, missing or undecodable makes
//     Node.Usage nil, which means unknown, never idle.
//   - Device slots are NVML indices of the physical GPUs the agent lists in
//     node-metrics v2 (gpus.go), never slots of allocatable nvidia.com/gpu
//     (time-slicing replicas inflate it, an unhealthy GPU's removal renumbers
//     it): an unhealthy or unlisted GPU has capacity 0, reservations follow
//     their GPU's UUID when the list changes (gpuTable.rekey; written
//     annotations keep their index: the agent resolves it at container
//     creation), and the allocatable
//     count over nvidia.com/gpu.replicas is only the fallback without agent
//     data. The annotation is written and read with package contract's codec,
//     the one the agent's NRI plugin reads it with.
//   - Whole-GPU devices are kubelet's (the device plugin's) choice: once the
//     agent's node-metrics v2 reports them, the ledger follows (gpus.go),
//     whatever the pod's devices annotation says; shares keep the annotation.
//   - Node names in a filter's verdicts alias the request body (package wire)
//     and per-request scratch is pooled: nothing may keep them past the request.
//   - The placement core is package placement (Policy and its implementations,
//     Workload, Select, Node and Request), shared with the openb replay
//     (bench/openb): it stays free of State, locks, clocks and I/O (its
//     TestImports checks), so the extender serialises the one policy that is
//     not safe for concurrent use (random, see lockedPolicy) and converts node
//     metrics into placement.Usage itself. A change there moves the replay's
//     published results as well as live placement.
package extender
