// Package collect reads node-level kernel statistics from /proc for the
// agent: CPU time (procstat.go), memory (meminfo.go) and pressure stall
// information (pressure.go), plus Rate (rate.go), which turns cumulative
// counters into usage. One file per collector. The proc root is always a
// parameter, so tests point it at a fake tree.
//
// # Traps
//
//   - /proc/stat counts in USER_HZ ticks. USER_HZ is 100 on amd64, arm64,
//     ppc64le and s390x whatever CONFIG_HZ is (only alpha and ia64 differ),
//     so it is a constant here and not looked up with sysconf(_SC_CLK_TCK)
//     (which would need cgo). Ticks make the
//     counters coarse: 10 ms per CPU, so a 100 ms rate on one CPU carries
//     ±10 % quantisation noise. Rate over longer windows or smooth.
//   - guest and guest_nice are already included in user and nice; adding
//     them again would double count virtualisation hosts' CPU time.
//   - idle and iowait are not guaranteed monotonic (NOHZ accounting and
//     per-CPU iowait can step back slightly), so Total may briefly go
//     backwards; Busy is the dependable counter. Rate reports ok=false
//     for a backwards step instead of a negative usage.
//   - CPUTimes durations are nanoseconds in an int64 summed over all CPUs:
//     they wrap after 292 CPU-years (e.g. ~1.1 years of uptime on 256
//     CPUs). Differences stay exact across the wrap because Go integer
//     arithmetic wraps; Rate relies on that. Do not compare absolute values.
//   - CPUs counts the "cpuN" lines, i.e. online CPUs; it can differ from
//     runtime.NumCPU() (which honours the process affinity mask) and it
//     changes with CPU hotplug.
//   - ProcStat keeps /proc/stat open and re-reads it with pread at offset
//     0, which makes the kernel regenerate it: one syscall and no
//     allocation per read. A ProcStat is not safe for concurrent use.
//   - MemAvailable appears in kernels from 3.14; without it ReadMemInfo
//     fails rather than guessing from MemFree.
//   - PSI files are missing when the kernel lacks CONFIG_PSI or was booted
//     with psi=0; ReadPressure then returns ErrNoPSI and callers should
//     degrade, not fail. Parsing is delegated to cgroups.ParsePSI.
package collect
