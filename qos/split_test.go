package qos_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/understory/understory/qos"
)

func TestSplitBudget(t *testing.T) {
	t.Parallel()
	nan, inf := math.NaN(), math.Inf(1)
	lim := func(u float64) qos.PodDemand { return qos.PodDemand{ID: "l", Usage: u} }
	thr := func(u float64) qos.PodDemand { return qos.PodDemand{ID: "t", Usage: u, Throttled: true} }
	fresh := qos.PodDemand{ID: "n", NoHistory: true}
	capped := func(d qos.PodDemand, limit float64) qos.PodDemand { d.Limit = limit; return d }
	tests := []struct {
		name   string
		budget float64
		min    float64
		pods   []qos.PodDemand
		want   []float64
	}{
		{name: "no pods", budget: 4, min: 0.1, pods: nil, want: []float64{}},
		{name: "two unlimited share equally", budget: 4, min: 0.1, pods: []qos.PodDemand{thr(1), fresh}, want: []float64{2, 2}},
		{name: "small demand met, rest to unlimited", budget: 4, min: 0.1,
			pods: []qos.PodDemand{lim(0.5), thr(0.3), fresh}, want: []float64{0.5, 1.75, 1.75}},
		{name: "all demands met: leftover spread evenly", budget: 4, min: 0,
			pods: []qos.PodDemand{lim(1), lim(0.5)}, want: []float64{2.25, 1.75}},
		{name: "budget below floors: even split", budget: 0.2, min: 0.1,
			pods: []qos.PodDemand{lim(1), thr(1), fresh, lim(0)}, want: []float64{0.05, 0.05, 0.05, 0.05}},
		{name: "budget exactly floors", budget: 0.4, min: 0.1,
			pods: []qos.PodDemand{lim(1), thr(1), fresh, lim(0)}, want: []float64{0.1, 0.1, 0.1, 0.1}},
		{name: "throttled low user is unlimited", budget: 3, min: 0,
			pods: []qos.PodDemand{thr(0.5), lim(2)}, want: []float64{1.5, 1.5}},
		{name: "no-history pod is unlimited", budget: 2, min: 0,
			pods: []qos.PodDemand{fresh, lim(0.2)}, want: []float64{1.8, 0.2}},
		{name: "NaN usage is no history", budget: 2, min: 0,
			pods: []qos.PodDemand{lim(nan), lim(0.2)}, want: []float64{1.8, 0.2}},
		{name: "negative usage is no history", budget: 2, min: 0,
			pods: []qos.PodDemand{lim(-1), lim(0.2)}, want: []float64{1.8, 0.2}},
		{name: "infinite usage is unlimited", budget: 2, min: 0,
			pods: []qos.PodDemand{lim(inf), lim(0.2)}, want: []float64{1.8, 0.2}},
		{name: "idle pod gets the floor", budget: 2, min: 0.5,
			pods: []qos.PodDemand{lim(0.01), thr(1)}, want: []float64{0.5, 1.5}},
		{name: "water level caps big limited demands", budget: 3, min: 0,
			pods: []qos.PodDemand{lim(5), lim(5), lim(0.2)}, want: []float64{1.4, 1.4, 0.2}},
		{name: "order follows input", budget: 3, min: 0,
			pods: []qos.PodDemand{lim(0.2), lim(5), lim(5)}, want: []float64{0.2, 1.4, 1.4}},
		{name: "NaN budget gives zeros", budget: nan, min: 0.1, pods: []qos.PodDemand{fresh, lim(1)}, want: []float64{0, 0}},
		{name: "negative budget gives zeros", budget: -1, min: 0.1, pods: []qos.PodDemand{fresh}, want: []float64{0}},
		{name: "infinite budget gives zeros", budget: inf, min: 0.1, pods: []qos.PodDemand{fresh}, want: []float64{0}},
		{name: "NaN min is 0", budget: 1, min: nan, pods: []qos.PodDemand{lim(0.25), fresh}, want: []float64{0.25, 0.75}},
		{name: "infinite min: even split", budget: 1, min: inf, pods: []qos.PodDemand{lim(0.25), fresh}, want: []float64{0.5, 0.5}},
		{name: "own limit caps an unlimited pod, rest to the other", budget: 4, min: 0.1,
			pods: []qos.PodDemand{capped(thr(1), 0.5), fresh}, want: []float64{0.5, 3.5}},
		{name: "headroom never passes a limit", budget: 4, min: 0,
			pods: []qos.PodDemand{capped(lim(0.2), 0.3), lim(0.5)}, want: []float64{0.3, 3.7}},
		{name: "every pod at its limit: budget left unused", budget: 4, min: 0.1,
			pods: []qos.PodDemand{capped(fresh, 1), capped(thr(1), 0.5)}, want: []float64{1, 0.5}},
		{name: "limit below the floor wins", budget: 2, min: 0.5,
			pods: []qos.PodDemand{capped(lim(0), 0.2), lim(0)}, want: []float64{0.2, 1.8}},
		{name: "limit caps the even split below floors", budget: 0.2, min: 0.1,
			pods: []qos.PodDemand{capped(fresh, 0.01), fresh, fresh, fresh}, want: []float64{0.01, 0.19 / 3, 0.19 / 3, 0.19 / 3}},
		{name: "NaN, infinite or negative limit is none", budget: 3, min: 0,
			pods: []qos.PodDemand{capped(fresh, nan), capped(fresh, inf), capped(fresh, -1)}, want: []float64{1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := qos.SplitBudget(tt.budget, tt.pods, tt.min)
			if got == nil || len(got) != len(tt.want) {
				t.Fatalf("SplitBudget = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !near(got[i], tt.want[i]) {
					t.Fatalf("SplitBudget = %v, want %v", got, tt.want)
				}
			}
			checkSplit(t, tt.budget, tt.pods, tt.min, got)
		})
	}
}

// checkSplit asserts the guarantees and the max-min fairness of a result.
func checkSplit(t *testing.T, budget float64, pods []qos.PodDemand, minPerPod float64, got []float64) {
	t.Helper()
	if len(got) != len(pods) {
		t.Fatalf("len %d, want %d", len(got), len(pods))
	}
	var sum float64
	for i, s := range got {
		if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
			t.Fatalf("share %d = %v", i, s)
		}
		sum += s
	}
	usable := !math.IsNaN(budget) && !math.IsInf(budget, 0) && budget > 0
	if !usable {
		if sum != 0 {
			t.Fatalf("unusable budget %v but shares %v", budget, got)
		}
		return
	}
	if sum > budget {
		t.Fatalf("sum %v > budget %v (shares %v)", sum, budget, got)
	}
	if len(pods) == 0 {
		return
	}
	tol := 1e-9 * math.Max(budget, 1)
	limit := func(d qos.PodDemand) float64 {
		if d.Limit > 0 && !math.IsInf(d.Limit, 0) {
			return d.Limit
		}
		return math.Inf(1)
	}
	capTotal := 0.0
	for i, d := range pods {
		if got[i] > limit(d)+tol {
			t.Fatalf("share %d = %v above the pod's limit %v", i, got[i], d.Limit)
		}
		capTotal += limit(d)
	}
	// Work-conserving: the whole budget is handed out, unless every pod is at its limit.
	if sum < math.Min(budget, capTotal)-tol*float64(len(pods)) {
		t.Fatalf("sum %v well below budget %v (shares %v)", sum, budget, got)
	}
	if !(minPerPod > 0) {
		minPerPod = 0
	}
	if budget < minPerPod*float64(len(pods)) {
		// Even split, except that a pod never passes its limit.
		top := 0.0
		for _, s := range got {
			top = math.Max(top, s)
		}
		for i, s := range got {
			if math.Abs(s-top) > tol && math.Abs(s-limit(pods[i])) > tol {
				t.Fatalf("budget below floors: share %d = %v, neither the even share %v nor its limit (shares %v)", i, s, top, got)
			}
		}
		return
	}
	for i, s := range got {
		if floor := math.Min(minPerPod, limit(pods[i])); s < floor-tol {
			t.Fatalf("share %d = %v below floor %v", i, s, floor)
		}
	}
	// Max-min fairness: a pod that got less than it wants (and less than its
	// limit) got at least as much as anybody else.
	for i, s := range got {
		d := pods[i]
		unlimited := d.Throttled || d.NoHistory || math.IsNaN(d.Usage) || math.IsInf(d.Usage, 0) || d.Usage < 0
		want := math.Max(d.Usage, minPerPod)
		if (!unlimited && s >= want-tol) || s >= limit(d)-tol {
			continue
		}
		for j, o := range got {
			if o > s+tol {
				t.Fatalf("pod %d (%+v) got %v < demand but pod %d got %v (shares %v)", i, d, s, j, o, got)
			}
		}
	}
}

func randomDemands(r *rand.Rand, n int) []qos.PodDemand {
	pods := make([]qos.PodDemand, n)
	for i := range pods {
		pods[i] = qos.PodDemand{ID: "p", Usage: r.Float64() * 4, Throttled: r.IntN(4) == 0, NoHistory: r.IntN(8) == 0}
		if r.IntN(3) == 0 {
			pods[i].Limit = r.Float64() * 2
		}
		switch r.IntN(20) {
		case 0:
			pods[i].Usage = math.NaN()
		case 1:
			pods[i].Usage = -r.Float64()
		case 2:
			pods[i].Usage = 0
		}
	}
	return pods
}

func TestSplitBudgetProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		n := r.IntN(12)
		pods := randomDemands(r, n)
		budget := r.Float64() * 16
		if r.IntN(10) == 0 {
			budget = r.Float64() * 1e-3
		}
		minPerPod := []float64{0, 0.01, 0.1, r.Float64()}[r.IntN(4)]
		got := qos.SplitBudget(budget, pods, minPerPod)
		checkSplit(t, budget, pods, minPerPod, got)

		// Permuting the input permutes the output.
		perm := r.Perm(n)
		shuffled := make([]qos.PodDemand, n)
		for i, j := range perm {
			shuffled[i] = pods[j]
		}
		got2 := qos.SplitBudget(budget, shuffled, minPerPod)
		for i, j := range perm {
			if math.Abs(got2[i]-got[j]) > 1e-9*math.Max(1, budget) {
				t.Fatalf("permutation changed shares: %v vs %v (perm %v)", got, got2, perm)
			}
		}
		// Deterministic.
		again := qos.SplitBudget(budget, pods, minPerPod)
		for i := range got {
			if again[i] != got[i] {
				t.Fatalf("not deterministic: %v vs %v", got, again)
			}
		}
	}
}

// TestSplitBudgetRoundingNeverExceeds uses values whose float sums round up.
func TestSplitBudgetRoundingNeverExceeds(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		n := 1 + r.IntN(40)
		budget := r.Float64() * math.Pow(10, float64(r.IntN(12)-4))
		pods := make([]qos.PodDemand, n)
		for i := range pods {
			pods[i] = qos.PodDemand{Throttled: true}
		}
		got := qos.SplitBudget(budget, pods, 0)
		var sum float64
		for _, s := range got {
			sum += s
		}
		if sum > budget {
			t.Fatalf("n=%d budget=%v: sum %v exceeds", n, budget, sum)
		}
	}
}

// FuzzSplitBudget: every 9 bytes of data are one pod (8 bytes of usage as raw
// float64 bits, so NaN/Inf/negatives occur, and a flags byte).
func FuzzSplitBudget(f *testing.F) {
	enc := func(pods ...qos.PodDemand) []byte {
		var out []byte
		for _, p := range pods {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(p.Usage))
			var fl byte
			if p.Throttled {
				fl |= 1
			}
			if p.NoHistory {
				fl |= 2
			}
			out = append(out, fl)
		}
		return out
	}
	f.Add(4.0, 0.1, enc(qos.PodDemand{Usage: 0.5}, qos.PodDemand{Usage: 1, Throttled: true}))
	f.Add(0.3, 0.1, enc(qos.PodDemand{Usage: 2}, qos.PodDemand{NoHistory: true}, qos.PodDemand{Usage: 0}, qos.PodDemand{Usage: 7}))
	f.Add(math.NaN(), -1.0, enc(qos.PodDemand{Usage: math.Inf(1)}))
	f.Add(1e308, 1e300, enc(qos.PodDemand{Usage: 1e308}, qos.PodDemand{Usage: 1e308}))
	f.Add(1.0/3, 0.0, enc(qos.PodDemand{Throttled: true}, qos.PodDemand{Throttled: true}, qos.PodDemand{Throttled: true}))
	f.Fuzz(func(t *testing.T, budget, minPerPod float64, data []byte) {
		var pods []qos.PodDemand
		for len(data) >= 9 && len(pods) < 256 {
			pods = append(pods, qos.PodDemand{
				Usage:     math.Float64frombits(binary.LittleEndian.Uint64(data)),
				Throttled: data[8]&1 != 0,
				NoHistory: data[8]&2 != 0,
			})
			if data[8]&4 != 0 { // a limit of half the usage's magnitude (NaN/Inf stay "none")
				pods[len(pods)-1].Limit = math.Abs(pods[len(pods)-1].Usage) / 2
			}
			data = data[9:]
		}
		got := qos.SplitBudget(budget, pods, minPerPod)
		if len(got) != len(pods) {
			t.Fatalf("len %d, want %d", len(got), len(pods))
		}
		var sum float64
		for i, s := range got {
			if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
				t.Fatalf("share %d = %v", i, s)
			}
			if l := pods[i].Limit; l > 0 && !math.IsInf(l, 0) && s > l {
				t.Fatalf("share %d = %v above its limit %v", i, s, l)
			}
			sum += s
		}
		if math.IsNaN(budget) || math.IsInf(budget, 0) || budget <= 0 {
			if sum != 0 {
				t.Fatalf("budget %v but sum %v", budget, sum)
			}
			return
		}
		if sum > budget {
			t.Fatalf("sum %v > budget %v (shares %v)", sum, budget, got)
		}
	})
}
