// Package realnode checks, on a REAL single-node Kubernetes started on this machine
// (kubelet v1.34 + containerd v2.1 + runc, cgroupfs driver, cgroup v1/hybrid; see
// scripts/realnode/), what the node agent assumes about kubelet and the runtime:
//
//  1. kubelet's pod cgroup names (kubepods/pod<uid>, kubepods/burstable/pod<uid>,
//     kubepods/besteffort/pod<uid>), as cgroups.PodPath computes them;
//  2. the agent's tier (kubepods/understory-batch, idle) survives kubelet's orphan
//     cgroup cleanup and kubelet restarts, and kubelet restarts with it and with idle
//     in-place batch pods (Koordinator issue 2732 is reproduced as the contrast);
//  3. kubelet does not revert the in-place settings of a batch pod's cgroup;
//  4. NRI: containerd honours the agent plugin's cgroups path, the pod works, deleting
//     it cleans up, other pods are untouched;
//  5. the agent in Kubernetes mode: informer, node-metrics annotation, Warning event
//     for a bad QoS class, /status.
//
// Everything is gated by UNDERSTORY_REALNODE=1 (the test otherwise skips with the
// command to run): it needs root, owns the machine's kubepods cgroups while it runs
// (one node per machine), and takes a few minutes. `make test-realnode` runs it.
//
// Traps:
//   - The node is started and torn down by the shell scripts (up.sh, down.sh); up.sh
//     gets this test's PID and its watchdog tears the node down if the test process
//     dies without running its cleanups (Ctrl-C, -timeout, SIGKILL).
//   - Unix socket paths limit the run dir to a short path under /tmp.
//   - cgroup v1 cpu.shares reads 3 while cpu.idle=1, and writes to it fail with EINVAL
//     (a failed write raises no inotify event: kubelet's failed rewrites are only in
//     its log).
//   - Writes are observed with inotify IN_MODIFY on the cgroup files, which fires for
//     every successful write, also of an unchanged value.
package realnode
