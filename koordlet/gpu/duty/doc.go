// Package duty applies GPU-aware batch throttling on the node: it freezes the batch pods
// using a GPU with the cgroup freezer, so that latency-sensitive (LS) work on that GPU
// gets the device, and it offers "suspend" through NVIDIA's cuda-checkpoint before
// eviction. qos.GPUThrottle decides per GPU whether batch is frozen; the agent hands the
// Cycler duty 1 (frozen solid: one write, no periodic thaw) or 0 (thawed). Fractional
// duties still work (tests and the bench's duty-error part use them) but the agent no
// longer sets them: a duty cycle lost on a real GPU (docs/gpu.md, "Levers").
//
// Cycler: keys (one per GPU) map to sets of cgroups (the batch pods on that GPU) and a
// duty d. Each group is frozen for d*period at the start of every period (about 100 ms)
// and thawed for the rest; a group in several keys gets the highest duty. All groups
// share one period clock, so the batch pods of a GPU are frozen at the same time. A
// frozen process launches no new GPU work, so LS kernels meet an idle device. One
// goroutine (Run) does every write: a window's freeze or thaw is one write that does not
// wait for the kernel to stop the tasks (it does so within microseconds); Release,
// ThawAll and the thaw of everything when Run's ctx ends wait, each bounded by OpTimeout.
// When Run's ctx ends it thaws everything it froze: a freeze must never outlive the
// agent. A rise from duty 0
// freezes at once for d*period, so batch is frozen within a loop turn of Set
// (milliseconds), not at the next period; that first window may overlap the next
// periodic one, so a cut freezes a little more than d for one period. A group that
// vanished is dropped. Release thaws one group for good (before eviction or suspend);
// ThawAll thaws everything. ThawStale is for the agent's start: it thaws whatever a run
// that crashed or was killed left frozen among the groups the agent names, before the
// agent decides the duties afresh.
//
// Checkpointer (feature-gated by SuspendConfig.Enabled): Suspend runs `cuda-checkpoint
// --toggle --pid P` on a running process (its device memory goes to host memory and the
// GPU is released) and Resume toggles it back; both read `--get-state` first and after.
//
// Traps:
//
//   - Queued GPU work drains while frozen: the freezer stops the CPU side only, so the
//     kernels a batch process queued before the freeze (up to the driver's queue depth,
//     or a whole CUDA graph) still run. The LS share of the device is lower than d, and a
//     deep queue can eat a short frozen window; measure with NVML, not with the duty.
//   - The same freezer files are written by the agent's CPU escalation (koordlet
//     freeze.go freezes the tier and in-place batch pods). While that freeze is meant
//     to hold, give the cycler duty 1 for those groups or Release them: the cycler's thaw
//     at the end of a window would undo it. Release thaws whatever froze the group.
//   - A frozen task cannot handle SIGTERM (v1: it does not even die from SIGKILL until
//     thawed): Release a pod's cgroup before evicting it. cuda-checkpoint works through a
//     thread of the target process, so Release before Suspend as well.
//   - Frozen time counts as no CPU use: the agent's CPU budget and metrics see batch
//     use less CPU while it is frozen for the GPU.
//   - kubelet exec probes and `kubectl exec` into a frozen container wait for the thaw:
//     frozen solid for longer than their timeout, kubelet may restart the container.
//     Collectives (NCCL) of a multi-node job wait for a frozen rank; keep
//     gpu.throttle.starveAfter well below the job's collective timeout (batch frozen that
//     long is suspended or evicted).
//   - A window's freeze is not waited for: Status's frozen means "freeze written". A task
//     in D state keeps a v1 group FREEZING and stops when it wakes; a task forked into
//     the group while the freeze began may escape it (a v1 race runc retries for) and
//     runs until the next period's freeze. A failed write still counts as frozen and is
//     thawed at the end of its window; the error shows in Status.
//   - On start, ThawStale must run before any new freeze: it cannot tell the previous
//     run's freezes from the current run's. Every group gets a thaw write (a v1 group
//     left FREEZING does not read as frozen).
//   - Cost on cgroup v1: the kernel turns a static key on at the first freeze and off at
//     the last thaw, patching kernel text on every CPU; with one batch pod cycled, every
//     window did that twice (0.2-0.4 ms of CPU per window on this project's VM, ~10x the
//     writes themselves). SetPin gives the cycler an empty cgroup it keeps frozen while it
//     cycles anything, so the key stays on. Not needed on cgroup v2.
//   - Windows shorter than 1 ms are not worth two writes: duties within 1 ms of 0 or of
//     the period are rounded to 0 or 1.
//   - Duty error: each write takes tens of microseconds (one open, write and close; no
//     wait for FROZEN), and the loop's timer is late by scheduler latency under load.
//     On an idle machine at a 100 ms period this is under a percentage point; on a busy
//     one a late freeze shortens the frozen window by a few points, so the agent must
//     keep a CPU weight well above batch's. bench/out/gpu.json (duty_error_pct) measures
//     it on the real freezer.
//
// cuda-checkpoint limits (see NVIDIA's README, github.com/NVIDIA/cuda-checkpoint):
//
//   - Display driver 550 or newer (570 adds --action lock|checkpoint|restore|unlock with
//     a lock timeout); x86_64 only. The probe finds the binary and its flags; whether the
//     driver supports it shows on the first call.
//   - One process at a time, CUDA processes only: a process without a CUDA context makes
//     --get-state fail. UVM (cudaMallocManaged) and CUDA IPC memory are not supported, and
//     nothing keeps a multi-process job (IPC, NCCL peers) consistent across separate
//     suspends; on such an error the driver does not try to leave the process in a good
//     state.
//   - A suspend waits for submitted work and copies all device memory to host memory: it
//     can take seconds for large memory, and the node needs that much free host memory.
//     Timeout bounds each call; a tool killed at the timeout may leave the process locked
//     (--get-state "locked"), which Suspend and Resume refuse (ErrCheckpointState).
//   - CPU threads keep running while suspended; their CUDA calls block until Resume.
package duty
