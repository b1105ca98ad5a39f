package koordlet

import (
	"errors"
	"math"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// enforce applies the period's budget. Batch pods below the tier share the tier's quota;
// batch pods held in place (in kubelet's pod cgroups) get SCHED_IDLE, the minimum weight
// and a quota each. The budget is split between the tier and the in-place pods by
// max-min fairness on demand, so that all their quotas together never exceed it.
//
// A failed write leaves the limit marked unknown and is retried the next period; a cut
// is written at once, a raise only when it is worth a write.
func (a *Agent) enforce(b qos.Budget, now time.Time) {
	demands := append(a.splitBuf[:0], qos.PodDemand{ID: "tier", Usage: a.tierDemand.v, NoHistory: !a.tierDemand.ok,
		Throttled: wantsMore(a.tierDemand.v, a.tierQuota)})
	inPlace, inTier := a.inPlaceBuf[:0], a.inTierBuf[:0]
	// The tier needs no more than its pods' own limits together, when every pod has one.
	tierLimit, tierLimited := 0.0, true
	for _, st := range a.sorted {
		if st.class != qos.ClassBatch || st.group == nil {
			continue
		}
		a.enforcePodMemory(st, now)
		if st.inTier {
			if st.spec.batchCPU > 0 {
				tierLimit += st.spec.batchCPU
				inTier = append(inTier, st)
			} else {
				tierLimited = false
			}
			continue
		}
		if !st.setUp {
			a.setUpPod(st)
		}
		// A terminating pod keeps its share: lifting its quota for the whole grace
		// period would let it run unbounded next to LS.
		demands = append(demands, qos.PodDemand{ID: string(st.uid), Usage: st.demand.v, NoHistory: !st.demand.ok,
			Throttled: wantsMore(st.demand.v, st.quota), Limit: st.spec.batchCPU})
		inPlace = append(inPlace, st)
	}
	if tierLimited && len(inTier) > 0 {
		demands[0].Limit = tierLimit
	}
	a.splitBuf, a.inPlaceBuf, a.inTierBuf = demands, inPlace, inTier
	shares := []float64{b.Applied}
	if len(inPlace) > 0 || demands[0].Limit > 0 {
		shares = qos.SplitBudget(b.Applied, demands, a.cfg.MinPodCPU)
	}
	// Cuts first, so that the sum of the quotas in force never exceeds the budget, even
	// between two writes. A pod below the tier gets its own batch-cpu limit, at most the
	// tier's share: cgroup v1 refuses a child quota above its parent's, so such pods are
	// cut before the tier and raised after it.
	for _, cuts := range []bool{true, false} {
		if cuts {
			a.enforceTierPods(inTier, shares[0], cuts, now)
		}
		if isCut(a.tierQuota, shares[0]) == cuts {
			if err := a.applyTier(shares[0], now); err != nil {
				a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
				a.log.Error("writing tier quota; retrying next period", "cgroup", a.layout.tier, "err", err)
			}
		}
		if !cuts {
			a.enforceTierPods(inTier, shares[0], cuts, now)
		}
		for i, st := range inPlace {
			a.applyPodQuota(st, shares[i+1], cuts, now)
		}
	}
}

// enforceTierPods gives each pod below the tier that has a batch-cpu limit a quota of
// that limit, at most the tier's share.
func (a *Agent) enforceTierPods(pods []*podState, tierShare float64, cuts bool, now time.Time) {
	for _, st := range pods {
		a.applyPodQuota(st, math.Min(st.spec.batchCPU, tierShare), cuts, now)
	}
}

// applyPodQuota writes one pod's quota q (cores) in the pass for cuts or for raises.
func (a *Agent) applyPodQuota(st *podState, q float64, cuts bool, now time.Time) {
	if isCut(st.quota, q) != cuts || !a.worthWriting(st.quota, q, st.lastWrite, now) {
		return
	}
	if err := a.writeQuota(st.group, q); err != nil {
		if applied, ok := a.clamped(err, st.key()); ok {
			// Written, but no lower than a child's own quota: never unlimited.
			st.quota, st.lastWrite, st.lastErr = applied, now, err
			return
		}
		st.quota = nan()
		st.lastErr = err
		if errors.Is(err, cgroups.ErrNotExist) {
			st.close()
			st.nextOpen = now.Add(reopenBackoff)
			return
		}
		a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		a.log.Error("writing pod quota; retrying next period", logAttrsPod(st), "err", err)
		return
	}
	st.quota, st.lastWrite = q, now
}

// demand is a consumer's smoothed CPU usage, what the budget split is based on. One
// period's usage of a quota-limited group is useless for that: the group burns its
// runtime in a burst and then sits throttled, so a period shorter than (or not aligned
// with) the CFS period sees 0 or several times the quota. An exponential average over
// about demandWindow tracks what the group actually gets.
type demand struct {
	v  float64
	ok bool
}

// demandWindow is the time constant of the demand average.
const demandWindow = time.Second

// add folds in usage measured over the last dt.
func (d *demand) add(cores float64, dt time.Duration) {
	if !d.ok {
		d.v, d.ok = cores, true
		return
	}
	alpha := math.Min(1, dt.Seconds()/demandWindow.Seconds())
	d.v += alpha * (cores - d.v)
}

// isCut reports whether going from limit cur to next lowers it (an unknown or
// unlimited current limit counts as a cut).
func isCut(cur, next float64) bool { return math.IsNaN(cur) || cur < 0 || next < cur }

// wantsMore reports whether a consumer used nearly all of its quota: within 10 % of it,
// or within hungryMargin cores, whichever is larger (a small quota is always measured a
// little short of itself, because throttling works in whole CFS periods).
func wantsMore(usage, quota float64) bool {
	return !math.IsNaN(quota) && quota > 0 && usage >= quota-math.Max((1-throttledShare)*quota, hungryMargin)
}

// hungryMargin is the absolute slack of wantsMore, in cores.
const hungryMargin = 0.02

// throttledShare is the fraction of its quota at which a pod counts as wanting more.
const throttledShare = 0.9

// worthWriting reports whether a limit should change from cur to next (cores), given
// when it was last written. Every write of a CFS quota refills the group's runtime and
// unthrottles it (kernel: tg_set_cfs_bandwidth), so a limit rewritten every period on
// noise lets batch use up to twice its budget. Hence a deadband: changes smaller than
// writeDeadband are not written; a cut past it is written at once; a raise past it at
// most once per CFS period.
func (a *Agent) worthWriting(cur, next float64, last, now time.Time) bool {
	if math.IsNaN(cur) || cur < 0 {
		return true
	}
	if math.Abs(next-cur) < writeDeadband(cur) {
		return false
	}
	return next < cur || now.Sub(last) >= a.cfg.CFSPeriod.Duration
}

// writeDeadband is the smallest limit change worth a write: 5 % of the limit, at least
// 0.05 CPU.
func writeDeadband(cur float64) float64 { return math.Max(0.05, 0.05*cur) }

// setUpPod gives an in-place batch pod the tier's static settings: the minimum weight
// and SCHED_IDLE. These are pod-level cgroups, never kubelet's QoS-level ones.
func (a *Agent) setUpPod(st *podState) {
	if err := st.group.SetCPUShares(minShares); err != nil && !errors.Is(err, cgroups.ErrIdle) {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		st.lastErr = err
		return
	}
	if err := st.group.SetIdle(true); err != nil && !errors.Is(err, cgroups.ErrUnsupported) {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		st.lastErr = err
		return
	}
	st.setUp = true
	a.metrics.Actions.WithLabelValues(metrics.ActionPodSet).Inc()
}

// applyTier writes the tier quota when it changed.
func (a *Agent) applyTier(cores float64, now time.Time) error {
	if !a.worthWriting(a.tierQuota, cores, a.tierWritten, now) {
		return nil
	}
	if err := a.writeQuota(a.tier, cores); err != nil {
		if applied, ok := a.clamped(err, "batch tier"); ok {
			a.tierQuota, a.tierWritten = applied, now
			return nil
		}
		a.tierQuota = nan()
		return err
	}
	a.tierQuota, a.tierWritten = cores, now
	return nil
}

// clamped reports whether err is a cut the kernel accepted only down to a child
// group's own quota (cgroup v1 refuses a parent quota below a child's), and the cores
// then in force. The cut is counted and logged; it is retried every period, but at the
// same value the kernel writes nothing.
func (a *Agent) clamped(err error, what string) (float64, bool) {
	var ce *cgroups.ClampError
	if !errors.As(err, &ce) {
		return 0, false
	}
	a.metrics.Actions.WithLabelValues(metrics.ActionQuotaClamped).Inc()
	a.log.Debug("CPU cut clamped to a child cgroup's own quota", "of", what, "err", err)
	return ce.Applied.CPUs(), true
}

// writeQuota sets a CFS quota of the given cores over the configured CFS period.
func (a *Agent) writeQuota(g *cgroups.Group, cores float64) error {
	period := a.cfg.CFSPeriod.Duration
	// Round down to whole microseconds, the kernel's unit, so shares never add up to more
	// than the budget.
	quota := time.Duration(cores * float64(period)).Truncate(time.Microsecond)
	if quota < time.Millisecond {
		quota = time.Millisecond // the kernel's minimum quota
	}
	return g.SetCPULimit(quota, period)
}
