// Package admission is Understory's pod admission webhook: it turns pods that opt in
// as batch (annotation understory.io/qos-class: batch, or a profile selecting the
// pod's namespace or labels) into consumers of the node's batch resources, moving
// every container's and init container's cpu and memory requests and limits to
// understory.io/batch-cpu (millicores) and understory.io/batch-memory (bytes), and
// recording the originals in understory.io/original-resources. Kubelet then sees a
// BestEffort pod and kube-scheduler counts it against the node's batch allocatable.
// Validation lives in a ValidatingAdmissionPolicy (manifests/admission); ValidatePod
// is its Go form, served at /validate only for API servers without that API.
// See docs/admission.md.
//
// Traps:
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
//   - CEL regexes with (?i) fold Unicode (ſ matches s); the policy spells case
//     classes out, like qos.ParseClass.
package admission
