package qos

import (
	"math"
	"slices"
)

// PodDemand is what one batch pod did last period.
type PodDemand struct {
	// ID identifies the pod for the caller; SplitBudget does not read it.
	ID string
	// Usage is the CPU the pod used last period, in cores.
	Usage float64
	// Throttled reports that the pod hit its CFS quota last period, so its
	// usage understates what it wants.
	Throttled bool
	// NoHistory marks a pod without a usage sample yet (new, or just
	// restarted). A NaN, infinite or negative Usage means the same.
	NoHistory bool
	// Limit is the most the pod may get, in cores: its own understory.io/batch-cpu
	// limit. 0, NaN, infinite or negative means none.
	Limit float64
}

// unlimited reports whether the pod's demand is unknown and so unbounded.
func (d PodDemand) unlimited() bool {
	return d.Throttled || d.NoHistory || !isFinite(d.Usage) || d.Usage < 0
}

// limit is the pod's cap in cores, +Inf when it has none.
func (d PodDemand) limit() float64 {
	if isFinite(d.Limit) && d.Limit > 0 {
		return d.Limit
	}
	return math.Inf(1)
}

// SplitBudget divides budget (cores) into one CPU share per pod, result[i]
// for pods[i], by max-min fair water-filling on demand:
//
//   - a pod's demand is its Usage, but a Throttled pod, a pod with NoHistory
//     and a pod whose Usage is NaN, infinite or negative want "unlimited";
//     either way a pod never wants more than its Limit;
//   - if budget < len(pods)*minPerPod, every pod gets budget/len(pods), or its
//     Limit when that is smaller, the rest going evenly to the others;
//   - otherwise every pod first gets minPerPod (at most its Limit), then the
//     rest is filled level by level: pods whose demand is below the water
//     level get their demand, the others (all unlimited-demand pods among
//     them) share what is left equally;
//   - if every demand is met and budget is left over, it is spread as
//     headroom, water-filled up to each pod's Limit, so a growing pod is not
//     pinned at exactly its last usage. What no pod may take stays unused.
//
// Guarantees: len(result) == len(pods); every share is finite and >= 0 and
// at most the pod's Limit; the sum of the shares, added in index order, never
// exceeds budget. A NaN, infinite or negative budget counts as 0; a NaN or
// negative minPerPod as 0. Shares meeting the floor or a demand may be 1 ulp
// short of it, because the sum constraint wins over every other rule.
func SplitBudget(budget float64, pods []PodDemand, minPerPod float64) []float64 {
	n := len(pods)
	shares := make([]float64, n)
	if n == 0 {
		return shares
	}
	if !isFinite(budget) || budget <= 0 {
		return shares
	}
	if !(minPerPod > 0) { // NaN too
		minPerPod = 0
	}

	floorTotal := minPerPod * float64(n)
	if budget < floorTotal { // +Inf floor lands here too
		want := make([]float64, n)
		for i, d := range pods {
			want[i] = d.limit()
		}
		waterFill(shares, want, budget)
		return fitSum(shares, budget)
	}

	// extra[i] is what pod i wants above the floor; +Inf = unlimited.
	extra := make([]float64, n)
	left := budget
	for i, d := range pods {
		shares[i] = math.Min(minPerPod, d.limit())
		left -= shares[i]
		room := d.limit() - shares[i]
		if d.unlimited() {
			extra[i] = room
		} else {
			extra[i] = math.Min(room, math.Max(0, d.Usage-shares[i]))
		}
	}
	left = waterFill(shares, extra, left)
	if left > 0 { // every demand met: spread the rest as headroom, up to each limit
		for i, d := range pods {
			extra[i] = d.limit() - shares[i]
		}
		waterFill(shares, extra, left)
	}
	return fitSum(shares, budget)
}

// waterFill adds up to left to shares, max-min fair on want (+Inf = as much as
// there is), and returns what is left over. Fill goes from the smallest want up;
// ties keep input order, so the result depends only on the input.
func waterFill(shares, want []float64, left float64) float64 {
	n := len(shares)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case want[a] < want[b]:
			return -1
		case want[a] > want[b]:
			return 1
		}
		return 0
	})
	for k, i := range order {
		level := left / float64(n-k)
		if want[i] <= level {
			shares[i] += want[i]
			left -= want[i]
			continue
		}
		// Every remaining pod wants at least the level: all get it.
		for _, j := range order[k:] {
			shares[j] += level
		}
		return 0
	}
	return left
}

// fitSum trims rounding excess so that the shares, summed in index order,
// do not exceed budget (budget finite and > 0, shares >= 0). Each round
// takes the excess (at least one ulp) off the largest share, so the loop
// ends; the last resort zeroes shares from the largest down, which always
// ends with a sum <= budget.
func fitSum(shares []float64, budget float64) []float64 {
	for range 64 {
		excess := sumInOrder(shares) - budget
		if excess <= 0 {
			return shares
		}
		i := argMax(shares)
		cut := math.Max(excess, shares[i]-math.Nextafter(shares[i], 0))
		shares[i] = math.Max(0, shares[i]-cut)
	}
	for sumInOrder(shares) > budget {
		shares[argMax(shares)] = 0
	}
	return shares
}

func sumInOrder(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func argMax(xs []float64) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}
