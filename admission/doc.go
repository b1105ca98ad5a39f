// Package admission is Understory's pod admission webhook: it turns pods that opt in
// as batch (annotation understory.io/qos-class: batch, or a profile selecting the
// pod's namespace or labels) into consumers of the node's batch resources, moving
// every container's and init container's cpu and memory requests and limits to
// understory.io/batch-cpu (millicores) and understory.io/batch-memory (bytes), and
// recording the originals in understory.io/original-resources. Kubelet then sees a
// BestEffort pod and kube-scheduler counts it against the node's batch allocatable.
// Validation lives in two ValidatingAdmissionPolicies (manifests/admission):
// understory-pod-rules, whose Go form is ValidatePod, and
// understory-gpu-devices-binding, whose Go form is ValidateBinding; /validate serves
// both only for API servers without that API. The rules: the QoS class keys the node
// agent honours (understory.io/qos-class, Koordinator's koordinator.sh/qosClass label
// and annotation; package qos) are immutable after creation, and a BestEffort pod the
// agent would classify LS through any of them is refused outside namespaces labelled
// understory.io/allow-ls-besteffort=true; only the scheduler extender's identity
// (Rules.GPUDevicesWriters) may set understory.io/gpu-devices on a pod or in a Binding,
// or change it, and likewise understory.io/gang-state and understory.io/extender-catch-up
// (Rules.ExtenderAnnotationWriters); understory.io/original-resources cannot change
// after creation; gang minimums are bounded. contract.TrustedKeys lists every key a
// component writes and later trusts. In second-scheduler mode a GPU-share pod must name
// the second scheduler (Rules.GPUShareScheduler). See docs/admission.md.
//
// Second-scheduler mode (WithSchedulerName; cmd/admission -scheduler-name, which
// manifests/components/second-scheduler sets to understory-scheduler; empty: off):
// for managed control planes whose kube-scheduler cannot call the extender, the
// mutator also sets spec.schedulerName on batch pods and on pods asking for a resource
// the extender manages (nvidia.com/gpu, understory.io/gpu-milli, the batch resources),
// so that the second kube-scheduler, whose profile calls the extender, places them.
// LS and BE pods asking for none of those stay with default-scheduler. See
// docs/second-scheduler.md.
//
// Traps:
//   - "Claims LS" is the agent's precedence, not "any key says LS": the first class key
//     with a valid value decides (an invalid one is skipped, as qos.Classify skips it),
//     so understory.io/qos-class: batch with a Koordinator LS label is batch, and an
//     invalid Koordinator label does not hide an LS annotation. classKeys mirrors
//     qos.Classify's order and a test and a fuzz target hold it there; the CEL variable
//     lsClaim mirrors it again, and the e2e test holds the two forms equal.
//   - The extender writes understory.io/gpu-devices in a Binding (pods/binding CREATE),
//     which kube-apiserver applies to the pod without a pod UPDATE admission: the
//     pod rule sees only direct pod writes, hence the separate Binding policy (which
//     also matches the legacy "bindings" resource, applied the same way). That policy
//     evaluates only Bindings carrying the key (matchConditions), so binders that copy
//     a pod's other annotations into their Binding are unaffected.
//   - The writer is a user name (system:serviceaccount:NS:NAME), named literally in
//     both policies and in DefaultGPUDevicesWriter: renaming the extender's service
//     account or its namespace needs all three changed.
//   - Extended resources cannot be overcommitted: the API server requires request ==
//     limit and an integer. The batch value is the limit if set, else the request,
//     and becomes both (a container with only a request is capped at it).
//   - The Priority admission plugin runs before mutating webhooks and again after a
//     webhook changed the pod; setting priorityClassName alone gets the pod rejected
//     ("the integer value of priority must not be provided"). The mutator sets
//     spec.priority and preemptionPolicy from the PriorityClass too, and treats the
//     globalDefault class (which Priority writes into priorityClassName) as "none".
//   - Mutation fails open (failurePolicy Ignore): a pod may arrive unmutated. The node
//     agent classifies by the annotation, so it is still batch, but kube-scheduler
//     counted it against cpu/memory. Problems are counted, never hidden.
//   - Reinvocation (reinvocationPolicy IfNeeded): Mutate is idempotent on its own
//     output, and moves cpu/memory a later webhook (a sidecar injector) added.
//   - Pod-level resources (spec.resources) cannot hold extended resources: such a
//     batch pod is denied with a message naming the field.
//   - AdmissionReview objects come from a possibly newer API server: pods are decoded
//     leniently, and patches touch only the maps the mutator owns.
//   - Second-scheduler mode: a pod whose spec.schedulerName is neither empty nor
//     default-scheduler is left alone: it chose its scheduler (Volcano, KAI, ...). An LS pod asking for a GPU is a GPU pod: it
//     goes to the second scheduler, since only the extender assigns devices. GPU pods
//     reach the webhook only through the MutatingWebhookConfiguration entry the
//     component widens; a GPU pod created while the webhook is down (fail open)
//     stays with default-scheduler, which places it without the extender.
//   - CEL regexes with (?i) fold Unicode (ſ matches s); the policy spells case
//     classes out, like qos.ParseClass.
package admission
