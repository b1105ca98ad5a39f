// Package runqlat measures, with eBPF, how long the tasks of watched cgroups
// (the latency-sensitive pods) wait in the CPU run queue: from the moment a
// task becomes runnable (woken, newly forked, or preempted while still
// runnable) until it runs again. Batch work that takes the CPU from LS pods
// shows up here first, before their own latency does.
//
// Load attaches a small program (bpf/runqlat.c, built by bpf2go into the
// committed runqlat_bpfel.{go,o}; see gen.go) to sched_wakeup,
// sched_wakeup_new and sched_switch. For tasks of watched cgroups it keeps a
// log2 histogram of the delay per pod, in the kernel. Userspace says which
// cgroups to watch (Probe.Watch), reads the cumulative histograms
// (Probe.Read, Histogram.Sub and Quantile on them) and exports them to
// Prometheus (Collector: understory_ls_runqueue_delay_seconds{namespace,pod}).
//
// A poller need not read the histograms to know nothing happened: the
// programs also count the delays at or above a threshold (Probe.SetThreshold)
// in one counter, Probe.SlowEvents, read from memory shared with the kernel
// (an 8-byte load: no syscall, no allocation). While it does not move no
// watched task waited that long, and the histograms can stay unread. Read
// takes every histogram in one batch lookup into buffers it keeps.
//
// Attribution: a slow delay (at or above the threshold) ends by taking the
// CPU from some task. When that task is batch, SCHED_IDLE or below a cgroup
// with cpu.idle (how the agent runs batch), the delay also counts in the
// histogram's Batch (Histogram.Batch; exported as
// understory_ls_runqueue_batch_delays_total). The rest were spent behind LS
// or system tasks. After SetBatchOnly(true), SlowEvents and the wake-up
// count only batch's. Attributes says whether the probe can tell.
//
// A poller need not even poll (Linux 5.8+, BPF ring buffers): after Arm, the
// first delay at or above the threshold disarms the probe and sends one value
// on Wake (a ring-buffer record, read by a goroutine waiting in the runtime's
// netpoller). The poller reads, polls while SlowEvents moves, and re-arms. On
// older kernels the object without the ring buffer is loaded
// (runqlatpoll_bpfel.o): Arm fails with ErrNoWake and Wake is nil.
//
// Traps:
//
//   - sched_switch runs on every context switch of every CPU (often 10^4 to
//     10^5 a second per node). The programs do the least they can: for a task
//     outside the watched cgroups one or two hash lookups that miss, no
//     write, no ring buffer, no per-event output; for a watched task the
//     clock lives in a per-tid entry written in place (no map update, no
//     lock) and the histogram takes three atomic adds. Measured with the
//     kernel's BPF stats on the 2-CPU development VM (tp_btf): ~40 ns per
//     event outside watched cgroups, ~150 ns inside; `perf bench sched pipe`
//     pinned to one CPU slowed by ~0.3 µs per switch with the probe attached
//     (attach overhead included; noisy). Anything added to bpf/runqlat.c is
//     paid on every switch. The slow-event gate adds to a watched task's
//     switch-in one inlined array lookup and a compare, and one atomic add to
//     a shared counter only for a delay past the threshold (rare unless the
//     pods are being harmed); the wake-up then one hash lookup, and a delete
//     and a ring-buffer write once per Arm.
//   - Attribution looks at the task switched out (prev at sched_switch) only
//     for slow delays: its policy, then up to 8 task groups for cpu.idle
//     (struct task_group's idle, Linux 5.15+; CO-RE, so an older kernel only
//     sees SCHED_IDLE tasks, and Attributes is false). The classic set has no
//     typed task to look at and counts every slow delay as batch's. A wait
//     that batch prolonged but that another task ended is not batch's.
//   - Arm and a slow delay race: one between the poller's last look at
//     SlowEvents and Arm sends nothing. Look again after Arm. The gate is a
//     one-key hash whose delete is the atomic test-and-set: BPF's xchg and
//     cmpxchg need Linux 5.12, ring buffers only 5.8.
//   - ringbuf.Reader.Read parks an OS thread in epoll_wait for the life of the
//     probe; the wake-up goroutine waits in the runtime's netpoller instead
//     and drains the reader without blocking.
//   - Cgroup ids are cgroup v2 ids: the inode number of the cgroup's directory
//     in the cgroup2 mount (CgroupID), which is the kernel's cgroup->kn->id.
//     On hybrid hosts (like the development machine) cgroup2 is mounted at
//     /sys/fs/cgroup/unified, has no controllers, and a task's v2 cgroup is
//     where the runtime put it in that tree; a v1 directory's inode is not a
//     cgroup id (CgroupID refuses it). A task whose runtime never joined the
//     unified tree sits in its root and is not counted.
//   - A pod's tasks run in its containers' cgroups, not in the pod cgroup:
//     watch the pod with its container cgroups as children
//     (Watch(pod, containers...)), and again when containers come and go.
//     The histogram is the pod's and survives container restarts.
//   - Two attach modes. tp_btf (Linux 5.5+ with BTF, /sys/kernel/btf/vmlinux)
//     reads the task's cgroup directly from the typed task pointer (CO-RE).
//     Classic tracepoints need tracefs (ErrNoTracefs otherwise; `mount -t
//     tracefs tracefs /sys/kernel/tracing`) but no BTF: their events carry
//     only pids, so the task's cgroup is taken when it is switched out (then
//     it is current: bpf_get_current_cgroup_id) and remembered per tid until
//     it wakes; a forked task gets its parent's. So in that mode a task's
//     first wakeup after Watch, or after it moved cgroups, is missed. The
//     default mode tries tp_btf, then classic; errors.Is on ErrPermission,
//     ErrNoBTF, ErrNoTracefs tells a caller why neither worked.
//   - Privileges: CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) in the initial
//     user namespace; root in a container's own user namespace is not enough
//     (ErrPermission). Before Linux 5.11 BPF maps count against
//     RLIMIT_MEMLOCK: Load raises it (rlimit.RemoveMemlock, needs
//     CAP_SYS_RESOURCE), a no-op on newer kernels.
//   - Memory is preallocated at Load and charged to the agent's memory
//     cgroup: the watched and histogram maps hold Options.MaxCgroups
//     entries each (~80 and ~300 bytes), the per-task clocks 10240 tasks of
//     watched cgroups (~1 MB; an LRU: past that, evicted tasks lose a delay),
//     the classic mode's tid -> cgroup map as much again. With the default
//     1024 cgroups: 1.4 MB (tp_btf), 2.3 MB (classic); the slow-event
//     count takes a page. Read's batch buffers grow with the histograms
//     watched (~240 bytes each, at least 64, doubling). Watch past
//     MaxCgroups fails with ErrFull.
//   - The kernel adds to a histogram's buckets, count and sum one after the
//     other, without a lock (atomics, several CPUs at once): a Read may see
//     a count a few behind its buckets. Quantile and the Collector use the
//     buckets' sum.
//   - Buckets are log2 of microseconds: a Quantile is an upper bound good to
//     a factor of two, and delays under 2 µs share bucket 0.
//   - SlowEvents counts delays >= the threshold in nanoseconds, not buckets:
//     a threshold that is a bucket's lower bound (BucketUpper(i-1)) counts
//     exactly the delays of buckets i and up. The count is global (every
//     watched cgroup) and only grows; compare it with the last value seen.
//     The kernel counts a delay after adding it to its histogram, so read the
//     count before the histograms: a delay counted after a read opens the
//     next one.
//   - Kernel features: the count is memory-mapped from Linux 5.5
//     (BPF_F_MMAPABLE; before, SlowEvents is one map lookup), and Read uses
//     batch lookups from 5.6 (before, one lookup per histogram). The batch
//     walks every bucket of the histogram map, so its cost follows
//     Options.MaxCgroups, not the number watched. The gate uses array maps,
//     not global variables, which would need 5.2 (the classic mode runs
//     from 4.18).
//   - A task woken again before it ran (rare) restarts its clock, as in
//     bcc's runqlat. A forked task's tid clears any clock a dead task left.
//   - Only 64-bit little-endian kernels (amd64, arm64): the classic
//     tracepoint contexts assume a 64-bit long and only bpfel is built.
package runqlat
