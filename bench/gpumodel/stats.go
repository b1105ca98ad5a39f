package gpumodel

import (
	"math"
	"slices"
	"time"
)

// LSStats summarises LS latencies in milliseconds, as the real bench does (nearest-rank
// quantiles; latency from each request's scheduled time).
type LSStats struct {
	Requests int     `json:"requests"`
	P50      float64 `json:"p50Ms"`
	P90      float64 `json:"p90Ms"`
	P99      float64 `json:"p99Ms"`
	Mean     float64 `json:"meanMs"`
	Max      float64 `json:"maxMs"`
	// FirstSecondP99 is the p99 of the requests scheduled in the first second.
	FirstSecondP99 float64 `json:"firstSecondP99Ms"`
}

// quantile is the nearest-rank q-quantile of sorted values (0 for none).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// summarise computes the statistics of latencies (ms) of requests scheduled at sched.
func summarise(sched []time.Duration, lat []float64) LSStats {
	st := LSStats{Requests: len(lat)}
	if len(lat) == 0 {
		return st
	}
	var first []float64
	sum := 0.0
	for i, v := range lat {
		sum += v
		if sched[i] < time.Second {
			first = append(first, v)
		}
	}
	st.Mean = sum / float64(len(lat))
	sorted := slices.Sorted(slices.Values(lat))
	st.P50, st.P90, st.P99 = quantile(sorted, 0.5), quantile(sorted, 0.9), quantile(sorted, 0.99)
	st.Max = sorted[len(sorted)-1]
	slices.Sort(first)
	st.FirstSecondP99 = quantile(first, 0.99)
	return st
}
