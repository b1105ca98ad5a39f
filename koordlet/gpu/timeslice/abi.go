package timeslice

import (
	"slices"
	"strconv"
	"strings"
)

// The NVIDIA resource manager's ioctl interface as the shim uses it, read from the open
// kernel modules (kernel-open/common/inc/nv-ioctl-numbers.h and nv-ioctl.h,
// src/nvidia/arch/nvalloc/unix/include/nv_escape.h, src/common/sdk/nvidia/inc/nvos.h,
// class/cla06c.h and ctrl/ctrla06c.h): the same in every release from 535.43.02 to
// 595.45.04. shim/nvrm_abi.h holds the same numbers for C; the tests keep them equal.
const (
	// IoctlMagic is the type of every driver ioctl; the kernel module dispatches on the
	// number and the size only.
	IoctlMagic = 'F'
	// IoctlBase is the first of the driver's own (non-RM) ioctl numbers.
	IoctlBase = 200
	// EscCheckVersionStr exchanges version strings with the kernel module.
	EscCheckVersionStr = IoctlBase + 10
	// EscIoctlXferCmd carries the real number, size and pointer in its 16-byte block.
	EscIoctlXferCmd = IoctlBase + 11
	// EscRMFree, EscRMControl and EscRMAlloc are the resource manager's free, control
	// and alloc ioctls.
	EscRMFree    = 0x29
	EscRMControl = 0x2A
	EscRMAlloc   = 0x2B

	// ClassKeplerChannelGroupA is the channel group (time-slice group, TSG) class, the
	// only one from Kepler to Blackwell.
	ClassKeplerChannelGroupA = 0xA06C
	// CtrlCmdSetTimeslice and CtrlCmdGetTimeslice set and read a channel group's slice
	// in microseconds (a 64-bit parameter).
	CtrlCmdSetTimeslice = 0xA06C0103
	CtrlCmdGetTimeslice = 0xA06C0104
	// RMControlFlagSerialized marks a control whose parameters are serialized, not the
	// plain structure: the shim passes such a call through untouched.
	RMControlFlagSerialized = 0x4
	// RMAPIVersionCmdQuery asks the kernel module its version without checking one.
	RMAPIVersionCmdQuery = '2'

	// The parameter blocks' sizes (they are in each request word).
	SizeRMAlloc21       = 32 // NVOS21_PARAMETERS
	SizeRMAlloc64       = 48 // NVOS64_PARAMETERS
	SizeRMControl       = 32 // NVOS54_PARAMETERS
	SizeXfer            = 16 // nv_ioctl_xfer_t
	SizeRMAPIVersion    = 72 // nv_ioctl_rm_api_version_t
	SizeTimesliceParams = 8  // NVA06C_CTRL_TIMESLICE_PARAMS

	// StatusOK is the resource manager's NV_OK.
	StatusOK = 0
)

// What the shim reads from its environment: the NRI plugin's part.
const (
	// EnvTimesliceUS is the slice in microseconds, a plain decimal in 1..MaxTimesliceUS;
	// absent, the shim changes nothing and only reports.
	EnvTimesliceUS = "UNDERSTORY_TSG_TIMESLICE_US"
	// EnvReport names the report file, or a directory in which each process writes
	// tsg-<pid>.log.
	EnvReport = "UNDERSTORY_TSG_REPORT"
	// EnvReportMaxBytes bounds a report file (default DefaultReportMaxBytes).
	EnvReportMaxBytes = "UNDERSTORY_TSG_REPORT_MAX_BYTES"
	// MaxTimesliceUS is the largest slice the shim accepts (100 s).
	MaxTimesliceUS = 100_000_000
	// DefaultReportMaxBytes is a report file's default bound.
	DefaultReportMaxBytes = 1 << 20
)

// IOWR is the request word of a read-write ioctl of the driver's type with the given
// number and parameter size, as the C library's _IOWR('F', nr, size) builds it.
func IOWR(nr, size uint32) uint32 {
	return 3<<30 | (size&0x3fff)<<16 | IoctlMagic<<8 | nr&0xff
}

// SupportedBranches returns the driver branches (major versions) whose open-module
// headers were read and found to hold the numbers and layouts above: 535, 545, 550,
// 555, 560, 565, 570, 575, 580, 590 and 595, every tag of each from 535.43.02 to
// 595.45.04. 530 and older differ (NVOS21 and NVOS64 lacked paramsSize before 535,
// and the version query came with 530.30.02); any branch not listed is unsupported
// until its headers are read.
func SupportedBranches() []int {
	return []int{535, 545, 550, 555, 560, 565, 570, 575, 580, 590, 595}
}

// DriverSupported says whether a kernel module version string ("580.159.04") is of a
// supported branch: its leading decimal digits, followed by a dot, name one.
func DriverSupported(version string) bool {
	major, _, ok := strings.Cut(version, ".")
	if !ok || major == "" || len(major) > 6 || strings.TrimLeft(major, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(major)
	return err == nil && slices.Contains(SupportedBranches(), n)
}
