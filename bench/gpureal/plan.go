package gpureal

import (
	"fmt"
	"slices"
	"time"
)

// Sections: one per agent configuration. A section starts fresh workload processes
// (new pods and containers through the NRI runtime), so every container of an agent
// section is created while that agent's plugin is registered.
const (
	// sectionNothing: no agent; the runtime has no plugin (kubelet's plain placement,
	// the driver's time-slicing).
	sectionNothing = "nothing"
	// sectionAgent: the agent with the freeze lever alone (gpu.mps.mode disabled).
	sectionAgent = "agent"
	// sectionMPS: the agent with gpu.mps.mode run; containers get CUDA_MPS_* from its
	// NRI plugin.
	sectionMPS = "agent-mps"
)

// Batch stand-ins.
const (
	batchNone    = ""
	batchShallow = "batch"      // synchronize every 8 matmuls
	batchDeep    = "batch-deep" // synchronize every 64 matmuls
)

// lsMode is what the LS stand-in does in a phase.
type lsMode string

const (
	lsOff lsMode = ""
	// lsRun: open loop for the whole phase.
	lsRun lsMode = "run"
	// lsGoIdle: open loop during the lead-in, then it keeps its CUDA context and sends
	// nothing for the measured window (batch's recovery is timed from the lead-in's end).
	lsGoIdle lsMode = "go-idle"
	// lsWake: idle (context held) during the lead-in, then the open loop for the window.
	lsWake lsMode = "wake"
	// lsArrive: a new LS pod (new process, new CUDA context) starts after the lead-in
	// while batch runs; its window starts when it is ready.
	lsArrive lsMode = "arrive"
	// lsMem: the memory-cap check (memcap.go): LS holds device memory, batch allocates
	// until CUDA refuses, LS checks its memory and allocates more; no timed window.
	lsMem lsMode = "mem"
)

// phaseSpec is one measured phase.
type phaseSpec struct {
	Name      string `json:"name"`
	Section   string `json:"section"`
	Title     string `json:"title"`
	BatchKind string `json:"batchKind,omitempty"`
	LSMode    lsMode `json:"lsMode,omitempty"`
	// Lead is the lead-in before the measured window (see lsMode); Window its length.
	Lead   time.Duration `json:"-"`
	Window time.Duration `json:"-"`
	// Pair is the nothing-done phase an agent phase is compared with.
	Pair string `json:"pair,omitempty"`
	// StopLSBefore: the section's LS process exits before this phase (lsArrive).
	StopLSBefore bool `json:"-"`
}

// planConfig sizes the phases.
type planConfig struct {
	Phase time.Duration // the main phases (≥ 20 s for the recorded table)
	Short time.Duration // the auxiliary windows (deep alone, idle, wake, arrival)
	Lead  time.Duration // lead-ins
	MPS   bool          // the MPS section
	// MemCap adds the memory-cap check to the MPS section (phMemCap).
	MemCap bool
	// Sections, when set, keeps only the phases of these sections (a short follow-up
	// run; ratios and targets then need their baselines from the same run, else they
	// read "not measured").
	Sections []string
}

func defaultPlanConfig() planConfig {
	return planConfig{Phase: 20 * time.Second, Short: 10 * time.Second, Lead: 4 * time.Second, MPS: true, MemCap: true}
}

// Phase names the targets and the table refer to.
const (
	phBatchAlone   = "batch-alone"
	phDeepAlone    = "deep-alone"
	phLSAlone      = "ls-alone"
	phNothing      = "nothing"
	phDeepNothing1 = "deep-nothing-1"
	phDeepNothing2 = "deep-nothing-2"
	phIdleNothing  = "ls-idle-nothing"
	phWakeNothing  = "ls-wakes-nothing"
	phAgent        = "agent"
	phDeepAgent1   = "deep-agent-1"
	phDeepAgent2   = "deep-agent-2"
	phIdleAgent    = "ls-idle-agent"
	phWakeAgent    = "ls-wakes-agent"
	phArriveAgent  = "ls-arrives-agent"
	phMPS          = "agent-mps"
	phMemCap       = "agent-mps-memcap"
)

// knownSections are the sections -sections may name.
var knownSections = []string{sectionNothing, sectionAgent, sectionMPS}

// selectSections keeps the phases of the named sections (all for none), in plan order.
func selectSections(phases []phaseSpec, sections []string) ([]phaseSpec, error) {
	if len(sections) == 0 {
		return phases, nil
	}
	for _, s := range sections {
		if !slices.Contains(knownSections, s) {
			return nil, fmt.Errorf("-sections: unknown section %q (want some of %v)", s, knownSections)
		}
	}
	out := slices.DeleteFunc(slices.Clone(phases), func(p phaseSpec) bool { return !slices.Contains(sections, p.Section) })
	if len(out) == 0 {
		return nil, fmt.Errorf("-sections %v: no phase left (is the MPS section off?)", sections)
	}
	return out, nil
}

// plan is the phase sequence, in run order. Within a section the order matters: the
// batch-alone phases run before the LS process exists; the arrival phase stops the
// section's LS first.
func plan(c planConfig) []phaseSpec {
	p := []phaseSpec{
		{Name: phBatchAlone, Section: sectionNothing, Title: "batch alone", BatchKind: batchShallow, Window: c.Phase},
		{Name: phDeepAlone, Section: sectionNothing, Title: "deep-queue batch alone", BatchKind: batchDeep, Window: c.Short},
		{Name: phLSAlone, Section: sectionNothing, Title: "LS alone", LSMode: lsRun, Window: c.Phase},
		{Name: phNothing, Section: sectionNothing, Title: "LS + batch, nothing done", BatchKind: batchShallow, LSMode: lsRun,
			Window: c.Phase},
		{Name: phDeepNothing1, Section: sectionNothing, Title: "LS + deep-queue batch, nothing done (1)",
			BatchKind: batchDeep, LSMode: lsRun, Window: c.Phase},
		{Name: phDeepNothing2, Section: sectionNothing, Title: "LS + deep-queue batch, nothing done (2)",
			BatchKind: batchDeep, LSMode: lsRun, Window: c.Phase},
		{Name: phIdleNothing, Section: sectionNothing, Title: "LS idle (context held) + batch, nothing done",
			BatchKind: batchShallow, LSMode: lsGoIdle, Lead: c.Lead, Window: c.Short},
		{Name: phWakeNothing, Section: sectionNothing, Title: "idle LS wakes next to batch, nothing done",
			BatchKind: batchShallow, LSMode: lsWake, Lead: c.Lead, Window: c.Short},

		{Name: phAgent, Section: sectionAgent, Title: "LS + batch, agent (freeze)", BatchKind: batchShallow, LSMode: lsRun,
			Window: c.Phase, Pair: phNothing},
		{Name: phDeepAgent1, Section: sectionAgent, Title: "LS + deep-queue batch, agent (1)", BatchKind: batchDeep,
			LSMode: lsRun, Window: c.Phase, Pair: phDeepNothing1},
		{Name: phDeepAgent2, Section: sectionAgent, Title: "LS + deep-queue batch, agent (2)", BatchKind: batchDeep,
			LSMode: lsRun, Window: c.Phase, Pair: phDeepNothing2},
		{Name: phIdleAgent, Section: sectionAgent, Title: "LS idle (context held) + batch, agent", BatchKind: batchShallow,
			LSMode: lsGoIdle, Lead: c.Lead, Window: c.Short, Pair: phIdleNothing},
		{Name: phWakeAgent, Section: sectionAgent, Title: "idle LS wakes next to batch, agent", BatchKind: batchShallow,
			LSMode: lsWake, Lead: c.Lead, Window: c.Short, Pair: phWakeNothing},
		{Name: phArriveAgent, Section: sectionAgent, Title: "LS arrives where batch runs, agent", BatchKind: batchShallow,
			LSMode: lsArrive, Lead: c.Lead, Window: c.Short, StopLSBefore: true},
	}
	if c.MPS {
		p = append(p, phaseSpec{Name: phMPS, Section: sectionMPS, Title: "LS + batch, agent (MPS)",
			BatchKind: batchShallow, LSMode: lsRun, Window: c.Phase, Pair: phNothing})
		if c.MemCap {
			p = append(p, phaseSpec{Name: phMemCap, Section: sectionMPS,
				Title: "batch allocates past its memory share; LS keeps its memory (agent, MPS)", BatchKind: batchShallow,
				LSMode: lsMem})
		}
	}
	return p
}

// Fixed costs the estimate counts, measured or bounded on the GPU machine's class of
// host: a stand-in's start (python, import torch, CUDA context, cuBLAS warm-up), the
// agent's start and the gap between phases (results read, GPU queue drained).
const (
	estWorkloadStart = 12 * time.Second
	estAgentStart    = 5 * time.Second
	estGap           = 2 * time.Second
	// estArrivalStart is an arriving LS stand-in's start (its window begins when ready).
	estArrivalStart = 10 * time.Second
	// estMemCap bounds the memory-cap check: allocations of a GPU's memory in 256 MiB
	// chunks, a check of what LS holds, the frees.
	estMemCap = 15 * time.Second
)

// estimate is how long a plan takes, end to end, by the fixed costs above.
func estimate(phases []phaseSpec) time.Duration {
	var d time.Duration
	section := ""
	for _, ph := range phases {
		if ph.Section != section {
			section = ph.Section
			d += estWorkloadStart // the section's stand-ins start together
			if section != sectionNothing {
				d += estAgentStart
			}
		}
		if ph.Name == phLSAlone {
			d += estWorkloadStart // the LS stand-in starts after the batch-alone phases
		}
		d += ph.Lead + ph.Window + estGap
		if ph.LSMode == lsArrive {
			d += estArrivalStart
		}
		if ph.LSMode == lsMem {
			d += estMemCap
		}
	}
	return d
}

// validatePlan checks the sizes a recorded run needs (phases long enough for stable p99s).
func validatePlan(c planConfig) error {
	switch {
	case c.Phase <= 0 || c.Short <= 0 || c.Lead < 0:
		return fmt.Errorf("phase durations must be positive: phase %v, short %v, lead %v", c.Phase, c.Short, c.Lead)
	case c.Short > c.Phase:
		return fmt.Errorf("-short %v is longer than -phase %v", c.Short, c.Phase)
	case c.Short < 3*time.Second:
		return fmt.Errorf("-short %v: the idle and arrival windows need ≥ 3 s (recovery is judged at 2 s)", c.Short)
	}
	return nil
}
