// Package kubectlunderstory is the kubectl plugin `kubectl understory` (its main is
// cmd/kubectl-understory): day-2 answers read from the API server with the user's
// credentials.
//
//   - Node: the node agent's budget, each of its terms, what the agent publishes for
//     the scheduler next to what the Node carries, and every batch pod's state. It
//     reads the agent's /status through the API server's pod proxy
//     (GET /api/v1/namespaces/understory-system/pods/<agent>:9316/proxy/status): the
//     agent serves /status as plain HTTP on its metrics port, which the API server
//     reaches on the pod's IP; no client certificate is involved.
//   - Why: why a batch or GPU pod is Pending (the scheduler's FailedScheduling events,
//     which carry the extender's reasons; its gang's PodGroup and members; every
//     node's published batch resources against the pod's request) or slowed (the
//     condition understory.io/BatchSlowed the agent sets, its BatchThrottled and
//     BatchFrozen events, and the agent's own view of the pod).
//
// Output is a table for people by default, JSON (Format JSON) for scripts: the agent's
// /status as it came for Node, the collected facts for Why.
//
// Traps:
//   - The pod proxy needs `get` on pods/proxy in the agent's namespace; a refusal says
//     so (ErrForbidden), as does any other verb the user lacks.
//   - The API server connects to the agent pod from wherever it runs: a NetworkPolicy
//     that admits only Prometheus to port 9316 (manifests/base/networkpolicy.yaml)
//     refuses it under a CNI that enforces policies, unless the control plane's
//     addresses are allowed; the error then is the proxy's "dial" or 503, wrapped in
//     ErrAgentUnreachable.
//   - Status decodes only the /status fields it shows; a test keeps their JSON names
//     equal to the agent's (koordlet.Status).
//   - A pod's state in Node comes from the agent's escalation (frozen: all of batch)
//     and from each pod's BatchSlowed condition; the agent's /status has no per-pod
//     throttling share.
package kubectlunderstory
