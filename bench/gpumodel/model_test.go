package gpumodel

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCalibratedReproducesMeasured: the calibrated model reproduces each measured row
// of the real H200 run that it is fitted to or that its mechanics alone decide (the
// time-sliced pair syncing every 8 and 64: LS p50, LS p99 / alone, batch's rate; the
// freeze: LS p99 / alone, batch 0) within 10 %, with the recorded seed and others.
func TestCalibratedReproducesMeasured(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{DefaultSeed, 2, 3} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			fit, err := Fit(H200(), Calibrated(), DefaultWindow, seed)
			if err != nil {
				t.Fatal(err)
			}
			gatedRows := 0
			for _, r := range fit {
				if r.Role != RoleFitted && !strings.HasPrefix(r.Phase, "freeze") {
					continue
				}
				gatedRows++
				if !r.Within10() {
					t.Errorf("%s, %s: model %.3f, measured %.3f: %+.1f %%, more than 10 %%", r.Phase, r.Quantity, r.Model, r.Measured, r.ErrorPct)
				}
			}
			if gatedRows != 9 {
				t.Errorf("%d rows held to 10 %%, want 9 (2 × 3 time-sliced, 3 freeze)", gatedRows)
			}
		})
	}
}

// TestCalibrateFindsTheCalibratedValues: a small grid around Calibrated() picks it,
// instruction-level preemption over kernel-level, and keeps the other mode's best as
// the alternative.
func TestCalibrateFindsTheCalibratedValues(t *testing.T) {
	t.Parallel()
	want := Calibrated()
	g := Grid{
		SliceFrom: want.GPU.DefaultSlice - 100*us1, SliceTo: want.GPU.DefaultSlice + 100*us1, SliceStep: 100 * us1,
		CostFrom: want.GPU.SwitchCost - 50*us1, CostTo: want.GPU.SwitchCost + 50*us1, CostStep: 50 * us1,
		FineSliceStep: 100 * us1, FineCostStep: 50 * us1,
		Jitters: []float64{0.10, want.LSJitter, 0.18},
	}
	start := want
	start.LSJitter, start.GPU = 0, GPU{}
	got, s, err := Calibrate(context.Background(), H200(), start, g, DefaultWindow, DefaultSeed)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Calibrate = %+v, want Calibrated() %+v", got, want)
	}
	if len(s.Refined) != 2 || s.Refined[0].MaxErrorPct >= s.Refined[1].MaxErrorPct || s.Best != s.Refined[0] {
		t.Errorf("refined %+v, best %+v: want instruction ahead of kernel", s.Refined, s.Best)
	}
	if s.Alternative == nil || s.Alternative.GPU.Preemption != PreemptKernel {
		t.Errorf("alternative %+v, want kernel-level preemption's best", s.Alternative)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := Calibrate(ctx, H200(), start, g, DefaultWindow, DefaultSeed); err == nil {
		t.Error("Calibrate with a cancelled context succeeded")
	}
	if _, _, err := Calibrate(context.Background(), H200(), start, Grid{}, DefaultWindow, DefaultSeed); err == nil {
		t.Error("Calibrate with an empty grid succeeded")
	}
}

// TestPredict: every row is labelled a model; the sweeps have their sizes; and the
// mechanics show: a longer batch kernel never shortens LS's wait under the gate, and
// a shorter batch slice never lengthens it with LS's slice long.
func TestPredict(t *testing.T) {
	t.Parallel()
	alt := Calibrated()
	alt.GPU = GPU{DefaultSlice: 1470 * us1, SwitchCost: 115 * us1, Preemption: PreemptKernel}
	pr, err := Predict(context.Background(), H200(), Calibrated(), &alt, 5*time.Second, DefaultSeed)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []struct {
		name string
		rows []Prediction
		want int
	}{
		{"timeslice", pr.Timeslice, 12}, {"gate", pr.Gate, 18}, {"sensitivity", pr.Sensitivity, 4}, {"alternative", pr.Alternative, 6},
	}
	for _, sz := range sizes {
		if len(sz.rows) != sz.want {
			t.Errorf("%d %s rows, want %d", len(sz.rows), sz.name, sz.want)
		}
		for _, r := range sz.rows {
			if r.Label != "model" {
				t.Errorf("%s row labelled %q, want model", sz.name, r.Label)
			}
		}
	}
	for i := 2; i < len(pr.Gate); i += 2 { // sync 8 rows, kernels ascending
		if pr.Gate[i].LSP99X < pr.Gate[i-2].LSP99X-0.02 {
			t.Errorf("gate: kernel %.2f ms gives LS p99 %.2f×, shorter %.2f ms %.2f×", pr.Gate[i].BatchKernelMs,
				pr.Gate[i].LSP99X, pr.Gate[i-2].BatchKernelMs, pr.Gate[i-2].LSP99X)
		}
	}
	long := pr.Timeslice[3:6] // sync 8, LS long, batch 100, 500, 2048 µs
	for i := 1; i < len(long); i++ {
		if long[i].LSSlice != "long" || long[i].LSP99X < long[i-1].LSP99X {
			t.Errorf("LS long: batch slice %.0f µs gives %.2f×, %.0f µs %.2f×", long[i].BatchSliceUs, long[i].LSP99X,
				long[i-1].BatchSliceUs, long[i-1].LSP99X)
		}
	}
	for _, r := range pr.Alternative {
		if r.Preemption != PreemptKernel {
			t.Errorf("alternative row under %s preemption", r.Preemption)
		}
	}
}

// TestBenchWritesReport: a short run without the search writes the JSON, labelled a
// model, with the fit and the predictions.
func TestBenchWritesReport(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out", "gpu-model.json")
	cfg := Config{Out: out, Window: 2 * time.Second, Seed: 1, Seeds: 2}
	var log strings.Builder
	if err := Bench(context.Background(), cfg, func(f string, a ...any) { log.WriteString(strings.TrimSpace(f)) }); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Schema != Schema || rep.Label != "model, not a measurement" || rep.Search != nil || len(rep.Fit) == 0 ||
		len(rep.Seeds) != 2 || len(rep.Predictions.Timeslice) == 0 || len(rep.Predictions.Alternative) != 0 ||
		rep.Params.Preemption != PreemptInstruction || math.IsNaN(rep.FittedMaxErrorPct) {
		t.Errorf("report %s", b)
	}
	if err := Bench(context.Background(), Config{Out: out}, func(string, ...any) {}); err == nil {
		t.Error("Bench without a window succeeded")
	}
}

// TestFittingAndSpread: Fitting keeps the winning mode's slices within the region, and
// Spread runs the five key rows under each, labelled a model.
func TestFittingAndSpread(t *testing.T) {
	t.Parallel()
	in := func(slice, cost, e float64) ModeBest {
		return ModeBest{Preemption: PreemptInstruction, SliceUs: slice, CostUs: cost, MaxErrorPct: e}
	}
	s := Search{
		Best:      in(2400, 250, 1.8),
		RegionPct: 5,
		BySlice: [][]ModeBest{
			{in(1000, 150, 4.9), in(2400, 250, 1.8), in(3000, 100, 12)},
			{{Preemption: PreemptKernel, SliceUs: 1400, CostUs: 100, MaxErrorPct: 4}},
		},
	}
	got := s.Fitting()
	if len(got) != 2 || got[0].SliceUs != 1000 || got[1].SliceUs != 2400 {
		t.Fatalf("Fitting = %+v, want the instruction slices 1000 and 2400", got)
	}
	rows, err := Spread(context.Background(), H200(), Calibrated(), got, 2*time.Second, DefaultSeed)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d spread rows, want 2", len(rows))
	}
	for _, r := range rows {
		if len(r.Rows) != 5 {
			t.Errorf("slice %.0f: %d rows, want 5", r.Fit.SliceUs, len(r.Rows))
		}
		for _, p := range r.Rows {
			if p.Label != "model" || us(time.Duration(r.Fit.CostUs*float64(us1))) != p.SwitchCostUs {
				t.Errorf("slice %.0f: row %+v", r.Fit.SliceUs, p)
			}
		}
	}
}
