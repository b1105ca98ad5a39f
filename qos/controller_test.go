package qos_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/qos"
)

const gib = 1 << 30

// simNode is the node TestControllerPlan plans for: 4 CPUs, 16 GiB for pods, the batch
// tier with the pod "train" below it, and the pod "etl" held in place with a 2 GiB
// batch-memory limit. It keeps what the agent holds as an actuator whose every write
// succeeds leaves it after each plan.
type simNode struct {
	t0                    time.Time
	tier, etl             qos.CPULimit
	tierMem, etlMem       qos.MemoryLimit
	tierFrozen, etlFrozen bool
}

func newSimNode(t0 time.Time) *simNode {
	return &simNode{t0: t0, tier: qos.UnknownCPULimit(), etl: qos.UnknownCPULimit(),
		tierMem: qos.UnknownMemoryLimit(), etlMem: qos.UnknownMemoryLimit()}
}

// simPeriod is one period's inputs: what LS, the system and batch use (cores), the
// share of memory in use, and what the period read besides.
type simPeriod struct {
	at                        time.Duration // since the first period
	ls, system                float64
	tier, etl                 float64 // batch usage, also the demand the budget is split by
	memoryUsed                float64 // share of the 16 GiB; 0: half
	slow                      bool    // a slow period: the reclaimer is fed
	stats                     bool    // a statistics interval
	tierThrottle, etlThrottle qos.Throttling
	harm                      qos.HarmSample
	terminating               bool // etl is being deleted
}

// sample is the period's qos.Sample on the simulated node.
func (n *simNode) sample(p simPeriod) qos.Sample {
	now := n.t0.Add(p.at)
	used := p.memoryUsed
	if used == 0 {
		used = 0.5
	}
	s := qos.Sample{Now: now, Harm: p.harm,
		CPU: qos.CPUSample{CPUs: 4, NodeCores: p.ls + p.system + p.tier + p.etl,
			// The in-place pod is a BestEffort pod: it counts in kubelet's BestEffort cgroup.
			Kubepods: p.ls + p.tier + p.etl, KubepodsOK: true, BestEffort: p.etl, BestEffortOK: true,
			Tier: p.tier, TierOK: true,
			Pods: []qos.PodSample{{Class: qos.ClassLS, Fresh: true, Open: true, Usage: p.ls},
				{Class: qos.ClassBatch, Fresh: true, Open: true, Usage: p.etl},
				{Class: qos.ClassBatch, InTier: true, Fresh: true, Open: true, Usage: p.tier}}},
		Memory: qos.MemorySample{OK: true, At: now, Capacity: 16 * gib, Used: used * 16 * gib, LS: 6 * gib,
			System: gib},
		Batch: []qos.BatchPodSample{
			{UID: "etl", Namespace: "jobs", Name: "etl", Priority: 0, MemoryBytes: gib,
				StartTime: n.t0.Add(-2 * time.Hour), Terminating: p.terminating},
			{UID: "train", Namespace: "jobs", Name: "train", InTier: true, Priority: 0, MemoryBytes: 3 * gib,
				StartTime: n.t0.Add(-time.Hour)}},
		Requests: qos.Requests{LSCPU: 1, LSMemory: 4 * gib},
		Reclaim:  p.slow}
	if p.stats {
		s.Stats = qos.StatsSample{Due: true, Interval: 10 * time.Second, Tier: p.tierThrottle, TierOK: true}
		s.Batch[0].Throttle, s.Batch[0].ThrottleOK = p.etlThrottle, true
	}
	return s
}

// limits are what the agent holds on the node.
func (n *simNode) limits(p simPeriod) qos.BatchLimits {
	return qos.BatchLimits{
		Tier:          qos.CPUConsumer{ID: "tier", Demand: p.tier, DemandOK: true, InForce: n.tier},
		TierUnlimited: true,
		InPlace:       []qos.CPUConsumer{{ID: "etl", Demand: p.etl, DemandOK: true, InForce: n.etl}},
		TierMemory:    n.tierMem,
		PodMemory:     []qos.PodMemoryLimit{{ID: "etl", InForce: n.etlMem, Want: 2 * gib}},
		HasTier:       true, TierFrozen: n.tierFrozen,
		Pods: []qos.PodInForce{{UID: "etl", Freezable: true, Frozen: n.etlFrozen, Quota: n.etl.Cores},
			{UID: "train", Quota: math.NaN()}},
	}
}

// apply makes the plan's writes on the node, each one succeeding.
func (n *simNode) apply(p qos.Plan, now time.Time) {
	for _, e := range p.PodMemory {
		if e.Write {
			n.etlMem = qos.MemoryLimit{Bytes: float64(e.Max), Written: now}
		}
	}
	for _, e := range p.CPU {
		if !e.Write {
			continue
		}
		l := qos.CPULimit{Cores: e.Cores, Written: now}
		switch e.Kind {
		case qos.TargetTier:
			n.tier = l
		case qos.TargetInPlacePod:
			n.etl = l
		}
	}
	if e := p.TierMemory; e.Write {
		n.tierMem = qos.MemoryLimit{Bytes: float64(e.Max), Written: now}
	}
	for _, f := range p.Freezes {
		if f.Kind == qos.TargetTier {
			n.tierFrozen = f.Freeze
		} else {
			n.etlFrozen = f.Freeze
		}
	}
}

// testEscalation is the graded actions' configuration of the scenarios: freeze after 2 s
// at the floor, thaw after 5 s with room, evict after 10 s starved, at most one eviction
// decision every 10 s.
func testEscalation() qos.EscalationConfig {
	c := qos.DefaultEscalationConfig()
	c.StarvationTimeout = metav1.Duration{Duration: 10 * time.Second}
	c.EvictionInterval = metav1.Duration{Duration: 10 * time.Second}
	return c
}

// testController is the agent's controller with the default policy, a 1 s CFS period and
// the scenarios' graded actions (their periods may be up to 100 s apart before the
// escalator takes the gap for a clock jump); guard adds a harm signal's guard.
func testController(guard bool) qos.Controller {
	c := qos.Controller{Budgeter: qos.NewBudgeter(qos.DefaultPolicy()),
		Writes:          qos.WritePolicy{CFSPeriod: time.Second, MinPodCPU: 0.01},
		MemoryThreshold: 0.9,
		Escalator:       qos.NewEscalator(testEscalation(), 10*time.Second),
		Reclaimer:       qos.NewReclaimer(qos.DefaultReclaimConfig()),
		Conditions:      qos.NewBatchConditions()}
	if guard {
		c.Guard = qos.NewGuard(qos.DefaultGuardConfig())
	}
	return c
}

// runPeriods plans each period in turn on one controller and node and compares the
// rendered plan with the period's text.
func runPeriods(t *testing.T, c qos.Controller, periods []struct {
	name string
	in   simPeriod
	want string
}) {
	t.Helper()
	n := newSimNode(time.Unix(1_800_000_000, 0).UTC())
	for _, tc := range periods {
		s := n.sample(tc.in)
		p := c.Plan(s, n.limits(tc.in))
		n.apply(p, s.Now)
		got := p.String()
		if want := strings.TrimLeft(tc.want, "\n"); got != want {
			t.Errorf("%s (at %v): plan\n%s\nwant\n%s", tc.name, tc.in.at, got, want)
		}
	}
}

// TestControllerPlan is the agent's decision, period by period, on one node in sampling
// mode (no harm signal: utilisation decides): why batch got the cores it got, when it was
// frozen, thawed and evicted, what the Node is told, and what the batch pods are told.
func TestControllerPlan(t *testing.T) {
	t.Parallel()
	runPeriods(t, testController(false), []struct {
		name string
		in   simPeriod
		want string
	}{
		{"first period: the utilisation target, every limit unknown is written",
			simPeriod{at: 0, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, slow: true}, `
budget 2.40 cores: initial
utilisation 2.40 cores: initial; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
write memory pod etl 2.00GiB: unknown limit: rewrite
write cpu tier 1.300 cores (quota 1.3s): unknown limit: rewrite
write cpu inPlacePod etl 1.100 cores (quota 1.1s): unknown limit: rewrite
write memory tier 8.40GiB: unknown limit: rewrite
escalation throttle: budget
batch resources: cpu 2.400 cores (publish: initial), memory 7.40GiB (publish: initial)
`},
		{"LS rises: the budget is cut at once, cuts written before raises",
			simPeriod{at: time.Second, ls: 2.5, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 0.90 cores: cut
utilisation 0.90 cores: cut; target 0.90 = clamp(4 CPUs × 0.90 − LS 2.50 − system 0.20, 0.10, 4.00)
cpu used: LS 2.50 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.550 cores (quota 549.999ms): cut
write cpu inPlacePod etl 0.350 cores (quota 349.999ms): cut
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"LS a little busier: the budget is cut by 0.02 cores, within the write deadband: nothing written",
			simPeriod{at: 2 * time.Second, ls: 2.52, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 0.88 cores: cut
utilisation 0.88 cores: cut; target 0.88 = clamp(4 CPUs × 0.90 − LS 2.52 − system 0.20, 0.10, 4.00)
cpu used: LS 2.52 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu inPlacePod etl 0.300 cores (quota 300ms): held: within the write deadband
hold cpu tier 0.580 cores (quota 579.999ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"LS falls back: batch grows back by at most 10 % of the node a period",
			simPeriod{at: 3 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, slow: true}, `
budget 1.28 cores: restore-limited
utilisation 1.28 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu inPlacePod etl 0.300 cores (quota 300ms): held: within the write deadband
write cpu tier 0.980 cores (quota 979.999ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
batch resources: cpu 2.400 cores (keep: hold), memory 7.40GiB (keep: hold)
`},
		{"statistics interval: etl throttled hard is told so, the tier's light throttling is not",
			simPeriod{at: 4 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, stats: true,
				etlThrottle: qos.Throttling{Periods: 10, Throttled: 8}, tierThrottle: qos.Throttling{Periods: 10, Throttled: 1}}, `
budget 1.68 cores: restore-limited
utilisation 1.68 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.940 cores (quota 939.999ms): held: within the write deadband
write cpu inPlacePod etl 0.740 cores (quota 739.999ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
event jobs/etl BatchThrottled: throttled by the node agent in 80% of its CFS periods over the last 10s (8 of 10) at a quota of 0.74 cores (its share of the batch budget, 1.68 cores: what LS leaves)
condition jobs/etl understory.io/BatchSlowed=True Throttled: throttled by the node agent in 80% of its CFS periods over the last 10s (8 of 10) at a quota of 0.74 cores (its share of the batch budget, 1.68 cores: what LS leaves)
`},
		{"memory pressure: the largest batch pod is evicted first",
			simPeriod{at: 5 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, memoryUsed: 0.97}, `
budget 2.08 cores: restore-limited
utilisation 2.08 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 1.140 cores (quota 1.139999s): raise
write cpu inPlacePod etl 0.940 cores (quota 940ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation evict: memory-pressure (memory pressure (97% used), next eviction at 08:00:15)
evict memory-pressure: node memory 16664473108 of 17179869184 bytes used (97.0% >= 95.0%), 1202590843 bytes to free to reach 90.0%; candidates in order: [jobs/train jobs/etl]
`},
		{"memory back below the target: the pressure ends",
			simPeriod{at: 6 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, memoryUsed: 0.85}, `
budget 2.40 cores: restore
utilisation 2.40 cores: restore; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 1.300 cores (quota 1.3s): raise
write cpu inPlacePod etl 1.100 cores (quota 1.1s): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget (next eviction at 08:00:15)
`},
		{"LS takes the node: batch at its floor, starved",
			simPeriod{at: 7 * time.Second, ls: 3.4, system: 0.2, tier: 0.05, etl: 0.05}, `
budget 0.10 cores: cut
utilisation 0.10 cores: cut; target 0.10 = clamp(4 CPUs × 0.90 − LS 3.40 − system 0.20, 0.10, 4.00)
cpu used: LS 3.40 (0.00 of it unknown pods), BE 0.00, batch 0.10, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.050 cores (quota 49.999ms): cut
write cpu inPlacePod etl 0.050 cores (quota 50ms): cut
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget (starved for 0s, next eviction at 08:00:15)
`},
		{"starved for freezeAfter: the tier and etl are frozen, the pods told",
			simPeriod{at: 9 * time.Second, ls: 3.4, system: 0.2}, `
budget 0.10 cores: hold
utilisation 0.10 cores: hold; target 0.10 = clamp(4 CPUs × 0.90 − LS 3.40 − system 0.20, 0.10, 4.00)
cpu used: LS 3.40 (0.00 of it unknown pods), BE 0.00, batch 0.00, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.050 cores (quota 49.999ms): held: within the write deadband
hold cpu inPlacePod etl 0.050 cores (quota 50ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation freeze: cpu-contention (starved for 2s, froze now, next eviction at 08:00:15)
freeze tier: freeze: LS and the system leave batch less than its floor
freeze inPlacePod etl: freeze: LS and the system leave batch less than its floor
event jobs/etl BatchFrozen: frozen by the node agent: LS (3.40 cores) and the system (0.20) leave batch 0.00 of 4 CPUs, below its floor of 0.10, for 2s; it is thawed once LS leaves room again
event jobs/train BatchFrozen: frozen by the node agent: LS (3.40 cores) and the system (0.20) leave batch 0.00 of 4 CPUs, below its floor of 0.10, for 2s; it is thawed once LS leaves room again
`},
		{"statistics interval while frozen: both pods' condition says Frozen",
			simPeriod{at: 10 * time.Second, ls: 3.4, system: 0.2, stats: true}, `
budget 0.10 cores: hold
utilisation 0.10 cores: hold; target 0.10 = clamp(4 CPUs × 0.90 − LS 3.40 − system 0.20, 0.10, 4.00)
cpu used: LS 3.40 (0.00 of it unknown pods), BE 0.00, batch 0.00, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.050 cores (quota 49.999ms): held: within the write deadband
hold cpu inPlacePod etl 0.050 cores (quota 50ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation freeze: cpu-contention (starved for 3s, next eviction at 08:00:15)
condition jobs/etl understory.io/BatchSlowed=True Frozen: frozen by the node agent: LS (3.40 cores) and the system (0.20) leave batch 0.00 of 4 CPUs, below its floor of 0.10, for 2s; it is thawed once LS leaves room again
condition jobs/train understory.io/BatchSlowed=True Frozen: frozen by the node agent: LS (3.40 cores) and the system (0.20) leave batch 0.00 of 4 CPUs, below its floor of 0.10, for 2s; it is thawed once LS leaves room again
`},
		{"starved for starvationTimeout: one batch pod is evicted",
			simPeriod{at: 17 * time.Second, ls: 3.4, system: 0.2}, `
budget 0.10 cores: hold
utilisation 0.10 cores: hold; target 0.10 = clamp(4 CPUs × 0.90 − LS 3.40 − system 0.20, 0.10, 4.00)
cpu used: LS 3.40 (0.00 of it unknown pods), BE 0.00, batch 0.00, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.050 cores (quota 49.999ms): held: within the write deadband
hold cpu inPlacePod etl 0.050 cores (quota 50ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation evict: cpu-starvation (starved for 10s, next eviction at 08:00:27)
evict cpu-starvation: batch starved of CPU by LS pods for 10s (starvationTimeout 10s); candidates in order: [jobs/train jobs/etl]
`},
		{"LS leaves room: thawed only after thawAfter",
			simPeriod{at: 18 * time.Second, ls: 1, system: 0.2}, `
budget 0.50 cores: restore-limited
utilisation 0.50 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.00, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.250 cores (quota 250ms): raise
write cpu inPlacePod etl 0.250 cores (quota 250ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation freeze: cpu-contention (starved for 11s, next eviction at 08:00:27)
`},
		{"room for thawAfter: the tier and etl are thawed",
			simPeriod{at: 23 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 0.90 cores: restore-limited
utilisation 0.90 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.450 cores (quota 450ms): raise
write cpu inPlacePod etl 0.450 cores (quota 450ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget (thawed now, next eviction at 08:00:27)
thaw tier: thaw: LS leaves batch room again
thaw inPlacePod etl: thaw: LS leaves batch room again
`},
		{"statistics interval a minute after the Frozen condition, running free: Running",
			simPeriod{at: 71 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, stats: true,
				etlThrottle: qos.Throttling{Periods: 10, Throttled: 2}, tierThrottle: qos.Throttling{Periods: 10}}, `
budget 1.30 cores: restore-limited
utilisation 1.30 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu inPlacePod etl 0.300 cores (quota 300ms): cut
write cpu tier 1.000 cores (quota 1s): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget (next eviction at 08:00:27)
condition jobs/etl understory.io/BatchSlowed=False Running: runs free: throttled in fewer than 50% of its CFS periods, not frozen
condition jobs/train understory.io/BatchSlowed=False Running: runs free: throttled in fewer than 50% of its CFS periods, not frozen
`},
		{"etl is being deleted: it is no longer told, its condition no longer tended",
			simPeriod{at: 81 * time.Second, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, stats: true, terminating: true}, `
budget 1.70 cores: restore-limited
utilisation 1.70 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.500 cores (quota 500ms): cut
write cpu inPlacePod etl 1.200 cores (quota 1.2s): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget (next eviction at 08:00:27)
forget condition etl
`},
	})
}

// TestControllerPlanGuarded is the same node with a harm signal (eBPF run-queue delay or
// PSI): only harm cuts, at once and by half, utilisation alone never does unless the
// signal is blind, and batch grows back after the hold at 10 % of the node a second.
func TestControllerPlanGuarded(t *testing.T) {
	t.Parallel()
	harm := func(since time.Duration) qos.HarmSample {
		return qos.HarmSample{Found: true, Signal: qos.SignalRunqueueDelay, Since: time.Unix(1_800_000_000, 0).Add(since)}
	}
	runPeriods(t, testController(true), []struct {
		name string
		in   simPeriod
		want string
	}{
		{"first period: the utilisation target",
			simPeriod{at: 0, ls: 1, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 2.40 cores: initial
utilisation 2.40 cores: initial; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
write memory pod etl 2.00GiB: unknown limit: rewrite
write cpu tier 1.300 cores (quota 1.3s): unknown limit: rewrite
write cpu inPlacePod etl 1.100 cores (quota 1.1s): unknown limit: rewrite
write memory tier 8.40GiB: unknown limit: rewrite
escalation throttle: budget
`},
		{"LS harmed: batch is cut by half at once, before LS utilisation shows anything",
			simPeriod{at: 100 * time.Millisecond, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, harm: harm(0)}, `
budget 1.20 cores: cut by runqueue_delay
utilisation 2.40 cores: hold; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.700 cores (quota 700ms): cut
write cpu inPlacePod etl 0.500 cores (quota 500ms): cut
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"the same harm, measured before the cut took effect: held, not cut again",
			simPeriod{at: 200 * time.Millisecond, ls: 1, system: 0.2, tier: 0.5, etl: 0.3, harm: harm(0)}, `
budget 1.20 cores: harm-hold
utilisation 2.40 cores: hold; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.700 cores (quota 700ms): held: within the write deadband
hold cpu inPlacePod etl 0.500 cores (quota 500ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"LS busier but not harmed: utilisation alone does not cut",
			simPeriod{at: 300 * time.Millisecond, ls: 2.9, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 1.20 cores: harm-hold
utilisation 0.50 cores: cut; target 0.50 = clamp(4 CPUs × 0.90 − LS 2.90 − system 0.20, 0.10, 4.00)
cpu used: LS 2.90 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
hold cpu tier 0.700 cores (quota 700ms): held: within the write deadband
hold cpu inPlacePod etl 0.500 cores (quota 500ms): held: within the write deadband
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"the signal is blind: utilisation decides, and cuts",
			simPeriod{at: 400 * time.Millisecond, ls: 2.9, system: 0.2, tier: 0.5, etl: 0.3,
				harm: qos.HarmSample{Blind: true}}, `
budget 0.50 cores: cut by utilisation
utilisation 0.50 cores: hold; target 0.50 = clamp(4 CPUs × 0.90 − LS 2.90 − system 0.20, 0.10, 4.00)
cpu used: LS 2.90 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.250 cores (quota 250ms): cut
write cpu inPlacePod etl 0.250 cores (quota 250ms): cut
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
		{"no harm for the hold: batch grows back by 10 % of the node a second",
			simPeriod{at: 1500 * time.Millisecond, ls: 1, system: 0.2, tier: 0.5, etl: 0.3}, `
budget 0.90 cores: restore-limited
utilisation 0.90 cores: restore-limited; target 2.40 = clamp(4 CPUs × 0.90 − LS 1.00 − system 0.20, 0.10, 4.00)
cpu used: LS 1.00 (0.00 of it unknown pods), BE 0.00, batch 0.80, system 0.20
hold memory pod etl 2.00GiB: held: within the write deadband
write cpu tier 0.450 cores (quota 450ms): raise
write cpu inPlacePod etl 0.450 cores (quota 450ms): raise
hold memory tier 8.40GiB: held: within the write deadband
escalation throttle: budget
`},
	})
}

// Guarded replaces the utilisation budget by the guard's answer to harm: a fresh harm
// cuts by cutPercent (or to the utilisation target when lower), evidence from before the
// last cut holds, a blind source lets utilisation cut, and no harm never cuts. The
// budget's other terms are the utilisation budget's.
func TestControllerGuarded(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	util := func(target float64) qos.Budget {
		return qos.Budget{NodeCPUs: 4, Threshold: 0.9, LSUsage: 3.4 - target, SystemUsage: 0.2, Raw: target, Min: 0.1,
			Max: 4, Target: target, Applied: target, Reason: qos.ReasonHold}
	}
	harm := func(since time.Duration) qos.HarmSample {
		return qos.HarmSample{Found: true, Signal: qos.SignalPSICPU, Since: t0.Add(since)}
	}
	tests := []struct {
		name      string
		util      qos.Budget
		harm      qos.HarmSample
		at        time.Duration
		applied   float64
		reason    string
		cause     qos.Signal
		firstCall bool // the guard's first decision is the utilisation target
	}{
		{"the first decision is the utilisation target", util(2), qos.HarmSample{}, 0, 2, qos.ReasonInitial, "", true},
		{"harm cuts by half", util(2), harm(0), 100 * time.Millisecond, 1, qos.ReasonCut, qos.SignalPSICPU, false},
		{"harm cuts to the utilisation target when that is lower", util(0.5), harm(0), 100 * time.Millisecond, 0.5,
			qos.ReasonCut, qos.SignalPSICPU, false},
		{"no harm: utilisation alone does not cut, batch grows back", util(0.5), qos.HarmSample{}, 100 * time.Millisecond,
			2.04, qos.ReasonRestoreLimited, "", false},
		{"blind: utilisation cuts", util(0.5), qos.HarmSample{Blind: true}, 100 * time.Millisecond, 0.5, qos.ReasonCut,
			qos.SignalUtilisation, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := qos.Controller{Guard: qos.NewGuard(qos.DefaultGuardConfig())}
			if !tc.firstCall {
				// The guard's first decision puts it at 2 cores, the node's ceiling being 4.
				c.Guard.Next(qos.GuardInput{Now: t0, Budget: util(2)})
			}
			b, cause := c.Guarded(tc.util, tc.harm, t0.Add(tc.at))
			if math.Abs(b.Applied-tc.applied) > 1e-9 || b.Reason != tc.reason || cause != tc.cause {
				t.Fatalf("Guarded = %.2f %s by %q, want %.2f %s by %q", b.Applied, b.Reason, cause, tc.applied, tc.reason,
					tc.cause)
			}
			if b.Target != tc.util.Target || b.LSUsage != tc.util.LSUsage || b.NodeCPUs != tc.util.NodeCPUs {
				t.Fatalf("Guarded changed the utilisation terms: %+v from %+v", b, tc.util)
			}
		})
	}
}

// PlanWrites plans the writes for the plan's budget: the pods' memory limits (with their
// IDs), the CPU limits (the graceful stop's exact writes when final), and the tier's
// memory limit only with a memory sample.
func TestControllerPlanWrites(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	c := qos.Controller{Writes: qos.WritePolicy{CFSPeriod: time.Second, MinPodCPU: 0.01}, MemoryThreshold: 0.9}
	inForce := qos.CPULimit{Cores: 0.5, Written: now.Add(-time.Minute)}
	in := qos.BatchLimits{Tier: qos.CPUConsumer{ID: "tier", InForce: inForce, Demand: 0.5, DemandOK: true},
		InPlace:    []qos.CPUConsumer{{ID: "etl", InForce: inForce, DemandOK: true}},
		TierMemory: qos.UnknownMemoryLimit(),
		PodMemory:  []qos.PodMemoryLimit{{ID: "etl", InForce: qos.UnknownMemoryLimit(), Want: gib}}}
	tests := []struct {
		name   string
		budget float64
		memory bool
		final  bool
		want   string
	}{
		{"the idle pod is cut first; the tier's raise is within the deadband; no memory sample: no tier memory write",
			0.52, false, false, `
write memory pod etl 1.00GiB: unknown limit: rewrite
write cpu inPlacePod etl 0.010 cores (quota 10ms): cut
hold cpu tier 0.510 cores (quota 510ms): held: within the write deadband
`},
		{"with a memory sample the tier's limit is capacity × threshold − LS", 0.52, true, false, `
write memory pod etl 1.00GiB: unknown limit: rewrite
write cpu inPlacePod etl 0.010 cores (quota 10ms): cut
hold cpu tier 0.510 cores (quota 510ms): held: within the write deadband
write memory tier 8.40GiB: unknown limit: rewrite
`},
		{"the graceful stop writes every change exactly, deadband and pacing aside", 0.52, false, true, `
write memory pod etl 1.00GiB: unknown limit: rewrite
write cpu inPlacePod etl 0.010 cores (quota 10ms): shutdown: exact
write cpu tier 0.510 cores (quota 510ms): shutdown: exact
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := qos.Plan{Budget: qos.Budget{Applied: tc.budget}}
			s := qos.Sample{Now: now}
			if tc.memory {
				s.Memory = qos.MemorySample{OK: true, Capacity: 16 * gib, LS: 6 * gib}
			}
			c.PlanWrites(&p, s, in, tc.final)
			got := p.String()
			got = got[strings.Index(got, "\n")+1:] // the budget line
			if want := strings.TrimLeft(tc.want, "\n"); got != want {
				t.Fatalf("writes\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// Plan leaves out the decisions whose part the controller lacks (no escalator, reclaimer
// or condition state: none of theirs), feeds the reclaimer only when the sample says so,
// tells only the batch pods it knows by name, and never offers a pod being deleted for
// eviction.
func TestControllerPlanParts(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	starved := simPeriod{ls: 3.5, system: 0.2, stats: true, slow: true, memoryUsed: 0.97,
		etlThrottle: qos.Throttling{Periods: 10, Throttled: 9}}
	t.Run("budget and writes only", func(t *testing.T) {
		t.Parallel()
		c := qos.Controller{Budgeter: qos.NewBudgeter(qos.DefaultPolicy()), Writes: qos.WritePolicy{CFSPeriod: time.Second}}
		n := newSimNode(t0)
		p := c.Plan(n.sample(starved), n.limits(starved))
		// The events need no part: static mode logs them.
		if p.Escalation.Reason != "" || len(p.Freezes) != 0 || p.Reclaim || len(p.Notices) != 1 || len(p.Conditions) != 0 ||
			len(p.CPU) == 0 {
			t.Fatalf("plan without the parts:\n%s", p)
		}
	})
	t.Run("the reclaimer only on the periods the sample allows", func(t *testing.T) {
		t.Parallel()
		c := testController(false)
		n := newSimNode(t0)
		in := starved
		in.slow = false
		if p := c.Plan(n.sample(in), n.limits(in)); p.Reclaim {
			t.Fatalf("reclaimer fed on a period the sample excludes:\n%s", p)
		}
	})
	t.Run("events and eviction candidates", func(t *testing.T) {
		t.Parallel()
		cfg := testEscalation()
		cfg.FreezeAfter = metav1.Duration{Duration: time.Nanosecond}
		c := testController(false)
		c.Escalator = qos.NewEscalator(cfg, time.Second)
		n := newSimNode(t0)
		var told, cands []string
		var evict *qos.EvictionRequest
		for i := range 2 { // starved under memory pressure (evict), then frozen
			in := starved
			in.at = time.Duration(i) * time.Second
			s := n.sample(in)
			// A nameless (static) pod and a pod being deleted are told nothing and are no
			// eviction candidates.
			s.Batch = append(s.Batch, qos.BatchPodSample{UID: "static", InTier: true},
				qos.BatchPodSample{UID: "going", Namespace: "jobs", Name: "going", InTier: true, Terminating: true})
			in2 := n.limits(in)
			in2.Pods = append(in2.Pods, qos.PodInForce{UID: "static"}, qos.PodInForce{UID: "going"})
			p := c.Plan(s, in2)
			n.apply(p, s.Now)
			for _, e := range p.Notices {
				told = append(told, e.Pod+" "+string(e.Kind))
			}
			if p.Escalation.Evict != nil {
				evict = p.Escalation.Evict
				for _, e := range p.EvictCandidates {
					cands = append(cands, e.Name)
				}
			}
		}
		if want := []string{"jobs/etl BatchThrottled", "jobs/etl BatchFrozen", "jobs/train BatchFrozen",
			"jobs/etl BatchThrottled"}; !slices.Equal(told, want) {
			t.Errorf("told %q, want %q", told, want)
		}
		if evict == nil || evict.Reason != qos.EvictReasonMemoryPressure || !slices.Equal(cands, []string{"train", "etl"}) {
			t.Errorf("eviction %v of %q, want memory pressure evicting train, then etl", evict, cands)
		}
	})
}
