package qos

import (
	"fmt"
	"math"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// This file is the rest of the period's decision (Controller.Plan), after the budget and
// the limits: the graded action (freeze, thaw, evict) and its freezer writes, the batch
// resources for the Node, and what the batch pods are told (Warning events and the pod
// condition ConditionBatchSlowed). Like plan.go it is pure: the caller reads the memory,
// the throttling and the pods before and acts after.

// Throttling is what one batch group was throttled in over a statistics interval: the CFS
// periods with runnable tasks and those it was throttled in.
type Throttling struct {
	Periods, Throttled uint64
}

// BatchPodSample is one batch pod as the decisions beyond CPU need it: who it is (eviction
// candidates, events, conditions), where it runs, its memory and its own throttling.
type BatchPodSample struct {
	UID             types.UID
	Namespace, Name string
	// InTier: the pod runs below the tier and shares its quota, freezer and throttling;
	// else it is held in place, in kubelet's pod cgroup.
	InTier bool
	// Terminating: the pod's deletion was requested. It is never frozen (it must handle
	// SIGTERM), never an eviction candidate and told nothing.
	Terminating bool
	Priority    int32
	// StartTime orders eviction candidates (zero: the oldest).
	StartTime time.Time
	// MemoryBytes is its working set at the last slow period; 0 unknown.
	MemoryBytes int64
	// Throttle is an in-place pod's own throttling over the statistics interval;
	// ThrottleOK is false when it was not read (no interval, no open cgroup, the first
	// read, which is the baseline).
	Throttle   Throttling
	ThrottleOK bool
}

// told reports whether the pod gets the agent's events and condition: a pod the agent
// knows by name (not a static pod read from a manifest without one) that is not being
// deleted.
func (p BatchPodSample) told() bool { return p.Namespace != "" && p.Name != "" && !p.Terminating }

func (p BatchPodSample) key() string { return p.Namespace + "/" + p.Name }

// StatsSample is what a statistics interval read: the tier's throttling (the in-place
// pods' own is in their BatchPodSample).
type StatsSample struct {
	// Due: this period starts a statistics interval: the throttling was read, and the
	// throttling events and the pod conditions are decided.
	Due bool
	// Interval is the statistics interval's length (the messages say it).
	Interval time.Duration
	// Tier is the tier's throttling; TierOK false when it was not read.
	Tier   Throttling
	TierOK bool
}

// Requests are what the node's pods request: the LS pods' CPU (cores) and memory
// (bytes), and every pod's batch resources (understory.io/batch-cpu in cores and
// batch-memory in bytes: kubelet counts them against allocatable whatever the class).
type Requests struct {
	LSCPU, LSMemory, BatchCPU, BatchMemory float64
}

// PodInForce is what the agent holds on one batch pod: its freezer state and CPU limit.
type PodInForce struct {
	UID types.UID
	// Freezable: the pod is held in place and its cgroup is open, so the agent freezes
	// it on its own (a pod below the tier is frozen with the tier).
	Freezable bool
	Frozen    bool
	// Quota is the pod's own CFS limit in force (cores; NaN unknown, negative unlimited).
	Quota float64
}

// FreezeEntry is one freezer write of the plan: freeze or thaw the tier or an in-place
// pod, and why.
type FreezeEntry struct {
	// Kind is TargetTier or TargetInPlacePod.
	Kind CPUTargetKind `json:"kind"`
	// Index is the pod's index in Sample.Batch (0 for the tier).
	Index  int    `json:"-"`
	ID     string `json:"id"`
	Freeze bool   `json:"freeze"`
	Reason string `json:"reason"`
}

// Freeze reasons.
const (
	FreezeStarved   = "freeze: LS and the system leave batch less than its floor"
	ThawRoom        = "thaw: LS leaves batch room again"
	ThawNoBatch     = "thaw: no batch pod left"
	ThawTerminating = "thaw: the pod is being deleted and must handle SIGTERM"
	ThawNotDecided  = "thaw: frozen, but the escalation does not freeze (an earlier run or another writer froze it)"
)

// NoticeKind is what a batch pod is told by a Warning event (its reason).
type NoticeKind string

// The notices.
const (
	// NoticeFrozen: batch was frozen because LS leaves it nothing.
	NoticeFrozen NoticeKind = "BatchFrozen"
	// NoticeThrottled: the pod's group was throttled in most of its CFS periods.
	NoticeThrottled NoticeKind = "BatchThrottled"
)

// Notice is a Warning event the plan asks for on one batch pod. The caller limits how
// often one pod hears one kind (its messages carry numbers that change every time).
type Notice struct {
	UID             types.UID  `json:"uid"`
	Namespace, Name string     `json:"-"`
	Pod             string     `json:"pod"`
	Kind            NoticeKind `json:"kind"`
	Message         string     `json:"message"`
}

// ConditionWrite is the pod condition the plan writes on one batch pod.
type ConditionWrite struct {
	UID             types.UID             `json:"uid"`
	Namespace, Name string                `json:"-"`
	Pod             string                `json:"pod"`
	Condition       WrittenBatchCondition `json:"condition"`
}

// BatchConditions is the condition state the plan decides from: what was last written on
// each batch pod (NextBatchCondition's prev) and the last freeze's message (the Frozen
// condition's while the freeze lasts). Not safe for concurrent use (the control loop's).
type BatchConditions struct {
	written   map[types.UID]WrittenBatchCondition
	freezeMsg string
}

// NewBatchConditions returns an empty condition state.
func NewBatchConditions() *BatchConditions {
	return &BatchConditions{written: map[types.UID]WrittenBatchCondition{}}
}

// Seed takes the condition a pod already carries (written by an earlier run of the agent)
// as the last written, once the pod is new to the state, so that a restarted agent still
// sets a stale True back to Running. Its write time counts as long ago.
//
// What it honours is bounded: a reason the agent never writes is read as Running and a
// message longer than maxSeededMessage as none. The state then holds only what the agent
// could have written, a few hundred bytes a pod, and such a condition differs from
// anything the agent writes, so the next plan replaces it.
func (c *BatchConditions) Seed(pod *corev1.Pod) {
	if pod == nil || pod.UID == "" {
		return
	}
	if _, ok := c.written[pod.UID]; ok {
		return
	}
	for _, pc := range pod.Status.Conditions {
		if pc.Type != ConditionBatchSlowed {
			continue
		}
		r, msg := BatchSlowReason(pc.Reason), pc.Message
		if !r.valid() {
			r, msg = BatchRunning, ""
		}
		if len(msg) > maxSeededMessage {
			msg = ""
		}
		c.written[pod.UID] = WrittenBatchCondition{BatchCondition: BatchCondition{Reason: r, Message: msg},
			Since: pc.LastTransitionTime.Time}
		return
	}
}

// maxSeededMessage is the longest condition message Seed keeps; the agent's own
// messages are a few hundred bytes at most.
const maxSeededMessage = 1024

// Written returns the condition last written on a pod, if any.
func (c *BatchConditions) Written(uid types.UID) (WrittenBatchCondition, bool) {
	w, ok := c.written[uid]
	return w, ok
}

// planEscalation decides the graded action from the utilisation budget and the memory
// figures, and plans its freezer writes, eviction candidates and freeze notices.
func (c Controller) planEscalation(p *Plan, s Sample, in BatchLimits) {
	if c.Escalator == nil {
		return
	}
	ei := EscalationInput{Now: s.Now, Budget: p.Util, HasBatch: p.Attribution.HasBatch, MemoryAt: s.Memory.At}
	if s.Memory.OK {
		ei.MemoryUsed, ei.MemoryCapacity = int64(s.Memory.Used), int64(s.Memory.Capacity)
	}
	d := c.Escalator.Decide(ei)
	p.Escalation = d
	p.Freezes = planFreezes(d, s.Batch, in)
	if d.Evict != nil {
		p.EvictCandidates = evictionCandidates(s.Batch)
	}
	if d.Froze {
		msg := frozenMessage(p.Util, d.StarvedFor.Duration)
		if c.Conditions != nil {
			c.Conditions.freezeMsg = msg
		}
		for _, pod := range s.Batch {
			if pod.told() {
				p.Notices = append(p.Notices, notice(pod, NoticeFrozen, msg))
			}
		}
	}
}

// planFreezes plans the freezer writes that make the tier and the in-place batch pods
// frozen as d says (Freeze), the tier first, then the pods in their order. A pod being
// deleted is never kept frozen.
func planFreezes(d EscalationDecision, pods []BatchPodSample, in BatchLimits) []FreezeEntry {
	var out []FreezeEntry
	if in.HasTier && in.TierFrozen != d.Freeze {
		out = append(out, FreezeEntry{Kind: TargetTier, ID: "tier", Freeze: d.Freeze, Reason: freezeReason(d, false)})
	}
	for i, pod := range pods {
		held, ok := inForce(in, i, pod.UID)
		if !ok || !held.Freezable {
			continue
		}
		want := d.Freeze && !pod.Terminating
		if held.Frozen == want {
			continue
		}
		out = append(out, FreezeEntry{Kind: TargetInPlacePod, Index: i, ID: string(pod.UID), Freeze: want,
			Reason: freezeReason(d, pod.Terminating)})
	}
	return out
}

// inForce is what is held on the i-th batch pod, when in.Pods is index-aligned with the
// sample there (the same pod).
func inForce(in BatchLimits, i int, uid types.UID) (PodInForce, bool) {
	if i >= len(in.Pods) || in.Pods[i].UID != uid {
		return PodInForce{Quota: math.NaN()}, false
	}
	return in.Pods[i], true
}

func freezeReason(d EscalationDecision, terminating bool) string {
	switch {
	case d.Freeze && terminating:
		return ThawTerminating
	case d.Freeze:
		return FreezeStarved
	case d.Thawed && d.Reason == EscalationReasonNoBatch:
		return ThawNoBatch
	case d.Thawed:
		return ThawRoom
	}
	return ThawNotDecided
}

// evictionCandidates are the batch pods known by name and not being deleted already, in
// the order to evict them (OrderEvictionCandidates).
func evictionCandidates(pods []BatchPodSample) []EvictionCandidate {
	var out []EvictionCandidate
	for _, pod := range pods {
		if pod.Terminating || pod.Namespace == "" {
			continue
		}
		out = append(out, EvictionCandidate{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Class: ClassBatch,
			Priority: pod.Priority, MemoryBytes: pod.MemoryBytes, StartTime: pod.StartTime})
	}
	return OrderEvictionCandidates(out)
}

// planReclaim feeds the reclaimer when the sample says it may be (Sample.Reclaim).
func (c Controller) planReclaim(p *Plan, s Sample) {
	if c.Reclaimer == nil || !s.Reclaim {
		return
	}
	at, m, r := p.Attribution, s.Memory, s.Requests
	p.Reclaim = true
	p.Reclaimed = c.Reclaimer.Next(ReclaimInput{Now: s.Now,
		CPU: ResourceUsage{Capacity: s.CPU.CPUs, LSUsage: at.LSEstimate, LSRequest: r.LSCPU, BEUsage: at.BE,
			SystemUsage: at.System, BatchRequest: r.BatchCPU},
		Memory: ResourceUsage{Capacity: m.Capacity, LSUsage: m.LS, LSRequest: r.LSMemory, BEUsage: m.BE,
			SystemUsage: m.System, BatchRequest: r.BatchMemory}})
}

// after is what the plan leaves in force once applied: the tier's and the i-th batch
// pod's freezer and CPU limit (a write the kernel refuses is not foreseen: the next plan
// writes it again).
type after struct {
	p  *Plan
	in BatchLimits
}

func (a after) tierFrozen() bool {
	for _, f := range a.p.Freezes {
		if f.Kind == TargetTier {
			return f.Freeze
		}
	}
	return a.in.TierFrozen
}

func (a after) tierQuota() float64 {
	for _, e := range a.p.CPU {
		if e.Kind == TargetTier && e.Write {
			return e.Cores
		}
	}
	return a.in.Tier.InForce.Cores
}

func (a after) podFrozen(i int, uid types.UID) bool {
	for _, f := range a.p.Freezes {
		if f.Kind == TargetInPlacePod && f.Index == i {
			return f.Freeze
		}
	}
	held, _ := inForce(a.in, i, uid)
	return held.Frozen
}

func (a after) podQuota(i int, uid types.UID) float64 {
	for _, e := range a.p.CPU {
		if e.Kind == TargetInPlacePod && e.Write && e.ID == string(uid) {
			return e.Cores
		}
	}
	held, _ := inForce(a.in, i, uid)
	return held.Quota
}

// planStats decides, on a statistics interval, the throttling notices (a group throttled
// hard, HardThrottled: an in-place pod's own, or the tier's on every pod below it) and
// every batch pod's condition.
func (c Controller) planStats(p *Plan, s Sample, in BatchLimits) {
	if !s.Stats.Due {
		return
	}
	now, budget, iv, af := s.Now, p.Budget.Applied, s.Stats.Interval, after{p: p, in: in}
	if t := s.Stats.Tier; s.Stats.TierOK {
		if share, hard := HardThrottled(t.Periods, t.Throttled); hard {
			msg := throttledMessage("the batch tier's", share, t, af.tierQuota(), budget, iv)
			for _, pod := range s.Batch {
				if pod.InTier && pod.told() {
					p.Notices = append(p.Notices, notice(pod, NoticeThrottled, msg))
				}
			}
		}
	}
	for i, pod := range s.Batch {
		if pod.InTier || !pod.ThrottleOK {
			continue
		}
		if share, hard := HardThrottled(pod.Throttle.Periods, pod.Throttle.Throttled); hard && pod.told() {
			p.Notices = append(p.Notices, notice(pod, NoticeThrottled,
				throttledMessage("its", share, pod.Throttle, af.podQuota(i, pod.UID), budget, iv)))
		}
	}
	if c.Conditions != nil {
		c.Conditions.plan(p, s, af, now)
	}
}

// plan sets every batch pod's condition from the statistics interval and the freeze the
// plan leaves: Frozen for a pod frozen in place or below a frozen tier, else Throttled for
// a pod whose group was throttled hard, else Running. A pod whose group has no statistics
// this interval keeps its condition; a pod gone (or no longer told) is forgotten.
func (c *BatchConditions) plan(p *Plan, s Sample, af after, now time.Time) {
	c.prune(p, s.Batch)
	tierFrozen := af.tierFrozen()
	for i, pod := range s.Batch {
		if !pod.told() {
			continue
		}
		if af.podFrozen(i, pod.UID) || pod.InTier && tierFrozen {
			msg := c.freezeMsg
			if msg == "" {
				msg = "frozen by the node agent: LS leaves batch less than its floor; it is thawed once LS leaves room again"
			}
			c.set(p, pod, BatchCondition{Reason: BatchFrozen, Message: msg}, now)
			continue
		}
		t, ok, whose, quota := pod.Throttle, pod.ThrottleOK, "its", af.podQuota(i, pod.UID)
		if pod.InTier {
			t, ok, whose, quota = s.Stats.Tier, s.Stats.TierOK, "the batch tier's", af.tierQuota()
		}
		if !ok {
			continue
		}
		if share, hard := HardThrottled(t.Periods, t.Throttled); hard {
			c.set(p, pod, BatchCondition{Reason: BatchThrottled,
				Message: throttledMessage(whose, share, t, quota, p.Budget.Applied, s.Stats.Interval)}, now)
			continue
		}
		c.set(p, pod, BatchCondition{Reason: BatchRunning, Message: runningMessage()}, now)
	}
}

// set plans the pod's condition if NextBatchCondition says so.
func (c *BatchConditions) set(p *Plan, pod BatchPodSample, next BatchCondition, now time.Time) {
	var prev *WrittenBatchCondition
	if w, ok := c.written[pod.UID]; ok {
		prev = &w
	}
	w, ok := NextBatchCondition(prev, next, now)
	if !ok {
		return
	}
	c.written[pod.UID] = w
	p.Conditions = append(p.Conditions, ConditionWrite{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Pod: pod.key(), Condition: w})
}

// prune forgets the pods that are gone or no longer told, in UID order.
func (c *BatchConditions) prune(p *Plan, pods []BatchPodSample) {
	if len(c.written) == 0 {
		return
	}
	keep := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		if pod.told() {
			keep[pod.UID] = true
		}
	}
	start := len(p.Forget)
	for uid := range c.written {
		if !keep[uid] {
			delete(c.written, uid)
			p.Forget = append(p.Forget, uid)
		}
	}
	slices.Sort(p.Forget[start:])
}

func notice(pod BatchPodSample, kind NoticeKind, msg string) Notice {
	return Notice{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Pod: pod.key(), Kind: kind, Message: msg}
}

// frozenMessage says why batch was frozen: what LS and the system leave batch (b.Raw)
// against its floor (b.Min), and for how long.
func frozenMessage(b Budget, starvedFor time.Duration) string {
	return fmt.Sprintf("frozen by the node agent: LS (%.2f cores) and the system (%.2f) leave batch %.2f of %.0f CPUs, "+
		"below its floor of %.2f, for %v; it is thawed once LS leaves room again", b.LSUsage, b.SystemUsage,
		math.Max(0, b.Raw), b.NodeCPUs, b.Min, starvedFor.Round(time.Second))
}

// throttledMessage says how hard a group (whose: "its", "the batch tier's") was throttled
// over the interval, at which quota (cores), and why: its share of the batch budget.
func throttledMessage(whose string, share float64, t Throttling, quota, budget float64, interval time.Duration) string {
	q := "an unknown quota"
	if !math.IsNaN(quota) && quota >= 0 {
		q = fmt.Sprintf("a quota of %.2f cores", quota)
	}
	return fmt.Sprintf("throttled by the node agent in %d%% of its CFS periods over the last %v (%d of %d) at %s "+
		"(%s share of the batch budget, %.2f cores: what LS leaves)", int(math.Round(100*share)), interval.Round(time.Second),
		t.Throttled, t.Periods, q, whose, budget)
}

// runningMessage is the Running condition's message: the same every time, so a pod that
// runs free costs no further write.
func runningMessage() string {
	return fmt.Sprintf("runs free: throttled in fewer than %d%% of its CFS periods, not frozen",
		int(math.Round(100*HardThrottledShare)))
}
