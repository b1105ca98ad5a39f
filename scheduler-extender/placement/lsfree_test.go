package placement

import (
	"slices"
	"testing"
)

// lsNode is a node with one free device per entry of free, and the agent's LS-free
// share per device (-1: the agent did not report it).
func lsNode(free []int, lsFree ...int) *Node {
	n := withFree(placeNode("n", "A100", 64000, len(free)), free...)
	if len(lsFree) == 0 {
		return n
	}
	n.Usage = &Usage{CPUCapacity: 64000, GPUs: make([]GPUUsage, len(lsFree))}
	for i, f := range lsFree {
		n.Usage.GPUs[i] = GPUUsage{Known: true, Reclaimable: 1}
		if f >= 0 {
			n.Usage.GPUs[i].LSFreeKnown, n.Usage.GPUs[i].LSFreeMilli = true, f
		}
	}
	return n
}

// TestSharePrefersLSFreeDevice: among the devices the ledger allows, a share goes to
// one whose published LS-free share holds it, then by each policy's own order; with
// none (or no figures), each policy's order alone decides.
func TestSharePrefersLSFreeDevice(t *testing.T) {
	t.Parallel()
	share := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}
	tests := []struct {
		name string
		node *Node
		// want is the device every deterministic policy picks (nil: its order
		// without figures); random the devices the random policy may draw.
		want, random []int
	}{
		{"the LS-free device", lsNode([]int{1000, 1000}, 200, 800), []int{1}, []int{1}},
		{"over a better-packed device", lsNode([]int{600, 1000}, 100, 900), []int{1}, []int{1}},
		{"exactly the request fits", lsNode([]int{1000, 1000, 1000}, 499, 500, 1000), []int{1}, []int{1, 2}},
		{"the ledger first: a full LS-free device is no candidate", lsNode([]int{1000, 400}, 100, 1000), []int{0},
			[]int{0}},
		{"none fits LS: the policy's order", lsNode([]int{1000, 600}, 100, 100), nil, []int{0, 1}},
		{"no figures: the policy's order", lsNode([]int{1000, 600}, -1, -1), nil, []int{0, 1}},
		{"an unhealthy device's figure does not count", func() *Node {
			n := lsNode([]int{1000, 1000}, 100, 900)
			n.Usage.GPUs[1].Known = false
			return n
		}(), nil, []int{0, 1}},
	}
	for _, name := range PolicyNames() {
		for _, tc := range tests {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				p, err := NewPolicy(name, shareWorkload(), nil)
				if err != nil {
					t.Fatal(err)
				}
				_, got, ok := p.Score(tc.node, share)
				if !ok || len(got) != 1 {
					t.Fatalf("the share does not fit: %v %v", got, ok)
				}
				if name == PolicyRandom {
					if !slices.Contains(tc.random, got[0]) {
						t.Fatalf("random drew device %d, not one of %v", got[0], tc.random)
					}
					return
				}
				want := tc.want
				if want == nil {
					bare := tc.node.Clone()
					bare.Usage = nil
					_, want, _ = p.Score(bare, share)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s picked %v, want %v", name, got, want)
				}
			})
		}
	}
}

// TestUnderstoryScoresLSFit: the understory policy ranks a node whose chosen device
// holds the share in LS's free SM share above one where it does not; unknown between.
func TestUnderstoryScoresLSFit(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy(PolicyUnderstory, shareWorkload(), nil)
	if err != nil {
		t.Fatal(err)
	}
	share := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}
	score := func(lsFree int) float64 {
		s, _, ok := p.Score(lsNode([]int{1000}, lsFree), share)
		if !ok {
			t.Fatal("no fit")
		}
		return s
	}
	fits, unknown, short := score(800), score(-1), score(100)
	if !(fits > unknown && unknown > short) {
		t.Fatalf("scores: LS-free fits %v, unknown %v, short %v; want decreasing", fits, unknown, short)
	}
	// A whole GPU is the device plugin's choice: no LS-free term.
	whole := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}
	a, _, _ := p.Score(lsNode([]int{1000}, 1000), whole)
	b, _, _ := p.Score(lsNode([]int{1000}, 0), whole)
	if a != b {
		t.Fatalf("whole GPU scores %v and %v differ by the LS-free share", a, b)
	}
}
