// Package gpubridge is the node agent's side of the GPU loop (koordlet/gpu, its own
// goroutine). Bridge builds the loop on the node's GPU source (Open) with its parts:
// the duty cycle's freezer and its pin, the MPS control daemon and partitions
// (gpu.mps), the per-context time-slice shim's installation and planner
// (gpu.timeslice), cuda-checkpoint suspend (gpu.suspend). It runs them (Start) and
// serves what the loop knows: the inventory and the MPS and time-slice planners to the
// NRI plugin, the GPU section of node metrics (with kubelet's whole-GPU allocation and
// understory.io/gpu-milli for the Node writer), and the loop's /status. The GPU loop's
// lever changes and self-set slices become Warning events on the batch pods.
//
// The bridge sees the agent's pod table only through the snapshot the control loop
// hands it (Options.Pods) and the batch pods' cgroups at Open.
//
// Traps:
//   - A crashed run may have left batch pods frozen by the duty cycle: Open thaws every
//     batch cgroup it can find (the tier's children, the cgroups it is given, the pin)
//     before the loop decides again.
//   - On cgroup v1 and hybrid nodes a freezer turns a kernel static key on and off at
//     the first freeze and the last thaw; the pin (an empty cgroup kept frozen) keeps it
//     on, or the duty cycle costs more CPU. cgroup v2 needs none.
//   - A shim that cannot be installed is logged and the feature runs without it: no
//     container gets the shim and every GPU keeps the freeze.
package gpubridge
