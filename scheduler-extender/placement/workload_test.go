package placement

import (
	"math"
	"math/rand"
	"testing"
)

func reqs(n int, r Request) []Request {
	out := make([]Request, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func TestNewWorkloadGrouping(t *testing.T) {
	t.Parallel()
	var in []Request
	in = append(in, reqs(50, Request{CPUMilli: 4000, MemoryMiB: 1, NumGPU: 1, GPUMilli: 1000})...)
	in = append(in, reqs(10, Request{CPUMilli: 4000, MemoryMiB: 999, NumGPU: 1, GPUMilli: 1000})...) // memory ignored
	in = append(in, reqs(20, Request{CPUMilli: 0, NumGPU: 1, GPUMilli: 500})...)                     // cpu 0 → 100
	in = append(in, reqs(10, Request{CPUMilli: 100, NumGPU: 1, GPUMilli: 500})...)                   // same class
	in = append(in, reqs(6, Request{CPUMilli: 2000})...)
	in = append(in, reqs(3, Request{CPUMilli: 2000, NumGPU: 1, GPUMilli: 1000, Models: []string{"T4"}})...)
	in = append(in, reqs(1, Request{CPUMilli: 1000, NumGPU: 8, GPUMilli: 1000})...)
	in = append(in, Request{CPUMilli: -1}) // invalid: skipped

	tests := []struct {
		name     string
		coverage float64
		want     []Class
	}{
		{"all", 1, []Class{
			{CPUMilli: 4000, GPUMilli: 1000, NumGPU: 1, Count: 60},
			{CPUMilli: 100, GPUMilli: 500, NumGPU: 1, Count: 30},
			{CPUMilli: 2000, Count: 6},
			{CPUMilli: 2000, GPUMilli: 1000, NumGPU: 1, Models: []string{"T4"}, Count: 3},
			{CPUMilli: 1000, GPUMilli: 1000, NumGPU: 8, Count: 1},
		}},
		{"90 percent", 0.9, []Class{
			{CPUMilli: 4000, GPUMilli: 1000, NumGPU: 1, Count: 60},
			{CPUMilli: 100, GPUMilli: 500, NumGPU: 1, Count: 30},
		}},
		{"95 percent", 0.95, []Class{
			{CPUMilli: 4000, GPUMilli: 1000, NumGPU: 1, Count: 60},
			{CPUMilli: 100, GPUMilli: 500, NumGPU: 1, Count: 30},
			{CPUMilli: 2000, Count: 6},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, w := range []*Workload{NewWorkload(in, tc.coverage)} {
				got := w.classes
				if w.Pods() != 100 || len(got) != len(tc.want) || w.Len() != len(tc.want) {
					t.Fatalf("pods %d, classes %+v", w.Pods(), got)
				}
				covered, sum := 0, 0.0
				for _, c := range tc.want {
					covered += c.Count
				}
				for i, c := range got {
					wc := tc.want[i]
					if c.CPUMilli != wc.CPUMilli || c.GPUMilli != wc.GPUMilli || c.NumGPU != wc.NumGPU || c.Count != wc.Count || len(c.Models) != len(wc.Models) {
						t.Fatalf("class %d = %+v, want %+v", i, c, wc)
					}
					if want := float64(c.Count) / float64(covered); math.Abs(c.Share-want) > 1e-12 {
						t.Fatalf("class %d share %v, want %v", i, c.Share, want)
					}
					sum += c.Share
				}
				if math.Abs(sum-1) > 1e-9 {
					t.Fatalf("shares sum to %v", sum)
				}
			}
		})
	}
}

func TestNewWorkloadTieOrder(t *testing.T) {
	t.Parallel()
	// Equal counts: the larger request comes first, whatever the input order.
	in := append(reqs(5, Request{CPUMilli: 1000}), reqs(5, Request{CPUMilli: 3000})...)
	in = append(in, reqs(5, Request{CPUMilli: 2000})...)
	got := NewWorkload(in, 0.5).classes
	if len(got) != 2 || got[0].CPUMilli != 3000 || got[1].CPUMilli != 2000 {
		t.Fatalf("classes %+v", got)
	}
}

func TestFrag(t *testing.T) {
	t.Parallel()
	// Classes: half whole-GPU (4 cpu), a quarter 0.5-GPU shares (1 cpu), a quarter CPU-only.
	var in []Request
	in = append(in, reqs(2, Request{CPUMilli: 4000, NumGPU: 1, GPUMilli: 1000})...)
	in = append(in, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}, Request{CPUMilli: 1000})
	w := NewWorkload(in, 1)
	tests := []struct {
		name string
		cpu  int64
		free []int
		want float64
	}{
		{"empty node", 8000, []int{1000, 1000}, 0.25 * 2000},
		{"no gpu left", 8000, []int{0, 0}, 0},
		{"a 300 sliver", 8000, []int{300, 1000}, 0.25*1300 + 0.5*300 + 0.25*300},
		{"a half device", 8000, []int{500, 1000}, 0.25*1500 + 0.5*500},
		{"cpu for shares only", 2000, []int{500, 1000}, 0.25*1500 + 0.5*1500},
		{"no cpu", 0, []int{1000, 1000}, 2000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := placeNode("n", "T4", 8000, len(tc.free))
			n.UsedCPUMilli = 8000 - tc.cpu
			copy(n.GPUFree, tc.free)
			if got := w.Frag(n); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("Frag = %v, want %v", got, tc.want)
			}
		})
	}
	var nilW *Workload
	if nilW.Frag(placeNode("n", "T4", 1, 1)) != 0 {
		t.Fatal("nil workload frag != 0")
	}
}

func TestFragModels(t *testing.T) {
	t.Parallel()
	// One class only runs on V100: on a T4 node every free milli is a fragment for it.
	w := NewWorkload(append(reqs(1, Request{CPUMilli: 1, NumGPU: 1, GPUMilli: 1000, Models: []string{"V100"}}),
		Request{CPUMilli: 1, NumGPU: 1, GPUMilli: 1000}), 1)
	t4, v100 := placeNode("a", "T4", 8000, 1), placeNode("b", "V100", 8000, 1)
	if got := w.Frag(t4); got != 500 {
		t.Fatalf("T4 frag %v, want 500", got)
	}
	if got := w.Frag(v100); got != 0 {
		t.Fatalf("V100 frag %v, want 0", got)
	}
}

func TestFillFrag(t *testing.T) {
	t.Parallel()
	// Classes: 0.4-GPU shares with 2 CPU (p=0.5), whole 2-GPU pods with 1 CPU (p=0.5).
	w := NewWorkload(append(reqs(1, Request{CPUMilli: 2000, NumGPU: 1, GPUMilli: 400}),
		Request{CPUMilli: 1000, NumGPU: 2, GPUMilli: 1000}), 1)
	tests := []struct {
		name string
		cpu  int64
		free []int
		want float64
	}{
		// Shares: 2+2+2 fit → 2400 of 3000 usable; pairs: one pair of full devices → 2000.
		{"cpu plenty", 100000, []int{1000, 1000, 1000}, 0.5*600 + 0.5*1000},
		// CPU for one share only: 400 usable.
		{"cpu strands gpu", 2000, []int{1000, 1000, 1000}, 0.5*2600 + 0.5*1000},
		{"no cpu", 0, []int{1000, 1000}, 2000},
		{"residues", 100000, []int{700, 300}, 0.5*600 + 0.5*1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := w.table("T4").fillFrag(tc.cpu, tc.free); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("fillFrag = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestEvalMatchesReference: the incremental evaluation equals frag and fillFrag.
func TestEvalMatchesReference(t *testing.T) {
	t.Parallel()
	_, w := benchCluster()
	rng := rand.New(rand.NewSource(3))
	for _, model := range []string{"T4", "G2", "other"} {
		tab := w.table(model)
		for range 2000 {
			free := make([]int, 1+rng.Intn(8))
			for i := range free {
				free[i] = []int{0, 1000, rng.Intn(1001)}[rng.Intn(3)]
			}
			cpu := rng.Int63n(70000) - 1000
			var st fragStats
			if !tab.stats(free, &st) {
				t.Fatal("stats refused a small node")
			}
			for _, b := range []float64{0, 0.3, 1} {
				want := (1-b)*tab.frag(cpu, free) + b*tab.fillFrag(cpu, free)
				if got := tab.eval(&st, cpu, b); math.Abs(got-want) > 1e-6 {
					t.Fatalf("%s free %v cpu %d blend %v: eval %v, reference %v", model, free, cpu, b, got, want)
				}
			}
			// Moving a device is the same as recounting.
			i, to := rng.Intn(len(free)), rng.Intn(1001)
			s2 := st
			tab.add(&s2, free[i], -1)
			tab.add(&s2, to, 1)
			free[i] = to
			var s3 fragStats
			tab.stats(free, &s3)
			if s2 != s3 {
				t.Fatalf("incremental stats differ after moving device %d to %d", i, to)
			}
		}
	}
}
