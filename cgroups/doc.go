// Package cgroups is the agent's cgroup layer. The caller says which relative
// path to create, which weight, quota, idle flag, memory limit or freezer state
// to apply, and reads CPU usage, throttling, OOM kills and pressure back; the
// package holds no policy. The root (/sys/fs/cgroup or a host mount of it) is
// injected; tests pass t.TempDir().
//
// It also owns kubelet's cgroup naming, for both drivers and any kubelet
// --cgroup-root (kubeletnames.go): Naming (driver and root) gives the paths of
// kubelet's QoS and pod cgroups, of its root cgroup and of the agent's tier
// (QOSPath, PodPath, RootPath, TierPathIn); TierPodPath names a pod below the
// tier, ContainerCgroupsPath the cgroups path a runtime hands to runc;
// SliceUnit and SlicePath convert systemd unit names; and the parsers read a
// cgroup path or a sandbox's cgroup parent back into QoS class, pod UID and
// container ID (ParseCgroupPath, ParsePodCgroupParent).
// CleanPath validates any relative path before it is joined to a root.
//
// Layouts: v1 (controllers at root/cpu, root/cpuacct, ... either separate
// mounts or a cpu,cpuacct co-mount with or without systemd's symlinks),
// hybrid (v1 controllers plus a controller-less cgroup2 at root/unified) and
// v2 (cgroup2 at root).
//
// Built on github.com/containerd/cgroups/v3 (cgroup1/cgroup2) for creating
// groups (v1 memory included), adding processes, listing them, deleting,
// v2 cpu.weight/cpu.max writes and the v2 freeze write. Hand-written, and
// why:
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
//   - cpu.pressure, memory.pressure and ParsePSI: the library only reads PSI
//     inside its v2 Stat and logs parse errors instead of returning them;
//     hybrid needs root/unified/<rel>/{cpu,memory}.pressure.
//   - Memory limits and events: the library's v2 Update can only write
//     numbers (memory.max needs "max" for no limit; "-1" is EINVAL there),
//     its v1 Update O_CREATs files (hiding a missing feature on a fake root)
//     and neither orders high against max nor checks usage first; its
//     Stat reads every memory file to get at oom_kill.
//
// Traps (read before changing anything here):
//
//   - Never write kubelet-owned QoS-level cgroups (kubepods, burstable,
//     besteffort). In particular setting cpu.idle=1 on kubelet's BestEffort
//     cgroup makes the kernel reject its later cpu.shares writes (EINVAL
//     while idle) and kubelet then fails to start its ContainerManager on
//     restart (Koordinator issue 2732). The agent owns a tier cgroup of its
//     own and sets idle there: by default a child of kubepods, a sibling of
//     kubelet's QoS cgroups (TierPathIn with QOSGuaranteed, whose pods live
//     in kubepods itself; docs/design.md, "Where the tier sits"), with
//     tierParent "besteffort" below BestEffort (QOSBestEffort). The only write
//     Create makes above the new group is containerd/cgroups'
//     cgroup.subtree_control toggle (v2 "+cpu", hybrid unified ""), a no-op
//     where already enabled.
//   - The tier name must not contain "pod", in any case: kubelet's orphan
//     cleanup takes every child of a QoS cgroup (kubepods included) whose name
//     contains "pod" for a pod cgroup and deletes it when no such pod exists.
//     It must not contain '_' either: with the systemd driver kubelet escapes
//     '-' to '_' inside a component and would parse the slice back to a
//     different name. Nor may it be one of kubelet's own names (kubepods,
//     burstable, besteffort): the tier would be kubelet's cgroup.
//   - cpu.idle quirks (kernel >= 5.15, verified on 6.18): while idle=1,
//     cpu.shares reads 3 and any weight write fails with EINVAL (ErrIdle);
//     setting idle back to 0 resets cpu.shares to 1024, not to the previous
//     value. Order: set the weight, then idle=1; after idle=0 set the weight
//     again.
//   - v1 CFS bandwidth is checked hierarchically (tg_cfs_schedulable_down):
//     a group's quota/period ratio may not exceed its parent's nor fall
//     below any limited descendant's (an unlimited child inherits, so its
//     limited children count), and each of the two files is validated on
//     its own write, so the order matters (e.g. 40ms/100ms -> 4ms/10ms under
//     a 0.6 CPU parent fails period-first). SetCPULimit orders the writes,
//     tries the other order, and NEVER passes through quota -1 between two
//     limits: -1 is always accepted, but a cut that goes through it leaves
//     a batch pod unthrottled, and an agent retrying every period keeps it
//     there. A cut below a child's own quota (kubelet's container limits
//     under an in-place batch pod) is clamped to the highest descendant
//     ratio, and a period change no order can make keeps the old period;
//     both return a *ClampError (ErrClamped) with the applied limit.
//     SetCPULimit never lowers a descendant itself: the caller does, with
//     LowerDescendantCPULimits (deepest first, each at its own period), which
//     returns the limits it changed, and puts them back with
//     Hierarchy.RaiseDescendantCPULimits (shallowest first, at most the
//     group's new ratio) when the group is raised. A target
//     above the parent restores the old value (ErrInvalidValue). Period must
//     be 1ms..1s, quota >= 1ms. v2 cpu.max is one atomic write and v2 does
//     not enforce parent ratios (it takes the minimum).
//   - Hybrid: cpu, cpuacct, freezer and memory are v1; the unified hierarchy
//     has no controllers but tracks PSI (cpu.pressure, memory.pressure) per
//     group, so Create also makes the group under root/unified and AddProc
//     moves tasks there too. Freezing uses the v1 freezer when mounted, else
//     unified cgroup.freeze.
//   - v1 memory: Create makes the group in the memory hierarchy too (so the
//     tier exists there before the runtime nests pod cgroups below it) and
//     Delete removes it, but AddProc never moves a task between memory
//     cgroups (a caller moving itself would leave its own, e.g. a sandbox's,
//     memory cgroup); AddProcMemory does. The cpuset hierarchy is never
//     touched. v2: Create does not enable the memory controller; kubelet
//     has on its QoS cgroups, and without it SetMemoryLimit is
//     ErrUnsupported.
//   - v1 has no memory.high: SetMemoryLimit's high goes to
//     memory.soft_limit_in_bytes, which only matters under node-wide memory
//     pressure. v1 memory.use_hierarchy=0 (kernels < 5.11, non-hierarchical
//     parent; it cannot be changed once children exist) would make a limit
//     ignore child groups: SetMemoryLimit refuses it (ErrUnsupported). Since
//     5.11 it always reads 1.
//   - Lowering a memory limit below usage: v1 reclaims and then fails with
//     EBUSY (ErrBusy, old limit kept); v2 memory.max reclaims and then
//     OOM-kills, so SetMemoryLimit writes memory.high first, asks
//     memory.reclaim for the excess and refuses (ErrBusy) rather than write
//     a memory.max below what is left. A limit never passes through
//     "unlimited". Without swap, anonymous memory cannot be reclaimed.
//   - v1 memory.limit_in_bytes reads PAGE_COUNTER_MAX pages (e.g.
//     9223372036854771712) for "no limit", and limits round down to pages.
//   - Rediscovery: kubelet never sets cpu.idle on pod cgroups, so Idle()
//     true on a pod cgroup (ListChildren of a QoS cgroup) marks one an agent
//     run made in-place batch.
//   - A v1 task frozen by the freezer does not die from SIGKILL until
//     thawed: thaw before killing and deleting.
//   - A removed cgroup answers ENODEV on an already open file; UsageReader
//     maps that (and ENOENT) to ErrNotExist so the caller skips the group.
//   - v2: a group with processes cannot get children with controllers
//     enabled ("no internal processes"); keep tasks in leaves.
package cgroups
