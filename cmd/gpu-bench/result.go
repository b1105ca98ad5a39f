package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/qos"
)

// The bench's parts (-parts).
const (
	partDuty     = "duty"
	partReaction = "reaction"
	partCollect  = "collect"
)

// allParts are the parts in the order they run; the default run has every one.
var allParts = []string{partDuty, partReaction, partCollect}

// config sizes a run.
type config struct {
	Out      string         `json:"-"`
	Parts    []string       `json:"parts"`
	Duty     dutyConfig     `json:"duty"`
	Reaction reactionConfig `json:"reaction"`
	Collect  collectConfig  `json:"collect"`
}

// reactionConfig sizes the reaction part. CgroupRoot and Period are the duty part's
// (-cgroup-root, -period).
type reactionConfig struct {
	CgroupRoot string
	// Period is the duty cycler's period; LoopPeriod the GPU loop's (the agent's default
	// is gpu.DefaultLoopPeriod).
	Period     time.Duration
	LoopPeriod time.Duration
	Trials     int
	// Policy is the agent's GPU throttle policy with a short hold and a fast restore, so
	// that a trial's wait for duty 0 after LS leaves is short; neither moves the cut.
	Policy qos.GPUThrottlePolicy
}

// MarshalJSON writes durations in readable units.
func (c reactionConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		CgroupRoot   string                `json:"cgroup_root"`
		PeriodMs     float64               `json:"period_ms"`
		LoopPeriodMs float64               `json:"loop_period_ms"`
		Trials       int                   `json:"trials"`
		GPUs         int                   `json:"gpus"`
		Policy       qos.GPUThrottlePolicy `json:"policy"`
	}{c.CgroupRoot, ms(c.Period), ms(c.LoopPeriod), c.Trials, mockGPUs, c.Policy})
}

// mockGPUs is the GPU count of the NVML mock (go-nvml's DGX A100) the reaction and
// collect parts run on.
const mockGPUs = 8

// maxTrials and maxScrapes bound -trials and -collect-scrapes (each sample is kept).
const (
	maxTrials  = 10_000
	maxScrapes = 1_000_000
	maxProcs   = 64
)

func (c reactionConfig) validate() error {
	if c.Trials < 1 || c.Trials > maxTrials {
		return fmt.Errorf("-trials %d not in [1, %d]", c.Trials, maxTrials)
	}
	if c.LoopPeriod < time.Millisecond || c.LoopPeriod > time.Second {
		return fmt.Errorf("-loop-period %v not in [1ms, 1s]", c.LoopPeriod)
	}
	if err := c.Policy.Validate(); err != nil {
		return fmt.Errorf("the reaction bench's GPU throttle policy: %w", err)
	}
	return nil
}

// benchGPUPolicy is the reaction part's policy: the agent's defaults at the bench's duty
// period, with a 100 ms hold and a restore of 10 duty per second (0.9 to 0 in 90 ms).
func benchGPUPolicy(period time.Duration) qos.GPUThrottlePolicy {
	p := qos.DefaultGPUThrottlePolicy()
	p.Period = metav1.Duration{Duration: period}
	p.Hold = metav1.Duration{Duration: 100 * time.Millisecond}
	p.RestorePerSecond = 10
	return p
}

// collectConfig sizes the collector part.
type collectConfig struct {
	// Iterations is the number of timed scrapes.
	Iterations int `json:"scrapes"`
	// ProcsPerGPU is the number of processes on each of the mock's GPUs.
	ProcsPerGPU int `json:"procs_per_gpu"`
}

func (c collectConfig) validate() error {
	if c.Iterations < 1 || c.Iterations > maxScrapes {
		return fmt.Errorf("-collect-scrapes %d not in [1, %d]", c.Iterations, maxScrapes)
	}
	if c.ProcsPerGPU < 0 || c.ProcsPerGPU > maxProcs {
		return fmt.Errorf("-collect-procs %d not in [0, %d]", c.ProcsPerGPU, maxProcs)
	}
	return nil
}

// result is bench/out/gpu.json.
type result struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Config  config `json:"config"`

	// DutyErrorPct is |frozen share - target| in percentage points per target duty
	// ("25", "50", "75"), measured against the unfrozen baseline on the freezer the agent
	// uses here (the first of Duty that ran). Target: <= 5.
	// Absent when the duty part did not run, like every part's figures.
	DutyErrorPct map[string]float64 `json:"duty_error_pct,omitempty"`
	// DutyErrorMaxPct is the largest of DutyErrorPct.
	DutyErrorMaxPct *float64 `json:"duty_error_max_pct,omitempty"`
	// Duty is every freezer measured, with each point's terms.
	Duty []dutyRun `json:"duty,omitempty"`

	// ReactionMs is the time from an LS GPU load step (on the NVML mock) until batch is
	// frozen; target <= 100 ms p99. Filled by the reaction part; absent until it runs.
	ReactionMs *reactionResult `json:"reaction_ms,omitempty"`
	// CollectUSPerDevice is the collector's cost per device per scrape, microseconds.
	// Filled by the collector part; absent until it runs.
	CollectUSPerDevice *float64 `json:"collect_us_per_device,omitempty"`
	// Collect is the collector part's detail.
	Collect *collectRun `json:"collect,omitempty"`
}

// reactionResult is the reaction part's measurement, milliseconds. p99 is the
// nearest-rank percentile: with fewer than 100 trials it is the maximum.
type reactionResult struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
	// Freezer is the freezer the batch cgroup was frozen with (v1 freezer.state on v1
	// and hybrid nodes, as the agent does).
	Freezer string `json:"freezer,omitempty"`
	Trials  int    `json:"trials,omitempty"`
	// RestoreP50 is the time from LS leaving to duty 0 and the group thawed (the bench
	// policy's hold and restore, not the agent's defaults).
	RestoreP50 float64   `json:"restore_p50,omitempty"`
	Samples    []float64 `json:"samples,omitempty"`
}

// collectRun is the collector part's measurement, microseconds.
type collectRun struct {
	GPUs         int     `json:"gpus"`
	ProcsPerGPU  int     `json:"procs_per_gpu"`
	Scrapes      int     `json:"scrapes"`
	ScrapeUSMean float64 `json:"scrape_us_mean"`
	ScrapeUSP50  float64 `json:"scrape_us_p50"`
	ScrapeUSP99  float64 `json:"scrape_us_p99"`
	// USPerDevice is ScrapeUSMean / GPUs: collect_us_per_device.
	USPerDevice float64 `json:"us_per_device"`
}

// percentile is the nearest-rank percentile q (0..1) of sorted, which must not be empty.
func percentile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// runBench runs cfg.Parts and writes cfg.Out. A part that fails fails the run: no
// partial JSON is written.
func runBench(ctx context.Context, cfg config, printf func(string, ...any)) error {
	res := result{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Config: cfg}
	if slices.Contains(cfg.Parts, partDuty) {
		runs, err := runDuty(ctx, cfg.Duty, printf)
		if err != nil {
			return err
		}
		res.Duty = runs
		res.DutyErrorPct = map[string]float64{}
		worst := 0.0
		for _, p := range runs[0].Points {
			key := strconv.FormatFloat(p.Target*100, 'f', -1, 64)
			res.DutyErrorPct[key] = p.ErrorPct
			worst = math.Max(worst, p.ErrorPct)
		}
		res.DutyErrorMaxPct = &worst
		printf("duty_error_pct (%s): %v, max %.2f\n", runs[0].Freezer, res.DutyErrorPct, worst)
	}
	if slices.Contains(cfg.Parts, partReaction) {
		r, err := runReaction(ctx, cfg.Reaction, printf)
		if err != nil {
			return fmt.Errorf("reaction: %w", err)
		}
		res.ReactionMs = r
	}
	if slices.Contains(cfg.Parts, partCollect) {
		c, err := runCollect(ctx, cfg.Collect, printf)
		if err != nil {
			return fmt.Errorf("collect: %w", err)
		}
		res.Collect = c
		res.CollectUSPerDevice = &c.USPerDevice
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
	printf("wrote %s\n", cfg.Out)
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
