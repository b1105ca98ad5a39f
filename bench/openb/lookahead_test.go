package openb

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/understory/understory/scheduler-extender/placement"
)

func TestParseLookahead(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Lookahead
		wantErr bool
	}{
		{"", Lookahead{}, false},
		{" ", Lookahead{}, false},
		{"4,500,0.8", Lookahead{Candidates: 4, Horizon: 500, From: 0.8}, false},
		{" 2 , 1 , 0 ", Lookahead{Candidates: 2, Horizon: 1}, false},
		{"1,500,0.8", Lookahead{}, true},   // one candidate is the policy itself
		{"4,0,0.8", Lookahead{}, true},     // no horizon
		{"0,0,0", Lookahead{}, true},       // says nothing
		{"4,500,-1", Lookahead{}, true},    // negative level
		{"4,500,NaN", Lookahead{}, true},   // not a level
		{"4,500", Lookahead{}, true},       // missing field
		{"4,500,0.8,1", Lookahead{}, true}, // extra field
		{"four,500,0.8", Lookahead{}, true},
		{"4,5e2,0.8", Lookahead{}, true},
	}
	for _, tc := range tests {
		got, err := ParseLookahead(tc.in)
		if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrBadConfig)) {
			t.Fatalf("%q: err = %v, want error %v", tc.in, err, tc.wantErr)
		}
		if err == nil && got != tc.want {
			t.Fatalf("%q = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// trap is a cluster where best fit's choice for a share blocks a later pod: the
// share fits both nodes and best fit takes the CPU-tight one, the only node of
// the model the whole-GPU pod that follows needs.
func trap() ([]*placement.Node, Pod, Pod) {
	nodes := []*placement.Node{
		{Name: "a", CPUMilli: 64000, MemoryMiB: 1 << 20, MaxPods: 10, GPUFree: []int{1000}, Model: "Y"},
		{Name: "b", CPUMilli: 8000, MemoryMiB: 1 << 20, MaxPods: 10, GPUFree: []int{1000}, Model: "X"},
	}
	share := Pod{Name: "1-share", Request: placement.Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}}
	whole := Pod{Name: "2-whole", Request: placement.Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000, Models: []string{"X"}}}
	return nodes, share, whole
}

func TestLookaheadPlace(t *testing.T) {
	t.Parallel()
	nodes, share, whole := trap()
	policy, err := placement.NewPolicy(placement.PolicyBestFit, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, _, err := placement.Select(policy, nodes, share.Request, nil); err != nil || n.Name != "b" {
		t.Fatalf("best fit puts the share on %v (%v), the test wants b", n, err)
	}
	order := []Pod{share, whole}
	tests := []struct {
		name     string
		horizon  int
		wantNode string
		changed  int
	}{
		{"sees the blocked pod", 1, "a", 1},
		{"horizon past the end", 10, "a", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nodes, _, _ := trap()
			l := &lookahead{cfg: Lookahead{Candidates: 2, Horizon: tc.horizon}, policy: policy, nodes: nodes}
			before := []int{nodes[0].GPUFree[0], nodes[1].GPUFree[0]}
			n, devs, err := l.place(order, 0, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if n.Name != tc.wantNode || len(devs) != 1 || l.res.Changed != tc.changed || l.res.Decisions != 1 {
				t.Fatalf("placed on %s %v, result %+v", n.Name, devs, l.res)
			}
			// The rollouts left the cluster as it was.
			for i, nd := range nodes {
				if nd.GPUFree[0] != before[i] || nd.UsedCPUMilli != 0 || nd.Pods != 0 {
					t.Fatalf("node %s changed by the probe: %+v", nd.Name, nd)
				}
			}
		})
	}

	// A pod nothing fits fails as in Select.
	nodes2, _, _ := trap()
	l := &lookahead{cfg: Lookahead{Candidates: 2, Horizon: 1}, policy: policy, nodes: nodes2}
	big := []Pod{{Name: "big", Request: placement.Request{NumGPU: 2, GPUMilli: 1000}}}
	if _, _, err := l.place(big, 0, 0, 1); !errors.Is(err, placement.ErrNoFit) {
		t.Fatalf("err = %v, want ErrNoFit", err)
	}
}

func TestLookaheadSameState(t *testing.T) {
	t.Parallel()
	node := func(name string, free ...int) *placement.Node {
		return &placement.Node{Name: name, CPUMilli: 8000, MemoryMiB: 100, MaxPods: 10, GPUFree: free, Model: "X"}
	}
	tests := []struct {
		name string
		a, b candidate
		want bool
	}{
		{"same free multiset, same device", candidate{n: node("a", 1000, 500), devs: []int{1}}, candidate{n: node("b", 500, 1000), devs: []int{0}}, true},
		{"same node state, other device", candidate{n: node("a", 1000, 500), devs: []int{1}}, candidate{n: node("b", 500, 1000), devs: []int{1}}, false},
		{"other free", candidate{n: node("a", 1000, 500)}, candidate{n: node("b", 1000, 400)}, false},
		{"other model", candidate{n: node("a", 1000)}, candidate{n: &placement.Node{Name: "b", CPUMilli: 8000, MemoryMiB: 100, MaxPods: 10, GPUFree: []int{1000}, Model: "Y"}}, false},
		{"other cpu", candidate{n: node("a", 1000)}, candidate{n: &placement.Node{Name: "b", CPUMilli: 9000, MemoryMiB: 100, MaxPods: 10, GPUFree: []int{1000}, Model: "X"}}, false},
	}
	for _, tc := range tests {
		if got := sameState(tc.a, tc.b); got != tc.want {
			t.Fatalf("%s: sameState = %v", tc.name, got)
		}
	}
}

// TestRunLookahead: in a replay, the probe takes the trap best fit falls into
// whatever order the seed shuffles the two pods in; and on a slice of the real
// trace it runs, places every pod on a node that fits, and reports what it did.
func TestRunLookahead(t *testing.T) {
	t.Parallel()
	nodes, share, whole := trap()
	pods := []Pod{share, whole}
	trapped := 0
	for seed := int64(1); seed <= 8; seed++ {
		plain, err := Run(context.Background(), nodes, pods, Config{Policy: placement.PolicyBestFit, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		look, err := Run(context.Background(), nodes, pods, Config{Policy: placement.PolicyBestFit, Seed: seed,
			Lookahead: Lookahead{Candidates: 2, Horizon: 1}})
		if err != nil {
			t.Fatal(err)
		}
		trapped += plain.Failed
		if look.Failed != 0 || look.FinalAlloc != 75 || look.Lookahead == nil || look.Lookahead.Candidates != 2 {
			t.Fatalf("seed %d: %+v", seed, look)
		}
		if plain.Lookahead != nil {
			t.Fatalf("plain replay reports a lookahead: %+v", plain.Lookahead)
		}
	}
	if trapped == 0 {
		t.Fatal("no seed put the share first; the test proves nothing")
	}

	real, trace := defaultSlice(t, 60, 500)
	r, err := Run(context.Background(), real, trace, Config{Policy: placement.PolicyFGD, Seed: 42, Tune: 1.3,
		Lookahead: Lookahead{Candidates: 3, Horizon: 40, From: 0.9}})
	if err != nil {
		t.Fatal(err)
	}
	var capacity float64
	for _, n := range real {
		capacity += float64(len(n.GPUFree))
	}
	if r.Lookahead == nil || r.Lookahead.Decisions == 0 || r.Lookahead.Changed > r.Lookahead.Decisions ||
		math.Abs(r.Leftover.Total()+r.FinalAlloc/100*capacity-capacity) > 0.1 {
		t.Fatalf("%+v, leftover %+v", r.Lookahead, r.Leftover)
	}
}
