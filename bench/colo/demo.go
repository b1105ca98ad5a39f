package colo

import (
	"context"
	"time"
)

// demoConfig drives `colo demo` and the phases of `colo bench`.
type demoConfig struct {
	phase     time.Duration // length of each measured phase
	warmup    time.Duration // after the agent is healthy, before measuring
	threshold float64
	period    time.Duration
	memory    bool // also run the memory-pressure phases
}

// agentPhases are the agent's two ways to hold batch: the tier (batch containers placed
// below it, as its NRI plugin does) and in-place (kubelet's pod cgroups, per-pod limits).
func agentPhases() []agentPhase {
	return []agentPhase{
		{"LS + batch, agent tier", "tier", true},
		{"LS + batch, agent in-place", "in-place", false},
	}
}

type agentPhase struct {
	name   string
	mode   string
	inTier bool
}

// runRound measures LS alone, LS with batch under kubelet's plain BestEffort settings,
// and LS with batch under the agent in each mode. It leaves the batch workers running.
func (s *scenario) runRound(ctx context.Context, dc demoConfig, logf func(string, ...any)) ([]phaseResult, error) {
	var out []phaseResult
	s.thawBatch() // a frozen worker would not die
	for _, p := range s.batch {
		if p.cmd != nil {
			_ = stopBurner(p)
		}
	}
	logf("phase 1/4: LS alone (%v)", dc.phase)
	r, err := s.measure(ctx, "LS alone", dc.phase)
	if err != nil {
		return nil, err
	}
	out = append(out, r)

	if err := s.resetBatch(); err != nil {
		return nil, err
	}
	if err := s.startBatch(); err != nil {
		return nil, err
	}
	logf("phase 2/4: LS + %d batch pods, kubelet BestEffort settings, no agent (%v)", len(s.batch), dc.phase)
	if r, err = s.measure(ctx, "LS + batch, no agent", dc.phase); err != nil {
		return nil, err
	}
	out = append(out, r)

	for i, ap := range agentPhases() {
		if err := s.placeBatch(ap.inTier); err != nil {
			return nil, err
		}
		logf("phase %d/4: LS + batch, agent %s mode (%v)", 3+i, ap.mode, dc.phase)
		if _, err := s.startAgent(dc.threshold, dc.period); err != nil {
			return nil, err
		}
		if err := sleep(ctx, dc.warmup); err != nil {
			return nil, err
		}
		r, err := s.measure(ctx, ap.name, dc.phase)
		if err != nil {
			return nil, err
		}
		if st, err := s.agent.status(); err == nil {
			r.PublishedBatchCPU = st.BatchResources.CPU.Published
			r.PublishedBatchMemory = st.BatchResources.Memory.Published
		}
		if err := s.stopAgent(); err != nil {
			logf("warning: agent exit: %v", err)
		}
		out = append(out, r)
		if err := s.placeBatch(false); err != nil {
			return nil, err
		}
		if err := s.resetBatch(); err != nil {
			return nil, err
		}
	}
	return out, nil
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

// runDemo is `make demo`: one round, one table.
func runDemo(ctx context.Context, sc scenarioConfig, dc demoConfig, printf func(string, ...any)) error {
	logf := func(f string, a ...any) { printf("  "+f+"\n", a...) }
	sc.logf = logf
	printf("Understory co-location demo: 1 LS web service + %d CPU-hungry batch pods on this machine's %d CPUs.\n", sc.batchPods, numCPU())
	printf("The LS service gets %.0f requests/s (open loop, latency from the scheduled send time).\n", sc.rate)
	s, err := newScenario(sc)
	if err != nil {
		return err
	}
	defer s.close()
	logf("fake node: kubelet cgroup root /%s, manifests in %s", s.base, s.dir)
	rs, err := s.runRound(ctx, dc, logf)
	if err != nil {
		return err
	}
	printTable(printf, "Results (batch CPUs = cores batch used on average; node % = CPU busy)", rs, rs[0].P99ms)
	for _, r := range rs[1:] {
		printf("%-28s batch used %.0f%% of the CPU the LS pod left idle\n", r.Name+":", 100*r.IdleShare)
	}
	for _, r := range rs[2:] {
		printf("%-28s the agent published batch-cpu %.2f cores, batch-memory %.0f MiB for the scheduler\n",
			r.Name+":", r.PublishedBatchCPU, r.PublishedBatchMemory/mib)
	}
	if dc.memory {
		s.close() // the memory scenario lays out the same fake node anew
		printf("\nMemory: the same LS service pattern with a working set (anonymous memory and a file it reads)\n")
		mc := defaultMemoryConfig()
		printf("on a %d MiB node, and batch jobs that grow until the node is short.\n", mc.Node/mib)
		mc.Phase = dc.phase
		if _, err := runMemory(ctx, sc, mc, printf); err != nil {
			return err
		}
	}
	printf("\nEverything the demo created is being removed.\n")
	return nil
}
