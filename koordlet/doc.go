// Package koordlet is Understory's node agent's control loop: it wires the pod sources
// (podsource), the node collectors (collect), the policy (qos) and the cgroup
// layer (cgroups) into one loop, and serves /metrics, /healthz, /status
// and /debug/plans. What is not the loop lives beside it: the configuration and its
// reload (koordlet/config), the NRI plugin (koordlet/nri), the API writers (the Node's
// resources, annotations and events, the pod condition: koordlet/nodestatus), the
// evictor (koordlet/evict), the GPU loop (koordlet/gpu, built and served by
// koordlet/gpubridge) and the harm signals (koordlet/signals).
//
// Every period (100 ms by default) is three steps, then a record (tick); every decision
// of the period is in the one qos.Plan the decide step returns:
//
//   - measure (sample.go, the sampler): the node's CPU time, the usage of kubepods,
//     kubelet's BestEffort cgroup, the tier and the pods that need it, memory every
//     memoryEvery periods, the batch pods (for evictions, events and conditions), what
//     the kernel holds on the tier and the batch pods (readback.go), every statistics
//     interval the throttling and CPU pressure, and the harm the signal source queued,
//     into one sample (a qos.Sample plus what only the agent records);
//   - decide (control.go, the controller, over qos.Controller.Plan in qos/plan.go and
//     qos/period.go, pure): the CPU attributed to LS, BE, batch and system, the budget
//     (qos.Budgeter, qos.Guard), and every write with its reason: the budget split
//     between the tier and the in-place pods by max-min fairness on smoothed demand
//     (never more than the budget, cuts written before raises), the write deadband and
//     raise pacing, the batch pods' batch-memory limits and the tier's memory limit;
//     then the batch resources (qos.Reclaimer), the graded action (qos.Escalator) with
//     its freezer writes and eviction candidates, and what the batch pods are told
//     (Warning events, the pod condition: qos.BatchConditions);
//   - apply (apply.go and freeze.go, the actuator): the writes in the plan's order, and
//     what is in force after each: one CFS quota on the tier for the batch pods below it
//     (placed there by the agent's NRI plugin), per-pod quotas, SCHED_IDLE and the
//     minimum weight for batch pods left in kubelet's cgroups ("in-place"); a batch
//     pod's own understory.io/batch-cpu limit caps its share; then the freezer writes
//     and the eviction (to the evictor). The handoff (handoff.go) gives the batch
//     resources, the events and the conditions to their writers. What is in force is
//     read back, not remembered: the tier's limits, SCHED_IDLE and freezer every
//     period, each batch pod's on slow periods; what another writer changed (systemd
//     re-applies a slice's own properties on daemon-reload) is written again.
//   - record (agent.go): metrics, node metrics, /status and /debug/plans; it decides
//     and writes nothing else.
//
// The pod table (pods.go) keeps a row per pod: who it is (syncPods), the sampler's row
// (podRead: where its cgroup is, what was read) and the actuator's (podAct: what the
// agent wrote and holds); each row is written by its owner only.
//
// /status shows the last plan (plan): every group's share and why it was written or
// held. /debug/plans (debugplans.go) keeps the last 256 plans that did something, each
// write with its reason, and how many quiet periods came between.
//
// With an LS harm signal (koordlet/signals: eBPF run-queue delay, else PSI triggers,
// picked from signals.mode) the budget is qos.Guard's: only harm cuts batch, at once,
// and the loop wakes for it between two periods (Run's select); without one (sampling)
// the utilisation budget decides as it always did. Every cut records its cause (the
// signal label of understory_batch_cut_reaction_seconds and batch_cuts_total, and
// /status signals.lastCut).
//
// It also samples memory every memoryEvery periods and gives the tier a memory
// limit (capacity × memory threshold − LS) and each batch pod its
// understory.io/batch-memory limit; plans the batch resources (qos.Reclaimer) and
// hands them to the Node writer (koordlet/nodestatus, its own goroutine); and plans
// the graded actions (qos.Escalator): freeze batch when LS leaves it nothing, evict
// through the evictor (koordlet/evict, its own goroutine, so PodDisruptionBudgets hold
// and the loop never waits for the API server). A batch pod hears of a freeze, and of
// being throttled in most CFS periods (qos.HardThrottled), as a Warning event
// (handoff.go), at most once a reason every 5 minutes. The same states set the pod
// condition understory.io/BatchSlowed: True with the reason
// Throttled or Frozen and the numbers, False with Running once the pod runs free. The
// plan decides every statistics interval (qos.NextBatchCondition: a harder reason at
// once, a milder one after a minute, new numbers after 5 minutes, nothing for a pod
// that never was held back), from the freezer and limits the plan leaves in force;
// nodestatus.PodConditionWriter patches pods/status from its own goroutine (a strategic merge of
// that one condition, with the pod's UID), latest-wins per pod, retried with backoff. A
// restarted agent takes the condition a pod carries as the last written
// (controller.seenPod), so a True left by the previous run goes back to Running.
// A ValidatingAdmissionPolicy (manifests/koordlet/node-policy.yaml) lets the agent
// write only that condition, only on its own node's pods.
//
// The configuration file is reloaded while the agent runs (koordlet/config): the
// Reloader reads it every 5 s and acts on a changed sha256 once two reads agree; a
// valid change goes to Agent.ApplyConfig (liveconfig.go), and Run applies its live
// fields (config.LiveFields:
// the budget policy, the guard's cut and restore, minPodCPU, shutdownBudgetCPU) at the
// start of the next period; the other fields keep their start value and are reported
// (/status config.needsRestart). An invalid one is refused: the configuration in force
// stays, a Warning event ConfigRejected goes to the Node, and
// understory_koordlet_config_last_reload_success is 0.
//
// Traps:
//   - Never write kubelet's QoS-level cgroups (kubepods, burstable,
//     besteffort): cpu.idle on besteffort makes the kernel refuse kubelet's
//     cpu.shares writes and kubelet fails to restart (Koordinator issue 2732).
//     The agent writes only its tier and batch pods' own cgroups.
//   - The kernel compares cpu.idle only between siblings (strict hierarchy
//     since Linux 6.12), so the tier is a child of kubepods by default: below
//     besteffort its SCHED_IDLE would not count against LS pods.
//   - Every CFS quota write refills the group's runtime and unthrottles it; a
//     limit rewritten every period lets batch run up to twice its budget. Limits
//     change only past a deadband, and raise at most once per CFS period.
//   - One period's usage of a throttled group is 0 or a burst; the budget split
//     uses an exponential average over about a second.
//   - Pod cgroups come and go under the agent: a vanished one is skipped and
//     looked for again, never fatal. A pod the agent cannot attribute (its
//     cgroup unreadable, or not yet listed) counts as LS.
//   - A (re)starting agent bounds the tier at the policy minimum before it has
//     measured anything, and a graceful stop leaves batch bounded: the shutdown
//     plan writes every limit that differs from its share (no deadband, no
//     pacing), so the tier and the in-place pods together hold at most the
//     shutdown budget. Quotas live in the kernel, so a crashed agent leaves the
//     last ones in force.
//   - cgroup v1 refuses a pod quota below its containers' own CFS limits: a cut
//     there lowers the containers first (their limits come back as the pod is
//     raised, and when it leaves batch); a cut the kernel still clamps is not
//     asked for again while unchanged (each attempt would count as a write).
//   - A freeze never outlives the agent: it thaws on shutdown, for a pod being
//     deleted and for a pod that leaves batch (each freeze or thaw bounded to
//     50 ms), and at start (ThawAtStart), before anything that can fail: a
//     killed run may have left the tier, in-place pods and their children
//     frozen, and any frozen cgroup below kubepods is the agent's.
//   - A restarted agent rediscovers in-place batch pods from the cgroup tree
//     (cpu.idle=1, which kubelet never sets) and bounds them before the pod
//     source syncs; a pod that leaves batch gets kubelet's values back.
//   - The reclaimer is fed only after the first second: the first samples were
//     seen to count batch as system, and its averages would carry that.
//   - The GPU glue (koordlet/gpubridge: the GPU loop, MPS, gpu.timeslice, the shim's
//     installation and planner, the self-set Events) is its own package: it builds the
//     GPU loop and sees the pod table only through what the control loop passes it (the
//     batch pods' cgroups at start, the snapshot gpuPods publishes on slow periods after
//     a change).
//   - The plan's conditions and events say the freezer and quota the plan leaves in
//     force; a freeze or limit write the kernel refuses shows in them until the next
//     plan writes it again.
//   - A reloaded configuration is handed over, never shared: ApplyConfig stores it,
//     Run's goroutine takes it between two periods and copies the live fields into
//     a.cfg one by one (Healthy reads a.cfg.Period from other goroutines). A new
//     policy or guard setting builds a new Budgeter or Guard that continues from the
//     budget in force (continueBudgeter, continueGuard): a fresh one would apply its
//     target at once, a raise the old one paced or, with a harm signal, a cut no harm
//     asked for. A mounted ConfigMap changes by a symlink swap: the file is read by
//     content, never watched.
//   - The control loop is single-goroutine; /status reads an atomically
//     swapped snapshot, node metrics, the Node's batch resources and evictions
//     are written from their own goroutines.
//   - A harm wake-up (react) cuts with the last period's utilisation budget and never
//     samples: a utilisation sample over a few milliseconds would be noise. A signal
//     source that cannot read makes the period blind: utilisation decides for it.
//   - With GPUs (Deps.GPU) the GPU loop (koordlet/gpu, every gpu.loopPeriod)
//     is a goroutine of its own: it sees pods only through the snapshot the
//     control loop hands it once a second, and stops (thawing what its duty
//     cycle froze) before the control loop's shutdown.
package koordlet
