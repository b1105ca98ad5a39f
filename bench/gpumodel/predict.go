package gpumodel

import (
	"context"
	"time"
)

// LongSlice is LS's slice in the "long" rows: longer than any LS request (3.2 ms alone),
// so a request that has the GPU keeps it to its end.
const LongSlice = 10 * time.Millisecond

// The targets a lever must meet on the standard pair.
const (
	TargetP99X            = 1.10
	TargetFirstSecondP99X = 1.25
	TargetBatchPct        = 90
)

// Prediction is the model's figure for one lever setting: never a measurement.
type Prediction struct {
	// Label is always "model".
	Label string `json:"label"`
	// Lever is "timeslice" (per-context slices), "gate" (the launch gate under the
	// default slices) or "nothing" (a reference).
	Lever     string `json:"lever"`
	SyncEvery int    `json:"syncEvery"`
	// BatchSliceUs and LSSliceUs are the contexts' slices; LSSlice names LS's
	// ("default" or "long").
	BatchSliceUs  float64    `json:"batchSliceUs"`
	LSSlice       string     `json:"lsSlice"`
	LSSliceUs     float64    `json:"lsSliceUs"`
	BatchKernelMs float64    `json:"batchKernelMs"`
	SwitchCostUs  float64    `json:"switchCostUs"`
	Preemption    Preemption `json:"preemption"`
	LS            LSStats    `json:"ls"`
	// LSP50X, LSP99X and LSFirstSecondP99X are against the model's LS alone.
	LSP50X            float64 `json:"lsP50X"`
	LSP99X            float64 `json:"lsP99X"`
	LSFirstSecondP99X float64 `json:"lsFirstSecondP99X"`
	BatchPerSecond    float64 `json:"batchPerSecond"`
	// BatchPctOfSliced is batch's rate against the model's time-sliced pair ("nothing",
	// default slices, the fitted switch cost) with the same batch kernel and sync.
	BatchPctOfSliced float64 `json:"batchPctOfSliced"`
	// MeetsTargets: LS p99 ≤ 1.10×, first-second p99 ≤ 1.25×, batch ≥ 90 %.
	MeetsTargets bool `json:"meetsTargets"`
	// LSFallsBehind: LS's median latency exceeds its request period, so its backlog
	// grows over the window and its quantiles measure the window's length.
	LSFallsBehind bool `json:"lsFallsBehind,omitempty"`
}

// Predictions are the model's rows for the levers not yet measured on a GPU.
type Predictions struct {
	// Timeslice: batch's slice 100, 500, 2048 µs, LS's default and long, batch syncing
	// every 8 and 64.
	Timeslice []Prediction `json:"timeslice"`
	// Gate: the launch gate (depth 1) as a function of batch's kernel length, under
	// the default slices, syncing every 8 and 64.
	Gate []Prediction `json:"gate"`
	// Sensitivity: the 100 µs batch slice with LS long at smaller switch costs than
	// the fitted one.
	Sensitivity []Prediction `json:"sensitivity"`
	// Alternative: the timeslice rows (sync 8) under the other preemption mode's best
	// fit, had the GPU preempted that way.
	Alternative []Prediction `json:"alternative,omitempty"`
}

// predictor runs lever settings against one parameter set's LS alone and time-sliced
// references.
type predictor struct {
	p    Params
	la   Result
	refs map[[2]time.Duration]float64
}

func newPredictor(m Measured, p Params, window time.Duration, seed uint64) (*predictor, error) {
	lsA, _ := alone(Workload(m, p, m.SyncEvery, window, seed))
	la, err := Run(lsA)
	if err != nil {
		return nil, err
	}
	return &predictor{p: p, la: la, refs: map[[2]time.Duration]float64{}}, nil
}

// ref is batch's rate in the time-sliced pair (default slices, no lever) with sc's batch
// kernel and sync.
func (pd *predictor) ref(sc Scenario) (float64, error) {
	key := [2]time.Duration{sc.Batch.Kernel, time.Duration(sc.Batch.SyncEvery)}
	if v, ok := pd.refs[key]; ok {
		return v, nil
	}
	n := sc
	n.Lever, n.LS.Slice, n.Batch.Slice, n.GPU = LeverNone, 0, 0, pd.p.GPU
	r, err := Run(n)
	if err != nil {
		return 0, err
	}
	pd.refs[key] = r.BatchPerSecond
	return r.BatchPerSecond, nil
}

func (pd *predictor) one(ctx context.Context, lever, lsSlice string, sc Scenario) (Prediction, error) {
	if err := ctx.Err(); err != nil {
		return Prediction{}, err
	}
	r, err := Run(sc)
	if err != nil {
		return Prediction{}, err
	}
	nb, err := pd.ref(sc)
	if err != nil {
		return Prediction{}, err
	}
	la := pd.la.LS
	pr := Prediction{
		Label: "model", Lever: lever, SyncEvery: sc.Batch.SyncEvery, Preemption: sc.GPU.Preemption,
		BatchSliceUs: us(cmpOr(sc.Batch.Slice, sc.GPU.DefaultSlice)), LSSlice: lsSlice,
		LSSliceUs: us(cmpOr(sc.LS.Slice, sc.GPU.DefaultSlice)), BatchKernelMs: us(sc.Batch.Kernel) / 1000,
		SwitchCostUs: us(sc.GPU.SwitchCost), LS: r.LS,
		LSP50X: r.LS.P50 / la.P50, LSP99X: r.LS.P99 / la.P99, LSFirstSecondP99X: r.LS.FirstSecondP99 / la.P99,
		BatchPerSecond: r.BatchPerSecond,
	}
	if nb > 0 {
		pr.BatchPctOfSliced = 100 * r.BatchPerSecond / nb
	}
	pr.LSFallsBehind = sc.LS.Rate > 0 && r.LS.P50 > 1000/sc.LS.Rate
	pr.MeetsTargets = pr.LSP99X <= TargetP99X && pr.LSFirstSecondP99X <= TargetFirstSecondP99X && pr.BatchPctOfSliced >= TargetBatchPct
	return pr, nil
}

// timeslices predicts batch's slices with LS's default and long slice for each sync.
func (pd *predictor) timeslices(ctx context.Context, m Measured, syncs []int, window time.Duration, seed uint64) ([]Prediction, error) {
	var out []Prediction
	for _, sync := range syncs {
		for _, lsSlice := range []string{"default", "long"} {
			for _, bs := range []time.Duration{100 * time.Microsecond, 500 * time.Microsecond, 2048 * time.Microsecond} {
				sc := Workload(m, pd.p, sync, window, seed)
				sc.Batch.Slice = bs
				if lsSlice == "long" {
					sc.LS.Slice = LongSlice
				}
				pr, err := pd.one(ctx, "timeslice", lsSlice, sc)
				if err != nil {
					return nil, err
				}
				out = append(out, pr)
			}
		}
	}
	return out, nil
}

// Predict runs the lever settings on the calibrated model p; alt, when set, is the other
// preemption mode's best fit, whose timeslice rows (sync 8) go to Predictions.Alternative.
func Predict(ctx context.Context, m Measured, p Params, alt *Params, window time.Duration, seed uint64) (Predictions, error) {
	var out Predictions
	pd, err := newPredictor(m, p, window, seed)
	if err != nil {
		return out, err
	}
	syncs := []int{m.SyncEvery, m.DeepSyncEvery}
	if out.Timeslice, err = pd.timeslices(ctx, m, syncs, window, seed); err != nil {
		return out, err
	}
	for _, ms := range []float64{0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.66, 2.0} {
		for _, sync := range syncs {
			sc := Workload(m, p, sync, window, seed)
			sc.Batch.Kernel = time.Duration(ms * float64(time.Millisecond))
			sc.Lever = LeverGate
			pr, err := pd.one(ctx, "gate", "default", sc)
			if err != nil {
				return out, err
			}
			out.Gate = append(out.Gate, pr)
		}
	}
	for _, c := range []time.Duration{100 * time.Microsecond, 40 * time.Microsecond} {
		for _, sync := range syncs {
			sc := Workload(m, p, sync, window, seed)
			sc.Batch.Slice, sc.LS.Slice = 100*time.Microsecond, LongSlice
			sc.GPU.SwitchCost = c
			pr, err := pd.one(ctx, "timeslice", "long", sc)
			if err != nil {
				return out, err
			}
			out.Sensitivity = append(out.Sensitivity, pr)
		}
	}
	if alt != nil {
		apd, err := newPredictor(m, *alt, window, seed)
		if err != nil {
			return out, err
		}
		if out.Alternative, err = apd.timeslices(ctx, m, syncs[:1], window, seed); err != nil {
			return out, err
		}
	}
	return out, nil
}

// SpreadRow is the key predictions under one parameter set that fits the measured rows
// nearly as well as the calibrated one (Search.Fitting).
type SpreadRow struct {
	Fit ModeBest `json:"fit"`
	// Rows: batch slice 100 µs with LS long, the same with LS's default slice, and the
	// gate with 0.2, 0.8 and 1.66 ms batch kernels; all syncing every 8.
	Rows []Prediction `json:"rows"`
}

// Spread runs the key predictions under each parameter set in fits (p's other values
// kept): how far the predictions move within what the measured rows allow.
func Spread(ctx context.Context, m Measured, p Params, fits []ModeBest, window time.Duration, seed uint64) ([]SpreadRow, error) {
	var out []SpreadRow
	for _, f := range fits {
		q := p
		q.GPU = GPU{DefaultSlice: time.Duration(f.SliceUs * float64(time.Microsecond)),
			SwitchCost: time.Duration(f.CostUs * float64(time.Microsecond)), Preemption: f.Preemption}
		pd, err := newPredictor(m, q, window, seed)
		if err != nil {
			return nil, err
		}
		row := SpreadRow{Fit: f}
		for _, lsSlice := range []string{"long", "default"} {
			sc := Workload(m, q, m.SyncEvery, window, seed)
			sc.Batch.Slice = 100 * time.Microsecond
			if lsSlice == "long" {
				sc.LS.Slice = LongSlice
			}
			pr, err := pd.one(ctx, "timeslice", lsSlice, sc)
			if err != nil {
				return nil, err
			}
			row.Rows = append(row.Rows, pr)
		}
		for _, ms := range []float64{0.2, 0.8, 1.66} {
			sc := Workload(m, q, m.SyncEvery, window, seed)
			sc.Batch.Kernel = time.Duration(ms * float64(time.Millisecond))
			sc.Lever = LeverGate
			pr, err := pd.one(ctx, "gate", "default", sc)
			if err != nil {
				return nil, err
			}
			row.Rows = append(row.Rows, pr)
		}
		out = append(out, row)
	}
	return out, nil
}
