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
	inPlace := a.inPlaceBuf[:0]
	for _, st := range a.sorted {
		if st.class != qos.ClassBatch || st.group == nil || st.inTier {
			continue
		}
		if st.terminating {
			a.liftQuota(st)
			continue
		}
		if !st.setUp {
			a.setUpPod(st)
		}
		demands = append(demands, qos.PodDemand{ID: string(st.uid), Usage: st.demand.v, NoHistory: !st.demand.ok,
			Throttled: wantsMore(st.demand.v, st.quota)})
		inPlace = append(inPlace, st)
	}
	a.splitBuf, a.inPlaceBuf = demands, inPlace
	shares := []float64{b.Applied}
	if len(inPlace) > 0 {
		shares = qos.SplitBudget(b.Applied, demands, a.cfg.MinPodCPU)
	}
	// Cuts first, so that the sum of the quotas in force never exceeds the budget, even
	// between two writes.
	for _, cuts := range []bool{true, false} {
		if isCut(a.tierQuota, shares[0]) == cuts {
			if err := a.applyTier(shares[0], now); err != nil {
				a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
				a.log.Error("writing tier quota; retrying next period", "cgroup", a.layout.tier, "err", err)
			}
		}
		for i, st := range inPlace {
			q := shares[i+1]
			if isCut(st.quota, q) != cuts || !a.worthWriting(st.quota, q, st.lastWrite, now) {
				continue
			}
			if err := a.writeQuota(st.group, q); err != nil {
				st.quota = nan()
				st.lastErr = err
				if errors.Is(err, cgroups.ErrNotExist) {
					st.close()
					st.nextOpen = now.Add(reopenBackoff)
					continue
				}
				a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
				a.log.Error("writing pod quota; retrying next period", logAttrsPod(st), "err", err)
				continue
			}
			st.quota, st.lastWrite = q, now
		}
	}
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

// liftQuota removes an in-place pod's quota once (the pod is being deleted).
func (a *Agent) liftQuota(st *podState) {
	if st.quota < 0 {
		return
	}
	if err := st.group.SetCPULimit(-1, a.cfg.CFSPeriod.Duration); err != nil {
		st.lastErr = err
		if !errors.Is(err, cgroups.ErrNotExist) {
			a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		}
		return
	}
	st.quota = -1
}

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
		a.tierQuota = nan()
		return err
	}
	a.tierQuota, a.tierWritten = cores, now
	return nil
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
