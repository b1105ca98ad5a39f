package qos

import (
	"fmt"
	"math"
	"strings"
)

// GPUMPSClientRead is what the agent could read of one batch MPS client process from
// outside it.
type GPUMPSClientRead uint8

const (
	// GPUMPSClientReadOK: its environment was read (GPUMPSClientObs.Cap and Priority).
	GPUMPSClientReadOK GPUMPSClientRead = iota
	// GPUMPSClientGone: the process exited; it runs nothing more.
	GPUMPSClientGone
	// GPUMPSClientUnreadable: its environment could not be read (no permission, an
	// oversized file, any error but the process being gone).
	GPUMPSClientUnreadable
	// GPUMPSClientUnknown: a client of the node's MPS server that belongs to no pod the
	// partitions planned as a client, so it has no planned cap to hold it to.
	GPUMPSClientUnknown
)

// Names of the CUDA variables an MPS client reads at its CUDA initialisation.
const (
	GPUMPSEnvActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	GPUMPSEnvClientPriority         = "CUDA_MPS_CLIENT_PRIORITY"
)

// GPUMPSClientObs is one batch MPS client process of a GPU, as the agent read it.
type GPUMPSClientObs struct {
	PID  int
	Read GPUMPSClientRead
	// Detail says why it is unreadable or unknown.
	Detail string
	// PlannedCapPercent and PlannedPriority are the cap and client priority the
	// partitions planned for the client's pod on the GPU.
	PlannedCapPercent, PlannedPriority int
	// Cap and Priority are the values of CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
	// CUDA_MPS_CLIENT_PRIORITY in the environment the process was started with (the
	// first of each, as getenv reads them); CapSet and PrioritySet whether it had them.
	Cap, Priority       string
	CapSet, PrioritySet bool
	// ServerCapPercent is the active thread percentage the MPS control daemon reports for
	// the server the client is connected to (0: not known). A client's own value can only
	// lower it, so a server limit at or below the planned cap holds whatever the client
	// set.
	ServerCapPercent float64
	// PlannedMemLimitMiB is the pinned device memory limit the partitions handed the
	// client's pod on the GPU, MiB (0: none, nothing to confirm), on each of its
	// PlannedMemDevices CUDA devices (ordinals 0 to PlannedMemDevices−1; 0 counts as 1).
	PlannedMemLimitMiB uint64
	PlannedMemDevices  int
	// MemLimit is the first CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of its environment;
	// MemLimitSet whether it had one.
	MemLimit    string
	MemLimitSet bool
}

// CheckGPUMPSClients returns "" when every batch MPS client of one GPU is confirmed to run
// within its planned SM cap at its planned priority or lower; otherwise why not, naming
// the first client that is not. A GPU whose check fails leaves the MPS lever for the
// freeze (GPUThrottleInput.MPSCapUnconfirmed).
//
// Per client: a process that exited is fine. Its cap is confirmed when the daemon caps
// its server at or below the planned cap, or when its environment sets
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE to a whole number in [1, planned cap]. Its priority
// is confirmed when its environment sets CUDA_MPS_CLIENT_PRIORITY to 0 or 1, at least
// the planned value (a larger number is a lower priority); the priority is read only on
// the client's side, so no daemon view confirms it. Where a memory limit was planned, it
// is confirmed when its environment sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT to a list that
// limits every planned ordinal to at most the planned MiB (checkGPUMPSMemLimit); the
// agent sets no daemon-side limit, so only the client's side confirms it. Everything else
// (an unreadable environment, a client of no planned pod, a missing, malformed or larger
// value, no planned cap) is unconfirmed: only what the agent read counts.
func CheckGPUMPSClients(cs []GPUMPSClientObs) string {
	for _, c := range cs {
		if why := checkGPUMPSClient(c); why != "" {
			return why
		}
	}
	return ""
}

// checkGPUMPSClient is CheckGPUMPSClients for one client.
func checkGPUMPSClient(c GPUMPSClientObs) string {
	switch c.Read {
	case GPUMPSClientGone:
		return ""
	case GPUMPSClientUnreadable:
		return fmt.Sprintf("batch MPS client pid %d: environment unreadable (%s)", c.PID, clipNote(c.Detail))
	case GPUMPSClientUnknown:
		return fmt.Sprintf("MPS client pid %d of no planned batch or LS client (%s)", c.PID, clipNote(c.Detail))
	case GPUMPSClientReadOK:
	default:
		return fmt.Sprintf("batch MPS client pid %d: read state %d unknown", c.PID, c.Read)
	}
	if c.PlannedCapPercent < 1 || c.PlannedCapPercent > 99 {
		return fmt.Sprintf("batch MPS client pid %d: no planned cap (%d)", c.PID, c.PlannedCapPercent)
	}
	serverHolds := c.ServerCapPercent > 0 && !math.IsNaN(c.ServerCapPercent) &&
		c.ServerCapPercent <= float64(c.PlannedCapPercent)
	if !serverHolds {
		switch v, ok := parseGPUMPSNumber(c.Cap, 100); {
		case !c.CapSet:
			return fmt.Sprintf("batch MPS client pid %d runs without %s (planned %d %%)", c.PID,
				GPUMPSEnvActiveThreadPercentage, c.PlannedCapPercent)
		case !ok || v < 1:
			return fmt.Sprintf("batch MPS client pid %d: %s=%q is no cap in [1, 100] (planned %d %%)", c.PID,
				GPUMPSEnvActiveThreadPercentage, clipNote(c.Cap), c.PlannedCapPercent)
		case v > c.PlannedCapPercent:
			return fmt.Sprintf("batch MPS client pid %d runs at %s=%d, above its planned %d %%", c.PID,
				GPUMPSEnvActiveThreadPercentage, v, c.PlannedCapPercent)
		}
	}
	switch v, ok := parseGPUMPSNumber(c.Priority, GPUMPSBatchPriority); {
	case !c.PrioritySet:
		return fmt.Sprintf("batch MPS client pid %d runs without %s (planned %d; CUDA's default 0 is LS's)", c.PID,
			GPUMPSEnvClientPriority, c.PlannedPriority)
	case !ok:
		return fmt.Sprintf("batch MPS client pid %d: %s=%q is no priority in [0, %d] (planned %d)", c.PID,
			GPUMPSEnvClientPriority, clipNote(c.Priority), GPUMPSBatchPriority, c.PlannedPriority)
	case v < c.PlannedPriority:
		return fmt.Sprintf("batch MPS client pid %d runs at %s=%d, a higher priority than its planned %d", c.PID,
			GPUMPSEnvClientPriority, v, c.PlannedPriority)
	}
	if c.PlannedMemLimitMiB == 0 {
		return ""
	}
	devices := max(c.PlannedMemDevices, 1)
	if devices > maxGPUMPSOrdinals {
		return fmt.Sprintf("batch MPS client pid %d: a memory limit planned on %d devices, more than the %d the check reads",
			c.PID, devices, maxGPUMPSOrdinals)
	}
	if !c.MemLimitSet {
		return fmt.Sprintf("batch MPS client pid %d runs without %s (planned %d MiB on %d device(s))", c.PID,
			GPUMPSEnvPinnedDeviceMemLimit, c.PlannedMemLimitMiB, devices)
	}
	if why := checkGPUMPSMemLimit(c.MemLimit, devices, c.PlannedMemLimitMiB); why != "" {
		return fmt.Sprintf("batch MPS client pid %d: %s=%q %s", c.PID, GPUMPSEnvPinnedDeviceMemLimit,
			clipNote(c.MemLimit), why)
	}
	return ""
}

// maxGPUMPSOrdinals bounds the device ordinals of a memory limit the check reads (a node
// with more GPUs is not one this agent partitions).
const maxGPUMPSOrdinals = 64

// checkGPUMPSMemLimit returns "" when v, a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value, limits
// each ordinal 0 to devices−1 to at most planned MiB, else what is wrong. Only the form
// the agent writes and its plain variants count: entries "<ordinal>=<digits>M" or
// "<digits>G" (MiB, GiB) separated by single commas, ordinals below 64, each at most once,
// values from 1 up; entries for other ordinals are allowed. Anything else (a space, a
// sign, another unit, no unit, an empty entry, 0, an ordinal twice) confirms nothing:
// the agent cannot be sure CUDA reads it the same way.
func checkGPUMPSMemLimit(v string, devices int, planned uint64) string {
	var seen, over uint64 // bit i: ordinal i
	var overMiB uint64
	for rest := v; ; {
		entry, tail, more := strings.Cut(rest, ",")
		ord, val, ok := strings.Cut(entry, "=")
		o, okOrd := parseGPUMPSNumber(ord, maxGPUMPSOrdinals-1)
		m, okVal := parseGPUMPSMiB(val)
		switch {
		case !ok || !okOrd || !okVal:
			return fmt.Sprintf("is no limit list of <ordinal>=<n>M entries (entry %q; planned %d MiB)",
				clipNote(entry), planned)
		case seen&(1<<o) != 0:
			return fmt.Sprintf("names device %d twice (planned %d MiB)", o, planned)
		}
		seen |= 1 << o
		if o < devices && m > planned && over == 0 {
			over, overMiB = 1<<o, m
		}
		if !more {
			break
		}
		rest = tail
	}
	for o := range devices {
		if seen&(1<<o) == 0 {
			return fmt.Sprintf("leaves device %d without a limit (planned %d MiB)", o, planned)
		}
		if over&(1<<o) != 0 {
			return fmt.Sprintf("limits device %d to %d MiB, above its planned %d MiB", o, overMiB, planned)
		}
	}
	return ""
}

// parseGPUMPSMiB parses a memory value of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as MiB: 1 to
// 12 decimal digits and the unit M (MiB) or G (GiB), at least 1 MiB.
func parseGPUMPSMiB(s string) (uint64, bool) {
	if len(s) < 2 || len(s) > 13 {
		return 0, false
	}
	var scale uint64
	switch s[len(s)-1] {
	case 'M':
		scale = 1
	case 'G':
		scale = 1024
	default:
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s)-1; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v * scale, v > 0
}

// parseGPUMPSNumber parses a whole number in [0, most] written as 1 to 3 decimal digits,
// nothing else (no sign, space or fraction: what the agent cannot be sure CUDA reads the
// same way does not confirm a cap).
func parseGPUMPSNumber(s string, most int) (int, bool) {
	if len(s) == 0 || len(s) > 3 {
		return 0, false
	}
	v := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, v <= most
}

// clipNote shortens outside input quoted in a reason.
func clipNote(s string) string {
	const most = 80
	if len(s) > most {
		return s[:most] + "..."
	}
	return s
}
