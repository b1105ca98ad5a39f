package gpubench

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

	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/qos"
)

// The bench's parts (-parts).
const (
	partDuty     = "duty"
	partReaction = "reaction"
	partCollect  = "collect"
	partAgentCPU = "agent_cpu"
)

// Parts are the parts in the order they run; the default run has every one.
func Parts() []string { return []string{partDuty, partReaction, partCollect, partAgentCPU} }

// Config sizes a run: DefaultConfig is `make bench-gpu`, cmd/gpu-bench's flags change it.
type Config struct {
	Out      string         `json:"-"`
	Parts    []string       `json:"parts"`
	Duty     DutyConfig     `json:"duty"`
	Reaction ReactionConfig `json:"reaction"`
	Collect  CollectConfig  `json:"collect"`
	AgentCPU AgentCPUConfig `json:"agent_cpu"`
}

// AgentCPUConfig sizes the agent_cpu part. CgroupRoot is the duty part's (-cgroup-root),
// LoopPeriod the reaction part's (-loop-period).
type AgentCPUConfig struct {
	CgroupRoot string
	// Duration is the measured window of each run, after Warmup.
	Duration, Warmup time.Duration
	// ProcsPerPod is the number of processes of each GPU pod.
	ProcsPerPod int
	// LoopPeriod and FullScrapePeriod are the agent's gpu.loopPeriod and
	// gpu.fullScrapePeriod.
	LoopPeriod, FullScrapePeriod time.Duration
	// Roles is what runs on each mock GPU, by index (roleShared, roleLS, roleBatch,
	// roleIdle).
	Roles []string
	// GPUOff also measures the agent with GPU features off, over the same node.
	GPUOff bool
	// CPUProfile, when set, is where the agent of the run with GPU features on writes its
	// CPU profile (profiling costs CPU too: not for the figure of record).
	CPUProfile string
	// Signals is the agent's signals.mode ("": its default, auto).
	Signals string
}

// MarshalJSON writes durations in readable units.
func (c AgentCPUConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		CgroupRoot         string   `json:"cgroup_root"`
		DurationS          float64  `json:"duration_s"`
		WarmupS            float64  `json:"warmup_s"`
		ProcsPerPod        int      `json:"procs_per_pod"`
		LoopPeriodMs       float64  `json:"loop_period_ms"`
		FullScrapePeriodMs float64  `json:"full_scrape_period_ms"`
		GPURoles           []string `json:"gpu_roles"`
		GPUOff             bool     `json:"gpu_off"`
	}{c.CgroupRoot, c.Duration.Seconds(), c.Warmup.Seconds(), c.ProcsPerPod, ms(c.LoopPeriod),
		ms(c.FullScrapePeriod), c.Roles, c.GPUOff})
}

// GPU roles of the agent_cpu node (-agent-gpus).
const (
	roleShared = "shared" // an LS pod and a batch pod: the throttle duty-cycles batch
	roleLS     = "ls"     // an LS pod alone
	roleBatch  = "batch"  // a batch pod alone
	roleIdle   = "idle"   // no process
)

// defaultGPURoles is every case the GPU loop tells apart, two GPUs each.
func defaultGPURoles() []string {
	return []string{roleShared, roleShared, roleLS, roleLS, roleBatch, roleBatch, roleIdle, roleIdle}
}

// Bounds of the agent_cpu flags.
const (
	maxAgentDuration = time.Hour
	maxProcsPerPod   = 16
)

func (c AgentCPUConfig) validate() error {
	if c.Duration < time.Second || c.Duration > maxAgentDuration {
		return fmt.Errorf("-agent-duration %v not in [1s, %v]", c.Duration, maxAgentDuration)
	}
	if c.Warmup < 0 || c.Warmup > maxAgentDuration {
		return fmt.Errorf("-agent-warmup %v not in [0s, %v]", c.Warmup, maxAgentDuration)
	}
	if len(c.Roles) != mockGPUs {
		return fmt.Errorf("-agent-gpus: %d roles, want one for each of the mock's %d GPUs", len(c.Roles), mockGPUs)
	}
	for _, r := range c.Roles {
		if !slices.Contains([]string{roleShared, roleLS, roleBatch, roleIdle}, r) {
			return fmt.Errorf("-agent-gpus: %q is not one of %s, %s, %s, %s", r, roleShared, roleLS, roleBatch, roleIdle)
		}
	}
	if c.ProcsPerPod < 1 || c.ProcsPerPod > maxProcsPerPod {
		return fmt.Errorf("-agent-procs %d not in [1, %d]", c.ProcsPerPod, maxProcsPerPod)
	}
	// The agent's own bounds (config.GPU.Validate in koordlet/config) apply too, in the child.
	if c.FullScrapePeriod < c.LoopPeriod || c.FullScrapePeriod > 10*time.Second {
		return fmt.Errorf("-agent-full-scrape-period %v not in [-loop-period (%v), 10s]", c.FullScrapePeriod,
			c.LoopPeriod)
	}
	return nil
}

// ReactionConfig sizes the reaction part. CgroupRoot and Period are the duty part's
// (-cgroup-root, -period).
type ReactionConfig struct {
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
func (c ReactionConfig) MarshalJSON() ([]byte, error) {
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
const mockGPUs = gpumock.GPUs

// maxTrials and maxScrapes bound -trials and -collect-scrapes (each sample is kept).
const (
	maxTrials  = 10_000
	maxScrapes = 1_000_000
	maxProcs   = 64
)

func (c ReactionConfig) validate() error {
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

// benchGPUPolicy is the reaction part's policy: the agent's defaults at the bench's
// freezer period, with a 100 ms hold (batch thawed 100 ms after LS went idle).
func benchGPUPolicy(period time.Duration) qos.GPUThrottlePolicy {
	p := qos.DefaultGPUThrottlePolicy()
	p.Period = metav1.Duration{Duration: period}
	p.Hold = metav1.Duration{Duration: 100 * time.Millisecond}
	return p
}

// CollectConfig sizes the collector part.
type CollectConfig struct {
	// Iterations is the number of timed scrapes.
	Iterations int `json:"scrapes"`
	// ProcsPerGPU is the number of processes on each of the mock's GPUs.
	ProcsPerGPU int `json:"procs_per_gpu"`
}

func (c CollectConfig) validate() error {
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
	Config  Config `json:"config"`

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

	// AgentCPUPctOfCore is the koordlet agent's CPU, percent of one core, with 8 mock GPUs
	// and 110 pods (AgentCPU.Included says what it counts); target <= 1. AgentRSSMiB is
	// its resident memory at the end of the window. Filled by the agent_cpu part.
	AgentCPUPctOfCore *float64 `json:"agent_cpu_pct_of_core,omitempty"`
	AgentRSSMiB       *float64 `json:"agent_rss_mib,omitempty"`
	// AgentCPU is the agent_cpu part's detail.
	AgentCPU *agentCPURun `json:"agent_cpu,omitempty"`
}

// agentCPURun is the agent_cpu part's measurement.
type agentCPURun struct {
	// Included says what the CPU figure counts, and what it leaves out.
	Included     string  `json:"included"`
	Pods         int     `json:"pods"`
	GPUs         int     `json:"gpus"`
	GPUProcesses int     `json:"gpu_processes"`
	ProcsPerPod  int     `json:"procs_per_pod"`
	DurationS    float64 `json:"duration_s"`
	LoopPeriodMs float64 `json:"loop_period_ms"`
	// FullScrapePeriodMs is the agent's gpu.fullScrapePeriod.
	FullScrapePeriodMs float64 `json:"full_scrape_period_ms"`
	CPUPctOfCore       float64 `json:"cpu_pct_of_core"`
	RSSMiB             float64 `json:"rss_mib"`
	PeakRSSMiB         float64 `json:"peak_rss_mib"`
	// GPUOff is the same agent over the same node with GPU features off;
	// GPUShareOfCorePct the difference, the GPU loop's share (with the run-to-run noise
	// of both figures).
	GPUOff            *agentSample `json:"gpu_off,omitempty"`
	GPUShareOfCorePct *float64     `json:"gpu_share_pct_of_core,omitempty"`
	// GPUsSeen is each GPU as the agent's /status showed it at the end of the window.
	GPUsSeen []agentGPU `json:"gpu_status"`
}

// agentSample is one run's CPU and memory.
type agentSample struct {
	CPUPctOfCore float64 `json:"cpu_pct_of_core"`
	RSSMiB       float64 `json:"rss_mib"`
	PeakRSSMiB   float64 `json:"peak_rss_mib"`
}

// agentGPU is one GPU of the agent_cpu node.
type agentGPU struct {
	Index int `json:"index"`
	// Role is what runs on it: shared (an LS and a batch pod), ls, batch, idle.
	Role string `json:"role"`
	// Cadence is how the GPU loop reads it (gpu.CadenceFast, gpu.CadenceFrozen or
	// gpu.CadenceProbe).
	Cadence   string  `json:"cadence"`
	Duty      float64 `json:"duty"`
	Reason    string  `json:"reason"`
	LSPods    int     `json:"ls_pods"`
	BatchPods int     `json:"batch_pods"`
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
	// ProbeUSMean is a Collect that only probes every GPU (process lists unchanged, so
	// each GPU's last full read is returned), as Scrapes times; ProbeUSPerDevice per GPU.
	ProbeUSMean      float64 `json:"probe_us_mean"`
	ProbeUSPerDevice float64 `json:"probe_us_per_device"`
}

// percentile is the nearest-rank percentile q (0..1) of sorted, which must not be empty.
func percentile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// runBench runs cfg.Parts and writes cfg.Out. A part that fails fails the run: no
// partial JSON is written.
func runBench(ctx context.Context, cfg Config, printf func(string, ...any)) error {
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
	if slices.Contains(cfg.Parts, partAgentCPU) {
		a, err := runAgentCPU(ctx, cfg.AgentCPU, printf)
		if err != nil {
			return fmt.Errorf("agent_cpu: %w", err)
		}
		res.AgentCPU = a
		res.AgentCPUPctOfCore, res.AgentRSSMiB = &a.CPUPctOfCore, &a.RSSMiB
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
