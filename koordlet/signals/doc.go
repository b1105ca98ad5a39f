// Package signals gives the node agent its fast LS harm signals and picks the best one
// this node allows, in the order eBPF → PSI → sampling:
//
//   - ebpf (koordlet/signals/runqlat): the run-queue delay of every LS pod's tasks,
//     judged over one pollInterval (20 ms by default), or up to five while fewer than
//     minSamples delays arrived (up to a second when most of them are in harm buckets:
//     tasks that wait a whole CFS slice each time, before Linux 6.6, cannot gather
//     minSamples in five). An LS pod whose delay quantile
//     over the interval passed its threshold is harm (runqueue_delay), when batch's slow
//     delays (those that took the CPU from a batch task) alone put it there: the others
//     were spent behind LS tasks, and a cut cannot shorten them (RunqueueAnyCause
//     counts them too; a probe that cannot tell counts every one as batch's). Each poll first
//     reads the kernel's count of delays in harm buckets (memory shared with the
//     kernel: no syscall) and reads the histograms (one batch lookup) only when it
//     moved, for new pods, and once a second. The source does not poll a quiet node:
//     from Linux 5.8 the probe wakes it (a ring-buffer record) at the first delay in a
//     harm bucket after it armed the probe; it polls then every pollInterval while the
//     count moves, and re-arms when a poll finds it unmoved. Before 5.8 it polls every
//     pollInterval.
//   - psi (koordlet/signals/psi): kernel PSI triggers (epoll) on every LS pod's
//     cpu.pressure and memory.pressure. A CPU trigger is confirmed by the pod's
//     cumulative stall less its own CFS throttled time over the last one to two windows
//     (a pod throttled by its own limit is not harmed by batch) before it counts as harm
//     (psi_cpu); a memory trigger is harm at once (psi_memory). The node's
//     /proc/pressure files are not used: their stall counts batch's own waits.
//   - sampling: no harm signal; the agent's 100 ms utilisation sample is all there is
//     (the agent's behaviour before signals existed).
//
// Open tries them in that order from the configured mode (auto and ebpf start at
// eBPF, psi at PSI, sampling is sampling) and returns a State that says which one is
// active and why each better one was not (errors.Is on the sentinels of runqlat and
// psi: no CAP_BPF, no BTF, no tracefs, no PSI, no cgroup2).
//
// A Source tracks the LS pods the agent gives it (Watch, Unwatch) by their cgroup in
// the cgroup2 hierarchy, and reports harm twice: it signals Wake at once, so the agent
// cuts between two control periods, and queues the harm for Take, which the agent
// calls on the wake-up and every period.
//
// Traps:
//   - A Source's goroutine (Run) and the agent's control loop share it: Watch, Unwatch
//     and Take are safe for concurrent use with Run; the rest is the caller's.
//   - Harm carries the start of the window it was measured over (Since): the agent
//     must not cut twice for evidence that began before its last cut.
//   - A pod's cgroup may not exist yet when the agent hears of the pod (the runtime
//     makes it later): Watch then fails with an error wrapping ErrNotExist; try again.
//   - On a hybrid node the pod's cgroup2 directory has the same relative path as its
//     v1 cpu directory, below the unified mount; the roots are values passed in.
//   - A failed map read or a broken PSI watcher is reported by Take as an error: the
//     agent is then blind for that period and falls back to utilisation for it.
//   - The eBPF gate shuts only while no delay reaches a harm bucket, so it never hides
//     harm; but the first read after skipped polls (or after a quiet wait for the
//     wake-up) spans all of them, and the rule over the last interval alone is then
//     known only when that interval's slow delays are at least RunqueueMinSamples (see
//     EBPF.poll). Otherwise the read carries its
//     slow delays into the next poll, which it forces to read and which judges them
//     with its own interval's delays (EBPF.judgeMerged): harm in bursts shorter than a
//     poll interval, each after a quiet one, is reported one poll after the burst, not
//     at the next refresh. Slow delays are carried once. Changing RunqueueThreshold
//     means a new source: the kernel's gate threshold is set from it at open.
//   - Batch's delays are told by the task the LS task took the CPU from: SCHED_IDLE, or
//     below a cgroup with cpu.idle (tp_btf on Linux 5.15+; runqlat.Probe.Attributes). A
//     wait that batch prolonged but an LS task ended is not batch's. Where the probe
//     cannot tell, the source judges every slow delay and says so in its log.
//   - The wake-up is one record per arming, and a slow delay between the poll that
//     found the count unmoved and the re-arming sends none: the source looks at the
//     count once more after arming (EBPF.wakeStep). Polling every 20 ms was not free
//     even with no syscall: each wake-up of the agent is a context switch, and 50 a
//     second cost 1 % of a core on a VM.
package signals
