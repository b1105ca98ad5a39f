// Package gpumock is a GPU node without GPUs for benchmarks and end-to-end tests:
// go-nvml's 8-GPU DGX A100 mock (Node, cgo only) whose devices answer like the driver
// from the processes a test sets on them, and the fake /proc entries (WriteProc,
// HybridProcCgroup) through which the agent's collector attributes those processes to
// pods. bench/gpubench (cmd/gpu-bench) and test/e2e/dashboards drive the agent's real
// GPU loop (koordlet/gpu) with it. Like go-nvml's mocks it is meant for tests and
// benchmarks, never for the agent itself.
//
//   - node.go (cgo only): Node, New, Set, SetDuty, Procs, Collector.
//   - proc.go: GPUs, HybridProcCgroup, WriteProc (pure Go).
//
// Traps:
//   - It mimics the driver, not go-nvml's defaults: a device's utilisation is the sum
//     of its processes' (capped at 100 %), its used memory their sum (capped at what
//     the driver leaves), GetMemoryInfo_v2 reports the driver's Reserved memory apart
//     while GetMemoryInfo (v1) counts it as used, as the driver does, and
//     GetProcessUtilization returns one sample per process that computed, stamped at
//     the query (a sampling pass at every query: a driver samples every 1/6 s to 1 s),
//     only when newer than the timestamp asked for; with no such sample it returns
//     ERROR_NOT_FOUND, as the driver does. A process with no SM and no memory
//     utilisation gets no sample.
//   - A batch process (Proc.Batch) computes only while its pod is thawed: its SM time
//     shrinks with the GPU's duty (SetDuty) as a frozen process's would, by
//     (1 - duty). Nothing freezes it here: the caller passes in the duty the GPU loop
//     decided (the manager's Status); at duty 1 a batch process reads 0 % SM. Only SM
//     is scaled: its memory stays (a frozen process keeps its allocations), and so
//     does its memory-controller utilisation, a simplification.
//   - Set replaces a GPU's processes at once; every query reads them again, so a change
//     shows in the next scrape. A device query on a GPU with nothing set reads idle.
//   - go-nvml's mocks panic on a query whose Func is unset; New sets the ones the
//     collector calls beyond the DGX A100 defaults (memory v1 and v2, utilisation,
//     running processes, process utilisation). Collector calls Init first, which NewCollector
//     expects; the collector's Close shuts the library down.
//   - The PIDs are names only: they must have entries under the proc root the
//     collector reads (WriteProc), not be real processes. WriteProc's stat line gives
//     start tick = PID, so a PID's entry written again keeps its start time.
package gpumock
