package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/evict"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the apply step of the control period: it hands qos the limits in force
// and the batch pods' demand, and writes what the plan says, in its order, recording
// what is in force after each write: the limits here, the freezer in freeze.go, then the
// evictions. What goes to the API server's writers (the batch resources, the pods'
// events and condition) is handoff.go's.

// cpuState is a CFS limit the agent writes on one group: the limit in force as qos
// plans with it, the descendants' limits lowered to make room for a v1 cut (put back
// as the group is raised again, and when a pod leaves batch), and the last write error.
type cpuState struct {
	qos.CPULimit
	lowered []cgroups.LoweredLimit
}

func unknownCPU() cpuState { return cpuState{CPULimit: qos.UnknownCPULimit()} }

// memState is a memory limit the agent writes on one group, and the last write error
// (for /status).
type memState struct {
	qos.MemoryLimit
	err error
}

func unknownMemory() memState { return memState{MemoryLimit: qos.UnknownMemoryLimit()} }

// actuator writes the plan: the tier's and the batch pods' CFS quotas and memory
// limits, their freezer, and the evictions (to the evictor). It keeps what is in force on
// the tier; a pod's is in its podState's act row.
type actuator struct {
	hier *cgroups.Hierarchy
	// policy turns cores into CFS quotas (its CFSPeriod; not live: a new cfsPeriod
	// needs a restart). The plan decides with the controller's, which has minPodCPU too.
	policy  qos.WritePolicy
	metrics *metrics.Agent
	log     *slog.Logger
	evictor evictor
	tierRel string
	tier    *cgroups.Group
	tierCPU cpuState
	tierMem memState
	// plan is the last CPU plan, for /status; the buffers are reused every period.
	plan                       []qos.CPUEntry
	tierPods, inPlace, memPods []*podState
	tierDemands, demands       []qos.CPUConsumer
	podMem                     []qos.PodMemoryLimit
	// batch are every batch pod (the plan's freezer entries index them) and held what
	// the agent holds on each.
	batch []*podState
	held  []qos.PodInForce
	// tierFrozen: the tier is frozen.
	tierFrozen bool
}

func newActuator(cfg config.Config, hier *cgroups.Hierarchy, tierRel string, ev evictor, m *metrics.Agent,
	log *slog.Logger) *actuator {
	return &actuator{hier: hier, policy: qos.WritePolicy{CFSPeriod: cfg.CFSPeriod.Duration}, metrics: m, log: log, evictor: ev, tierRel: tierRel,
		tierCPU: unknownCPU(), tierMem: unknownMemory()}
}

// writePolicy is how cfg has limits written.
func writePolicy(cfg config.Config) qos.WritePolicy {
	return qos.WritePolicy{CFSPeriod: cfg.CFSPeriod.Duration, MinPodCPU: cfg.MinPodCPU}
}

// limits are the batch groups with the limits in force on them and their demand, for
// the plan: the tier (tierDemand), the pods below it with a batch-cpu limit, the
// in-place batch pods, the batch pods with a batch-memory limit, and every batch pod's
// freezer (in the order pods lists them, as the sampler's qos.Sample.Batch). It keeps the
// pods in the plan's order, for apply.
func (x *actuator) limits(pods []*podState, tierDemand demand) qos.BatchLimits {
	in := qos.BatchLimits{Tier: qos.CPUConsumer{ID: "tier", Demand: tierDemand.v, DemandOK: tierDemand.ok,
		InForce: x.tierCPU.CPULimit}, TierMemory: x.tierMem.MemoryLimit, HasTier: x.tier != nil, TierFrozen: x.tierFrozen}
	x.tierPods, x.inPlace, x.memPods = x.tierPods[:0], x.inPlace[:0], x.memPods[:0]
	x.tierDemands, x.demands, x.podMem = x.tierDemands[:0], x.demands[:0], x.podMem[:0]
	x.batch, x.held = x.batch[:0], x.held[:0]
	for _, st := range pods {
		if st.class != qos.ClassBatch {
			continue
		}
		x.batch = append(x.batch, st)
		x.held = append(x.held, qos.PodInForce{UID: st.uid, Freezable: st.read.group != nil && !st.read.inTier,
			Frozen: st.act.frozen, Quota: st.act.quota.Cores})
		if st.read.group == nil {
			continue
		}
		if st.spec.batchMemory > 0 {
			x.memPods = append(x.memPods, st)
			x.podMem = append(x.podMem, qos.PodMemoryLimit{ID: string(st.uid), InForce: st.act.memory.MemoryLimit,
				Want: float64(st.spec.batchMemory)})
		}
		if st.read.inTier {
			if st.spec.batchCPU > 0 {
				x.tierPods = append(x.tierPods, st)
				x.tierDemands = append(x.tierDemands, qos.CPUConsumer{ID: string(st.uid), Limit: st.spec.batchCPU,
					InForce: st.act.quota.CPULimit})
			} else {
				in.TierUnlimited = true
			}
			continue
		}
		x.inPlace = append(x.inPlace, st)
		// A terminating pod keeps its share: lifting its quota for the whole grace
		// period would let it run unbounded next to LS.
		x.demands = append(x.demands, qos.CPUConsumer{ID: string(st.uid), Demand: st.read.demand.v, DemandOK: st.read.demand.ok,
			Limit: st.spec.batchCPU, InForce: st.act.quota.CPULimit})
	}
	in.TierPods, in.InPlace, in.PodMemory, in.Pods = x.tierDemands, x.demands, x.podMem, x.held
	return in
}

// apply makes the plan's writes, in its order, on the groups limits listed: the batch
// pods' memory limits, the in-place pods' static settings (once), the CPU limits, the
// tier's memory limit, then the freezer (freeze.go) and the evictions. A failed write
// leaves the limit marked unknown; the next plan writes it again. It returns when the
// limits were written (before the freezer, which may wait for the kernel).
func (x *actuator) apply(p qos.Plan, now time.Time) (written time.Time) {
	x.applyLimits(p, now)
	written = time.Now()
	x.applyFreezes(p)
	x.submitEvictions(p)
	return written
}

// applyLimits writes the plan's memory and CPU limits.
func (x *actuator) applyLimits(p qos.Plan, now time.Time) {
	for i, e := range p.PodMemory {
		if i >= len(x.memPods) {
			break
		}
		st := x.memPods[i]
		x.writeMemory(st.read.group, &st.act.memory, e, now)
		st.act.wroteMemory = st.act.wroteMemory || !math.IsNaN(st.act.memory.Bytes)
	}
	for _, st := range x.inPlace {
		if !st.act.setUp {
			x.setUpPod(st)
		}
	}
	x.plan = p.CPU
	x.applyCPU(p.CPU, now)
	if p.TierMemory.Write && x.tier != nil {
		x.writeMemory(x.tier, &x.tierMem, p.TierMemory, now)
	}
}

// applyCPU makes the plan's writes in its order.
func (x *actuator) applyCPU(plan []qos.CPUEntry, now time.Time) {
	for _, e := range plan {
		if !e.Write {
			continue
		}
		switch e.Kind {
		case qos.TargetTier:
			if x.tier == nil {
				continue
			}
			if err := x.writeCPU(x.tier, &x.tierCPU, e, now); err != nil {
				x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
				x.log.Error("writing tier quota; retrying next period", "cgroup", x.tierRel, "err", err)
			}
		case qos.TargetTierPod:
			x.writePodCPU(x.tierPods[e.Index], e, now)
		case qos.TargetInPlacePod:
			x.writePodCPU(x.inPlace[e.Index], e, now)
		}
	}
}

// writePodCPU writes one pod's quota.
func (x *actuator) writePodCPU(st *podState, e qos.CPUEntry, now time.Time) {
	err := x.writeCPU(st.read.group, &st.act.quota, e, now)
	if err == nil {
		switch {
		case st.act.quota.Clamped > 0:
			st.lastErr = errClampedCut
		case errors.Is(st.lastErr, errClampedCut):
			st.lastErr = nil
		}
		return
	}
	st.lastErr = err
	if errors.Is(err, cgroups.ErrNotExist) {
		st.read.lose(now)
		return
	}
	x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
	x.log.Error("writing pod quota; retrying next period", logAttrsPod(st), "err", err)
}

// errClampedCut is a pod's /status error while the kernel holds its quota above the
// plan's cut.
var errClampedCut = errors.New("quota cut clamped at a descendant's own CFS limit")

// writeCPU writes e's quota to g and records what is in force in s. On cgroup v1 a cut
// below a descendant's own limit (an in-place pod's container limit) is clamped by the
// kernel at that limit: the descendants are then lowered too and the cut written again;
// their own limits come back as g is raised again. A cut still clamped is kept as in
// force (never unlimited) and not asked for again while it is unchanged.
func (x *actuator) writeCPU(g *cgroups.Group, s *cpuState, e qos.CPUEntry, now time.Time) error {
	period := x.policy.CFSPeriod
	err := g.SetCPULimit(e.Quota, period)
	if errors.Is(err, cgroups.ErrClamped) {
		lowered, lerr := g.LowerDescendantCPULimits(e.Quota, period)
		s.lowered = mergeLowered(s.lowered, lowered)
		if lerr != nil {
			x.log.Warn("lowering a batch group's descendants' CPU limits for a cut", "cgroup", g.Path(), "err", lerr)
		}
		err = g.SetCPULimit(e.Quota, period)
	}
	if err != nil {
		var ce *cgroups.ClampError
		if errors.As(err, &ce) {
			x.metrics.Actions.WithLabelValues(metrics.ActionQuotaClamped).Inc()
			x.log.Debug("CPU cut clamped to a child cgroup's own quota", "cgroup", g.Path(), "err", err)
			s.Cores, s.Written, s.Clamped = ce.Applied.CPUs(), now, e.Cores
			return nil
		}
		s.Cores = math.NaN()
		return err
	}
	s.Cores, s.Written, s.Clamped = e.Cores, now, 0
	if len(s.lowered) > 0 {
		left, err := x.hier.RaiseDescendantCPULimits(s.lowered, e.Quota, period)
		s.lowered = left
		if err != nil {
			x.log.Warn("putting back a batch group's descendants' CPU limits", "cgroup", g.Path(), "err", err)
		}
	}
	return nil
}

// mergeLowered adds newly lowered descendants to have, keeping the first limit recorded
// for each (their own, from before any cut).
func mergeLowered(have, add []cgroups.LoweredLimit) []cgroups.LoweredLimit {
next:
	for _, l := range add {
		for _, h := range have {
			if h.Rel == l.Rel {
				continue next
			}
		}
		have = append(have, l)
	}
	return have
}

// setUpPod gives an in-place batch pod the tier's static settings: the minimum weight
// and SCHED_IDLE. These are pod-level cgroups, never kubelet's QoS-level ones.
func (x *actuator) setUpPod(st *podState) {
	if err := st.read.group.SetCPUShares(minShares); err != nil && !errors.Is(err, cgroups.ErrIdle) {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		st.lastErr = err
		return
	}
	if err := st.read.group.SetIdle(true); err != nil && !errors.Is(err, cgroups.ErrUnsupported) {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		st.lastErr = err
		return
	}
	st.act.setUp = true
	x.metrics.Actions.WithLabelValues(metrics.ActionPodSet).Inc()
}

// boundTier writes the tier's quota at cores at once (start, recreation): a
// (re)starting agent never unleashes batch.
func (x *actuator) boundTier(cores float64, now time.Time) error {
	e := qos.CPUEntry{Kind: qos.TargetTier, ID: "tier", Cores: cores, Quota: x.policy.Quota(cores), Write: true}
	return x.writeCPU(x.tier, &x.tierCPU, e, now)
}

// boundPod writes a pod's quota at cores on g at once (a rediscovered in-place pod).
func (x *actuator) boundPod(st *podState, g *cgroups.Group, cores float64, now time.Time) error {
	e := qos.CPUEntry{Kind: qos.TargetInPlacePod, Cores: cores, Quota: x.policy.Quota(cores), Write: true}
	return x.writeCPU(g, &st.act.quota, e, now)
}

// reopened forgets what was written on the pods whose cgroup the sampler opened anew:
// none of it holds on the new cgroup.
func (x *actuator) reopened(pods []*podState) {
	for _, st := range pods {
		st.act.setUp, st.act.quota, st.act.memory = false, unknownCPU(), unknownMemory()
	}
}

// evictor performs the evictions the plan decides, off the control loop
// (evict.Evictor; a dry-run one in static mode).
type evictor interface {
	Submit(req qos.EvictionRequest, candidates []qos.EvictionCandidate) error
	Run(ctx context.Context) error
	Status() evict.Status
}

var _ evictor = (*evict.Evictor)(nil)

// submitEvictions hands the plan's eviction, with its candidates in order, to the
// evictor (which keeps PodDisruptionBudgets and its own rate limit).
func (x *actuator) submitEvictions(p qos.Plan) {
	if p.Escalation.Evict == nil || len(p.EvictCandidates) == 0 {
		return
	}
	if err := x.evictor.Submit(*p.Escalation.Evict, p.EvictCandidates); err != nil {
		x.log.Error("submitting an eviction", "err", err)
	}
}

// writeMemory writes g's memory limit as e says. A cut the kernel refuses because the
// memory is in use keeps the old limit and is reported.
func (x *actuator) writeMemory(g *cgroups.Group, s *memState, e qos.MemoryEntry, now time.Time) {
	if !e.Write {
		return
	}
	if err := g.SetMemoryLimit(e.Max, e.High); err != nil {
		s.err = err
		if errors.Is(err, cgroups.ErrBusy) {
			s.Busy = now
			x.metrics.Actions.WithLabelValues(metrics.ActionMemoryCutRefused).Inc()
			return
		}
		if !errors.Is(err, cgroups.ErrNotExist) && !errors.Is(err, cgroups.ErrUnsupported) {
			x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
			x.log.Error("writing memory limit; retrying next period", "cgroup", g.Path(), "err", err)
		}
		s.Bytes = math.NaN()
		return
	}
	if e.Reason == qos.WriteCut {
		x.metrics.Actions.WithLabelValues(metrics.ActionMemoryCut).Inc()
	}
	s.Bytes, s.Written, s.Busy, s.err = float64(e.Max), now, time.Time{}, nil
}

// planStatus is the last CPU plan as /status shows it: every group's share, and whether
// it was written and why (or why not), pods named namespace/name.
func (x *actuator) planStatus() []qos.CPUEntry {
	out := make([]qos.CPUEntry, len(x.plan))
	copy(out, x.plan)
	for i := range out {
		if name := x.podName(out[i].Kind, out[i].Index); name != "" {
			out[i].ID = name
		}
	}
	return out
}

// Kinds of plan entries podName names besides the CPU entries' own: a pod's memory limit
// (qos.Plan.PodMemory) and a batch pod (qos.Plan.Freezes, qos.Sample.Batch).
const (
	memoryTarget qos.CPUTargetKind = "podMemory"
	batchTarget  qos.CPUTargetKind = "batchPod"
)

// podName is the namespace/name of the pod entry i of this period's plan is for: a CPU
// entry (qos.TargetTierPod, qos.TargetInPlacePod), a pod's memory limit (memoryTarget)
// or a freezer entry (batchTarget); "" for the tier or an index out of range.
func (x *actuator) podName(kind qos.CPUTargetKind, i int) string {
	var pods []*podState
	switch kind {
	case qos.TargetTierPod:
		pods = x.tierPods
	case qos.TargetInPlacePod:
		pods = x.inPlace
	case memoryTarget:
		pods = x.memPods
	case batchTarget:
		pods = x.batch
	}
	if i < 0 || i >= len(pods) {
		return ""
	}
	return pods[i].key()
}

// setUpTier creates the agent-owned tier with minimum weight and SCHED_IDLE, and bounds
// it at min cores until the first period measured the node: a (re)starting agent never
// unleashes batch. It returns the CFS limit the tier had before (cores; NaN for a new
// tier, an unlimited one or an unreadable limit): what a previous run left in force.
func (x *actuator) setUpTier(min float64) (float64, error) {
	found := math.NaN()
	if g, err := x.hier.Load(x.tierRel); err == nil {
		if q, p, err := g.CPULimit(); err == nil && q >= 0 && p > 0 {
			found = float64(q) / float64(p)
		}
	}
	g, err := x.hier.Create(x.tierRel)
	if err != nil {
		return found, fmt.Errorf("creating batch tier %s: %w", x.tierRel, err)
	}
	// An idle group refuses weight writes (cgroups.ErrIdle): a tier a previous run left
	// idle already has the weight idle groups get, so that is fine.
	if err := g.SetCPUShares(minShares); err != nil && !errors.Is(err, cgroups.ErrIdle) {
		return found, fmt.Errorf("setting tier weight: %w", err)
	}
	if err := g.SetIdle(true); err != nil {
		if !errors.Is(err, cgroups.ErrUnsupported) {
			return found, fmt.Errorf("setting tier SCHED_IDLE: %w", err)
		}
		x.log.Warn("kernel has no cpu.idle; the batch tier relies on weight and quota only")
	}
	x.tier = g
	if err := x.boundTier(min, time.Now()); err != nil {
		return found, fmt.Errorf("bounding tier: %w", err)
	}
	return found, nil
}
