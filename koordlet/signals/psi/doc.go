// Package psi gives the node agent pressure stall information (PSI) fast:
// kernel triggers that wake it when an LS pod's tasks stall (Watcher),
// cheap repeated reads of the cumulative stall (Reader) and of a group's
// CFS throttling (ThrottleReader), and the discount of the stall a pod
// causes itself by hitting its own CPU limit (Harm). Parsers (ParseBytes,
// ParseThrottle) are pure and fuzzed; paths and roots are values the
// caller passes (ProcFile, CgroupFile).
//
// A trigger is the text "some <stall µs> <window µs>" written to a pressure
// file opened read-write: the kernel then reports POLLPRI on that file
// descriptor when the tasks were stalled for <stall> in total within any
// <window>, at most once per window. The Watcher keeps one such fd per key
// (a pod UID, KeyNodeMemory, ...) in one epoll instance, read by one
// goroutine (Run); events are coalesced per trigger and handed out on C
// without ever blocking that goroutine.
//
// Harm: the kernel keeps a CFS-throttled group's tasks runnable for PSI, so
// a pod throttled by its own limit shows cpu "some" stall as if batch had
// taken its CPU. Harm subtracts the pod's throttled time (cpu.stat) over
// the same interval, divided by its parallelism, from the stall. Measured
// on this project's hybrid 6.18 machines: a shell busy loop under a
// 10 ms / 100 ms v1 quota stalled 1.805 s in 2 s of its unified group's
// cpu.pressure with 1.763 s throttled; a Go busy loop (whose idle runtime
// threads get throttled on the other CPU too) stalled 1.10 s in 1.6 s with
// 1.66 s throttled; Harm was 42 ms and 0.
//
// # Traps
//
//   - Privilege decides latency. With CAP_SYS_RESOURCE a trigger is checked
//     by a kernel thread every window/10 (50 ms for a 500 ms window) once
//     the group starts stalling (kernel documentation; this project's test
//     machines lack the capability, so it is not measured here). Without it
//     (uid 0 there too) the window must be a multiple of 2 s (else EINVAL,
//     reported as ErrPermission) and the trigger is checked only by the 2 s
//     averaging work: measured 0.83 to 1.94 s for the node (the work's phase)
//     and 2.02 s for a group that was idle, from the start of contention to
//     the event. A ≤ 50 ms reaction needs the capability; Privileged tells.
//   - Window bounds: 500 ms..10 s (MinWindow, MaxWindow). Newer kernels
//     ("psi: remove 500ms min window size limitation for triggers") accept
//     shorter windows from privileged users, older ones do not. The stall
//     must be below the window.
//   - Hybrid nodes: a pod's pressure lives in the cgroup2 (unified)
//     hierarchy, which tracks PSI per group although no controller is
//     enabled there; its throttling lives in the v1 cpu hierarchy's cpu.stat
//     (the unified cpu.stat has usage only: ErrNoThrottle). The relative
//     path is the same in both; CgroupFile takes the cgroup2 root
//     (root/unified on hybrid, root on v2).
//   - A trigger lives exactly as long as its fd; closing it (Remove, Close)
//     destroys it. A second trigger on the same fd is EBUSY, so each key has
//     its own fd. The fds are raw, never *os.File: Go's runtime poller would
//     also register a pollable kernfs file, and the first epoll to poll a
//     trigger clears its event.
//   - Removing a group (rmdir) while its trigger is open makes the fd report
//     POLLERR|POLLPRI for ever (level-triggered epoll would spin) and reads
//     ENODEV. The watcher drops the key, closes the fd and reports the event
//     with Gone set; readers report ErrNotExist.
//   - A regular file accepts the trigger text (it is appended) and refuses
//     epoll (EPERM): Add checks that the file is on procfs or cgroup2 before
//     writing (ErrUnsupported) and that its name is a pressure file's.
//   - /proc/pressure/* replaces the last byte written with a NUL: the
//     trigger is written NUL-terminated, as the kernel documentation does.
//   - The node's /proc/pressure/cpu "some" counts throttled tasks too: one
//     throttled busy loop on an otherwise idle node raised it by 1.80 s in
//     2 s. Once the agent throttles batch with CFS quotas the node's cpu
//     pressure (and that of every ancestor group of a throttled group:
//     kubepods, the batch tier) says little about LS harm; watch the LS
//     pods' own cpu.pressure, and the node's memory pressure.
//   - cpu.stat's throttled time grows only when a throttled run queue is
//     unthrottled, at the next period refill, while the stall grows as it
//     happens: it lags by up to one CFS period (100 ms by default). Over
//     intervals shorter than the period most intervals show the whole stall
//     as harm and the others none (measured: 15 of 20 intervals of 25 ms);
//     at about one period the steps fall unevenly. Judge Harm over several
//     periods (a trigger's window is 5 to 100 of them), or over an interval
//     that ends just after the throttled time stepped.
//   - Throttled time is summed over CPUs but stall is an average over the
//     group's busy CPUs: Harm divides by the parallelism estimated from
//     usage. A pod with more runnable threads than it has CPUs stalls on
//     itself outside throttling too; Harm counts that as harm (PSI cannot
//     tell whose task held the CPU).
//   - Cost: a Read is one pread and no allocation (the agent reads ~100
//     files every 100 ms); a trigger costs one fd and, when privileged, a
//     per-group polling kernel thread ("psimon") while the group stalls.
//     Creating one is microseconds; destroying one (closing its fd) waits
//     for an RCU grace period, about 12 ms here, so the watcher closes fds
//     in the background: Remove and a Gone group never hold up the epoll
//     loop, and Close of 100 triggers took ~130 ms instead of ~1.2 s.
//   - PSI may be absent (CONFIG_PSI off, psi=0 on the kernel command line,
//     cgroup.pressure set to 0 for a group): missing files and EOPNOTSUPP
//     are ErrUnsupported, and the caller falls back to sampling.
package psi
