// Package realnode runs Understory on a REAL single-node Kubernetes started on this
// machine (kubelet v1.37 + containerd v2.1 + runc + kube-proxy, a bridge pod network,
// cgroupfs driver, cgroup v1/hybrid; see scripts/realnode/ and docs/real-node.md).
//
// TestInstall installs Understory as a user does and checks it end to end:
//
//  1. `helm install understory charts/understory -n understory-system
//     --create-namespace -f charts/understory/ci/realnode-values.yaml` (the images
//     `make images` built and the second scheduler's kube-scheduler image, imported
//     into containerd; helm from scripts/helm.sh) installs everything in one pass and
//     rolls out, the extender as a leader (Ready) and a standby (not Ready); every
//     Kustomization under manifests/ passes `kubectl apply --dry-run=server`;
//  2. the agent runs as the DaemonSet's pod with exactly the capabilities its manifest
//     gives and its own PID namespace, classifies the install's pods, creates the tier
//     and publishes understory.io/batch-cpu and batch-memory on its Node;
//  3. the second scheduler (components/second-scheduler, the managed-cluster mode)
//     holds its own Lease in understory-system and reaches the extender at its
//     Service's fixed ClusterIP (a host alias: the node has no cluster DNS) over mutual
//     TLS with the client certificate Helm issued; the node's own kube-scheduler is
//     left as it was, without the extender;
//     3b. Debian's Prometheus starts scraping the agent's pod (HTTP), the extender's
//     two (HTTPS, the install's CA, no client certificate) and the second scheduler's
//     two (HTTPS, with a service account's token bound to the shipped ClusterRole
//     understory-scheduler-metrics-reader) for the rest of the run; after each stage
//     the targets follow the current pods (the agent's: stage 7);
//  4. an LS Deployment and a batch Job written as users write them: the LS pods stay as
//     written and are placed by default-scheduler; the batch pod is mutated by the
//     webhook (schedulerName understory-scheduler), placed by the second scheduler,
//     filtered and bound by the extender (its metrics), runs below the tier (NRI), and
//     the agent classifies both;
//     4b. `kubectl understory node NAME` (bin/kubectl-understory on PATH) shows the real
//     node's budget term by term, what the Node publishes and the batch pod; `why`
//     shows the batch pod running in the tier;
//  5. with LS burning both CPUs the tier is cut (or frozen) within seconds, batch uses
//     no more than the tier's quota, and the tier follows the budget again afterwards;
//     5b. LS loaded again: the batch pod's condition understory.io/BatchSlowed turns
//     True (Throttled or Frozen, with the numbers) and `kubectl understory why` shows it;
//  6. kubelet restarts cleanly after the agent ran: every pod keeps its container;
//  7. the agent's pod is deleted: batch stays bounded until the new pod runs, and the
//     new agent puts back a quota the test moved meanwhile within one control period;
//  8. kube-apiserver stopped for 30 s: the agent keeps enforcing (LS load started during
//     the outage is cut), the extender refuses binds once staler than
//     -max-cache-staleness (/status and a refused /bind), and both recover: a leader
//     holds the extender's Lease again and a new batch pod is placed through it; only
//     the two leaders (extender, second scheduler) restart, once, having lost their
//     Leases;
//  9. every panel and variable of the shipped Grafana dashboards shows data over the
//     run, but for those that need a GPU, a gang or Kueue (allInstallExemptions, with
//     reasons) and, when the agent ran with an LS harm signal, the cut-reaction panels.
//
// TestUpgrade installs the previous release's chart (testdata/upgrade) with that
// release's image tags, runs an LS Deployment, a batch Job and a Koordinator-dialect
// gang, and `helm upgrade`s to charts/understory with this build's images and the
// Koordinator migration on: every component's pod is replaced, no workload pod is lost
// or restarted, the new extender leader's ledger agrees with the API server and holds
// the gang, the certificates are kept; then Koordinator's colocation example pod is
// admitted as batch, placed by the second scheduler and the extender, and runs in the
// tier (upgrade_test.go).
//
// TestInstallFromRegistry installs from `make release` and `make push` to a registry
// the test serves: containerd pulls every image (registry_test.go).
//
// TestRealNode checks what the node agent (the host binary, not the DaemonSet)
// assumes about kubelet and the runtime:
//
//  1. kubelet's pod cgroup names (kubepods/pod<uid>, kubepods/burstable/pod<uid>,
//     kubepods/besteffort/pod<uid>), as cgroups.Naming.PodPath computes them;
//  2. the agent's tier (kubepods/understory-batch, idle) survives kubelet's orphan
//     cgroup cleanup and kubelet restarts, and kubelet restarts with it and with idle
//     in-place batch pods (Koordinator issue 2732 is reproduced as the contrast);
//  3. kubelet does not revert the in-place settings of a batch pod's cgroup;
//  4. NRI: containerd honours the agent plugin's cgroups path, the pod works, deleting
//     it cleans up, other pods are untouched;
//  5. the agent in Kubernetes mode: informer, node-metrics annotation, Warning event
//     for a bad QoS class, /status.
//
// Both need root and own the machine's kubepods cgroups, its NRI socket, the bridge
// and kube-proxy's iptables chains while they run (one node per machine: up.sh waits
// for another). As another user, or with -short, they skip and say why; under CI=true
// they fail instead. `make e2e` runs them (`make test` too, after the rest).
//
// Traps:
//   - The node is started and torn down by the shell scripts (up.sh, down.sh); up.sh
//     gets the test's PID and its watchdog tears the node down if the test process
//     dies without running its cleanups (Ctrl-C, -timeout, SIGKILL).
//   - Unix socket paths limit the run dir to a short path under /tmp.
//   - cgroup v1 cpu.shares reads 3 while cpu.idle=1, and writes to it fail with EINVAL
//     (a failed write raises no inotify event: kubelet's failed rewrites are only in
//     its log).
//   - Writes are observed with inotify IN_MODIFY on the cgroup files, which fires for
//     every successful write, also of an unchanged value.
//   - The machine may be shared: the bounds on batch are upper bounds (a busy machine
//     only lowers what the agent gives batch), and kubelet's cadvisor also reports
//     other trees' kubepods/understory-batch (a demo's), which tierLines filters out.
//   - kubelet admits every pod again when it restarts, against the Node's allocatable
//     of that moment: a batch pod whose batch-cpu the agent no longer publishes is
//     rejected (stage 6 says so; the Job then makes a new pod for the later stages).
package realnode
