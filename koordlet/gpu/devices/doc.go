// Package devices decides which GPUs a container gets when the agent's NRI plugin sees
// it being created: a container that requests shared GPU (understory.io/gpu-milli)
// gets exactly the devices the scheduler extender named in the pod's
// understory.io/gpu-devices annotation, as CDI device names (mode cdi) or as the
// NVIDIA runtime's NVIDIA_VISIBLE_DEVICES variable (mode env). Anything that cannot
// be decided safely is refused with a sentinel error, so the runtime fails the
// container with a reason instead of starting it with no GPU or every GPU.
//
// The package is pure: it takes the pod, the container name and the node's inventory
// (index → UUID, from NVML) and returns the decision. It never imports the extender:
// the annotation is read with package contract's codec, the one the extender writes
// it with.
//
// MPS clients (mps.go, mpsclient.go): DecideMPS asks an MPSPlanner (the GPU manager's
// partitions) once per GPU a container gets (the extender's devices, or the device
// plugin's whole GPUs as WholeGPUs names them from NVIDIA_VISIBLE_DEVICES and CDI
// devices) and returns the CUDA_MPS_* variables to set, overriding the pod's (a batch
// client's device memory limit on every CUDA ordinal of its GPUs), and the mounts (pipe
// directory, /dev/shm). A batch container whose planning fails or is
// answered unsafely (ErrMPSPlanner, ErrMPSUnsafe) is refused; a batch container that is
// no client is pointed at NoMPSPipeDirectory.
//
// The time-slice shim (timeslice.go): DecideTimeslice asks a TimeslicePlanner (the GPU
// manager's Timeslices) for a shared-GPU container that is no MPS client and returns the
// environment (LD_PRELOAD with the shim first, UNDERSTORY_TSG_TIMESLICE_US,
// UNDERSTORY_TSG_REPORT, UNDERSTORY_TSG_REPORT_MAX_BYTES) and the mounts (the library
// read-only, the container's report directory read-write). It never refuses a container.
//
// Traps:
//   - Whole GPUs (nvidia.com/gpu) are NVIDIA's device plugin's: kubelet allocates them
//     and the device plugin injects them. Their containers are left alone here, even
//     though the extender also annotates such pods with the devices it counted.
//   - Indices are NVML indices. The extender numbers a node's GPUs 0..n-1 from its
//     allocatable nvidia.com/gpu and the agent maps an index to a device through its
//     NVML inventory; NVML enumeration order may change across reboots (it is PCI
//     order on today's drivers), which is why the default CDI names and the
//     environment variable use UUIDs, fixed at the moment of the decision.
//   - CDI names must exist in the node's CDI spec. nvidia-ctk cdi generate writes
//     both nvidia.com/gpu=<index> and nvidia.com/gpu=<UUID> by default; a spec
//     generated with --device-name-strategy=index has no UUID names (use CDINames
//     index), one with type-index ("gpu0") is not supported. A name the runtime cannot
//     resolve fails the container in the runtime ("unresolvable CDI devices").
//   - Mode env relies on the NVIDIA Container Runtime honouring the variable for
//     unprivileged containers (its accept-nvidia-visible-devices-envvar-when-unprivileged
//     default). The same trust lets any container that sets
//     NVIDIA_VISIBLE_DEVICES=all itself, or inherits it from a CUDA base image, see
//     every GPU. The agent therefore pins the variable in every container it creates
//     (Visible, both modes): the container's devices, or "void"; only a pod spec that
//     sets it itself (the node's GPU components) keeps its value.
//   - The device list is decided per container; every gpu-milli container of a pod
//     gets all of the pod's annotated devices (the extender places a shared pod on one
//     device).
//   - An MPS client's connection covers every GPU of its process: a container is a
//     client only if each of its GPUs has a partition, with the lowest cap and priority.
//   - MPS runs one server per UID at a time; a client of another UID waits inside CUDA
//     initialisation. Only containers of MPSSetup.ClientUID (from the runtime's user,
//     else runAsUser) become clients; an unknown UID, and root, are no client.
//   - A client gets the pipe directory read-only and the server's private shm
//     directory read-write at /dev/shm.
//   - The cap, priority and memory limit are environment variables the client's CUDA
//     driver reads; the pod's own values are overridden, but a process that rewrites its
//     environment before CUDA starts is not stopped here (docs/gpu.md).
package devices
