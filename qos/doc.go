// Package qos is Understory's pure policy layer: it decides, from values the
// caller passes in, which QoS class a pod belongs to, how much CPU and memory
// batch may use and everything else the agent does in a control period. It does
// no IO and reads no clock; one call of Controller.Plan is one control period,
// whatever its length.
//
// Its decisions:
//
//   - Classify maps a pod to LS, BE or batch from the annotation
//     understory.io/qos-class, then Koordinator's koordinator.sh/qosClass
//     (LSE, LSR, LS and SYSTEM -> LS; BE -> batch), then a request of the
//     batch resources (understory.io/batch-cpu or batch-memory -> batch), then
//     the Kubernetes QoS class (Guaranteed and Burstable -> LS; BestEffort ->
//     BE). Koordinator
//     documents SYSTEM as the class of system daemons; Understory protects
//     them like LS.
//   - Budgeter computes the batch CPU budget
//     clamp(nodeCPUs*threshold - LS usage - system usage, min, max), cutting at
//     once and growing back by at most restoreStepPercent of the node per
//     period. Policy is its YAML-configurable part.
//   - SplitBudget divides that budget into per-pod CFS shares (max-min fair
//     on demand) for the in-place mode, where batch pods stay in kubelet's pod
//     cgroups.
//   - Controller.Plan (plan.go, period.go) is the agent's decide step for one
//     period, and every decision of it is in the Plan it returns: it attributes
//     the sampled CPU to LS, BE, batch and system (Attribute), calls the Budgeter
//     and the Guard, and plans every CPU and memory limit write with its reason
//     (WritePolicy.PlanCPU, PlanMemory, TierMemoryLimit): the write deadband,
//     raises at most once per CFS period, the 1 ms quota floor, cuts before
//     raises, and the graceful stop's exact writes (Final); then the batch
//     resources (Reclaimer, on the periods the sample allows), the graded action
//     (Escalator) with its freezer writes and eviction candidates, and what the
//     batch pods are told: Warning events (a freeze, hard throttling) and, every
//     statistics interval, the pod condition (BatchConditions, from the freezer
//     and limits the plan leaves). The caller reads before and writes after; the
//     plan keeps no state but its parts' (Budgeter, Guard, Escalator, Reclaimer,
//     BatchConditions). The tests render plans for people (Plan.String,
//     planstring_test.go).
//   - NextBatchCondition (batchcondition.go) decides the pod condition
//     understory.io/BatchSlowed the agent writes on a batch pod (Throttled,
//     Frozen, Suspended, Evicted, or False with Running) and when: a harder
//     state at once, a milder one or new numbers only after a minimum interval.
//
// Traps:
//
//   - A CPULimit whose last cut the kernel clamped (Clamped) is not cut to the
//     same value again: on cgroup v1 the retry writes nothing and still counts.
//   - WantsMore's absolute margin (0.02 CPU) is capped at half the quota: an idle
//     consumer at a quota below 0.02 would otherwise count as hungry and the
//     split would flip between two consumers every period.
//   - An invalid class annotation or label never moves a pod: Classify skips
//     it, returns what the other sources say AND an error wrapping
//     ErrInvalidClass. The class is usable even when the error is not nil;
//     log the error and record a Warning event, do not drop the pod.
//   - Koordinator sets koordinator.sh/qosClass as a LABEL (Koordinator itself
//     matches it case-sensitively and ignores the annotation); Classify reads
//     the label first and the annotation of that name second, both ASCII
//     case-insensitive. Case folding is ASCII only: strings.EqualFold would
//     accept Unicode look-alikes such as "ſ" (U+017F) for "s".
//   - Error messages quote at most 64 bytes of a bad value (annotation values
//     may be 256 KiB and reach Events and logs); %q escapes control bytes.
//   - KubeQOSClass trusts pod.Status.QOSClass (immutable once the API server
//     set it). ComputeKubeQOSClass re-implements kubelet's rules without
//     importing k8s.io/kubernetes: only cpu and memory count, pod-level
//     resources (spec.resources), when set, override the containers, init
//     containers count, ephemeral containers do not. It does not apply API
//     defaulting: a container with limits but no requests, as sent to the API
//     server, is Burstable here but may be Guaranteed once the server has
//     copied the limits into the requests.
//   - The first Budgeter.Next (and the first after Reset) applies Target, not
//     Max: a restarted agent must not give batch the whole node before it has
//     seen LS usage. Keep one Budgeter for the life of the agent; building a
//     new one per period disables the restore limit.
//   - Budgeter fails safe, never generous: NaN, infinite or negative usage is
//     taken as the whole node, an unusable node size holds batch at
//     minBatchCPU, and every Budget field stays finite (JSON-encodable).
//     Budget.Sanitized says what was replaced.
//   - Cuts are unlimited, growth is limited: per-period noise in LS usage
//     makes the applied budget ratchet down fast and up slowly. That is the
//     intent; tune restoreStepPercent, not the cut path.
//   - SplitBudget guarantees sum <= budget in float64, summed in index order.
//     The cgroup layer must keep that when converting to integer CFS quota
//     (floor the microseconds, never round up). The kernel's minimum quota (1 ms
//     per period) is the plan's floor: a share below it is written as 1 ms, so
//     the real sum can exceed a tiny budget by up to 1 ms per group and period.
//     Holding batch below that is the escalation's job (freeze), not the split's.
//   - A pod with no usage sample must be marked NoHistory (or given a NaN
//     Usage); with Usage 0 it is taken as idle and gets only minPerPod until
//     it is seen throttled.
//   - Policy fields are matched by encoding/json, which also accepts keys in
//     another case ("Threshold"). When Policy is a field of a bigger config,
//     pre-fill it with DefaultPolicy() before unmarshalling, or absent fields
//     are 0 and Validate fails (a zero Policy is invalid on purpose).
//   - Budgeter is not safe for concurrent use; the agent's single control loop
//     owns it.
//
// Reclaimer (reclaim.go, window.go) computes what the node agent publishes on
// its Node as understory.io/batch-cpu and understory.io/batch-memory: what
// batch pods can be scheduled against. Per resource, every control period:
//
//	lsTerm    = max(p(lsPercentile) of per-second LS peaks over lsWindow,
//	                moving average of LS (time constant smoothing))
//	            and, under maxUsageRequest, max with the LS requests
//	computed  = clamp(capacity*threshold - lsTerm - avg BE - avg system, 0, capacity)
//	published = computed at once when it is more than the deadband lower;
//	            raised by at most riseStepPercentPerMinute of capacity per
//	            minute of pending rise, in steps of at least the deadband;
//	            rewritten every refreshInterval.
//
// Reclaimer traps:
//
//   - Its purpose is stability for the scheduler, not protection of LS: the
//     Budgeter throttles batch within one period; the published value lags an
//     LS burst by the smoothing time (seconds) and may exceed what is free
//     meanwhile. Do not shorten smoothing to chase that: one period's burst
//     would then move batch-cpu.
//   - A rise of LS cuts batch as soon as the moving average moves by more
//     than the deadband; a fall of LS raises batch only when the rise has
//     left the window (lsWindow, 5 min by default) and then at the rise limit.
//     A drop to 0 needs the moving average or the window percentile to fill
//     the node: 16 s at full node in 5 min for p95, never one sample.
//   - Write says when to patch the Node. The Reclaimer assumes the write
//     happened: if the patch fails, retry Published, or call Reset to start
//     over (the next call writes "initial").
//   - Bad readings are taken as the worst reading (the whole capacity) and go
//     through the window and the average like any sample: one NaN cannot zero
//     batch, a broken collector does within a few smoothing time constants.
//     An unusable capacity gives 0 at once. Sanitized says what was replaced.
//   - The first call publishes Computed from one sample, with an empty window:
//     a restarted agent must not wait 5 minutes to publish. Later rises are
//     damped from there.
//   - Time is the caller's. Going back resets the window and the averages
//     and restarts the refresh clock; a gap longer than lsWindow resets them
//     too; a forward gap earns at most one minute of rise. None of these
//     writes more than once.
//   - Keep one Reclaimer for the life of the agent and call it with both
//     resources every period; it allocates nothing per call once the window
//     is built (the percentile is sorted once per second, over <= 300 steps).
//   - Publish the values with Reclaimed.BatchCPUMilli and BatchMemoryBytes,
//     which round down: rounding up would promise more than computed.
//
// Escalator (escalate.go) grades what the agent does to batch pods, one
// Decide per control period from the period's Budget, the node's memory and
// whether batch pods exist: throttle (the budget alone); freeze once batch has
// been held below its floor (raw < min) for freezeAfter, thawed after raw has
// stayed >= min + thawMarginCPU for thawAfter; evict only as the last step,
// when node memory crosses memoryEvictThreshold (down to memoryEvictTarget)
// or batch has been starved (below the floor or frozen) for starvationTimeout,
// at most one decision per evictionInterval. OrderEvictionCandidates keeps
// only batch pods (never LS or BE) and orders them: lowest priority, largest
// memory, most recently started. Escalator traps:
//
//   - A clock that goes back, or a call more than EscalationMaxGapPeriods
//     periods (at least MinEscalationGap) after the last, restarts every timer
//     (freeze, thaw, starvation, eviction interval): a stalled agent or a
//     clock step never fires the actions it would have taken meanwhile. An
//     agent so starved itself that every period is that late never freezes
//     or evicts for CPU; memory eviction still works.
//   - A Budget with Sanitized set is no evidence: the starvation timers
//     restart and frozen batch stays frozen (no freeze, thaw or eviction on a
//     broken reader). Unknown memory figures keep the pressure state.
//   - After an eviction, only a memory reading taken later (MemoryAt) can
//     trigger the next: a stale one still counts the evicted pod's memory.
//   - Decide says what to do; the agent must still thaw a pod it evicts
//     (frozen tasks cannot handle SIGTERM) and leave out terminating pods.
//
// Guard (harm.go) is the batch budget when the agent has an LS harm signal (eBPF
// run-queue delay, PSI): harm cuts at once (to the utilisation target, or by cutPercent
// of the budget when that is higher), utilisation alone never cuts, and the budget
// restores by restorePercentPerSecond of the node after restoreHold without harm. A
// restarted agent's first budget is at most the tier limit it found (StartFrom), held
// for restoreHold. Its traps are on the type. HardThrottled (throttle.go) is when a batch
// group counts as throttled hard (the agent's BatchThrottled event).
//
// GPUThrottle (gputhrottle.go) decides, per GPU, the lever (an MPS partition or the
// freeze) and whether the batch pods using the GPU are frozen solid so LS gets the device:
// at once while LS needs more than its partition protects (without MPS: an LS process
// arrived, or LS utilisation is high), thawed once LS has been idle for `hold`. Its rules
// and traps are on the type. gpumps.go chooses the MPS caps (ChooseGPUMPSCaps: batch at
// most 25 % of the SMs at client priority 1, LS the rest, from LS's demand peak,
// GPUDemandPeak, and the pods' gpu-milli requests), with the measurements behind the
// defaults, and batch clients' device memory limits (ChooseGPUMPSMemLimit: their
// request's share of the GPU's memory, never what LS's requests hold; LS none).
// gpumpscheck.go confirms from outside a batch client that it runs with what it was
// handed (CheckGPUMPSClients).
//
// ChooseGPUTimeslice (gputimeslice.go) picks a GPU's lever among per-context time slices
// (timeslice), the MPS partition (kept on MPS GPUs: the clients share one context) and
// the freeze (MIG, unknown GPUs, and the fallback), and the slices the agent asks: LS
// long (10 ms), batch short where LS is on the GPU (100–240 µs from batch's part of what
// LS's requests and demand leave, so LS's worst wait, batch's slice plus a switch, stays
// within lsMaxWait), the driver's default without LS. A batch context counts only when
// its slice is confirmed from outside the tenant (an observer of the driver's ioctls and
// the shim's read-back alike); any batch context unconfirmed, or seen setting itself a
// longer slice, sends the GPU to the freeze, and so does LS still suffering (escalated).
// Each context's verdict is in the decision.
package qos
