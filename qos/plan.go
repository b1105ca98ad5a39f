package qos

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// This file is the decide step of the agent's control period: from one sample (values
// the caller measured) and what is in force, which CPU and memory limits to write, in
// which order, and why. It is pure: the caller reads the cgroups before and writes them
// after (koordlet: sample → plan → apply).

// CPULimit is a CFS limit in force on one group, as far as the caller knows it.
type CPULimit struct {
	// Cores is the limit in force: NaN unknown (never written, or the last write
	// failed: rewrite), negative unlimited.
	Cores float64
	// Written is when it was last written.
	Written time.Time
	// Clamped is the cut (cores) the kernel last answered by clamping the limit at
	// Cores, a descendant's own limit (cgroup v1); 0 none. The same cut is not asked
	// for again: the kernel would write nothing and every retry counts as a write.
	Clamped float64
}

// UnknownCPULimit is a limit never written.
func UnknownCPULimit() CPULimit { return CPULimit{Cores: math.NaN()} }

// known reports whether the limit in force is known and bounded.
func (l CPULimit) known() bool { return !math.IsNaN(l.Cores) && l.Cores >= 0 }

// CPUTargetKind is the kind of group a CPU limit is written to.
type CPUTargetKind string

const (
	// TargetTier is the batch tier (the pods below it share its quota).
	TargetTier CPUTargetKind = "tier"
	// TargetTierPod is a pod below the tier with its own understory.io/batch-cpu limit.
	TargetTierPod CPUTargetKind = "tierPod"
	// TargetInPlacePod is a batch pod held in kubelet's pod cgroup.
	TargetInPlacePod CPUTargetKind = "inPlacePod"
)

// CPUConsumer is one group the batch budget is written to.
type CPUConsumer struct {
	// ID names the consumer for the caller (a pod UID, "tier").
	ID string
	// Demand is its smoothed usage (cores); DemandOK false while it has none.
	Demand   float64
	DemandOK bool
	// Limit is its own cap (a pod's understory.io/batch-cpu), 0 none.
	Limit float64
	// InForce is its CFS limit in force.
	InForce CPULimit
}

// CPUPlanInput is one period's CPU write decision's input.
type CPUPlanInput struct {
	Now time.Time
	// Budget is the batch budget in force this period (cores).
	Budget float64
	// Tier is the batch tier; TierPods the pods below it with a batch-cpu limit (Limit
	// > 0); TierUnlimited whether a pod below it has none (the tier's demand is then
	// not capped by its pods' limits).
	Tier          CPUConsumer
	TierPods      []CPUConsumer
	TierUnlimited bool
	// InPlace are the batch pods held in kubelet's cgroups.
	InPlace []CPUConsumer
	// Final is the graceful stop: every limit that differs from its share is written,
	// deadband and raise pacing aside, so what batch is left with adds up to at most
	// the budget.
	Final bool
}

// CPUEntry is the plan for one group's CPU limit: its share of the budget and whether
// (and why, or why not) it is written.
type CPUEntry struct {
	Kind CPUTargetKind `json:"kind"`
	// Index is the consumer's index in the input's TierPods or InPlace (0 for the tier).
	Index int    `json:"-"`
	ID    string `json:"id"`
	// Cores is the share the plan gives; Quota what is written over the CFS period
	// (whole microseconds, at least the kernel's 1 ms).
	Cores float64       `json:"cores"`
	Quota time.Duration `json:"quotaNanoseconds"`
	// Write says it is written this period; Reason why, or why not.
	Write  bool   `json:"write"`
	Reason string `json:"reason"`
}

// Write reasons: why a CPUEntry or MemoryEntry is written, or held.
const (
	WriteUnknown      = "unknown limit: rewrite"
	WriteCut          = "cut"
	WriteRaise        = "raise"
	WriteShutdown     = "shutdown: exact"
	WriteUnchanged    = "held: unchanged"
	WriteDeadbandHeld = "held: within the write deadband"
	WritePaced        = "held: raised at most once per CFS period"
	WriteClamped      = "held: the kernel clamped this cut at a descendant's limit"
	WriteMemoryBusy   = "held: the kernel refused this cut (memory in use); retried later"
	WriteMemoryPaced  = "held: a memory limit is raised at most once a second"
)

// WritePolicy is how limits are written: the CFS period every quota is written over
// and the smallest share of an in-place pod.
type WritePolicy struct {
	CFSPeriod time.Duration
	MinPodCPU float64
}

// PlanCPU splits the budget between the tier and the in-place pods (max-min fair on
// demand, SplitBudget) and decides every write, in the order they must be made: cuts
// before raises, so that the limits in force never add up to more than the budget, even
// between two writes. A pod below the tier gets its own batch-cpu limit, at most the
// tier's share; cgroup v1 refuses a child quota above its parent's, so such pods are cut
// before the tier and raised after it. A limit changes only past a deadband (every CFS
// quota write refills the group's runtime: a limit rewritten every period on noise lets
// batch use up to twice its budget); a cut past it is written at once, a raise at most
// once per CFS period (Final: every change, at once).
func (p WritePolicy) PlanCPU(in CPUPlanInput) []CPUEntry {
	demands := make([]PodDemand, 0, 1+len(in.InPlace))
	tier := PodDemand{ID: in.Tier.ID, Usage: in.Tier.Demand, NoHistory: !in.Tier.DemandOK,
		Throttled: WantsMore(in.Tier.Demand, in.Tier.InForce.Cores)}
	// The tier needs no more than its pods' own limits together, when every pod has one.
	if !in.TierUnlimited && len(in.TierPods) > 0 {
		for _, c := range in.TierPods {
			tier.Limit += c.Limit
		}
	}
	demands = append(demands, tier)
	for _, c := range in.InPlace {
		// A terminating pod keeps its share: lifting its quota for the whole grace
		// period would let it run unbounded next to LS.
		demands = append(demands, PodDemand{ID: c.ID, Usage: c.Demand, NoHistory: !c.DemandOK,
			Throttled: WantsMore(c.Demand, c.InForce.Cores), Limit: c.Limit})
	}
	shares := []float64{in.Budget}
	if len(in.InPlace) > 0 || tier.Limit > 0 {
		shares = SplitBudget(in.Budget, demands, p.MinPodCPU)
	}
	entries := make([]CPUEntry, 0, 2*(1+len(in.TierPods)+len(in.InPlace)))
	add := func(kind CPUTargetKind, i int, c CPUConsumer, share float64, cuts bool) {
		if IsCut(c.InForce.Cores, share) != cuts {
			return
		}
		write, reason := p.worthWriting(c.InForce, share, in.Now, in.Final)
		entries = append(entries, CPUEntry{Kind: kind, Index: i, ID: c.ID, Cores: share, Quota: p.Quota(share),
			Write: write, Reason: reason})
	}
	tierPods := func(cuts bool) {
		for i, c := range in.TierPods {
			add(TargetTierPod, i, c, math.Min(c.Limit, shares[0]), cuts)
		}
	}
	for _, cuts := range []bool{true, false} {
		if cuts {
			tierPods(cuts)
		}
		add(TargetTier, 0, in.Tier, shares[0], cuts)
		if !cuts {
			tierPods(cuts)
		}
		for i, c := range in.InPlace {
			add(TargetInPlacePod, i, c, shares[i+1], cuts)
		}
	}
	return entries
}

// worthWriting decides whether a limit changes from cur to next (cores) now, and why.
func (p WritePolicy) worthWriting(cur CPULimit, next float64, now time.Time, final bool) (bool, string) {
	if !cur.known() {
		return true, WriteUnknown
	}
	if final {
		if p.Quota(next) == p.Quota(cur.Cores) {
			return false, WriteUnchanged
		}
		return true, WriteShutdown
	}
	if cur.Clamped > 0 && next < cur.Cores && math.Abs(next-cur.Clamped) < WriteDeadband(cur.Clamped) {
		return false, WriteClamped
	}
	if math.Abs(next-cur.Cores) < WriteDeadband(cur.Cores) {
		return false, WriteDeadbandHeld
	}
	if next < cur.Cores {
		return true, WriteCut
	}
	if now.Sub(cur.Written) < p.CFSPeriod {
		return false, WritePaced
	}
	return true, WriteRaise
}

// Quota is the CFS quota for cores over the policy's CFS period: rounded down to whole
// microseconds, the kernel's unit, so shares never add up to more than the budget, and
// at least the kernel's minimum of 1 ms.
func (p WritePolicy) Quota(cores float64) time.Duration {
	if math.IsNaN(cores) || cores < 0 {
		return -1
	}
	quota := time.Duration(cores * float64(p.CFSPeriod)).Truncate(time.Microsecond)
	return max(quota, time.Millisecond)
}

// IsCut reports whether going from limit cur to next lowers it (an unknown or
// unlimited current limit counts as a cut).
func IsCut(cur, next float64) bool { return math.IsNaN(cur) || cur < 0 || next < cur }

// WantsMore reports whether a consumer used nearly all of its quota: within 10 % of it,
// or within 0.02 cores, whichever is larger (a small quota is always measured a little
// short of itself, because throttling works in whole CFS periods), but never less than
// half of it: with the 0.02 margin alone an idle consumer at a quota below 0.02 counted
// as hungry, took the headroom, and the split flipped between two consumers every
// period, rewriting both quotas each time.
func WantsMore(usage, quota float64) bool {
	const hungryMargin, throttledShare = 0.02, 0.9
	margin := math.Min(math.Max((1-throttledShare)*quota, hungryMargin), quota/2)
	return !math.IsNaN(quota) && quota > 0 && usage >= quota-margin
}

// WriteDeadband is the smallest CPU limit change worth a write: 5 % of the limit, at
// least 0.05 CPU.
func WriteDeadband(cur float64) float64 { return math.Max(0.05, 0.05*cur) }

// MemoryLimit is a memory limit in force on one group.
type MemoryLimit struct {
	// Bytes is the limit in force; NaN unknown.
	Bytes   float64
	Written time.Time
	// Busy is when the kernel last refused a cut (memory in use it could not
	// reclaim); such a cut is retried at most every MemoryRaiseInterval.
	Busy time.Time
}

// UnknownMemoryLimit is a memory limit never written.
func UnknownMemoryLimit() MemoryLimit { return MemoryLimit{Bytes: math.NaN()} }

// Memory limit rules.
const (
	// MemoryHighShare is where a v2 memory.high is put below memory.max: reclaim (and
	// throttling of the allocating task) starts before the OOM killer.
	MemoryHighShare = 0.9
	// MinTierMemory is the smallest memory limit the tier gets: a few pages of
	// headroom so a cut to "nothing" does not make every batch allocation an OOM kill
	// at once; LS harm beyond that is the eviction path's job.
	MinTierMemory = 64 << 20
	// MemoryRaiseInterval bounds how often a memory limit is raised.
	MemoryRaiseInterval = time.Second
)

// TierMemoryLimit is the tier's memory limit: capacity × threshold − LS usage, at most
// the capacity and at least MinTierMemory (bytes).
func TierMemoryLimit(capacity, ls, threshold float64) float64 {
	return math.Max(MinTierMemory, math.Min(capacity, capacity*threshold-ls))
}

// MemoryEntry is the plan for one memory limit.
type MemoryEntry struct {
	// ID names a pod's limit for the caller (PodMemoryLimit.ID); empty for the tier.
	ID string
	// Max is memory.max (bytes) and High memory.high (v2) when written.
	Max, High int64
	Write     bool
	Reason    string
}

// PlanMemory decides whether the memory limit in force cur goes to want (bytes): cut at
// once (a cut the kernel refused is retried at most every MemoryRaiseInterval), raised
// past a deadband at most every MemoryRaiseInterval.
func PlanMemory(cur MemoryLimit, want float64, now time.Time) MemoryEntry {
	e := MemoryEntry{Max: int64(want)}
	e.High = int64(float64(e.Max) * MemoryHighShare)
	known := !math.IsNaN(cur.Bytes) && cur.Bytes > 0
	switch {
	case !known:
		e.Write, e.Reason = true, WriteUnknown
	case want < cur.Bytes:
		if !cur.Busy.IsZero() && now.Sub(cur.Busy) < MemoryRaiseInterval {
			e.Reason = WriteMemoryBusy
			return e
		}
		e.Write, e.Reason = true, WriteCut
	case want-cur.Bytes < MemoryDeadband(cur.Bytes):
		e.Reason = WriteDeadbandHeld
	case now.Sub(cur.Written) < MemoryRaiseInterval:
		e.Reason = WriteMemoryPaced
	default:
		e.Write, e.Reason = true, WriteRaise
	}
	return e
}

// MemoryDeadband is the smallest raise of a memory limit worth a write: 2 % of it, at
// least 16 MiB.
func MemoryDeadband(cur float64) float64 { return math.Max(16<<20, 0.02*cur) }

// PodSample is one pod's CPU sample, as the attribution needs it.
type PodSample struct {
	Class  Class
	InTier bool
	// Mismatched: the pod does not run where kubelet's cgroup for its class would put
	// it (an LS pod in BestEffort, a batch or BE pod outside it), and is not below the
	// tier.
	Mismatched bool
	// Fresh: Usage was read this period; Open: the pod's cgroup is open (Usage is its
	// last sample).
	Fresh, Open bool
	Usage       float64
}

// CPUSample is what one period measured of the node's CPU (cores).
type CPUSample struct {
	CPUs, NodeCores float64
	// The aggregates: kubepods, kubelet's BestEffort cgroup and the tier; OK false
	// when one has no rate this period.
	Kubepods, BestEffort, Tier       float64
	KubepodsOK, BestEffortOK, TierOK bool
	// TierInBE: the tier is inside kubelet's BestEffort cgroup.
	TierInBE bool
	Pods     []PodSample
	// Slow: every pod was read this period.
	Slow bool
	// Unattributed is the kubepods CPU no known pod accounted for at the last slow
	// period.
	Unattributed float64
}

// FastLS reports whether LS usage comes from the aggregates this period: kubepods
// minus kubelet's BestEffort cgroup minus the tier, corrected by the pods whose class
// does not match where kubelet put them (which are then read every period). Without
// them (first period, a read error) LS pods are read one by one.
func (s CPUSample) FastLS() bool { return s.KubepodsOK && s.BestEffortOK && s.TierOK }

// Attribution is the period's CPU by class (cores).
type Attribution struct {
	// LS is what the LS pods read used; UnknownPods what kubepods used that no known
	// pod accounts for (it counts as LS: the safe side); LSEstimate the LS usage the
	// budget sees.
	LS, UnknownPods, LSEstimate float64
	BE, Batch, System           float64
	// Unattributed is the sample's, updated on a slow period.
	Unattributed float64
	// HasBatch: the node has a batch pod.
	HasBatch bool
}

// Attribute attributes the period's CPU to LS, BE, batch and system. What runs in
// kubepods but not in a pod the agent knows (a pod it has not heard of yet, a pod whose
// cgroup it cannot read) counts as LS: the safe side. It is measured when every pod was
// read in the same period and held in between, so the period-to-period swings of
// throttled batch pods never leak into the LS estimate.
func Attribute(s CPUSample) Attribution {
	fast := s.FastLS()
	var a Attribution
	var inPlace, lsInBE, otherOutBE float64
	for _, p := range s.Pods {
		a.HasBatch = a.HasBatch || p.Class == ClassBatch
		if fast && p.Mismatched && p.Fresh {
			if p.Class == ClassLS {
				lsInBE += p.Usage
			} else {
				otherOutBE += p.Usage
			}
		}
		switch {
		case p.Class == ClassLS && (p.Fresh || (fast && p.Open)):
			a.LS += p.Usage
		case p.Class == ClassBE && p.Open:
			a.BE += p.Usage
		case p.Class == ClassBatch && !p.InTier && p.Open:
			inPlace += p.Usage
		}
	}
	a.Batch = inPlace
	if s.TierOK {
		a.Batch += s.Tier
	}
	a.Unattributed = s.Unattributed
	if s.Slow && s.KubepodsOK {
		a.Unattributed = math.Max(0, s.Kubepods-(a.LS+a.BE+a.Batch))
	}
	a.UnknownPods = a.Unattributed
	a.LSEstimate = a.LS + a.UnknownPods
	if fast {
		tier := s.Tier
		if s.TierInBE {
			tier = 0 // already in BestEffort's usage
		}
		a.LSEstimate = math.Max(0, s.Kubepods-s.BestEffort-tier-otherOutBE+lsInBE)
		a.UnknownPods = math.Max(0, a.LSEstimate-a.LS)
	}
	a.System = s.NodeCores - s.Kubepods
	if !s.KubepodsOK {
		a.System = s.NodeCores - (a.LS + a.BE + a.Batch)
	}
	a.System = math.Max(0, a.System)
	return a
}

// HarmSample is the LS harm the signal source reported since the last period: the
// evidence the guard acts on (the freshest window), or none.
type HarmSample struct {
	// Found: some harm was reported; Signal and Since are its freshest evidence.
	Found  bool
	Signal Signal
	Since  time.Time
	// Blind: the source could not be read.
	Blind bool
}

// MemorySample is the node's memory (bytes), the last sample: the tier's memory rule, the
// graded actions and the batch resources decide from it.
type MemorySample struct {
	// OK: memory has been sampled (the last sample stands between two samples); At is
	// when (zero: never).
	OK bool
	At time.Time
	// Capacity is what pods may use and Used what counts against it; LS, BE and System
	// the working sets by class.
	Capacity, Used, LS, BE, System float64
}

// Sample is everything one control period measured: a plain value.
type Sample struct {
	Now    time.Time
	CPU    CPUSample
	Harm   HarmSample
	Memory MemorySample
	// Batch are the node's batch pods, in the pod table's order.
	Batch []BatchPodSample
	// Stats is the statistics interval's throttling (Stats.Due on such a period).
	Stats StatsSample
	// Requests are the pods' requests (the batch resources' formula).
	Requests Requests
	// Reclaim: the reclaimer may be fed this period (not in the agent's first second,
	// nor in a period whose kubepods usage has no rate: its averages would carry that).
	Reclaim bool
}

// PodMemoryLimit is a batch pod's own memory limit: what is in force and what its
// understory.io/batch-memory asks.
type PodMemoryLimit struct {
	// ID names the pod for the caller (a pod UID).
	ID      string
	InForce MemoryLimit
	Want    float64
}

// BatchLimits are the batch groups the plan writes, with the limits in force on them and
// their demand.
type BatchLimits struct {
	// Tier, TierPods, TierUnlimited and InPlace are as in CPUPlanInput.
	Tier          CPUConsumer
	TierPods      []CPUConsumer
	TierUnlimited bool
	InPlace       []CPUConsumer
	TierMemory    MemoryLimit
	// PodMemory are the batch pods with a batch-memory limit.
	PodMemory []PodMemoryLimit
	// HasTier: the agent holds the tier's group (it can freeze it); TierFrozen: the tier
	// is frozen.
	HasTier, TierFrozen bool
	// Pods are every batch pod's freezer and CPU limit, index-aligned with Sample.Batch
	// (a pod whose UID differs there counts as nothing held).
	Pods []PodInForce
}

// Plan is one control period's decision: the CPU attributed by class, the budget and
// why, every write with its reason, in the order to make them (the pods' memory limits,
// the CPU limits, the tier's memory limit, the freezer), the graded action and its
// evictions, the batch resources for the Node, and what the batch pods are told (events,
// the pod condition). String renders it.
type Plan struct {
	Attribution Attribution
	// Util is the utilisation budget (the Budgeter's); Budget the one in force: with a
	// harm signal the guard's, which only harm cuts.
	Util, Budget Budget
	// Cause is what cut the budget (SignalNone: nothing, or utilisation in sampling
	// mode, where Budget.Reason says).
	Cause      Signal
	PodMemory  []MemoryEntry // index-aligned with BatchLimits.PodMemory
	CPU        []CPUEntry
	TierMemory MemoryEntry // Write false without a memory sample
	// Escalation is the graded action (throttle, freeze, evict) and why; zero without
	// an Escalator. Freezes are its freezer writes, the tier first, then the in-place
	// pods in their order.
	Escalation EscalationDecision
	Freezes    []FreezeEntry
	// EvictCandidates are the pods Escalation.Evict may evict, in the order to evict
	// them; empty when there is nothing to evict (or no pod to evict).
	EvictCandidates []EvictionCandidate
	// Reclaim: the reclaimer was fed this period; Reclaimed is its result (each
	// resource's Write says whether the Node is written).
	Reclaim   bool
	Reclaimed Reclaimed
	// Notices are the Warning events on batch pods: a freeze, and on a statistics
	// interval hard throttling.
	Notices []Notice
	// Conditions are the pod conditions to write (a statistics interval); Forget the pods
	// whose condition is no longer tended (gone, or no longer told).
	Conditions []ConditionWrite
	Forget     []types.UID
}

// Controller decides the control period: the Budgeter's utilisation budget, the Guard's
// answer to harm (nil Guard: sampling mode, utilisation decides), the write policy, the
// graded actions (nil Escalator: none), the batch resources (nil Reclaimer: none) and the
// pod condition (nil Conditions: none). Its Budgeter, Guard, Escalator, Reclaimer and
// Conditions keep state between periods; Plan is otherwise pure.
type Controller struct {
	Budgeter *Budgeter
	Guard    *Guard
	Writes   WritePolicy
	// MemoryThreshold is the share of the node's memory capacity LS and batch may use
	// together (batchResources.memory.threshold).
	MemoryThreshold float64
	Escalator       *Escalator
	Reclaimer       *Reclaimer
	Conditions      *BatchConditions
}

// Plan decides one period from its sample and the limits in force. The sample's node
// CPU must have a rate (not the agent's first sample).
func (c Controller) Plan(s Sample, in BatchLimits) Plan {
	var p Plan
	p.Attribution = Attribute(s.CPU)
	p.Util = c.Budgeter.Next(BudgetInput{NodeCPUs: s.CPU.CPUs, LSUsage: p.Attribution.LSEstimate,
		SystemUsage: p.Attribution.System})
	p.Budget = p.Util
	if c.Guard != nil {
		p.Budget, p.Cause = c.Guarded(p.Util, s.Harm, s.Now)
	}
	c.PlanWrites(&p, s, in, false)
	c.planReclaim(&p, s)
	c.planEscalation(&p, s, in)
	c.planStats(&p, s, in)
	return p
}

// Guarded replaces the utilisation budget b by the guard's decision on harm h (signal
// modes): with a harm signal only harm cuts, utilisation alone never does.
func (c Controller) Guarded(b Budget, h HarmSample, now time.Time) (Budget, Signal) {
	in := GuardInput{Now: now, Budget: b, Blind: h.Blind}
	if h.Found {
		in.Harm, in.HarmSince = h.Signal, h.Since
	}
	d := c.Guard.Next(in)
	b.Previous, b.Applied, b.Reason = d.Previous, d.Applied, d.Reason
	return b, d.Cause
}

// PlanWrites fills p's writes for its budget: the pods' memory limits, the CPU limits
// (WritePolicy.PlanCPU; final: the graceful stop) and, with a memory sample, the tier's
// memory limit (TierMemoryLimit).
func (c Controller) PlanWrites(p *Plan, s Sample, in BatchLimits, final bool) {
	p.PodMemory = make([]MemoryEntry, len(in.PodMemory))
	for i, m := range in.PodMemory {
		p.PodMemory[i] = PlanMemory(m.InForce, m.Want, s.Now)
		p.PodMemory[i].ID = m.ID
	}
	p.CPU = c.Writes.PlanCPU(CPUPlanInput{Now: s.Now, Budget: p.Budget.Applied, Tier: in.Tier, TierPods: in.TierPods,
		TierUnlimited: in.TierUnlimited, InPlace: in.InPlace, Final: final})
	p.TierMemory = MemoryEntry{}
	if s.Memory.OK {
		p.TierMemory = PlanMemory(in.TierMemory, TierMemoryLimit(s.Memory.Capacity, s.Memory.LS, c.MemoryThreshold), s.Now)
	}
}
