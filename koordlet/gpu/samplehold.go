package gpu

import "time"

// The driver samples per-process utilisation every 1/6 s to 1 s depending on the GPU
// (NVML's documentation; about 1/6 s to 1/3 s measured on an H200), and it returns a
// sample only for a process that computed in a sample period. The loop reads every
// 50 ms, so most reads find no newer sample: read as 0, a busy process flickered to 0 in
// most steps (328 of 400 on the H200). The collector therefore holds each process's
// newest sample (sampleHold) and reports it until one of these says the process went
// idle:
//
//   - a later sampling pass of the device lacked it: the device returned a sample newer
//     than the process's by more than samplePass (another process computed in a later
//     period while this one did not). The pass counts once a read before the current
//     one returned it, so that the samples of one pass read across two reads are never
//     taken as an absence;
//   - the device's own utilisation reads 0 (no kernel ran in its last sample period)
//     and the collector first saw the sample more than a sample period (plus
//     samplePass) ago, so that period lies after the sample's: with nothing computing
//     there is no pass to lack the process, and without this rule a process alone on a
//     GPU (its batch frozen) would read busy until stale;
//   - it is stale: the collector first saw it holdFor ago: sampleHoldPeriods of the
//     device's sample period (the shortest gap seen between passes), at least
//     sampleFresh, at most maxSampleHold, or sampleHoldUnknown while the device has
//     not shown two passes. This is how a process alone on a GPU that stops computing
//     reads 0: no pass comes at all.
//
// The driver is asked only when a pass may be due (sampleHold.due): a read before the
// next pass could come is a read of no newer sample, taken without the call.
//
// So a busy process never reads 0 between two of its samples, and an idle one reads 0
// one pass (plus one read) after it stopped, whether others compute or none does; only
// where the device's utilisation is unknown (or its period is) it takes about a second
// (sampleFresh; longer on a GPU whose driver samples slower than every half second).
const (
	// sampleFresh is the least time a sample is held without a newer one.
	sampleFresh = time.Second
	// sampleHoldPeriods is how many of the device's sample periods a sample is held at
	// least, so that a driver sampling slower than sampleFresh/2 does not flicker.
	sampleHoldPeriods = 2
	// maxSampleHold bounds the hold, whatever the period estimate.
	maxSampleHold = 3 * time.Second
	// sampleHoldUnknown is the hold while the device's period is unknown: twice the
	// longest period NVML documents.
	sampleHoldUnknown = 2 * time.Second
	// samplePass is how far apart timestamps of one sampling pass may lie: well below
	// the shortest sample period the driver uses (1/6 s).
	samplePass = 50 * time.Millisecond
)

// heldSample is a process's newest utilisation sample on one device.
type heldSample struct {
	sm, mem uint32 // percent, as the driver gave them
	ts      uint64 // the driver's timestamp, µs since the Unix epoch
	seen    time.Time
}

// sampleHold is one device's per-process utilisation samples across reads. Not safe for
// concurrent use (the collector serialises its reads).
type sampleHold struct {
	// newest is the newest sample timestamp read: the next read asks for newer ones.
	newest uint64
	// period is the shortest gap (µs) seen between two sampling passes, 0 while unknown.
	period uint64
	// prev is newest before the current read: the passes an absence counts in.
	prev uint64
	// read is when the driver was last asked (the caller's clock).
	read  time.Time
	procs map[uint32]heldSample
}

func newSampleHold() *sampleHold { return &sampleHold{procs: map[uint32]heldSample{}} }

// begin starts a read at now.
func (h *sampleHold) begin() { h.prev = h.newest }

// add records one sample of the current read (any order; a process's newest counts).
func (h *sampleHold) add(pid, sm, mem uint32, ts uint64, now time.Time) {
	if pid == 0 {
		return
	}
	if old, ok := h.procs[pid]; !ok || ts >= old.ts {
		seen := now
		if ok && ts == old.ts {
			seen = old.seen // the same sample read again
		}
		h.procs[pid] = heldSample{sm: sm, mem: mem, ts: ts, seen: seen}
	}
	if ts > h.newest {
		if gap := ts - h.newest; h.newest != 0 && gap > uint64(samplePass.Microseconds()) &&
			(h.period == 0 || gap < h.period) {
			h.period = gap
		}
		h.newest = ts
	}
}

// end finishes the read at now: it drops the samples of processes that went idle (see
// the constants above). devIdle: the device's utilisation read 0 in this read.
func (h *sampleHold) end(now time.Time, devIdle bool) {
	hold := h.holdFor()
	pass := uint64(samplePass.Microseconds())
	quiet := time.Duration(1<<63 - 1)
	if devIdle && h.period > 0 {
		quiet = time.Duration(h.period)*time.Microsecond + samplePass
	}
	for pid, s := range h.procs {
		idle := h.prev > pass && s.ts < h.prev-pass
		if age := now.Sub(s.seen); idle || age >= hold || (age >= quiet && s.ts <= h.prev) {
			delete(h.procs, pid)
		}
	}
}

// holdFor is how long a sample is held without a newer one.
func (h *sampleHold) holdFor() time.Duration {
	if h.period == 0 {
		return sampleHoldUnknown
	}
	p := time.Duration(min(h.period, uint64(maxSampleHold.Microseconds()))) * time.Microsecond
	return min(max(sampleFresh, p*sampleHoldPeriods), maxSampleHold)
}

// due reports whether a read at now may find a sampling pass newer than the newest
// read. None can come before newest + period (period is the shortest gap seen between
// passes), so reads before then would return nothing at the driver's full price
// (nvmlDeviceGetProcessUtilization was 83–92 % of the agent's CPU on an H200 read every
// 50 ms). Due while the period is unknown, and at least every sampleFresh of now's
// clock since the last read (read), whatever the timestamps say: a host clock set back
// must not stop the reads.
func (h *sampleHold) due(now time.Time) bool {
	if h.period == 0 || h.newest == 0 || now.IsZero() || h.read.IsZero() || now.Sub(h.read) >= sampleFresh {
		return true
	}
	at := now.UnixMicro()
	return at <= 0 || uint64(at) >= h.newest+h.period
}

// fresh reports whether the current read returned pid's held sample.
func (h *sampleHold) fresh(pid uint32) bool {
	s, ok := h.procs[pid]
	return ok && s.ts > h.prev
}

// clear forgets every sample (the device reports no per-process utilisation).
func (h *sampleHold) clear() {
	clear(h.procs)
	h.newest, h.prev, h.period, h.read = 0, 0, 0, time.Time{}
}
