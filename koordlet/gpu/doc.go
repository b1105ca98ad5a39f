// Package gpu is the agent's GPU side. It reads every GPU through NVML
// (github.com/NVIDIA/go-nvml, passed in as nvml.Interface so tests use its mocks),
// attributes GPU processes to pods through /proc/<pid>/cgroup, and feeds the GPU
// throttle (qos) and the freezer (subpackage duty, at duty 1 or 0: the on/off freeze).
//
//   - types.go: the shared types (Sample, Device, Process, PodRef, Scrape), Source,
//     sentinels.
//   - collector.go (cgo only): Open, NewCollector and Collector, one scrape of
//     every GPU per Collect: index, UUID, model, memory (GetMemoryInfo_v2, else v1),
//     utilisation, health, and per process its SM and memory utilisation
//     (GetProcessUtilization, held between the driver's samples) and memory
//     (GetComputeRunningProcesses); or, where the plan says ScrapeProbe, only the
//     process list, with the GPU's last full read returned while the list is unchanged
//     (ScrapeUtil: and the GPU's own utilisation read now, for a GPU whose batch the
//     loop holds frozen).
//   - samplehold.go (pure Go): sampleHold, each process's newest utilisation sample
//     held between the driver's sampling passes until the process is seen idle.
//   - view.go: viewDevice, a scrape's processes sorted by class (batch, or LS: LS and
//     BE pods, unknown pods and no pod), and the throttle's input.
//   - levers.go: leverState, the levers' part of a step: LS processes that arrived
//     (per-GPU PIDs), the MPS server's process taken out of LS (by argv[0] in cmdline,
//     nvidia-cuda-mps-server, only with Options.MPS), the MPS lever where every LS and
//     batch process on a GPU is a client the partitions handed out, and the lever events
//     (Options.OnLever) when LS outgrows its MPS partition or a batch cap is unconfirmed.
//   - mpscheck.go: the MPS cap check: each batch client's /proc/<pid>/environ
//     (ParseMPSEnviron: its cap, priority and device memory limit) and the control
//     daemon's clients and server limits (mps.Daemon's Servers), judged by
//     qos.CheckGPUMPSClients; an unconfirmed GPU uses the freeze
//     lever (qos.GPUReasonMPSCapUnconfirmed).
//   - partitions.go: Partitions, the MPS client planner the NRI plugin asks
//     (devices.MPSPlanner): caps from qos.ChooseGPUMPSCaps, batch memory limits from
//     qos.ChooseGPUMPSMemLimit, records per pod container and GPU, updated by the loop
//     (server readiness, LS demand peak and memory total per GPU, pods gone).
//   - timeslices.go: Timeslices, the time-slice shim's planner the NRI plugin asks
//     (devices.TimeslicePlanner; gpu.timeslice.enabled): the slice of a shared-GPU
//     container's class on its GPU (qos.ChooseGPUTimeslice), its report directory
//     (reports/<pod UID>/<container>/, 1733, emptied at each creation), the record of
//     the containers given the shim, and the sweep of pods gone.
//   - tsgreports.go: reportReader, a container's report directory read bounded (names,
//     files, bytes), without following links, each file parsed again only when it
//     changed (timeslice.ParseReport), and the lines folded into contexts.
//   - timesliceloop.go: the loop's time-slice part: every gpu.fullScrapePeriod the
//     reports, and per GPU qos.ChooseGPUTimeslice's input (a context per reported
//     context of each process on the GPU, matched by its container and its PID in its
//     own namespace, /proc/<pid>/status NSpid; one with nothing seen per process that
//     reported none), the decision in /status and the metrics, the throttle's input
//     Timeslice where it is the timeslice lever, and the self-set Events
//     (Options.OnSelfSet).
//   - recover.go: a panicking loop step is recovered (logged with its stack, counted,
//     the cycler thawed, the error in /status) and the loop goes on.
//   - cadence.go: the GPU loop's plan (pure): which GPU is read in full every period
//     (batch runs beside other processes), which probed with its own utilisation
//     (batch shares it but is frozen), which only probed (the rest, and a GPU where LS
//     and batch run in MPS partitions), and whether the loop runs at its period or,
//     with no batch on any GPU, at the full-scrape period.
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
//     moves to another pod, and a reused PID has another start time. A process with no
//     pod, or with its pod but no container, may still be moved into one (it opened its
//     CUDA context before the runtime or a launcher moved it): its cgroup is read again
//     every attrRecheck until it names a container. A PID that exits and is reused on
//     a GPU within one scrape period is misattributed until the next start-time read; a
//     PID that leaves every GPU is forgotten.
//   - A probe compares only the PIDs listed: figures of a probed Device are those of
//     its last full read (Probed, ScrapedAt). The probe cannot see an LS process's
//     utilisation rise, so the manager reads a GPU where batch runs beside other
//     processes in full every period. Where it holds that batch frozen it asks for
//     ScrapeUtil instead: the view then takes the GPU's own utilisation (UtilNow) as
//     the other processes' (nothing of batch computes), and the per-process figures
//     are a full read's, at most gpu.fullScrapePeriod old. The probe cannot see a
//     class change either, so the manager
//     classifies the processes again with its current pod view at every step. A driver
//     without process listing cannot be probed: such a GPU is read in full every time.
//   - An agent in a private cgroup namespace reads other processes' cgroups as
//     "/../../besteffort/pod<uid>/...": ParseProcCgroup accepts that, but it cannot
//     then see the kubepods ancestor, so run the agent in the host cgroup namespace.
//     On hybrid hosts the v1 memory (else cpu) line is read, never the unified one,
//     where kubelet and the runtime may not place containers.
//   - GetProcessUtilization returns only samples newer than the timestamp passed,
//     so the collector keeps the newest one per device. The driver returns samples
//     only for processes that computed in a sample period, and its period is 1/6 s to
//     1 s depending on the GPU (NVML's documentation), while the loop reads every
//     50 ms: most reads find no newer sample (ERROR_NOT_FOUND is normal). Read as 0,
//     a busy LS process read 0 in 328 of 400 steps on an H200; and the call is the
//     agent's dearest (83–92 % of its CPU there), so it is made only once the
//     driver's next pass can be due (sampleHold.due). The collector holds
//     each process's newest sample (samplehold.go) until a later sampling pass of the
//     device lacks it (another process computed then, this one did not: it reads 0
//     about one pass after it stopped), the device's utilisation reads 0 a sample
//     period after it (nothing computed since), or it is stale (about a second, two
//     sample periods on a slower driver). A
//     process's newest sample counts, not a mean. The first scrape asks for at most
//     the last 2 s (the driver's timestamps are microseconds since the Unix epoch),
//     or a burst long over would read as current. go-nvml answers
//     ERROR_INSUFFICIENT_SIZE with an empty list when the driver counted no sample.
//     The device's own utilisation (GetUtilizationRates) is always the last sample
//     period's and needs no hold.
//   - go-nvml's GetProcessUtilization asks the driver for the sample count, then reads
//     into a buffer that size: a sample arriving in between makes it slice past the
//     buffer and panic (go-nvml v0.13.4-1, device.go; its API takes no buffer of ours).
//     The collector recovers the panic (ErrNVMLPanic), retries once, and else reads no
//     new sample that scrape: the device stays healthy and its held samples stand.
//     Any other panic in a step is recovered by the Manager (recover.go).
//   - Memory is read with GetMemoryInfo_v2: v1 counts the driver's reserved memory as
//     used (615 MiB above nvidia-smi on an H200). A driver without v2
//     (ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_SUPPORTED, ERROR_ARGUMENT_VERSION_MISMATCH)
//     is read with v1, logged once per GPU.
//   - Health is per scrape: a device's first failing query stops its scrape and
//     marks it unhealthy (Err, Fault; ERROR_GPU_IS_LOST wraps ErrDeviceLost), the
//     other devices are still read, and it reads healthy again once its queries
//     succeed. Only a failing device count fails the whole Collect.
//   - ERROR_NOT_SUPPORTED is a capability, not a fault: a GPU in MIG mode reports
//     no utilisation (UtilUnsupported: 0 means unknown, never idle), and a driver
//     without process listing gives no processes. NVML_VALUE_NOT_AVAILABLE memory of
//     a process counts as 0.
//   - MPS caps are fixed when a client starts. Partitions records what it handed out;
//     whether a container really started as that client is not checked (a container
//     that overrides CUDA_MPS_* after the injection still counts as planned). On an H200
//     (driver 580) NVML reported the clients' SM utilisation under the MPS server's PID,
//     not the clients': the server's share is taken out of LS, so on an MPS GPU the
//     lever sees no LS demand per pod and the partition alone protects LS. The server
//     is told by argv[0] (/proc/<pid>/cmdline): its comm is truncated to 15 bytes,
//     "nvidia-cuda-mps", which the control daemon shares.
//   - node-metrics' per-GPU lsFree (publish.go) is 1000 − the larger of LS's peak
//     utilisation in the window and, on an MPS GPU, LS's largest MPS cap: the cap
//     covers the case above where LS's MPS utilisation reads as the server's. The
//     extender sends shares by it: a published share must never overstate what LS
//     leaves (the used part is rounded up; unhealthy: absent, never "free").
//   - The time slices (timesliceloop.go) have no observer outside the tenant: a
//     shim's report is the tenant's word, so every context is unconfirmed and
//     qos.ChooseGPUTimeslice keeps every GPU where batch runs on the freeze (its
//     reason slice-unconfirmed). Only contexts of processes NVML lists on the GPU count: a
//     report line of a process that exited is ignored; a PID reused within a container
//     inherits the old process's lines (the safe side: a self-set stays reported). A
//     container of several GPUs counts each of its contexts on each. Records live in
//     memory: after an agent restart the containers it gave the shim before count as
//     without one (unconfirmed) until created again.
//   - NewCollector takes an initialised library over; Close calls nvmlShutdown
//     (NVML counts Init and Shutdown). go-nvml's mocks panic on any query whose Func
//     is unset: a mock device needs GetUUID, GetName, GetMemoryInfo_v2 (and
//     GetMemoryInfo where v2 fails), GetUtilizationRates, GetComputeRunningProcesses
//     and GetProcessUtilization.
package gpu
