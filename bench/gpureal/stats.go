package gpureal

import (
	"math"
	"slices"
)

// lsRun is what the LS stand-in reports for one run: per request, its scheduled send
// time (seconds after the run's start) and its latency from that time (ms). Requests it
// could not send before giving up are in the lists too, with the latency they had
// reached (a lower bound), and counted in Unsent.
type lsRunResult struct {
	Sched  []float64 `json:"sched"`
	LatMS  []float64 `json:"lat_ms"`
	Unsent int       `json:"unsent"`
}

// batchRunResult is what a batch stand-in reports for one run: the time of each
// synchronize (seconds after the run's start) and the matmuls per synchronize.
type batchRunResult struct {
	Syncs []float64 `json:"syncs"`
	Every int       `json:"every"`
}

// lsStats summarises LS latencies.
type lsStats struct {
	Requests int     `json:"requests"`
	Unsent   int     `json:"unsent,omitempty"`
	P50      float64 `json:"p50Ms"`
	P90      float64 `json:"p90Ms"`
	P99      float64 `json:"p99Ms"`
	Max      float64 `json:"maxMs"`
	Mean     float64 `json:"meanMs"`
	// FirstSecondP99 is the p99 of the requests scheduled in the window's first second.
	FirstSecondP99 float64 `json:"firstSecondP99Ms"`
	// P99PerSecond is the p99 of each second of the window.
	P99PerSecond []float64 `json:"p99PerSecondMs,omitempty"`
}

// quantile is the nearest-rank q-quantile of sorted values (0 for none).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// summariseLS computes the statistics of the requests scheduled in [from, to) seconds
// of the run.
func summariseLS(r lsRunResult, from, to float64) lsStats {
	var lat []float64
	var perSec [][]float64
	for i, t := range r.Sched {
		if i >= len(r.LatMS) || t < from || t >= to {
			continue
		}
		lat = append(lat, r.LatMS[i])
		s := int(t - from)
		for len(perSec) <= s {
			perSec = append(perSec, nil)
		}
		perSec[s] = append(perSec[s], r.LatMS[i])
	}
	st := lsStats{Requests: len(lat), Unsent: r.Unsent}
	if len(lat) == 0 {
		return st
	}
	sum := 0.0
	for _, v := range lat {
		sum += v
	}
	st.Mean = sum / float64(len(lat))
	slices.Sort(lat)
	st.P50, st.P90, st.P99, st.Max = quantile(lat, 0.5), quantile(lat, 0.9), quantile(lat, 0.99), lat[len(lat)-1]
	for i, s := range perSec {
		slices.Sort(s)
		v := quantile(s, 0.99)
		if i == 0 {
			st.FirstSecondP99 = v
		}
		st.P99PerSecond = append(st.P99PerSecond, v)
	}
	return st
}

// batchStats summarises a batch run over a window.
type batchStats struct {
	// PerSecond is matmuls/s over the window: the matmuls whose synchronize fell in it.
	PerSecond float64 `json:"matmulsPerSecond"`
	Matmuls   int     `json:"matmuls"`
	// Timeline is matmuls/s per timelineStep from the window's start.
	Timeline []float64 `json:"timeline"`
	// TimelineStepS is the timeline's step, seconds.
	TimelineStepS float64 `json:"timelineStepS"`
}

const timelineStep = 0.25 // seconds

// summariseBatch computes the throughput over [from, to) seconds of the run.
func summariseBatch(r batchRunResult, from, to float64) batchStats {
	st := batchStats{TimelineStepS: timelineStep}
	if to <= from {
		return st
	}
	n := int(math.Ceil((to - from) / timelineStep))
	counts := make([]int, n)
	for _, t := range r.Syncs {
		if t < from || t >= to {
			continue
		}
		st.Matmuls += r.Every
		counts[min(int((t-from)/timelineStep), n-1)] += r.Every
	}
	st.PerSecond = float64(st.Matmuls) / (to - from)
	st.Timeline = make([]float64, n)
	for i, c := range counts {
		st.Timeline[i] = float64(c) / timelineStep
	}
	return st
}

// recoveryWindow is the trailing window over which batch's recovery is judged.
const recoveryWindow = 0.5 // seconds

// recovery is how batch came back after LS went idle.
type recovery struct {
	// Seconds from LS's last request until batch's rate over the trailing
	// recoveryWindow first reached frac of its alone rate; -1 if it never did.
	Seconds float64 `json:"seconds"`
	// SustainedFrac is batch's rate from 2 s after LS went idle to the window's end, as
	// a fraction of its alone rate.
	SustainedFrac float64 `json:"sustainedFraction"`
}

// timeToRate finds when batch recovered: r's synchronizes from t0 (seconds of the run)
// to end, against alone matmuls/s.
func timeToRate(r batchRunResult, t0, end, alone, frac float64) recovery {
	rec := recovery{Seconds: -1}
	if alone <= 0 || end <= t0 {
		return rec
	}
	const step = 0.05
	for t := t0 + recoveryWindow; t <= end+1e-9; t += step {
		if summariseBatch(r, t-recoveryWindow, t).PerSecond >= frac*alone {
			rec.Seconds = t - t0
			break
		}
	}
	if end > t0+2 {
		rec.SustainedFrac = summariseBatch(r, t0+2, end).PerSecond / alone
	}
	return rec
}
