package colo

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// demoConfig drives `colo demo` and the CPU phases of `colo bench`.
type demoConfig struct {
	phase     time.Duration // length of each measured CPU phase
	warmup    time.Duration // after the agent is healthy (or batch started), before measuring
	threshold float64
	period    time.Duration
	memory    bool          // also run the memory-pressure phases
	rounds    int           // demo: paired rounds of the four CPU phases
	memPhase  time.Duration // length of each memory phase (0: the memory scenario's own)
}

// cpuPhase is one of the four CPU phases of a round.
type cpuPhase int

const (
	phaseSolo    cpuPhase = iota // LS alone
	phaseVanilla                 // LS + batch under kubelet's plain BestEffort settings
	phaseTier                    // LS + batch below the agent's tier
	phaseInPlace                 // LS + batch held in kubelet's pod cgroups by the agent
	numCPUPhases
)

// String is the phase's row name in the tables and the JSON.
func (p cpuPhase) String() string {
	switch p {
	case phaseSolo:
		return "LS alone"
	case phaseVanilla:
		return "LS + batch, no agent"
	case phaseTier:
		return "LS + batch, agent tier"
	case phaseInPlace:
		return "LS + batch, agent in-place"
	}
	return fmt.Sprintf("phase %d", int(p))
}

// short is the phase's name in a round's order line.
func (p cpuPhase) short() string {
	switch p {
	case phaseSolo:
		return "alone"
	case phaseVanilla:
		return "no agent"
	case phaseTier:
		return "tier"
	case phaseInPlace:
		return "in-place"
	}
	return p.String()
}

// roundOrder is the order of the four CPU phases in round i (from 0). Fixed, it is the
// canonical order (alone, no agent, tier, in-place). Rotated, it is row i mod 4 of a
// balanced Latin square (Williams' design: the first row 0, 1, 3, 2, each next one
// shifted by one): over four rounds every phase runs once in every position, so a drift
// of the machine over the run (warming up, a neighbour's load) hits every phase alike,
// and every phase follows every other exactly once, so no phase inherits the state
// another one leaves (in-place always ran right after the tier phase before).
func roundOrder(i int, rotate bool) []cpuPhase {
	first := []cpuPhase{phaseSolo, phaseVanilla, phaseInPlace, phaseTier}
	out := make([]cpuPhase, 0, numCPUPhases)
	for j := range numCPUPhases {
		if !rotate {
			out = append(out, j)
			continue
		}
		out = append(out, (first[j]+cpuPhase(i%int(numCPUPhases)))%numCPUPhases)
	}
	return out
}

func orderString(order []cpuPhase) string {
	names := make([]string, len(order))
	for i, p := range order {
		names[i] = p.short()
	}
	return strings.Join(names, " → ")
}

// runRounds runs n paired rounds of the four CPU phases (rotated from round to round
// when rotate is set) and returns them by round, each in the canonical order whatever
// order it ran in: out[r][p] is round r's phase p. It leaves the batch workers running,
// in kubelet's pod cgroups with kubelet's settings.
func (s *scenario) runRounds(ctx context.Context, dc demoConfig, n int, rotate bool,
	printf, logf func(string, ...any)) ([][]phaseResult, error) {
	out := make([][]phaseResult, 0, n)
	for i := range n {
		order := roundOrder(i, rotate)
		printf("round %d/%d: %s\n", i+1, n, orderString(order))
		round := make([]phaseResult, numCPUPhases)
		for _, p := range order {
			r, err := s.runPhase(ctx, dc, p, logf)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", i+1, p, err)
			}
			round[p] = r
		}
		out = append(out, round)
	}
	if err := s.ensureBatch(); err != nil {
		return nil, err
	}
	return out, nil
}

// runPhase brings the fake node into phase p, from whatever phase ran before, and
// measures it. Every phase with batch starts from the same place: the workers running
// in kubelet's BestEffort pod cgroups with kubelet's settings (resetBatch), no agent.
// Each then gets the same dc.warmup before measuring: the agent phases after the agent
// answers, the plain BestEffort phase after the workers run.
func (s *scenario) runPhase(ctx context.Context, dc demoConfig, p cpuPhase, logf func(string, ...any)) (phaseResult, error) {
	if p == phaseSolo {
		s.stopBatch()
		logf("%s (%v)", p, dc.phase)
		return s.measure(ctx, p.String(), dc.phase)
	}
	if err := s.ensureBatch(); err != nil {
		return phaseResult{}, err
	}
	if p == phaseVanilla {
		logf("%s: %d batch pods, kubelet BestEffort settings (%v)", p, len(s.batch), dc.phase)
		if err := sleep(ctx, dc.warmup); err != nil {
			return phaseResult{}, err
		}
		return s.measure(ctx, p.String(), dc.phase)
	}
	inTier := p == phaseTier
	if err := s.placeBatch(inTier); err != nil {
		return phaseResult{}, err
	}
	logf("%s (%v)", p, dc.phase)
	a, err := s.startAgent(dc.threshold, dc.period)
	if err != nil {
		return phaseResult{}, err
	}
	if err := sleep(ctx, dc.warmup); err != nil {
		return phaseResult{}, err
	}
	th0, sig0 := s.batchThrottled(inTier), agentCuts(a)
	r, err := s.measure(ctx, p.String(), dc.phase)
	if err != nil {
		return phaseResult{}, err
	}
	if th1 := s.batchThrottled(inTier); th1 >= th0 {
		r.ThrottledPeriods = th1 - th0
	}
	r.AgentCuts = max(0, agentCuts(a)-sig0)
	if st, err := s.agent.status(); err == nil {
		r.PublishedBatchCPU = st.BatchResources.CPU.Published
		r.PublishedBatchMemory = st.BatchResources.Memory.Published
	}
	if err := s.stopAgent(); err != nil {
		logf("warning: agent exit: %v", err)
	}
	if err := s.placeBatch(false); err != nil {
		return phaseResult{}, err
	}
	return r, s.resetBatch()
}

// batchThrottled sums the CFS periods in which the groups the agent bounds batch in
// were throttled: the tier (inTier), or each batch pod's kubelet cgroup (in place).
// Groups it cannot read count 0.
func (s *scenario) batchThrottled(inTier bool) uint64 {
	rels := []string{s.tier()}
	if !inTier {
		rels = rels[:0]
		for _, p := range s.batch {
			if rel, err := s.batchCgroup(p, false); err == nil {
				rels = append(rels, rel)
			}
		}
	}
	var n uint64
	for _, rel := range rels {
		if g, err := s.hier.Load(rel); err == nil {
			if st, err := g.Stats(); err == nil {
				n += st.NrThrottled
			}
		}
	}
	return n
}

// agentCuts is how many batch CPU cuts the agent has made, by its /metrics (0 when
// unreadable).
func agentCuts(a *agentProc) float64 {
	sig, err := readAgentSignals(a)
	if err != nil {
		return 0
	}
	var n float64
	for _, v := range sig.CutsBySignal {
		n += v
	}
	return n
}

// stopBatch stops every batch worker.
func (s *scenario) stopBatch() {
	s.thawBatch() // a frozen worker would not die
	for _, p := range s.batch {
		if p.cmd != nil {
			_ = stopBurner(p)
		}
	}
}

// ensureBatch starts the batch workers, in kubelet's pod cgroups with kubelet's
// settings, unless all of them run already (where the last phase left them).
func (s *scenario) ensureBatch() error {
	running := true
	for _, p := range s.batch {
		running = running && p.cmd != nil
	}
	if running {
		return nil
	}
	s.stopBatch()
	if err := s.resetBatch(); err != nil {
		return err
	}
	return s.startBatch()
}

func stopBurner(p *batchPod) error {
	if p.cmd == nil || p.cmd.Process == nil {
		return nil
	}
	_ = p.cmd.Process.Kill()
	err := p.cmd.Wait()
	p.cmd = nil
	return err
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// runDemo is `make demo`: the memory scenario, where the agent's effect is plain, then
// the four CPU phases in paired, rotated rounds, printed with their noise band.
func runDemo(ctx context.Context, sc scenarioConfig, dc demoConfig, printf func(string, ...any)) error {
	started := time.Now()
	logf := func(f string, a ...any) { printf("  "+f+"\n", a...) }
	sc.logf = logf
	printf("Understory co-location demo on this machine's %d CPUs: an LS web service next to batch pods,\n", numCPU())
	printf("measured alone, with kubelet's plain BestEffort settings, and with the agent.\n")
	printf("colo demo: expected duration about %v on an idle machine\n", estimateDemo(dc).Round(time.Second))
	part := 1
	if dc.memory {
		mc := defaultMemoryConfig()
		if dc.memPhase > 0 {
			mc.Phase = dc.memPhase
		}
		printf("\nPart %d, memory: an LS key-value service with a working set (anonymous memory and a file it\n", part)
		printf("reads) on a %d MiB node, and batch jobs that grow until the node is short.\n", mc.Node/mib)
		part++
		if _, err := runMemory(ctx, sc, mc, printf); err != nil {
			return fmt.Errorf("memory scenario: %w", err)
		}
	}
	if dc.rounds > 0 {
		printf("\nPart %d, CPU: 1 LS web service (%.0f requests/s, open loop, latency from the scheduled send time)\n",
			part, sc.rate)
		printf("and %d CPU-hungry batch pods; %d rounds of 4 phases × %v, the order rotated every round.\n",
			sc.batchPods, dc.rounds, dc.phase)
		s, err := newScenario(sc)
		if err != nil {
			return err
		}
		defer s.close()
		logf("fake node: kubelet cgroup root /%s, manifests in %s", s.base, s.dir)
		rounds, err := s.runRounds(ctx, dc, dc.rounds, true, printf, logf)
		if err != nil {
			return err
		}
		printBands(printf, summariseRounds(rounds), dc.rounds, dc.phase)
		last := rounds[len(rounds)-1]
		for _, p := range []cpuPhase{phaseTier, phaseInPlace} {
			printf("%-28s the agent published batch-cpu %.2f cores, batch-memory %.0f MiB for the scheduler (last round)\n",
				p.String()+":", last[p].PublishedBatchCPU, last[p].PublishedBatchMemory/mib)
		}
	}
	printf("\ncolo demo took %v. Everything it created is being removed.\n", time.Since(started).Round(time.Second))
	return nil
}

// estimateDemo is how long `colo demo` will take with these settings, roughly.
func estimateDemo(dc demoConfig) time.Duration {
	var d time.Duration
	if dc.memory {
		d += estMemory(dc.memPhase)
	}
	if dc.rounds > 0 {
		d += estScenarioSetUp + time.Duration(dc.rounds)*estRound(dc)
	}
	return d
}

// estRound is how long one round of the four CPU phases takes, roughly: four phases,
// the warm-up before each batch phase, two agent starts and stops.
func estRound(dc demoConfig) time.Duration {
	return time.Duration(numCPUPhases)*dc.phase + 3*dc.warmup + 2*estAgentCycle
}
