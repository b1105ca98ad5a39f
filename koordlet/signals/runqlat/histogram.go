package runqlat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// NumBuckets is the number of log2 buckets of a Histogram (NUM_BUCKETS in
// bpf/runqlat.c).
const NumBuckets = 26

// rawHistogramSize is the size of the kernel's struct hist: the buckets,
// count, sum_ns and batch, each a u64.
const rawHistogramSize = (NumBuckets + 3) * 8

// ErrMalformed: a raw histogram of the wrong size.
var ErrMalformed = errors.New("malformed run-queue histogram")

// Histogram is the cumulative run-queue delay of one watched cgroup (or pod)
// since Watch: Buckets[i] counts delays d with 2^i µs <= d < 2^(i+1) µs
// (bucket 0 also those under 1 µs, the last one everything from 2^25 µs,
// about 34 s, up), Count the delays and SumNs their sum.
//
// Batch counts the delays at or above the slow-event threshold
// (Probe.SetThreshold; none while it is 0) that ended by taking the CPU from
// a batch task: one with SCHED_IDLE, or below a cgroup with cpu.idle (how the
// agent runs batch). Those are the slow delays batch caused; the others were
// spent behind LS or system tasks, which taking CPU from batch cannot shorten.
// A probe attached with classic tracepoints cannot see the task switched out
// and counts every slow delay here.
//
// The kernel adds to the buckets, Count and SumNs one after the other, so a
// Histogram read while tasks run may have Count differ from the sum of its
// buckets by a few: Total, Quantile and the collector use the buckets.
type Histogram struct {
	Buckets [NumBuckets]uint64
	Count   uint64
	SumNs   uint64
	Batch   uint64
}

// DecodeHistogram decodes the value of the kernel's histogram map (native
// byte order; only little-endian is built). It wants exactly the kernel
// struct's size.
func DecodeHistogram(b []byte) (Histogram, error) {
	var h Histogram
	if len(b) != rawHistogramSize {
		return h, fmt.Errorf("%w: %d bytes, want %d", ErrMalformed, len(b), rawHistogramSize)
	}
	for i := range h.Buckets {
		h.Buckets[i] = binary.NativeEndian.Uint64(b[i*8:])
	}
	h.Count = binary.NativeEndian.Uint64(b[NumBuckets*8:])
	h.SumNs = binary.NativeEndian.Uint64(b[(NumBuckets+1)*8:])
	h.Batch = binary.NativeEndian.Uint64(b[(NumBuckets+2)*8:])
	return h, nil
}

// BucketUpper is the exclusive upper bound of bucket i: 2^(i+1) µs. The last
// bucket has none: BucketUpper(NumBuckets-1) is math.MaxInt64 (about 292
// years), and so is anything past it. A negative i has 0.
func BucketUpper(i int) time.Duration {
	switch {
	case i < 0:
		return 0
	case i >= NumBuckets-1:
		return math.MaxInt64
	}
	return time.Duration(uint64(2)<<i) * time.Microsecond
}

// Total is the number of delays in the buckets.
func (h Histogram) Total() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// Sub is what happened between a previous read prev and h. When any counter
// of h is below prev's, the histogram was reset in between (unwatched and
// watched again, or the probe reloaded) and h itself, all counted since the
// reset, is returned.
func (h Histogram) Sub(prev Histogram) Histogram {
	if h.Count < prev.Count || h.SumNs < prev.SumNs || h.Batch < prev.Batch {
		return h
	}
	for i := range h.Buckets {
		if h.Buckets[i] < prev.Buckets[i] {
			return h
		}
	}
	d := Histogram{Count: h.Count - prev.Count, SumNs: h.SumNs - prev.SumNs, Batch: h.Batch - prev.Batch}
	for i := range h.Buckets {
		d.Buckets[i] = h.Buckets[i] - prev.Buckets[i]
	}
	return d
}

// add sums two histograms (several cgroups under one pod name).
func (h Histogram) add(o Histogram) Histogram {
	h.Count += o.Count
	h.SumNs += o.SumNs
	h.Batch += o.Batch
	for i := range h.Buckets {
		h.Buckets[i] += o.Buckets[i]
	}
	return h
}

// Rank is the 1-based rank, among the Total delays, of the q-th quantile
// (q in [0, 1], clamped; NaN reads as 0): at least the first delay. An empty
// histogram gives 0.
func (h Histogram) Rank(q float64) uint64 {
	total := h.Total()
	if total == 0 {
		return 0
	}
	if math.IsNaN(q) || q < 0 {
		q = 0
	}
	if q > 1 {
		q = 1
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = max(rank, 1)
	return min(rank, total) // float rounding near 2^53
}

// Quantile is the upper bound (BucketUpper) of the bucket holding the q-th
// quantile of the delays, q in [0, 1] (clamped; NaN reads as 0): a bound the
// quantile is below, good to a factor of two. An empty histogram gives 0.
func (h Histogram) Quantile(q float64) time.Duration {
	rank := h.Rank(q)
	if rank == 0 {
		return 0
	}
	var seen uint64
	for i, b := range h.Buckets {
		seen += b
		if seen >= rank {
			return BucketUpper(i)
		}
	}
	return BucketUpper(NumBuckets - 1) // not reached: seen ends at total
}
