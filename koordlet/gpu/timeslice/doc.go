// Package timeslice is the Go side of the per-context GPU time slices (docs/gpu.md,
// "Per-context time slices"): the shim that sets each CUDA context's time-slice group
// (TSG) slice from inside the tenant's process, the driver interface it relies on, and
// the parser of what it reports.
//
//   - shim/ (C, not Go): libunderstory-tsg.so, an LD_PRELOAD library (make tsg-shim),
//     and nvrm_abi.h, the resource-manager numbers and layouts it uses.
//   - abi.go: those numbers as Go constants (the tests hold them equal to nvrm_abi.h),
//     IOWR, the environment the shim reads (what the NRI plugin injects), and the
//     supported driver branches (SupportedBranches, DriverSupported).
//   - report.go: the shim's report lines (version "tsg/1"): Event, ParseLine,
//     ParseReport (bounded, for a file the tenant can write), Event.String.
//   - install.go: Install, the shim copied from the agent's image to the host directory
//     the NRI plugin mounts it from (a temporary file renamed over the old one).
//   - testdata/: a fake of the driver's resource-manager ioctls (fake_rm.c, preloaded
//     after the shim) and a program that drives it (tsgtest.c); timeslicetest builds
//     them with gcc for this package's tests and bench/gpureal's.
//
// Traps:
//   - The report is written by the tenant's own process: an event whose slice was set
//     and read back equal (Event.ClaimsApplied) is the tenant's claim, never
//     confirmation. Confirmation must come from outside the tenant (an observer of the
//     driver's ioctl entry, not built yet); until then every context counts as
//     unconfirmed and the agent keeps the freeze (koordlet/gpu, timesliceloop.go).
//   - GET_TIMESLICE returns what the driver's kernel module recorded when the firmware
//     accepted the value, not what the hardware runs: a read-back equal to the value
//     asked says only that the driver said yes.
//   - Nothing here runs on a GPU yet: the numbers come from the open kernel modules'
//     headers, the tests run the shim against the fake driver.
package timeslice
