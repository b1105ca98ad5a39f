// Package koordlet is Understory's node agent: it wires the pod sources
// (podsource), the node collectors (collect), the policy (qos) and the cgroup
// layer (cgroups) into one control loop, and serves /metrics, /healthz and
// /status.
//
// Every period (100 ms by default) the agent reads the node's CPU time and the
// cumulative usage of every pod cgroup, of kubepods and of its batch tier;
// computes the batch budget (qos.Budgeter); and enforces it: one CFS quota on
// the tier for the batch pods below it (placed there by the agent's NRI
// plugin), and per-pod quotas, SCHED_IDLE and the minimum weight for batch
// pods left in kubelet's cgroups ("in-place"). The shares of the budget are
// split by max-min fairness on smoothed demand and never add up to more than
// the budget (cuts are written before raises); a batch pod's own
// understory.io/batch-cpu limit caps its share.
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
// understory.io/batch-memory limit; computes the batch resources (qos.Reclaimer)
// and hands them to the Node writer (koordlet/nodestatus, its own goroutine);
// and runs the graded actions (qos.Escalator): freeze batch when LS leaves it
// nothing, evict through the evictor (koordlet/evict, its own goroutine, so
// PodDisruptionBudgets hold and the loop never waits for the API server).
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
//     measured anything, and a graceful stop leaves batch bounded; quotas live
//     in the kernel, so a crashed agent leaves the last ones in force.
//   - A freeze never outlives the agent: it thaws on shutdown, at start (a
//     crashed run may have left batch frozen), for a pod being deleted and for
//     a pod that leaves batch. Each freeze or thaw is bounded to 50 ms.
//   - A restarted agent rediscovers in-place batch pods from the cgroup tree
//     (cpu.idle=1, which kubelet never sets) and bounds them before the pod
//     source syncs; a pod that leaves batch gets kubelet's values back.
//   - The reclaimer is fed only after the first second: the first samples were
//     seen to count batch as system, and its averages would carry that.
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
