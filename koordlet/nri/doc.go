// Package nri is the node agent's NRI plugin (nri.enabled): at each container's
// creation the runtime (containerd ≥ 1.7 or CRI-O with NRI on) asks it for adjustments,
// and it
//   - moves the containers of batch pods below the agent's tier, so that the tier's one
//     quota, weight and SCHED_IDLE bound all batch work at once; the pod is classified
//     exactly as the agent's loop classifies it (qos.Classify on the pod from the
//     agent's pod source, waiting up to DefaultPodWait for a pod not listed yet);
//   - gives a shared-GPU container exactly the devices of its pod's
//     understory.io/gpu-devices annotation, or refuses it with the reason;
//   - makes GPU containers MPS clients of the agent's partitions, and points every
//     other container away from the MPS daemons;
//   - pins NVIDIA_VISIBLE_DEVICES of every container to what it was given;
//   - injects the time-slice shim into shared-GPU containers when gpu.timeslice is on.
//
// Plugin's comment says each case in full.
//
// Traps:
//   - NRI gives a plugin 2 s per request and drops a plugin that exceeds it: the wait
//     for an unlisted pod is bounded well below that, and a pod still unknown gets no
//     LS privilege (no MPS as LS, not moved: the loop bounds it in place).
//   - The sandbox carries labels, annotations and the cgroup parent, not the
//     containers' requests: without a pod source the pod is classified from those only.
//   - The runtime's cgroups path names the container under kubelet's driver
//     (cgroupfs paths, or systemd "slice:prefix:id"); the rewrite keeps the runtime's
//     prefix and ID and changes only the pod's cgroup (cgroups.ContainerCgroupsPath).
package nri
