package gpumodel

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// Params are the model's values beside the measured workloads: the GPU's three, fitted
// to the time-sliced rows (Calibrate), LS's jitter, fitted to LS alone, and the host
// gaps, which are assumptions.
type Params struct {
	GPU GPU
	// LSJitter is each LS kernel's relative standard deviation.
	LSJitter float64
	// BatchJitter is each batch kernel's (batch alone runs steadily: 602/s in every
	// 0.25 s of the real run).
	BatchJitter float64
	// SyncGap is batch's host time between a synchronize and its next launch.
	SyncGap time.Duration
	// GateGap is the launch gate's host round trip per forwarded launch.
	GateGap time.Duration
}

// Calibrated is the result of Calibrate on H200() with DefaultGrid over 20 s windows
// with seed 1, as recorded in bench/out/gpu-model.json: TestCalibratedReproducesMeasured
// holds it to the measured rows, TestCalibrateFindsTheCalibratedValues to the search.
func Calibrated() Params {
	return Params{
		GPU:         GPU{DefaultSlice: 2370 * time.Microsecond, SwitchCost: 255 * time.Microsecond, Preemption: PreemptInstruction},
		LSJitter:    0.14,
		BatchJitter: 0.005,
		SyncGap:     20 * time.Microsecond,
		GateGap:     20 * time.Microsecond,
	}
}

// Run lengths and the seed of the fit and the predictions: the real bench's 20 s phases.
const (
	DefaultWindow = 20 * time.Second
	DefaultSeed   = 1
)

// Workload is the measured pair as a scenario under the driver's time-slicing: LS as
// measured (its kernels' mean from LS alone's mean latency), batch syncing every sync
// kernels (its kernel from batch alone's rate, less the sync gap).
func Workload(m Measured, p Params, sync int, window time.Duration, seed uint64) Scenario {
	lsKernel := time.Duration(m.LSAlone.Mean / float64(m.LSKernels) * float64(time.Millisecond))
	batchKernel := time.Duration(float64(time.Second)/m.BatchAlone) - p.SyncGap/time.Duration(m.SyncEvery)
	return Scenario{
		GPU:      p.GPU,
		LS:       LS{Rate: m.LSRate, Kernels: m.LSKernels, Kernel: lsKernel, Jitter: p.LSJitter},
		Batch:    Batch{Kernel: batchKernel, Jitter: p.BatchJitter, SyncEvery: sync, SyncGap: p.SyncGap},
		Gate:     Gate{Depth: 1, Gap: p.GateGap},
		Duration: window,
		Seed:     seed,
	}
}

// alone returns sc without batch, and sc without LS.
func alone(sc Scenario) (lsAlone, batchAlone Scenario) {
	lsAlone, batchAlone = sc, sc
	lsAlone.Batch.Kernel = 0
	batchAlone.LS.Rate = 0
	return lsAlone, batchAlone
}

// Role says what a fit row is to the model.
type Role string

// The roles of fit rows.
const (
	// RoleInput: the model is built from it (a kernel length, LS's jitter).
	RoleInput Role = "input"
	// RoleFitted: Calibrate's objective.
	RoleFitted Role = "fitted"
	// RoleCheck: in no objective; the model's mechanics alone produce it.
	RoleCheck Role = "check"
)

// FitRow compares one measured figure with the model's.
type FitRow struct {
	Phase    string  `json:"phase"`
	Quantity string  `json:"quantity"`
	Role     Role    `json:"role"`
	Measured float64 `json:"measured"`
	Model    float64 `json:"model"`
	// ErrorPct is (model − measured) / measured in percent; for a measured 0 (batch
	// under the freeze), the model's figure as a percentage of the measured time-sliced
	// batch rate.
	ErrorPct float64 `json:"errorPct"`
}

// Within10 says whether the model's row is within 10 % of the measured one.
func (r FitRow) Within10() bool { return math.Abs(r.ErrorPct) <= 10 }

// FitRows are the model's figures beside every measured row it can reproduce.
type FitRows []FitRow

// MaxAbsErrorPct is the largest |error| of rows of the given roles (all with none).
func (f FitRows) MaxAbsErrorPct(roles ...Role) float64 {
	worst := 0.0
	for _, r := range f {
		if len(roles) == 0 || slices.Contains(roles, r.Role) {
			worst = max(worst, math.Abs(r.ErrorPct))
		}
	}
	return worst
}

func errPct(model, measured, zeroRef float64) float64 {
	if measured == 0 {
		return 100 * model / zeroRef
	}
	return 100 * (model - measured) / measured
}

// Fit runs the model on every measured phase it covers: LS alone, batch alone, the
// time-sliced pair syncing every 8 and 64, and the freeze (batch stopped from the
// phase's start, as the agent held it there).
func Fit(m Measured, p Params, window time.Duration, seed uint64) (FitRows, error) {
	base := Workload(m, p, m.SyncEvery, window, seed)
	lsA, bA := alone(base)
	deep := Workload(m, p, m.DeepSyncEvery, window, seed)
	_, dA := alone(deep)
	freeze := base
	freeze.Lever = LeverFreeze
	runs, err := runAll(lsA, bA, dA, base, deep, freeze)
	if err != nil {
		return nil, err
	}
	la, ba, da, n8, n64, fz := runs[0], runs[1], runs[2], runs[3], runs[4], runs[5]
	ref := m.Nothing.Batch
	row := func(phase, q string, role Role, measured, model float64) FitRow {
		return FitRow{Phase: phase, Quantity: q, Role: role, Measured: measured, Model: model, ErrorPct: errPct(model, measured, ref)}
	}
	out := FitRows{
		row("LS alone", "LS p50 ms", RoleCheck, m.LSAlone.P50, la.LS.P50),
		row("LS alone", "LS p99 ms", RoleInput, m.LSAlone.P99, la.LS.P99),
		row("batch alone, sync 8", "batch matmuls/s", RoleInput, m.BatchAlone, ba.BatchPerSecond),
		row("batch alone, sync 64", "batch matmuls/s", RoleCheck, m.DeepAlone, da.BatchPerSecond),
	}
	pair := func(phase string, meas Row, r Result) {
		out = append(out,
			row(phase, "LS p50 ms", RoleFitted, meas.P50, r.LS.P50),
			row(phase, "LS p99 / alone", RoleFitted, meas.P99/m.LSAlone.P99, r.LS.P99/la.LS.P99),
			row(phase, "batch matmuls/s", RoleFitted, meas.Batch, r.BatchPerSecond),
			row(phase, "LS mean ms", RoleCheck, meas.Mean, r.LS.Mean),
			row(phase, "LS p90 ms", RoleCheck, meas.P90, r.LS.P90),
			row(phase, "LS p99 first second ms", RoleCheck, meas.FirstSecondP99, r.LS.FirstSecondP99),
		)
	}
	pair("nothing, sync 8", m.Nothing, n8)
	pair("nothing, sync 64", m.DeepNothing, n64)
	out = append(out,
		row("freeze, sync 8", "LS p50 ms", RoleCheck, m.Freeze.P50, fz.LS.P50),
		row("freeze, sync 8", "LS p99 / alone", RoleCheck, m.Freeze.P99/m.LSAlone.P99, fz.LS.P99/la.LS.P99),
		row("freeze, sync 8", "batch matmuls/s", RoleCheck, m.Freeze.Batch, fz.BatchPerSecond),
	)
	return out, nil
}

func runAll(scs ...Scenario) ([]Result, error) {
	out := make([]Result, len(scs))
	for i, sc := range scs {
		r, err := Run(sc)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// Grid is Calibrate's search: every default slice and switch cost of the coarse grid
// under each preemption mode, then a finer grid around the best.
type Grid struct {
	SliceFrom, SliceTo, SliceStep time.Duration
	CostFrom, CostTo, CostStep    time.Duration
	// FineSliceStep and FineCostStep refine around the coarse best, one coarse step
	// either side.
	FineSliceStep, FineCostStep time.Duration
	// Jitters are LS's jitters tried against LS alone's p99 first.
	Jitters []float64
}

// DefaultGrid is the search `make bench-gpu-model` runs.
func DefaultGrid() Grid {
	js := make([]float64, 0, 31)
	for i := 0; i <= 30; i++ {
		js = append(js, float64(i)/100)
	}
	return Grid{
		SliceFrom: 1000 * time.Microsecond, SliceTo: 3000 * time.Microsecond, SliceStep: 100 * time.Microsecond,
		CostFrom: 0, CostTo: 500 * time.Microsecond, CostStep: 50 * time.Microsecond,
		FineSliceStep: 10 * time.Microsecond, FineCostStep: 5 * time.Microsecond,
		Jitters: js,
	}
}

// ModeBest is the best fit one preemption mode reached.
type ModeBest struct {
	Preemption Preemption `json:"preemption"`
	SliceUs    float64    `json:"defaultSliceUs"`
	CostUs     float64    `json:"switchCostUs"`
	// MaxErrorPct is the objective: the largest |error| of the fitted rows.
	MaxErrorPct float64 `json:"maxErrorPct"`
}

// Search is what Calibrate tried.
type Search struct {
	// Evaluated is how many parameter sets were simulated.
	Evaluated int `json:"evaluated"`
	// Jitter is LS's jitter chosen against LS alone's p99.
	Jitter float64 `json:"lsJitter"`
	// Coarse is each mode's best on the coarse grid, Refined after the finer grid
	// around it; Best is the winner.
	Coarse  []ModeBest `json:"coarse"`
	Refined []ModeBest `json:"refined"`
	Best    ModeBest   `json:"best"`
	// Alternative is the best parameters of the other preemption mode.
	Alternative *Params `json:"-"`
	// Region is, per mode, the span of the grid points whose worst fitted error is at
	// most RegionPct: how sharply the rows pin the values down.
	RegionPct float64  `json:"regionPct"`
	Region    []Region `json:"region"`
	// BySlice is, per mode, each default slice of the coarse grid with its best switch
	// cost.
	BySlice [][]ModeBest `json:"bySlice"`
}

// Fitting is the winning mode's coarse grid points, one per default slice with its best
// switch cost, whose worst fitted error is within Search.RegionPct: the parameter sets
// the measured rows cannot tell apart at that precision.
func (s Search) Fitting() []ModeBest {
	var out []ModeBest
	for _, by := range s.BySlice {
		for _, b := range by {
			if b.Preemption == s.Best.Preemption && b.MaxErrorPct <= s.RegionPct {
				out = append(out, b)
			}
		}
	}
	return out
}

// Region is the span of one preemption mode's grid points that fit within
// Search.RegionPct (Points 0: none does).
type Region struct {
	Preemption Preemption `json:"preemption"`
	Points     int        `json:"points"`
	SliceUsMin float64    `json:"defaultSliceUsMin"`
	SliceUsMax float64    `json:"defaultSliceUsMax"`
	CostUsMin  float64    `json:"switchCostUsMin"`
	CostUsMax  float64    `json:"switchCostUsMax"`
}

// add widens the region by a point.
func (r *Region) add(slice, cost time.Duration) {
	if r.Points == 0 {
		r.SliceUsMin, r.SliceUsMax, r.CostUsMin, r.CostUsMax = us(slice), us(slice), us(cost), us(cost)
	}
	r.Points++
	r.SliceUsMin, r.SliceUsMax = min(r.SliceUsMin, us(slice)), max(r.SliceUsMax, us(slice))
	r.CostUsMin, r.CostUsMax = min(r.CostUsMin, us(cost)), max(r.CostUsMax, us(cost))
}

// regionPct is the worst fitted error within which Search.Region counts a grid point.
const regionPct = 5

// objective is the largest |error| of the fitted rows for p.
func objective(m Measured, p Params, window time.Duration, seed uint64) (float64, error) {
	base := Workload(m, p, m.SyncEvery, window, seed)
	lsA, _ := alone(base)
	deep := Workload(m, p, m.DeepSyncEvery, window, seed)
	runs, err := runAll(lsA, base, deep)
	if err != nil {
		return 0, err
	}
	ref := m.Nothing.Batch
	worst := 0.0
	for i, meas := range []Row{m.Nothing, m.DeepNothing} {
		r := runs[i+1]
		for _, e := range []float64{
			errPct(r.LS.P50, meas.P50, ref),
			errPct(r.LS.P99/runs[0].LS.P99, meas.P99/m.LSAlone.P99, ref),
			errPct(r.BatchPerSecond, meas.Batch, ref),
		} {
			worst = max(worst, math.Abs(e))
		}
	}
	return worst, nil
}

// Calibrate fits LS's jitter to LS alone's p99, then the GPU's default slice, switch
// cost and preemption mode to the time-sliced rows (LS p50, LS p99 / alone and batch's
// rate, syncing every 8 and 64), minimising the largest relative error: for each mode a
// coarse grid, then a finer one around its best. start's other fields (batch jitter,
// host gaps) are kept. Search.Alternative is the losing mode's best.
func Calibrate(ctx context.Context, m Measured, start Params, g Grid, window time.Duration, seed uint64) (Params, Search, error) {
	if g.SliceStep <= 0 || g.CostStep <= 0 || g.FineSliceStep <= 0 || g.FineCostStep <= 0 || g.SliceFrom <= 0 {
		return Params{}, Search{}, fmt.Errorf("%w: grid steps must be positive", ErrScenario)
	}
	var s Search
	p := start
	bestJ := math.Inf(1)
	for _, j := range g.Jitters {
		q := p
		q.LSJitter = j
		q.GPU = GPU{DefaultSlice: g.SliceFrom} // LS alone: the GPU's values do not matter
		lsA, _ := alone(Workload(m, q, m.SyncEvery, window, seed))
		r, err := Run(lsA)
		if err != nil {
			return Params{}, s, err
		}
		s.Evaluated++
		if e := math.Abs(r.LS.P99 - m.LSAlone.P99); e < bestJ {
			bestJ, s.Jitter = e, j
		}
	}
	p.LSJitter = s.Jitter

	s.RegionPct = regionPct
	s.Region = []Region{{Preemption: PreemptInstruction}, {Preemption: PreemptKernel}}
	try := func(mode Preemption, slice, cost time.Duration, best *ModeBest, bestP *Params) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		q := p
		q.GPU = GPU{DefaultSlice: slice, SwitchCost: cost, Preemption: mode}
		e, err := objective(m, q, window, seed)
		if err != nil {
			return err
		}
		s.Evaluated++
		if e <= regionPct {
			s.Region[mode].add(slice, cost)
		}
		if e < best.MaxErrorPct {
			*best = ModeBest{Preemption: mode, SliceUs: us(slice), CostUs: us(cost), MaxErrorPct: e}
			*bestP = q
		}
		return nil
	}
	var modeP []Params
	for _, mode := range []Preemption{PreemptInstruction, PreemptKernel} {
		mb := ModeBest{MaxErrorPct: math.Inf(1)}
		var mp Params
		var bySlice []ModeBest
		for slice := g.SliceFrom; slice <= g.SliceTo; slice += g.SliceStep {
			sb := ModeBest{MaxErrorPct: math.Inf(1)}
			var sp Params
			for cost := g.CostFrom; cost <= g.CostTo; cost += g.CostStep {
				if err := try(mode, slice, cost, &sb, &sp); err != nil {
					return Params{}, s, err
				}
			}
			bySlice = append(bySlice, sb)
			if sb.MaxErrorPct < mb.MaxErrorPct {
				mb, mp = sb, sp
			}
		}
		s.Coarse = append(s.Coarse, mb)
		s.BySlice = append(s.BySlice, bySlice)
		coarse := mp.GPU
		for slice := max(coarse.DefaultSlice-g.SliceStep, g.FineSliceStep); slice <= coarse.DefaultSlice+g.SliceStep; slice += g.FineSliceStep {
			for cost := max(coarse.SwitchCost-g.CostStep, 0); cost <= coarse.SwitchCost+g.CostStep; cost += g.FineCostStep {
				if err := try(mode, slice, cost, &mb, &mp); err != nil {
					return Params{}, s, err
				}
			}
		}
		s.Refined = append(s.Refined, mb)
		modeP = append(modeP, mp)
	}
	win := 0
	if s.Refined[1].MaxErrorPct < s.Refined[0].MaxErrorPct {
		win = 1
	}
	s.Best = s.Refined[win]
	alt := modeP[1-win]
	s.Alternative = &alt
	return modeP[win], s, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
