// Package extender is Understory's kube-scheduler HTTP extender (served by
// cmd/scheduler-extender, described in docs/extender.md). For pods asking for
// whole GPUs, GPU shares or the node agent's batch resources it filters,
// prioritizes and binds: it picks the devices on a node, accounts batch
// capacity, and admits gangs (scheduler-plugins PodGroups, Volcano and
// Koordinator annotations) all-or-nothing. It also serves /healthz, /metrics
// and /status.
//
// Types and their one job: Server serves HTTP (server*.go: decoding, the
// decoded-pod cache, encoding) and binds (bind.go); State is the cluster
// index and its reservations; gangBook the gang registry (membership,
// PodGroups, plan ids); shapeTable and resolvedLists
// (verdicts.go) key and resolve what filters score; gangJob plans a gang
// outside the lock; outbox queues the Events and nudges the index decides;
// apiContact measures cache staleness; placement (its own package) decides.
//
// State is the one in-memory index: nodes, the pods charged on them, the
// extender's own reservations and gangs, behind a single sync.RWMutex. The
// node, pod and PodGroup informers feed it; scoring runs under the read lock,
// every change under the write lock, and a filter that scored optimistically
// re-checks the node's generation before it commits. Gang planning runs on
// copies without the lock (gangJob) and commits under it. Nothing does I/O under
// the lock: Events and gang nudges are queued and flushed afterwards, and a
// gang member's bind waits on a channel with no lock held.
//
// Traps:
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
//   - Verdicts are cached per node, keyed by the node's generation, the policy
//     epoch and the request shape. Every change of a node's placement state
//     must go through State.bump, and cached device slices are shared: never
//     modify them. Gang "can never fit" verdicts are keyed by capGen, which
//     moves with the node set and each node's capacity, labels and taints.
//   - A node-metrics annotation that is stale, missing or undecodable makes
//     Node.Usage nil, which means unknown, never idle.
//   - Whole-GPU devices are kubelet's (the device plugin's) choice: once the
//     agent's node-metrics v2 reports them, the ledger follows (gpualloc.go),
//     whatever the pod's devices annotation says; shares keep the annotation.
//   - Node names in a filter's verdicts alias the request body and per-request
//     scratch is pooled: nothing may keep them past the request.
//   - The placement core is package placement (Policy and its implementations,
//     Workload, Select, Node and Request), shared with cmd/openb-replay through
//     package openb: it stays free of State, locks, clocks and I/O (its
//     TestImports checks), so the extender serialises the one policy that is
//     not safe for concurrent use (random, see lockedPolicy) and converts node
//     metrics into placement.Usage itself. A change there moves the replay's
//     published results as well as live placement.
package extender
