package gpureal

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// resultSchema versions bench/out/gpu-real.json.
const resultSchema = "understory.gpu-real/v1"

// result is bench/out/gpu-real.json.
type result struct {
	Schema    string    `json:"schema"`
	Started   time.Time `json:"started"`
	DurationS float64   `json:"durationS"`
	// Fake: the stand-ins were the driver's GPU-free fakes (a dry run, no GPU figures).
	Fake bool `json:"fake"`
	// Host is what the run found: GPU, driver, cgroup layout, the stand-ins' torch.
	Host     hostInfo       `json:"host"`
	Config   runConfig      `json:"config"`
	Phases   []phaseResult  `json:"phases"`
	Sections []sectionInfo  `json:"sections"`
	Targets  []targetResult `json:"targets"`
	// Error is why the run stopped early, if it did (the phases before it are kept).
	Error string `json:"error,omitempty"`
}

// hostInfo describes the machine.
type hostInfo struct {
	GPU          string `json:"gpu,omitempty"`
	NvidiaSMI    string `json:"nvidiaSmi,omitempty"`
	CgroupLayout string `json:"cgroupLayout"`
	CgroupRoot   string `json:"cgroupRoot"`
	KubeletRoot  string `json:"kubeletCgroupRoot"`
	Torch        string `json:"torch,omitempty"`
	CPUs         int    `json:"cpus"`
}

// runConfig is the run's settings as recorded.
type runConfig struct {
	PhaseS        float64 `json:"phaseS"`
	ShortS        float64 `json:"shortS"`
	LeadS         float64 `json:"leadS"`
	LSRate        float64 `json:"lsRequestsPerSecond"`
	LSMatmuls     int     `json:"lsMatmulsPerRequest"`
	LSSize        int     `json:"lsMatrixSize"`
	BatchSize     int     `json:"batchMatrixSize"`
	BatchEvery    int     `json:"batchSyncEvery"`
	DeepEvery     int     `json:"deepBatchSyncEvery"`
	MPS           string  `json:"mps"`
	LSGPUMilli    int     `json:"lsGpuMilli"`
	BatchGPUMilli int     `json:"batchGpuMilli"`
	Agent         string  `json:"agent"`
	EstimateS     float64 `json:"estimateS"`
}

// sectionInfo is what one agent configuration looked like: the agent's config, its
// containers' adjustments from NRI, the processes on the GPU.
type sectionInfo struct {
	Name        string            `json:"name"`
	AgentConfig string            `json:"agentConfig,omitempty"`
	Containers  []containerReport `json:"containers"`
	GPUProcs    string            `json:"gpuProcesses,omitempty"`
	// AgentCPUPct is the agent's CPU over the whole section (start to stop).
	AgentCPUPct *float64 `json:"agentCpuPctOfCore,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// phaseResult is one phase's measurement.
type phaseResult struct {
	phaseSpec
	LeadS   float64   `json:"leadS"`
	WindowS float64   `json:"windowS"`
	Start   time.Time `json:"start"`
	LS      *lsStats  `json:"ls,omitempty"`
	// LeadLS is LS during the lead-in of a phase whose window has LS idle.
	LeadLS *lsStats    `json:"leadLs,omitempty"`
	Batch  *batchStats `json:"batch,omitempty"`
	// Recovery is batch's recovery after LS went idle (lsGoIdle phases).
	Recovery *recovery `json:"recovery,omitempty"`
	// MemCap is the memory-cap check's outcome (lsMem phases, memcap.go).
	MemCap *memCapResult `json:"memCap,omitempty"`
	Ratios ratios        `json:"ratios"`
	// AgentCPUPct is the agent's CPU over the window, % of one core.
	AgentCPUPct *float64 `json:"agentCpuPctOfCore,omitempty"`
	// Agent is what /status said during the phase: each distinct GPU decision, when first
	// seen and how often.
	Agent []statusSample `json:"agent,omitempty"`
	Notes []string       `json:"notes,omitempty"`
}

// ratios compare a phase with the baselines of the same run.
type ratios struct {
	LSP50VsAlone   *float64 `json:"lsP50VsAlone,omitempty"`
	LSP99VsAlone   *float64 `json:"lsP99VsAlone,omitempty"`
	BatchVsAlone   *float64 `json:"batchVsAlone,omitempty"`
	LSP99VsNothing *float64 `json:"lsP99VsNothing,omitempty"`
	BatchVsNothing *float64 `json:"batchVsNothing,omitempty"`
}

func ratio(a, b float64, okA, okB bool) *float64 {
	if !okA || !okB || b <= 0 {
		return nil
	}
	r := a / b
	return &r
}

// fillRatios computes every phase's ratios against LS alone, the batch's alone phase
// (shallow or deep) and its nothing-done pair.
func fillRatios(phases []phaseResult) {
	m := byName(phases)
	aloneLS := m[phLSAlone]
	a99, okA99 := lsP99(aloneLS)
	var a50 float64
	okA50 := okA99
	if okA50 {
		a50 = aloneLS.LS.P50
	}
	for i := range phases {
		p := &phases[i]
		r := ratios{}
		if p.LS != nil && p.LS.Requests > 0 && p.Name != phLSAlone {
			r.LSP50VsAlone = ratio(p.LS.P50, a50, true, okA50)
			r.LSP99VsAlone = ratio(p.LS.P99, a99, true, okA99)
		}
		if b, ok := batchRate(p); ok && p.Name != phBatchAlone && p.Name != phDeepAlone {
			alone := m[phBatchAlone]
			if p.BatchKind == batchDeep {
				alone = m[phDeepAlone]
			}
			ab, okB := batchRate(alone)
			r.BatchVsAlone = ratio(b, ab, ok, okB)
		}
		if n := m[p.Pair]; n != nil {
			x, ok1 := lsP99(p)
			y, ok2 := lsP99(n)
			r.LSP99VsNothing = ratio(x, y, ok1, ok2)
			bx, ok3 := batchRate(p)
			by, ok4 := batchRate(n)
			r.BatchVsNothing = ratio(bx, by, ok3, ok4)
		}
		p.Ratios = r
	}
}

func fmtRatio(r *float64) string {
	if r == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f×", *r)
}

// printTable writes the phase table (the one docs/benchmarks.md records), then the targets.
func printTable(w io.Writer, res *result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tLS p50 ms\tLS p99 ms\tLS p99 1st s\tbatch matmuls/s\tLS p99 / alone\tbatch / alone\t"+
		"LS p99 / nothing\tbatch / nothing\tagent CPU %\tagent decisions")
	for _, p := range res.Phases {
		ls50, ls99, first, batch := "–", "–", "–", "–"
		if p.LS != nil && p.LS.Requests > 0 {
			ls50, ls99 = fmt.Sprintf("%.2f", p.LS.P50), fmt.Sprintf("%.2f", p.LS.P99)
			first = fmt.Sprintf("%.2f", p.LS.FirstSecondP99)
			if p.LS.Unsent > 0 {
				ls99 += fmt.Sprintf(" (%d unsent)", p.LS.Unsent)
			}
		}
		if p.Batch != nil {
			batch = fmt.Sprintf("%.0f", p.Batch.PerSecond)
		}
		if p.Recovery != nil {
			batch += fmt.Sprintf(" (90 %% at %.2f s)", p.Recovery.Seconds)
		}
		cpu := "–"
		if p.AgentCPUPct != nil {
			cpu = fmt.Sprintf("%.2f", *p.AgentCPUPct)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, ls50, ls99, first, batch,
			fmtRatio(p.Ratios.LSP99VsAlone), fmtRatio(p.Ratios.BatchVsAlone), fmtRatio(p.Ratios.LSP99VsNothing),
			fmtRatio(p.Ratios.BatchVsNothing), cpu, decisionsSummary(p.Agent))
	}
	_ = tw.Flush()
	for _, p := range res.Phases {
		if p.MemCap != nil {
			fmt.Fprintf(w, "memory cap (%s): %s\n", p.Name, p.MemCap.Verdict)
		}
	}
	for _, s := range res.Sections {
		for _, n := range s.Notes {
			fmt.Fprintf(w, "note (%s): %s\n", s.Name, n)
		}
	}
	if res.Error != "" {
		fmt.Fprintf(w, "STOPPED EARLY: %s\n", res.Error)
	}
	fmt.Fprintln(w)
	for _, t := range res.Targets {
		fmt.Fprintf(w, "target %-9s %s\n    %s\n", t.verdict()+":", t.Target, t.Value)
		if t.Detail != "" {
			fmt.Fprintf(w, "    (%s)\n", t.Detail)
		}
	}
}

// decisionsSummary is a short text of the decisions seen: reason and lever, most seen
// first.
func decisionsSummary(s []statusSample) string {
	if len(s) == 0 {
		return "–"
	}
	var parts []string
	for i, x := range s {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("+%d more", len(s)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%s×%d", x.Key, x.Count))
	}
	return strings.Join(parts, ", ")
}

// writeResult writes res as indented JSON, through a temporary file.
func writeResult(path string, res *result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
