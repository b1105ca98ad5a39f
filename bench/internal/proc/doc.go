// Package proc reads a process's CPU time and resident memory from /proc, for the
// benchmarks that measure the agent's own cost (bench/colo, bench/gpubench) from
// outside its process. The agent itself does not use it: its reads are koordlet/collect.
//
// Traps:
//   - /proc/<pid>/stat's command name may hold spaces and parentheses: fields count from
//     its last ')'.
//   - CPU time is in clock ticks (collect.UserHZ), so a short window's figure is coarse:
//     measure over seconds.
//   - ReadRSS's peak (VmHWM) is the whole life's peak, not the window's.
package proc
