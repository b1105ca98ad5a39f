// Package cgroups is the agent's cgroup layer. It takes numbers and paths
// and knows nothing of pods or policy: the caller says which relative path
// to create, which weight, quota, idle flag or freezer state to apply, and
// reads CPU usage, throttling and pressure back. The root (/sys/fs/cgroup or
// a host mount of it) is injected; tests pass t.TempDir().
//
// Layouts: v1 (controllers at root/cpu, root/cpuacct, ... either separate
// mounts or a cpu,cpuacct co-mount with or without systemd's symlinks),
// hybrid (v1 controllers plus a controller-less cgroup2 at root/unified) and
// v2 (cgroup2 at root). Naming helpers (QOSPath, PodPath, TierPath) return
// kubelet's exact names for both drivers; CleanPath validates any relative
// path before it is joined to a root.
//
// Built on github.com/containerd/cgroups/v3 (cgroup1/cgroup2) for creating
// groups, adding processes, listing them, deleting, v2 cpu.weight/cpu.max
// writes and the v2 freeze write. Hand-written, and why:
//
//   - cpu.idle, v1 cpu.shares and cpu.cfs_*: the library has no cpu.idle;
//     its v1 cpu Update always writes cfs_period_us before cfs_quota_us
//     (rejected by the kernel under a parent quota, see below) and MkdirAlls
//     the group first, which would resurrect a group that was just removed.
//   - UsageReader: the agent reads ~110 groups every 100 ms and must stay
//     under 1% of a core. The library's v1 Stat opens and parses cpu.stat,
//     cpuacct.stat, cpuacct.usage and cpuacct.usage_percpu in a goroutine per
//     subsystem (~150 µs and ~60 allocations per group here: ~17% of a core
//     for 110 groups at 10 Hz). UsageReader keeps cpuacct.usage (v2:
//     cpu.stat) open and preads offset 0: one syscall, no allocation, ~1.8
//     µs per group (~0.2% of a core). See BenchmarkUsageSweep*.
//   - Stats: a small cpu.stat parser that reports a vanished group as
//     ErrNotExist; the library's v2 reader returns zeros for a missing
//     cpu.stat.
//   - Freeze/Thaw: the library's v1 Freeze spins forever while a task in D
//     state keeps the group FREEZING, and its v2 Freeze does not wait for
//     cgroup.events "frozen 1". Ours wait with a deadline (ErrTimeout).
//   - cpu.pressure and ParsePSI: the library only reads PSI inside its v2
//     Stat and logs parse errors instead of returning them; hybrid needs
//     root/unified/<rel>/cpu.pressure.
//
// Traps (read before changing anything here):
//
//   - Never write kubelet-owned QoS-level cgroups (kubepods, burstable,
//     besteffort). In particular setting cpu.idle=1 on kubelet's BestEffort
//     cgroup makes the kernel reject its later cpu.shares writes (EINVAL
//     while idle) and kubelet then fails to start its ContainerManager on
//     restart (Koordinator issue 2732). The agent owns a tier cgroup *below*
//     BestEffort (TierPath) and sets idle there. The only write Create makes
//     above the new group is containerd/cgroups' cgroup.subtree_control
//     toggle (v2 "+cpu", hybrid unified ""), a no-op where already enabled.
//   - The tier name must not start with "pod": kubelet's orphan cleanup
//     treats every pod*-named child of a QoS cgroup as a pod cgroup and
//     deletes it when no such pod exists. It must not contain '_' either:
//     with the systemd driver kubelet escapes '-' to '_' inside a component
//     and would parse the slice back to a different name.
//   - cpu.idle quirks (kernel >= 5.15, verified on 6.18): while idle=1,
//     cpu.shares reads 3 and any weight write fails with EINVAL (ErrIdle);
//     setting idle back to 0 resets cpu.shares to 1024, not to the previous
//     value. Order: set the weight, then idle=1; after idle=0 set the weight
//     again.
//   - v1 CFS bandwidth is checked hierarchically: a group's quota/period
//     ratio may not exceed its parent's nor fall below a child's, and each
//     of the two files is validated on its own write, so the order matters
//     (e.g. 40ms/100ms -> 4ms/10ms under a 0.6 CPU parent fails period-first).
//     SetCPULimit orders the writes and falls back through quota -1, which
//     is always accepted; a target the kernel rejects restores the old value.
//     Period must be 1ms..1s, quota >= 1ms. v2 cpu.max is one atomic write
//     and v2 does not enforce parent ratios.
//   - Hybrid: cpu, cpuacct and freezer are v1; the unified hierarchy has no
//     controllers but tracks PSI per group, so Create also makes the group
//     under root/unified and AddProc moves tasks there too. Freezing uses the
//     v1 freezer when mounted, else unified cgroup.freeze.
//   - The memory and cpuset hierarchies are never touched: no mkdir, no
//     task moves (the agent's own sandbox lives in a memory cgroup here).
//   - A v1 task frozen by the freezer does not die from SIGKILL until
//     thawed: thaw before killing and deleting.
//   - A removed cgroup answers ENODEV on an already open file; UsageReader
//     maps that (and ENOENT) to ErrNotExist so the caller skips the group.
//   - v2: a group with processes cannot get children with controllers
//     enabled ("no internal processes"); keep tasks in leaves.
package cgroups
