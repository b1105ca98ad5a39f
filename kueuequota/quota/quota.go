package quota

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Queue quotas: the decision of the Kueue quota follower (package kueuequota). The
// agents publish reclaimable batch capacity on their Nodes (understory.io/batch-cpu,
// ...), which changes by the minute; Kueue admits work against each ClusterQueue's
// nominalQuota. Decide keeps those quotas following the published total:
// split between tenants by weight, never above what is published, falling at once and
// rising slowly, and not written for small changes.

// Params is the damping of Decide.
type Params struct {
	// RiseFraction is the part of the gap between a quota and its target that one
	// decision closes when the target is above the quota (0 < RiseFraction <= 1; 1 =
	// at once). Falls are always at once: a quota above what is published would let
	// Kueue admit work the nodes cannot hold.
	RiseFraction float64
	// Deadband is the relative gap (of the target) below which a rise is not made
	// (0 <= Deadband < 1): capacity that jitters upwards does not cause a write every
	// minute. A rise that would leave a gap inside the deadband goes to the target.
	Deadband float64
	// EvictTolerance is the part of the quotas' sum (per resource) by which the
	// cohort's reservations may exceed it before SelectEvictions evicts
	// anything, and what is left over after it has (0 <= EvictTolerance < 1). The
	// quotas fall at once, so Kueue admits nothing new while the cohort is over;
	// admitted work drains as it finishes, and each node's agent keeps its own LS
	// safe meanwhile. Without a tolerance every small dip of the published total
	// evicted admitted work a full cohort had just been given (measured: 762
	// evictions for 1 264 admissions in a 300-node cluster benchmark).
	EvictTolerance float64
}

// DefaultParams: half of the gap per decision, a 5 % deadband, evictions
// only beyond 5 % over. At one decision a minute a quota reaches 95 % of a risen
// target in about 4 minutes.
func DefaultParams() Params {
	return Params{RiseFraction: 0.5, Deadband: 0.05, EvictTolerance: 0.05}
}

// ErrQueueQuotaInput is returned for input Decide refuses: bad
// parameters, weights, names or amounts.
var ErrQueueQuotaInput = errors.New("invalid queue quota input")

// Validate returns an error wrapping ErrQueueQuotaInput when p is out of range.
func (p Params) Validate() error {
	if !(p.RiseFraction > 0 && p.RiseFraction <= 1) {
		return fmt.Errorf("%w: riseFraction %v must be in (0, 1]", ErrQueueQuotaInput, p.RiseFraction)
	}
	if !(p.Deadband >= 0 && p.Deadband < 1) {
		return fmt.Errorf("%w: deadband %v must be in [0, 1)", ErrQueueQuotaInput, p.Deadband)
	}
	if !(p.EvictTolerance >= 0 && p.EvictTolerance < 1) {
		return fmt.Errorf("%w: evictTolerance %v must be in [0, 1)", ErrQueueQuotaInput, p.EvictTolerance)
	}
	return nil
}

// Tenant is one ClusterQueue as the follower sees it.
type Tenant struct {
	// Name identifies the tenant (the ClusterQueue's name); unique.
	Name string
	// Weight is the tenant's part of the published capacity (>= 0, finite); the
	// weights need not sum to 1. A weight of 0 gets a quota of 0.
	Weight float64
	// Current is the tenant's nominalQuota now, per resource (a resource missing
	// counts as 0).
	Current map[string]int64
}

// Decision is the decision for one tenant.
type Decision struct {
	Name string
	// Quota is the nominalQuota to have, for every published resource.
	Quota map[string]int64
	// Target is the tenant's weighted part of the published amount, per resource:
	// what Quota follows.
	Target map[string]int64
	// Fell and Rose name the resources whose quota this decision lowers and raises
	// (sorted); Changed is whether there is any.
	Fell, Rose []string
	Changed    bool
}

// Decide returns every tenant's quota, in the order given. published is
// the amount of each resource the agents publish in all (the sum of the Nodes'
// allocatable), in the resource's units (>= 0). For each resource:
//
//   - the targets split published by weight, with the units left by rounding down
//     given to the largest remainders (ties: the earlier tenant), so that they sum to
//     exactly published when any weight is positive;
//   - a quota above its target falls to it at once;
//   - a quota below its target rises by RiseFraction of the gap (rounded up, at least
//     1), straight to the target when what would be left is within the deadband, and
//     not at all when the gap itself is within the deadband (gap < Deadband*target);
//
// so no quota is ever above its target and the quotas never sum above published.
// Resources a tenant has in Current but that are not published are left out of the
// decision (the caller keeps them as they are).
func Decide(published map[string]int64, tenants []Tenant, p Params) ([]Decision, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(tenants))
	var sumW float64
	for _, t := range tenants {
		if strings.TrimSpace(t.Name) == "" {
			return nil, fmt.Errorf("%w: a tenant without a name", ErrQueueQuotaInput)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: tenant %q given twice", ErrQueueQuotaInput, t.Name)
		}
		seen[t.Name] = true
		if math.IsNaN(t.Weight) || math.IsInf(t.Weight, 0) || t.Weight < 0 {
			return nil, fmt.Errorf("%w: tenant %q: weight %v must be finite and >= 0", ErrQueueQuotaInput, t.Name, t.Weight)
		}
		for r, q := range t.Current {
			if q < 0 {
				return nil, fmt.Errorf("%w: tenant %q: current %s %d is negative", ErrQueueQuotaInput, t.Name, r, q)
			}
		}
		sumW += t.Weight
	}
	resources := make([]string, 0, len(published))
	for r, q := range published {
		if q < 0 {
			return nil, fmt.Errorf("%w: published %s %d is negative", ErrQueueQuotaInput, r, q)
		}
		resources = append(resources, r)
	}
	slices.Sort(resources)

	out := make([]Decision, len(tenants))
	for i, t := range tenants {
		out[i] = Decision{Name: t.Name, Quota: make(map[string]int64, len(resources)), Target: make(map[string]int64, len(resources))}
	}
	for _, r := range resources {
		targets := splitByWeight(published[r], tenants, sumW)
		for i, t := range tenants {
			cur, target := t.Current[r], targets[i]
			next := followQuota(cur, target, p)
			out[i].Target[r] = target
			out[i].Quota[r] = next
			switch {
			case next < cur:
				out[i].Fell = append(out[i].Fell, r)
			case next > cur:
				out[i].Rose = append(out[i].Rose, r)
			}
		}
	}
	for i := range out {
		out[i].Changed = len(out[i].Fell) > 0 || len(out[i].Rose) > 0
	}
	return out, nil
}

// followQuota is one step of a quota towards its target (see Decide).
func followQuota(cur, target int64, p Params) int64 {
	if cur >= target {
		return target
	}
	gap := target - cur
	band := p.Deadband * float64(target)
	if float64(gap) < band {
		return cur
	}
	step := gap
	if sf := math.Ceil(float64(gap) * p.RiseFraction); sf < float64(gap) {
		step = max(int64(sf), 1) // in range: below float64(gap)
	}
	if float64(gap-step) < band {
		return target
	}
	return min(cur+step, target)
}

// splitByWeight splits total between the tenants by weight (largest remainders; sum
// exactly total when sumW > 0, else all 0).
func splitByWeight(total int64, tenants []Tenant, sumW float64) []int64 {
	out := make([]int64, len(tenants))
	if sumW <= 0 || total == 0 {
		return out
	}
	type rem struct {
		i    int
		frac float64
	}
	rems := make([]rem, 0, len(tenants))
	var given int64
	for i, t := range tenants {
		exact := float64(total) * (t.Weight / sumW)
		// Clamp in floats before converting (an out-of-range conversion is
		// undefined); float rounding must never hand out more than total.
		f := math.Min(math.Max(math.Floor(exact), 0), float64(total-given))
		floor := min(int64(f), total-given)
		out[i] = floor
		given += floor
		if t.Weight > 0 {
			rems = append(rems, rem{i, exact - f})
		}
	}
	slices.SortStableFunc(rems, func(a, b rem) int {
		switch {
		case a.frac > b.frac:
			return -1
		case a.frac < b.frac:
			return 1
		}
		return 0
	})
	// One unit per tenant, largest remainder first; what float rounding left beyond
	// that (only for amounts near 2^53 and up) goes to the first.
	for k := 0; given < total && k < len(rems); k++ {
		out[rems[k].i]++
		given++
	}
	if given < total && len(rems) > 0 {
		out[rems[0].i] += total - given
	}
	return out
}

// Usage is one ClusterQueue's nominal quota and what its admitted Workloads
// reserve, per resource (the follower reads them from the ClusterQueue).
type Usage struct {
	Name          string
	Nominal, Used map[string]int64
}

// Workload is one admitted Workload, as SelectEvictions ranks it.
type Workload struct {
	// Name identifies the Workload (namespace/name); Queue is its ClusterQueue.
	Name, Queue string
	// Priority is the Workload's priority; lower is evicted first.
	Priority int32
	// Admitted orders Workloads of equal priority: the larger (the later admitted)
	// is evicted first. Any monotonic number (Unix nanoseconds).
	Admitted int64
	// Usage is what it reserves, per resource.
	Usage map[string]int64
}

// SelectEvictions returns the Workloads to evict (by name, in order) so that
// the cohort's reservations fit its quotas again after they fell: for every resource,
// the Workloads' usage summed over the queues must not exceed the nominal quotas
// summed over them by more than tolerance of that sum (Params.
// EvictTolerance; outside [0, 1) counts as 0). Kueue itself does not evict admitted
// work when a nominalQuota falls (it preempts only to admit pending work), so
// without this the cohort keeps running more than the agents publish. While a
// resource is over: among the queues using more of an over resource than their own
// nominal quota, the one furthest over (in units of that resource, the resources
// taken in sorted order) gives up its lowest-priority, latest-admitted Workload
// using that resource; ties by name. Stops when nothing is over or no Workload can
// help. Pure: it only ranks.
func SelectEvictions(queues []Usage, workloads []Workload, tolerance float64) []string {
	used := map[string]map[string]int64{}
	excess := quotaExcess(queues, tolerance)
	for _, q := range queues {
		u := make(map[string]int64, len(q.Used))
		for r, v := range q.Used {
			u[r] = v
		}
		used[q.Name] = u
	}
	nominal := map[string]map[string]int64{}
	for _, q := range queues {
		nominal[q.Name] = q.Nominal
	}
	left := slices.Clone(workloads)
	slices.SortStableFunc(left, func(a, b Workload) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		if a.Admitted != b.Admitted {
			if a.Admitted > b.Admitted {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	var out []string
	for {
		r := overResource(excess)
		if r == "" {
			return out
		}
		// The queue furthest over its own nominal in r.
		var queue string
		var worst int64
		for _, q := range queues {
			if over := used[q.Name][r] - nominal[q.Name][r]; over > worst || (over == worst && over > 0 && q.Name < queue) {
				queue, worst = q.Name, over
			}
		}
		i := -1
		if queue != "" {
			i = slices.IndexFunc(left, func(w Workload) bool { return w.Queue == queue && w.Usage[r] > 0 })
		}
		if i < 0 {
			// No queue over its own nominal holds r (or none of its Workloads uses
			// it): take from any queue using r.
			i = slices.IndexFunc(left, func(w Workload) bool { return w.Usage[r] > 0 })
		}
		if i < 0 {
			return out
		}
		w := left[i]
		left = slices.Delete(left, i, i+1)
		out = append(out, w.Name)
		for res, v := range w.Usage {
			excess[res] -= v
			if u := used[w.Queue]; u != nil {
				u[res] -= v
			}
		}
	}
}

// Over reports whether the queues' reservations exceed their nominal quotas,
// summed over the queues, by more than tolerance of that sum for some resource:
// whether SelectEvictions would look for evictions.
func Over(queues []Usage, tolerance float64) bool {
	return overResource(quotaExcess(queues, tolerance)) != ""
}

// quotaExcess is, per resource, what the queues reserve beyond their nominal
// quotas' sum and the tolerance of it (positive: over).
func quotaExcess(queues []Usage, tolerance float64) map[string]int64 {
	if !(tolerance >= 0 && tolerance < 1) {
		tolerance = 0
	}
	excess := map[string]int64{}
	nominal := map[string]int64{}
	for _, q := range queues {
		for r, v := range q.Used {
			excess[r] += v
		}
		for r, v := range q.Nominal {
			nominal[r] += v
		}
	}
	for r, v := range nominal {
		excess[r] -= v + int64(math.Floor(tolerance*float64(v)))
	}
	return excess
}

// overResource is the first resource (sorted) whose excess is positive, or "".
func overResource(excess map[string]int64) string {
	var over []string
	for r, v := range excess {
		if v > 0 {
			over = append(over, r)
		}
	}
	if len(over) == 0 {
		return ""
	}
	slices.Sort(over)
	return over[0]
}
