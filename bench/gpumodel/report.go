package gpumodel

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Schema names the JSON's format.
const Schema = "understory.gpu-model/v1"

// Config is one `make bench-gpu-model`: cmd/gpu-model's flags set it.
type Config struct {
	Out    string
	Window time.Duration
	Seed   uint64
	// Search runs Calibrate; without it the model uses Calibrated().
	Search bool
	// Seeds is how many seeds (Seed, Seed+1, ...) the fit is repeated with, for its
	// spread.
	Seeds int
}

// DefaultConfig is `make bench-gpu-model`.
func DefaultConfig() Config {
	return Config{Out: "bench/out/gpu-model.json", Window: DefaultWindow, Seed: DefaultSeed, Search: true, Seeds: 5}
}

// ParamsOut is Params in the JSON, with the kernel lengths the workload derives.
type ParamsOut struct {
	DefaultSliceUs float64    `json:"defaultSliceUs"`
	SwitchCostUs   float64    `json:"switchCostUs"`
	Preemption     Preemption `json:"preemption"`
	LSJitter       float64    `json:"lsJitter"`
	BatchJitter    float64    `json:"batchJitter"`
	SyncGapUs      float64    `json:"syncGapUs"`
	GateGapUs      float64    `json:"gateGapUs"`
	LSKernelUs     float64    `json:"lsKernelUs"`
	BatchKernelUs  float64    `json:"batchKernelUs"`
	LongSliceUs    float64    `json:"longSliceUs"`
}

// SeedFit is the fit's worst error with one seed.
type SeedFit struct {
	Seed              uint64  `json:"seed"`
	FittedMaxErrorPct float64 `json:"fittedMaxErrorPct"`
	AllMaxErrorPct    float64 `json:"allMaxErrorPct"`
}

// Report is bench/out/gpu-model.json.
type Report struct {
	Schema  string  `json:"schema"`
	Label   string  `json:"label"`
	Date    string  `json:"date"`
	Machine string  `json:"machine"`
	WallS   float64 `json:"wallS"`
	// Measured names the real run fitted.
	Measured string    `json:"measured"`
	WindowS  float64   `json:"windowS"`
	Seed     uint64    `json:"seed"`
	Params   ParamsOut `json:"params"`
	// Search is Calibrate's record (absent when the run used Calibrated()).
	Search *Search `json:"search,omitempty"`
	// CalibratedMatches says whether the search found Calibrated()'s GPU values.
	CalibratedMatches bool    `json:"calibratedMatches"`
	Fit               FitRows `json:"fit"`
	// FittedMaxErrorPct is the worst |error| of the fitted rows and the freeze;
	// AllMaxErrorPct of every row.
	FittedMaxErrorPct float64     `json:"fittedMaxErrorPct"`
	AllMaxErrorPct    float64     `json:"allMaxErrorPct"`
	Seeds             []SeedFit   `json:"seeds"`
	Predictions       Predictions `json:"predictions"`
	// Spread is the key predictions under every default slice of the coarse grid that
	// fits within Search.RegionPct (absent without the search).
	Spread []SpreadRow `json:"spread,omitempty"`
}

// gated is the worst |error| of the rows the model must fit within 10 %: the fitted
// time-sliced rows and the freeze's.
func gated(f FitRows) float64 {
	worst := f.MaxAbsErrorPct(RoleFitted)
	for _, r := range f {
		if strings.HasPrefix(r.Phase, "freeze") {
			worst = max(worst, abs(r.ErrorPct))
		}
	}
	return worst
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// Bench calibrates (or takes Calibrated()), reports the fit, predicts the levers, prints
// the tables (Markdown) and writes cfg.Out.
func Bench(ctx context.Context, cfg Config, printf func(string, ...any)) error {
	if cfg.Window <= 0 || cfg.Seeds <= 0 {
		return fmt.Errorf("%w: window %v, seeds %d", ErrScenario, cfg.Window, cfg.Seeds)
	}
	start := time.Now()
	m := H200()
	p := Calibrated()
	rep := Report{Schema: Schema, Label: "model, not a measurement", Date: start.UTC().Format(time.RFC3339),
		Machine: machine(), Measured: m.Source, WindowS: cfg.Window.Seconds(), Seed: cfg.Seed}
	if cfg.Search {
		found, s, err := Calibrate(ctx, m, p, DefaultGrid(), cfg.Window, cfg.Seed)
		if err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		rep.Search = &s
		rep.CalibratedMatches = found.GPU == p.GPU && found.LSJitter == p.LSJitter
		p = found
		printf("calibration: %d parameter sets; best per preemption mode on the coarse grid:\n", s.Evaluated)
		for _, c := range s.Coarse {
			printf("  %-11s slice %4.0f µs, switch %3.0f µs: worst fitted error %.1f %%\n", c.Preemption, c.SliceUs, c.CostUs, c.MaxErrorPct)
		}
		printf("refined around each:\n")
		for _, c := range s.Refined {
			printf("  %-11s slice %4.0f µs, switch %3.0f µs: worst fitted error %.1f %%\n", c.Preemption, c.SliceUs, c.CostUs, c.MaxErrorPct)
		}
		for _, r := range s.Region {
			if r.Points == 0 {
				printf("  %-11s no grid point within %.0f %%\n", r.Preemption, s.RegionPct)
				continue
			}
			printf("  %-11s %d grid points within %.0f %%: slice %.0f-%.0f µs, switch %.0f-%.0f µs\n",
				r.Preemption, r.Points, s.RegionPct, r.SliceUsMin, r.SliceUsMax, r.CostUsMin, r.CostUsMax)
		}
		printf("refined: %s, slice %.0f µs, switch %.0f µs, LS jitter %.2f: worst fitted error %.1f %% (Calibrated() matches: %t)\n\n",
			s.Best.Preemption, s.Best.SliceUs, s.Best.CostUs, s.Jitter, s.Best.MaxErrorPct, rep.CalibratedMatches)
	}
	w := Workload(m, p, m.SyncEvery, cfg.Window, cfg.Seed)
	rep.Params = ParamsOut{DefaultSliceUs: us(p.GPU.DefaultSlice), SwitchCostUs: us(p.GPU.SwitchCost), Preemption: p.GPU.Preemption,
		LSJitter: p.LSJitter, BatchJitter: p.BatchJitter, SyncGapUs: us(p.SyncGap), GateGapUs: us(p.GateGap),
		LSKernelUs: us(w.LS.Kernel), BatchKernelUs: us(w.Batch.Kernel), LongSliceUs: us(LongSlice)}

	fit, err := Fit(m, p, cfg.Window, cfg.Seed)
	if err != nil {
		return fmt.Errorf("fit: %w", err)
	}
	rep.Fit, rep.FittedMaxErrorPct, rep.AllMaxErrorPct = fit, gated(fit), fit.MaxAbsErrorPct()
	for i := range cfg.Seeds {
		seed := cfg.Seed + uint64(i)
		f, err := Fit(m, p, cfg.Window, seed)
		if err != nil {
			return fmt.Errorf("fit, seed %d: %w", seed, err)
		}
		rep.Seeds = append(rep.Seeds, SeedFit{Seed: seed, FittedMaxErrorPct: gated(f), AllMaxErrorPct: f.MaxAbsErrorPct()})
	}
	printFit(printf, p, fit)
	printf("worst error, fitted rows and freeze: %.1f %%; every row: %.1f %%; over seeds %d-%d: ",
		rep.FittedMaxErrorPct, rep.AllMaxErrorPct, cfg.Seed, cfg.Seed+uint64(cfg.Seeds)-1)
	for _, s := range rep.Seeds {
		printf("%.1f/%.1f ", s.FittedMaxErrorPct, s.AllMaxErrorPct)
	}
	printf("%%\n\n")

	var alt *Params
	if rep.Search != nil {
		alt = rep.Search.Alternative
	}
	rep.Predictions, err = Predict(ctx, m, p, alt, cfg.Window, cfg.Seed)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	printPredictions(printf, rep.Predictions)
	if rep.Search != nil {
		if rep.Spread, err = Spread(ctx, m, p, rep.Search.Fitting(), cfg.Window, cfg.Seed); err != nil {
			return fmt.Errorf("spread: %w", err)
		}
		printSpread(printf, rep.Search.RegionPct, rep.Spread)
	}
	rep.WallS = time.Since(start).Seconds()

	if err := os.MkdirAll(filepath.Dir(cfg.Out), 0o755); err != nil {
		return fmt.Errorf("output folder: %w", err)
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if err := os.WriteFile(cfg.Out, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	printf("\n%.1f s; wrote %s (model, not a measurement)\n", rep.WallS, cfg.Out)
	return nil
}

func printFit(printf func(string, ...any), p Params, fit FitRows) {
	printf("Fit (model: %s preemption, default slice %.0f µs, switch %.0f µs, LS jitter %.2f):\n\n",
		p.GPU.Preemption, us(p.GPU.DefaultSlice), us(p.GPU.SwitchCost), p.LSJitter)
	printf("| phase | quantity | role | measured (H200) | model | error |\n|---|---|---|---|---|---|\n")
	for _, r := range fit {
		printf("| %s | %s | %s | %s | %s | %+.1f %% |\n", r.Phase, r.Quantity, r.Role, num(r.Measured), num(r.Model), r.ErrorPct)
	}
	printf("\n")
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func printPredictions(printf func(string, ...any), pr Predictions) {
	printf("Per-context timeslices (model):\n\n")
	printf("| batch slice µs | LS slice | sync | LS p50 / alone | LS p99 / alone | LS p99 first s / alone | batch %% of time-sliced | targets |\n|---|---|---|---|---|---|---|---|\n")
	for _, p := range pr.Timeslice {
		printf("| %.0f | %s (%.0f µs) | %d | %.2f× | %.2f× | %.2f× | %.0f %% | %s |\n", p.BatchSliceUs, p.LSSlice, p.LSSliceUs, p.SyncEvery,
			p.LSP50X, p.LSP99X, p.LSFirstSecondP99X, p.BatchPctOfSliced, meets(p))
	}
	printf("\nLaunch gate, depth 1, default slices (model):\n\n")
	printf("| batch kernel ms | sync | LS p50 / alone | LS p99 / alone | LS p99 first s / alone | batch %% of time-sliced | targets |\n|---|---|---|---|---|---|---|\n")
	for _, p := range pr.Gate {
		printf("| %.2f | %d | %.2f× | %.2f× | %.2f× | %.0f %% | %s |\n", p.BatchKernelMs, p.SyncEvery,
			p.LSP50X, p.LSP99X, p.LSFirstSecondP99X, p.BatchPctOfSliced, meets(p))
	}
	if len(pr.Alternative) > 0 {
		a := pr.Alternative[0]
		printf("\nThe same under the other preemption mode's best fit (%s, default slice %.0f µs, switch %.0f µs; model):\n\n",
			a.Preemption, a.LSSliceUs, a.SwitchCostUs)
		printf("| batch slice µs | LS slice | sync | LS p50 / alone | LS p99 / alone | LS p99 first s / alone | batch %% of time-sliced | targets |\n|---|---|---|---|---|---|---|---|\n")
		for _, p := range pr.Alternative {
			printf("| %.0f | %s (%.0f µs) | %d | %.2f× | %.2f× | %.2f× | %.0f %% | %s |\n", p.BatchSliceUs, p.LSSlice, p.LSSliceUs, p.SyncEvery,
				p.LSP50X, p.LSP99X, p.LSFirstSecondP99X, p.BatchPctOfSliced, meets(p))
		}
	}
	printf("\nSwitch-cost sensitivity, batch slice 100 µs, LS long (model):\n\n")
	printf("| switch µs | sync | LS p50 / alone | LS p99 / alone | LS p99 first s / alone | batch %% of time-sliced | targets |\n|---|---|---|---|---|---|---|\n")
	for _, p := range pr.Sensitivity {
		printf("| %.0f | %d | %.2f× | %.2f× | %.2f× | %.0f %% | %s |\n", p.SwitchCostUs, p.SyncEvery,
			p.LSP50X, p.LSP99X, p.LSFirstSecondP99X, p.BatchPctOfSliced, meets(p))
	}
}

func printSpread(printf func(string, ...any), pct float64, rows []SpreadRow) {
	printf("\nThe key rows under every default slice that fits within %.0f %% (its best switch cost; sync 8; model):\n\n", pct)
	printf("| default slice µs | switch µs | worst fitted error | batch 100 µs, LS long: LS p99 / alone, batch %% | batch 100 µs, LS default: LS p99 / alone | gate 0.2 / 0.8 / 1.66 ms: LS p99 / alone |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if len(r.Rows) != 5 {
			continue
		}
		x := r.Rows
		printf("| %.0f | %.0f | %.1f %% | %.2f×, %.0f %% | %.2f× | %.2f× / %.2f× / %.2f× |\n", r.Fit.SliceUs, r.Fit.CostUs, r.Fit.MaxErrorPct,
			x[0].LSP99X, x[0].BatchPctOfSliced, x[1].LSP99X, x[2].LSP99X, x[3].LSP99X, x[4].LSP99X)
	}
}

func meets(p Prediction) string {
	if p.LSFallsBehind {
		return "not met: LS falls behind (model)"
	}
	if p.MeetsTargets {
		return "met (model)"
	}
	return "not met (model)"
}

func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs, %s, %s/%s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
