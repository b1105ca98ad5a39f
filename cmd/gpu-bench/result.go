package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// config sizes a run.
type config struct {
	Out  string     `json:"-"`
	Duty dutyConfig `json:"duty"`
}

// result is bench/out/gpu.json.
type result struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Config  config `json:"config"`

	// DutyErrorPct is |frozen share - target| in percentage points per target duty
	// ("25", "50", "75"), measured against the unfrozen baseline on the freezer the agent
	// uses here (the first of Duty that ran). Target: <= 5.
	DutyErrorPct map[string]float64 `json:"duty_error_pct"`
	// DutyErrorMaxPct is the largest of DutyErrorPct.
	DutyErrorMaxPct float64 `json:"duty_error_max_pct"`
	// Duty is every freezer measured, with each point's terms.
	Duty []dutyRun `json:"duty"`

	// ReactionMs is the time from an LS GPU load step (on the NVML mock) until batch is
	// frozen; target <= 100 ms p99. Filled by the reaction part; absent until it runs.
	ReactionMs *reactionResult `json:"reaction_ms,omitempty"`
	// CollectUSPerDevice is the collector's cost per device per scrape, microseconds.
	// Filled by the collector part; absent until it runs.
	CollectUSPerDevice *float64 `json:"collect_us_per_device,omitempty"`
}

// reactionResult is the slot for the reaction-time measurement.
type reactionResult struct {
	P50     float64   `json:"p50"`
	P99     float64   `json:"p99"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples,omitempty"`
}

// runBench runs every part and writes cfg.Out.
func runBench(ctx context.Context, cfg config, printf func(string, ...any)) error {
	res := result{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Config: cfg}
	runs, err := runDuty(ctx, cfg.Duty, printf)
	if err != nil {
		return err
	}
	res.Duty = runs
	res.DutyErrorPct = map[string]float64{}
	for _, p := range runs[0].Points {
		key := strconv.FormatFloat(p.Target*100, 'f', -1, 64)
		res.DutyErrorPct[key] = p.ErrorPct
		res.DutyErrorMaxPct = math.Max(res.DutyErrorMaxPct, p.ErrorPct)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Out), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(cfg.Out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	printf("duty_error_pct (%s): %v, max %.2f\nwrote %s\n", runs[0].Freezer, res.DutyErrorPct, res.DutyErrorMaxPct, cfg.Out)
	return nil
}

func machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	model := "unknown CPU"
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs, %s, %s/%s, Linux %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, kernel)
}
