// Package qos is Understory's pure policy layer: it decides, from values the
// caller passes in, which QoS class a pod belongs to and how much CPU the
// batch tier may use. It does no IO and reads no clock; one call of
// Budgeter.Next is one control period, whatever its length.
//
// It holds three decisions:
//
//   - Classify maps a pod to LS, BE or batch from the annotation
//     understory.io/qos-class, then Koordinator's koordinator.sh/qosClass
//     (LSE, LSR, LS and SYSTEM -> LS; BE -> batch), then the Kubernetes QoS
//     class (Guaranteed and Burstable -> LS; BestEffort -> BE). Koordinator
//     documents SYSTEM as the class of system daemons; Understory protects
//     them like LS.
//   - Budgeter computes the batch CPU budget
//     clamp(nodeCPUs*threshold - LS usage - system usage, min, max), cutting at
//     once and growing back by at most restoreStepPercent of the node per
//     period. Policy is its YAML-configurable part (LoadPolicy).
//   - SplitBudget divides that budget into per-pod CFS shares (max-min fair
//     on demand) for the in-place mode, where batch pods stay in kubelet's pod
//     cgroups.
//
// Traps:
//
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
//     (floor the microseconds, never round up), and the kernel's minimum quota
//     (1 ms per period) can push the real sum over the budget when a share is
//     tiny or 0: the agent must handle shares below that minimum (for example
//     by freezing the pod) rather than raising them.
//   - A pod with no usage sample must be marked NoHistory (or given a NaN
//     Usage); with Usage 0 it is taken as idle and gets only minPerPod until
//     it is seen throttled.
//   - Policy fields are matched by encoding/json, which also accepts keys in
//     another case ("Threshold"). When Policy is a field of a bigger config,
//     pre-fill it with DefaultPolicy() before unmarshalling, or absent fields
//     are 0 and Validate fails (a zero Policy is invalid on purpose).
//   - Budgeter is not safe for concurrent use; the agent's single control loop
//     owns it.
package qos
