package qos

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of [GPUMPSPolicy], from the levers tried by hand on an H200 (bench/gpureal; LS: 100
// requests/s of 17 bf16 4096² matmuls, ≈33 % busy alone; batch: 8192² matmuls back to
// back):
//
//	MPS, batch unlimited (client priority 0 or 1)        LS starved, p99 25-26 s
//	MPS, batch 50 % + client priority 1                  LS p99 1.99× alone, batch 328/s
//	MPS, batch 25 %, equal priority                      LS p99 3.10×,       batch 193/s
//	MPS, LS 75 % + batch 25 % + batch client priority 1  LS p99 1.40×,       batch 192/s (55 % of time-sliced)
//
// The best is the last: LS and batch in disjoint partitions, batch at priority 1. So
// batch's cap is at most 25 % (MaxBatchPercent) and LS gets the rest; LS's measured
// demand plus 25 points of headroom (33 + 25 = 58 ≤ 75 there) squeezes batch further
// down to MinBatchPercent (10) when LS needs more; below that batch is frozen instead
// while LS needs the GPU (GPUReasonMPSCapStale).
const (
	DefaultGPUMPSLSHeadroomPercent   = 25.0
	DefaultGPUMPSMinBatchPercent     = 10
	DefaultGPUMPSMaxBatchPercent     = 25
	DefaultGPUMPSFreezeMarginPercent = 5.0
	DefaultGPUMPSDemandWindow        = time.Minute
	// GPUMPSBatchPriority and GPUMPSLSPriority are the CUDA_MPS_CLIENT_PRIORITY values:
	// batch below LS (1 is the lowest CUDA offers, 0 the default).
	GPUMPSBatchPriority = 1
	GPUMPSLSPriority    = 0
	// milliPerPercent: understory.io/gpu-milli is 1000 per GPU.
	milliPerPercent = 10
)

// GPUMPSPolicy chooses MPS partitions (gpu.throttle.mps.*).
type GPUMPSPolicy struct {
	// LSHeadroomPercent is added to LS's measured demand (its recent peak of SM
	// utilisation, percent) for the share batch must leave LS, in [0, 100].
	LSHeadroomPercent float64 `json:"lsHeadroomPercent"`
	// MinBatchPercent is the smallest SM cap batch gets however much LS needs, in
	// [1, maxBatchPercent]: LS's demand is measured when a batch client starts and may
	// fall later, and a cap is fixed for the client's life. LS's requests
	// (understory.io/gpu-milli) are never squeezed: the cap can go below it for them.
	MinBatchPercent int `json:"minBatchPercent"`
	// MaxBatchPercent is the largest SM cap batch gets, in [minBatchPercent, 99]: never
	// an unlimited batch client next to LS (that starved LS).
	MaxBatchPercent int `json:"maxBatchPercent"`
	// FreezeMarginPercent: LS utilisation within this many points of what its partition
	// protects freezes batch (GPUReasonMPSCapStale), in [0, 100].
	FreezeMarginPercent float64 `json:"freezeMarginPercent"`
	// DemandWindow is how far back LS's demand peak reaches, in [1s, 1h].
	DemandWindow metav1.Duration `json:"demandWindow"`
	// LSCapPercent is the LS clients' cap, in [0, 100]. 0 (the default): the rest,
	// 100 − batch's cap, so the two partitions are disjoint. 1..100: that cap, but never
	// below 100 − batch's cap; 100 lets LS use every SM, batch's partition overlapping
	// it at client priority 1. An LS cap below 100 slows LS even alone: on the H200, LS
	// at 75 % read p50 4.08 ms with batch frozen against 3.24 ms without MPS.
	LSCapPercent int `json:"lsCapPercent,omitempty"`
}

// DefaultGPUMPSPolicy returns the defaults. It passes Validate.
func DefaultGPUMPSPolicy() GPUMPSPolicy {
	return GPUMPSPolicy{
		LSHeadroomPercent:   DefaultGPUMPSLSHeadroomPercent,
		MinBatchPercent:     DefaultGPUMPSMinBatchPercent,
		MaxBatchPercent:     DefaultGPUMPSMaxBatchPercent,
		FreezeMarginPercent: DefaultGPUMPSFreezeMarginPercent,
		DemandWindow:        metav1.Duration{Duration: DefaultGPUMPSDemandWindow},
	}
}

// Bounds of GPUMPSPolicy.DemandWindow.
const (
	MinGPUMPSDemandWindow = time.Second
	MaxGPUMPSDemandWindow = time.Hour
)

// Validate reports every out-of-range field, named by its YAML key under mps, each
// wrapping ErrInvalidConfig.
func (p GPUMPSPolicy) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("gpu throttle mps.%s: %v %s: %w", field, v, rule, ErrInvalidConfig))
	}
	if !(p.LSHeadroomPercent >= 0 && p.LSHeadroomPercent <= 100) {
		bad("lsHeadroomPercent", p.LSHeadroomPercent, "must be in [0, 100]")
	}
	maxOK := p.MaxBatchPercent >= 1 && p.MaxBatchPercent <= 99
	if !maxOK {
		bad("maxBatchPercent", p.MaxBatchPercent, "must be in [1, 99]: never an unlimited batch client")
	}
	switch {
	case p.MinBatchPercent < 1 || p.MinBatchPercent > 99:
		bad("minBatchPercent", p.MinBatchPercent, "must be in [1, maxBatchPercent]")
	case maxOK && p.MinBatchPercent > p.MaxBatchPercent:
		bad("minBatchPercent", p.MinBatchPercent, fmt.Sprintf("must not exceed maxBatchPercent (%d)", p.MaxBatchPercent))
	}
	if !(p.FreezeMarginPercent >= 0 && p.FreezeMarginPercent <= 100) {
		bad("freezeMarginPercent", p.FreezeMarginPercent, "must be in [0, 100]")
	}
	if p.LSCapPercent < 0 || p.LSCapPercent > 100 {
		bad("lsCapPercent", p.LSCapPercent, "must be in [0, 100] (0: the rest, 100 − batch's cap)")
	}
	if w := p.DemandWindow.Duration; w < MinGPUMPSDemandWindow || w > MaxGPUMPSDemandWindow {
		bad("demandWindow", w, fmt.Sprintf("must be in [%v, %v]", MinGPUMPSDemandWindow, MaxGPUMPSDemandWindow))
	}
	return errors.Join(errs...)
}

// forceGPUMPSRange maps out-of-range fields to their defaults (bounded by the fields
// they depend on); the result passes Validate.
func forceGPUMPSRange(p GPUMPSPolicy) GPUMPSPolicy {
	if !(p.LSHeadroomPercent >= 0 && p.LSHeadroomPercent <= 100) {
		p.LSHeadroomPercent = DefaultGPUMPSLSHeadroomPercent
	}
	if p.MaxBatchPercent < 1 || p.MaxBatchPercent > 99 {
		p.MaxBatchPercent = DefaultGPUMPSMaxBatchPercent
	}
	if p.MinBatchPercent < 1 || p.MinBatchPercent > p.MaxBatchPercent {
		p.MinBatchPercent = min(DefaultGPUMPSMinBatchPercent, p.MaxBatchPercent)
	}
	if !(p.FreezeMarginPercent >= 0 && p.FreezeMarginPercent <= 100) {
		p.FreezeMarginPercent = DefaultGPUMPSFreezeMarginPercent
	}
	if w := p.DemandWindow.Duration; w < MinGPUMPSDemandWindow || w > MaxGPUMPSDemandWindow {
		p.DemandWindow.Duration = DefaultGPUMPSDemandWindow
	}
	if p.LSCapPercent < 0 || p.LSCapPercent > 100 {
		p.LSCapPercent = 0
	}
	return p
}

// GPUMPSCapInput is what the cap choice knows of one GPU when a client starts.
type GPUMPSCapInput struct {
	// LSDemandPercent is LS's recent peak SM utilisation of the GPU, percent (NaN,
	// infinite or negative: unknown, taken as 100).
	LSDemandPercent float64
	// LSRequestMilli are the understory.io/gpu-milli requests of the LS containers on the
	// GPU (each bounded to [0, 1000], their sum to 1000).
	LSRequestMilli []int64
	// BatchRequestMilli is the starting batch container's own request (0 when the client
	// is LS or has none).
	BatchRequestMilli int64
}

// GPUMPSCaps are the CUDA_MPS_ACTIVE_THREAD_PERCENTAGE values for one GPU's clients.
type GPUMPSCaps struct {
	// LSPercent + BatchPercent = 100 (disjoint partitions) unless the policy's
	// lsCapPercent raises LS's cap above the rest. 1 <= BatchPercent <= 99.
	LSPercent, BatchPercent int
	// Reason says what bound the batch cap.
	Reason string
}

// ChooseGPUMPSCaps returns the SM caps for an LS and a batch client on one GPU:
//
//	reserve   = max(ceil(LS demand + headroom), ceil(LS requests / 10))   percent of SMs
//	batch     = min(maxBatchPercent, 100 - reserve)
//	batch     = max(batch, min(max(minBatchPercent, ceil(batch request / 10)), maxBatchPercent))
//	batch     = min(batch, 100 - ceil(LS requests / 10)), at least 1
//	LS        = 100 - batch, or max(lsCapPercent, 100 - batch) where lsCapPercent is set
//
// so batch is never unlimited (< 100), never above maxBatchPercent, never eats into LS's
// requests, and LS's cap covers its requests (requests of 990 milli or more leave batch
// 1 %). A batch request above maxBatchPercent is not honoured: batch at 50 % doubled
// LS's p99 on the real GPU.
func ChooseGPUMPSCaps(p GPUMPSPolicy, in GPUMPSCapInput) GPUMPSCaps {
	p = forceGPUMPSRange(p)
	demand := in.LSDemandPercent
	var notes string
	switch {
	case math.IsNaN(demand) || math.IsInf(demand, 0) || demand < 0:
		notes = fmt.Sprintf("; LS demand %v unusable: taken as 100", demand)
		demand = 100
	case demand > 100:
		demand = 100
	}
	var reqMilli int64
	for _, r := range in.LSRequestMilli {
		reqMilli += min(max(r, 0), 1000)
	}
	reqMilli = min(reqMilli, 1000)
	reqPct := min(ceilDiv(reqMilli, milliPerPercent), 99) // batch keeps 1 % at least
	need := int(math.Ceil(math.Min(demand+p.LSHeadroomPercent, 100)))
	reserve := max(need, reqPct)

	batch := min(p.MaxBatchPercent, 100-reserve)
	reason := fmt.Sprintf("batch at its most (%d %%): LS demand %.0f %% + headroom %.0f fits in %d %%",
		p.MaxBatchPercent, demand, p.LSHeadroomPercent, 100-p.MaxBatchPercent)
	if batch < p.MaxBatchPercent {
		reason = fmt.Sprintf("batch squeezed to %d %%: LS demand %.0f %% + headroom %.0f, requests %d milli",
			batch, demand, p.LSHeadroomPercent, reqMilli)
	}
	batchReq := ceilDiv(min(max(in.BatchRequestMilli, 0), 1000), milliPerPercent)
	if floor := min(max(p.MinBatchPercent, batchReq), p.MaxBatchPercent); batch < floor {
		batch = floor
		reason = fmt.Sprintf("batch at its floor (%d %%: minBatchPercent or its request); "+
			"LS above %d %% freezes it", floor, 100-floor)
	}
	if hi := 100 - reqPct; batch > hi {
		batch = hi
		reason = fmt.Sprintf("batch bounded to %d %% by LS requests of %d milli", hi, reqMilli)
	}
	batch = min(max(batch, 1), 99)
	ls := 100 - batch
	if p.LSCapPercent > ls {
		ls = p.LSCapPercent
		notes += fmt.Sprintf("; LS cap %d %% (lsCapPercent) overlaps batch's partition", ls)
	}
	return GPUMPSCaps{LSPercent: ls, BatchPercent: batch, Reason: reason + notes}
}

// ceilDiv is ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int {
	return int((a + b - 1) / b)
}

// GPUDemandPeak is the peak of a series (LS's SM utilisation of one GPU) over the last
// window to two windows: two buckets of one window each, so Observe allocates nothing.
// The zero value is empty; it is not safe for concurrent use.
type GPUDemandPeak struct {
	start     time.Time // the current bucket's start
	cur, prev float64
	has       bool
}

// Observe adds v at now and returns the peak of the samples of the last window at least
// (two at most). NaN or infinite v counts as 100, negative as 0; a clock that goes back
// restarts the peak at v.
func (g *GPUDemandPeak) Observe(now time.Time, v float64, window time.Duration) float64 {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		v = 100
	case v < 0:
		v = 0
	}
	window = max(window, time.Nanosecond)
	switch el := now.Sub(g.start); {
	case !g.has || el < 0 || el >= 2*window:
		// First sample, clock back, or both buckets are older than the window.
		g.start, g.cur, g.prev, g.has = now, v, 0, true
	case el >= window:
		g.start, g.prev, g.cur = g.start.Add(window), g.cur, v
	default:
		g.cur = math.Max(g.cur, v)
	}
	return math.Max(g.cur, g.prev)
}

// Peak returns the peak without adding a sample (0 when empty).
func (g *GPUDemandPeak) Peak() float64 {
	if !g.has {
		return 0
	}
	return math.Max(g.cur, g.prev)
}

// GPU memory limits of MPS clients. MPS reserves no device memory per client: without a
// limit a batch client can allocate the whole GPU and LS's next allocation fails. CUDA
// bounds what one client may allocate through CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, read by
// the client's own CUDA driver at its initialisation, so batch clients get a limit from
// their share and LS keeps the rest.
const (
	// GPUMPSEnvPinnedDeviceMemLimit is the variable: a comma list of
	// "<device ordinal>=<value><unit>", the ordinals as the client enumerates its devices
	// (NVIDIA's MPS documentation).
	GPUMPSEnvPinnedDeviceMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// MinGPUMPSMemLimitMiB is the smallest limit handed out: never 0, which is no
	// allocation CUDA could grant and which the agent cannot be sure CUDA does not read
	// as "no limit". Higher floors would hand batch memory that LS's requests hold, so a
	// batch share squeezed to nothing gets 1 MiB: its allocations fail, LS's do not.
	MinGPUMPSMemLimitMiB = 1
	// bytesPerMiB is one MiB, the limit's unit (the "M" of the variable's values).
	bytesPerMiB = 1 << 20
	// milliPerGPU is a whole GPU in understory.io/gpu-milli.
	milliPerGPU = 1000
)

// GPUMPSMemInput is what the memory limit choice knows of one GPU and one client when
// the client starts.
type GPUMPSMemInput struct {
	// Batch: the client is of a batch pod. LS clients get no limit.
	Batch bool
	// TotalBytes is the GPU's memory as NVML reports it (its total, the driver's reserve
	// included); 0: unknown.
	TotalBytes uint64
	// BatchRequestMilli is the batch container's understory.io/gpu-milli request
	// (0..1000; 1000 for whole GPUs).
	BatchRequestMilli int64
	// LSRequestMilli are the gpu-milli requests of the LS clients on the GPU.
	LSRequestMilli []int64
}

// GPUMPSMemLimit is one client's pinned device memory limit.
type GPUMPSMemLimit struct {
	// MiB is the limit in MiB (2^20 bytes); 0: no limit.
	MiB uint64
	// Reason says how it was chosen, or why there is none.
	Reason string
}

// ChooseGPUMPSMemLimit returns a client's pinned device memory limit on one GPU:
//
//	share = min(batch request, 1000 − LS requests)           gpu-milli, each in [0, 1000]
//	limit = max(⌊total × share / 1000 / 2^20⌋, MinGPUMPSMemLimitMiB)   MiB
//
// so a batch client may allocate its share of the GPU's memory, rounded down to whole
// MiB, and never memory the LS clients' requests hold (its request is what the extender
// placed it by; a whole-GPU batch container on a GPU with LS requests gets only what they
// leave). No limit (MiB 0) for an LS client (LS keeps what batch's limits leave), for a
// batch client without a request, and where the GPU's memory is unknown: then nothing
// bounds batch's memory, and LS keeps its memory only while the extender's placement
// (requests summing to at most 1000 per GPU) matches what batch really allocates.
func ChooseGPUMPSMemLimit(in GPUMPSMemInput) GPUMPSMemLimit {
	switch {
	case !in.Batch:
		return GPUMPSMemLimit{Reason: "LS: no memory limit (LS keeps what batch's limits leave)"}
	case in.BatchRequestMilli <= 0:
		return GPUMPSMemLimit{Reason: "batch without a gpu-milli request: no memory limit"}
	case in.TotalBytes == 0:
		return GPUMPSMemLimit{Reason: "the GPU's memory is unknown: no memory limit"}
	}
	var lsMilli int64
	for _, r := range in.LSRequestMilli {
		lsMilli += min(max(r, 0), milliPerGPU)
	}
	lsMilli = min(lsMilli, milliPerGPU)
	req := min(in.BatchRequestMilli, milliPerGPU)
	share := min(req, milliPerGPU-lsMilli)
	// ⌊total × share / (1000 × 2^20)⌋ without total × share, which could pass 64 bits:
	// total = a × unit + b with b < unit (about 2^30), so b × share stays below 2^40.
	const unit = milliPerGPU * bytesPerMiB
	a, b := in.TotalBytes/unit, in.TotalBytes%unit
	q := a*uint64(share) + b*uint64(share)/unit
	limit := max(q, MinGPUMPSMemLimitMiB)
	reason := fmt.Sprintf("batch memory limit %d MiB: %d milli of %d MiB", limit, share, in.TotalBytes/bytesPerMiB)
	if share < req {
		reason += fmt.Sprintf(" (its request of %d milli bounded by LS requests of %d milli)", req, lsMilli)
	}
	return GPUMPSMemLimit{MiB: limit, Reason: reason}
}

// GPUMPSPinnedMemLimitValue is the CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value that limits
// each of a client's first devices CUDA devices (ordinals 0 to devices−1) to limitMiB:
// "0=<limit>M,1=<limit>M,...". The same value on every ordinal holds whatever order the
// client enumerates its devices in. "" when limitMiB is 0 or devices < 1 (no limit).
func GPUMPSPinnedMemLimitValue(devices int, limitMiB uint64) string {
	if limitMiB == 0 || devices < 1 {
		return ""
	}
	v := strconv.FormatUint(limitMiB, 10) + "M"
	b := make([]byte, 0, devices*(len(v)+4))
	for i := range devices {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, '=')
		b = append(b, v...)
	}
	return string(b)
}
