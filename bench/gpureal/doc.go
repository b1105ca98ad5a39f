// Package gpureal is the real-GPU benchmark (make bench-gpu-real; its main is
// cmd/gpu-real, built as bin/gpureal-bench): an LS inference stand-in and a batch
// training stand-in (bench/gpureal/workloads, PyTorch) on one NVIDIA GPU, measured
// alone, with nothing done, and with the agent (bin/koordlet in its no-cluster mode:
// the freeze lever, then MPS). The driver is the node's
// container runtime: it hosts NRI's runtime side (the agent's plugin connects to it),
// creates kubelet-style pod and container cgroups, and starts each stand-in inside its
// container cgroup with the environment NRI gave it. It prints the table and the
// targets it is held to, and writes bench/out/gpu-real.json. docs/benchmarks.md, "Real GPU",
// has the runs and the targets.
//
// The binary also runs as the launcher of the stand-ins (launch) and as GPU-free fake
// stand-ins (fake-ls, fake-batch) for a dry run (-fake) and the tests.
//
// Files: plan.go (the phases), bench.go (the orchestration), runtime.go (NRI's runtime
// side), node.go (the cgroups), agentproc.go (the agent process, /status, its CPU),
// workload.go (the stand-ins' protocol), memcap.go (the memory-cap check: batch
// allocates until CUDA_MPS_PINNED_DEVICE_MEM_LIMIT stops it, LS keeps its memory),
// launch.go (the launcher), fake.go (the fakes),
// stats.go, targets.go, result.go (figures, verdicts, table, JSON), agentcfg.go (the
// agent's config and the pods' manifests), gpu.go (nvidia-smi, MPS clean-up).
//
// Traps:
//   - The stand-ins are host processes, not containers: of NRI's adjustments the driver
//     applies the cgroups path, the environment and bind mounts (the launcher makes them
//     in a mount namespace of the stand-in's own: the MPS pipe directory read-only, the
//     MPS shm directory at /dev/shm); other mounts and CDI devices cannot be, and are
//     listed as not applied.
//   - Root is never an MPS client: the MPS section's stand-ins run as the client UID
//     (mpsClientUID, 1000; the launcher switches to it after joining its cgroup and
//     making its mounts) and the runtime reports that user to NRI; the run's directory is
//     made enterable (0711) for it to reach the pipe directory. The agent (mode run)
//     starts the MPS daemon with the run's shm directory as its /dev/shm. Devices go as NVIDIA_VISIBLE_DEVICES (gpu.devices.mode env),
//     which a host process ignores: the machine has one GPU.
//   - The MPS section's pipe directory is the run's own: a control daemon at the default
//     /tmp/nvidia-mps would make every CUDA process of the machine its client, the
//     nothing-done stand-ins too.
//   - A frozen stand-in handles no input and, on cgroup v1, does not die: stopping one
//     falls back to thawing the whole tree (the agent freezes pods and its tier).
//   - The agent's CPU escalation can freeze the batch tier for CPU reasons (a small busy
//     machine: the Python stand-ins busy-wait a core each in synchronize); a phase in which
//     it did says so. -cpu-freeze=false turns it off for dry runs.
//   - Reading /status costs the agent CPU: the steady phases, whose CPU the target
//     judges, read it once a second, the reaction phases every 100 ms.
//   - Phases start at absolute times (CLOCK_REALTIME, one clock for every process), so
//     the stand-ins line up without waiting on each other.
//   - bin/koordlet without NVML (no GPU) refuses shared-GPU containers ("no GPU inventory"):
//     a -fake dry run on such a machine needs -ls-gpu-milli 0 -batch-gpu-milli 0.
package gpureal
