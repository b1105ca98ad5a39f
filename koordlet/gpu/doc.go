// Package gpu is the agent's GPU room. It reads every GPU through NVML
// (github.com/NVIDIA/go-nvml, passed in as nvml.Interface so tests use its mocks),
// attributes GPU processes to pods through /proc/<pid>/cgroup, and feeds the GPU
// throttle (qos) and the freezer duty cycle (subpackage duty).
//
//   - types.go: the shared types (Sample, Device, Process, PodRef, Scrape), Source,
//     sentinels.
//   - collector.go (cgo only): Open, NewCollector and Collector, one scrape of
//     every GPU per Collect: index, UUID, model, memory, utilisation, health, and
//     per process its SM and memory utilisation (GetProcessUtilization) and memory
//     (GetComputeRunningProcesses); or, where the plan says ScrapeProbe, only the
//     process list, with the GPU's last full read returned while the list is unchanged.
//   - cadence.go: the GPU loop's plan (pure): which GPU is read in full every period
//     (batch shares it with other processes), which only probed, and whether the loop
//     runs at its period or, with no batch on any GPU, at the full-scrape period.
//   - open_nocgo.go: Open for the pure-Go build, always ErrNoNVML.
//   - attribute.go (pure Go): ParseProcCgroup and PodOfPID, PID → pod UID and
//     container ID for both cgroup drivers, v1, v2 and hybrid, and the agent's tier;
//     a process's start time (/proc/<pid>/stat), which keys the collector's cache.
//
// Traps:
//   - NVML needs cgo. Files that import go-nvml build only with cgo; without it
//     (CGO_ENABLED=0, the pure-Go build) Open returns ErrNoNVML and GPU features
//     are off. The same happens at run time when libnvidia-ml.so.1 or the driver is
//     missing, or nvmlInit fails: the caller logs it once and runs everything else.
//     go-nvml's cgo code uses deprecated NVML declarations: build with
//     CGO_CFLAGS=-Wno-deprecated-declarations (the Makefile exports it) to keep the
//     build quiet.
//   - NVML reports host PIDs. procRoot must be the host's /proc and the agent must
//     run in the host PID namespace (the DaemonSet sets hostPID): in a private one
//     the numbers name other processes, or none. A PID without a /proc entry (it
//     exited between NVML's listing and the read, or lives in a PID namespace the
//     proc root does not show) is kept, unattributed. The collector keeps each
//     process's pod while the PID stays on a GPU and its start time (/proc/<pid>/stat
//     field 22, read again at most every attrRecheck, 1 s) is unchanged: a process never
//     moves to another pod, and a reused PID has another start time. A PID that exits
//     and is reused on a GPU within one scrape period is misattributed until the next
//     start-time read; a PID that leaves every GPU is forgotten.
//   - A probe compares only the PIDs listed: figures of a probed Device are those of
//     its last full read (Probed, ScrapedAt). The probe cannot see an LS process's
//     utilisation rise, so the manager reads a GPU that batch shares with other
//     processes in full every period; and it cannot see a class change, so the manager
//     classifies the processes again with its current pod view at every step. A driver
//     without process listing cannot be probed: such a GPU is read in full every time.
//   - An agent in a private cgroup namespace reads other processes' cgroups as
//     "/../../besteffort/pod<uid>/...": ParseProcCgroup accepts that, but it cannot
//     then see the kubepods ancestor, so run the agent in the host cgroup namespace.
//     On hybrid hosts the v1 memory (else cpu) line is read, never the unified one,
//     where kubelet and the runtime may not place containers.
//   - GetProcessUtilization returns only samples newer than the timestamp passed,
//     so the collector keeps the newest one per device. ERROR_NOT_FOUND (no newer
//     sample) is normal: every process reads 0. The driver returns samples only
//     for processes that computed in a sample period, and its period is 1/6 s to
//     1 s depending on the GPU (NVML's documentation), so scraping faster than that
//     reads 0 between samples: smooth before acting on it. A
//     process's newest sample counts, not a mean. The first scrape asks for at most
//     the last 2 s (the driver's timestamps are microseconds since the Unix epoch),
//     or a burst long over would read as current. go-nvml answers
//     ERROR_INSUFFICIENT_SIZE with an empty list when the driver counted no sample.
//   - Health is per scrape: a device's first failing query stops its scrape and
//     marks it unhealthy (Err, Fault; ERROR_GPU_IS_LOST wraps ErrDeviceLost), the
//     other devices are still read, and it reads healthy again once its queries
//     succeed. Only a failing device count fails the whole Collect.
//   - ERROR_NOT_SUPPORTED is a capability, not a fault: a GPU in MIG mode reports
//     no utilisation (UtilUnsupported: 0 means unknown, never idle), and a driver
//     without process listing gives no processes. NVML_VALUE_NOT_AVAILABLE memory of
//     a process counts as 0.
//   - NewCollector takes an initialised library over; Close calls nvmlShutdown
//     (NVML counts Init and Shutdown). go-nvml's mocks panic on any query whose Func
//     is unset: a mock device needs GetUUID, GetName, GetMemoryInfo,
//     GetUtilizationRates, GetComputeRunningProcesses and GetProcessUtilization.
package gpu
