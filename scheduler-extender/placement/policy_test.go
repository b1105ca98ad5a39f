package placement

import (
	"errors"
	"math/rand"
	"slices"
	"testing"

	"github.com/understory/understory/contract"
)

// shareWorkload is half whole-GPU pods and half 0.5-GPU shares, 1 CPU each.
func shareWorkload() *Workload {
	return NewWorkload(append(reqs(5, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}),
		reqs(5, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500})...), 1)
}

func withFree(n *Node, free ...int) *Node {
	copy(n.GPUFree, free)
	for _, f := range free {
		if f < contract.MilliPerGPU {
			n.Pods++
		}
	}
	return n
}

func TestPolicyChoices(t *testing.T) {
	t.Parallel()
	share := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}
	whole := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}
	tests := []struct {
		name     string
		policy   string
		nodes    []*Node
		req      Request
		wantNode string
		wantDevs []int
	}{
		{"bestfit packs the fuller node", PolicyBestFit,
			[]*Node{withFree(placeNode("empty", "T4", 8000, 2), 1000, 1000), withFree(placeNode("half", "T4", 8000, 2), 1000, 500)},
			whole, "half", []int{0}},
		{"bestfit shares the tightest device", PolicyBestFit,
			[]*Node{withFree(placeNode("n", "T4", 8000, 4), 1000, 700, 600, 900)},
			share, "n", []int{2}},
		{"fgd puts a share beside another share", PolicyFGD,
			[]*Node{withFree(placeNode("fresh", "T4", 8000, 2), 1000, 1000), withFree(placeNode("shared", "T4", 8000, 2), 1000, 500)},
			share, "shared", []int{1}},
		{"fgd keeps whole devices for whole-GPU pods", PolicyFGD,
			[]*Node{withFree(placeNode("n", "T4", 8000, 3), 1000, 600, 1000)},
			share, "n", []int{1}},
		{"fgd avoids a node whose cpu it would strand", PolicyFGD,
			[]*Node{func() *Node { n := withFree(placeNode("tight", "T4", 2000, 2), 1000, 1000); return n }(),
				withFree(placeNode("roomy", "T4", 8000, 2), 1000, 1000)},
			Request{CPUMilli: 1500}, "roomy", nil},
		{"fgd takes the lowest free devices for whole GPUs", PolicyFGD,
			[]*Node{withFree(placeNode("n", "T4", 8000, 4), 0, 1000, 1000, 1000)},
			Request{CPUMilli: 1000, NumGPU: 2, GPUMilli: 1000}, "n", []int{1, 2}},
		{"understory puts a share beside another share", PolicyUnderstory,
			[]*Node{withFree(placeNode("fresh", "T4", 8000, 2), 1000, 1000), withFree(placeNode("shared", "T4", 8000, 2), 1000, 500)},
			share, "shared", []int{1}},
		{"understory keeps whole devices for whole-GPU pods", PolicyUnderstory,
			[]*Node{withFree(placeNode("n", "T4", 8000, 3), 1000, 600, 1000)},
			share, "n", []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := NewPolicy(tc.policy, shareWorkload(), nil)
			if err != nil {
				t.Fatal(err)
			}
			best, devs, err := Select(p, tc.nodes, tc.req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if best.Name != tc.wantNode || !slices.Equal(devs, tc.wantDevs) {
				t.Fatalf("%s chose %s %v, want %s %v", p.Name(), best.Name, devs, tc.wantNode, tc.wantDevs)
			}
			// Score agrees with Select and never changes the node.
			before := best.Clone()
			_, sdevs, ok := p.Score(best, tc.req)
			if !ok || !slices.Equal(sdevs, tc.wantDevs) || !nodesEqual(best, before) {
				t.Fatalf("Score = %v %v", sdevs, ok)
			}
		})
	}
}

func TestPolicyScoreRefusesWhatDoesNotFit(t *testing.T) {
	t.Parallel()
	for _, name := range PolicyNames() {
		p, err := NewPolicy(name, nil, rand.New(rand.NewSource(1)))
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != name {
			t.Fatalf("Name = %q, want %q", p.Name(), name)
		}
		n := placeNode("n", "T4", 1000, 1)
		for _, r := range []Request{{CPUMilli: 2000}, {NumGPU: 2, GPUMilli: 1000}, {NumGPU: 1, GPUMilli: 1000, Models: []string{"A100"}}, {CPUMilli: -5}} {
			if _, _, ok := p.Score(n, r); ok {
				t.Fatalf("%s scored %+v on %+v", name, r, n)
			}
		}
	}
}

func TestNewPolicyUnknown(t *testing.T) {
	t.Parallel()
	if _, err := NewPolicy("tetris", nil, nil); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("err = %v", err)
	}
}

func TestRandomPolicyCoversFeasibleNodes(t *testing.T) {
	t.Parallel()
	p, _ := NewPolicy(PolicyRandom, nil, rand.New(rand.NewSource(7)))
	nodes := []*Node{placeNode("a", "T4", 8000, 1), placeNode("b", "T4", 8000, 1), placeNode("full", "T4", 8000, 0), placeNode("c", "T4", 8000, 1)}
	seen := map[string]int{}
	for range 300 {
		n, _, err := Select(p, nodes, Request{NumGPU: 1, GPUMilli: 300}, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[n.Name]++
	}
	if len(seen) != 3 || seen["full"] != 0 || seen["a"] < 50 || seen["b"] < 50 || seen["c"] < 50 {
		t.Fatalf("random picks %v", seen)
	}
}

func TestUnderstoryUsage(t *testing.T) {
	t.Parallel()
	metricsAt := func(used, ls int64) *Usage {
		return &Usage{CPUCapacity: 8000, CPUUsed: used, CPULS: ls, MemoryCapacity: 100, MemoryUsed: 10}
	}
	node := func(name string, u *Usage) *Node {
		n := placeNode(name, "T4", 8000, 1)
		n.Usage = u
		return n
	}
	tests := []struct {
		name  string
		nodes []*Node
		want  string
	}{
		{"idle beats unknown and busy", []*Node{node("busy", metricsAt(7000, 0)), node("unknown", nil), node("idle", metricsAt(500, 0))}, "idle"},
		{"unknown beats busy", []*Node{node("busy", metricsAt(7000, 0)), node("unknown", nil)}, "unknown"},
		{"unknown never counts as idle", []*Node{node("unknown", nil), node("idle", metricsAt(0, 0))}, "idle"},
		{"LS-heavy is avoided", []*Node{node("ls", metricsAt(3000, 3000)), node("batch", metricsAt(3000, 0))}, "batch"},
	}
	p, _ := NewPolicy(PolicyUnderstory, shareWorkload(), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Either order: usage, not node order, decides.
			for _, nodes := range [][]*Node{tc.nodes, reversed(tc.nodes)} {
				best, _, err := Select(p, nodes, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if best.Name != tc.want {
					t.Fatalf("chose %s, want %s", best.Name, tc.want)
				}
			}
		})
	}
}

// TestUnderstoryGPUUsage: GPU pods go to devices the agent reports idle now, not
// only unallocated; unknown and unhealthy devices never count as idle.
func TestUnderstoryGPUUsage(t *testing.T) {
	t.Parallel()
	idle := GPUUsage{Known: true, Reclaimable: 1}
	lsBusy := GPUUsage{Known: true, Util: 80, LSUtil: 80, Reclaimable: 0.2}
	batchBusy := GPUUsage{Known: true, Util: 90, LSUtil: 0, Reclaimable: 1} // reclaimable, but not idle now
	unhealthy := GPUUsage{Known: false, Util: 0, Reclaimable: 1}
	gpuNode := func(name string, gpus ...GPUUsage) *Node {
		n := placeNode(name, "T4", 8000, len(gpus))
		n.Usage = &Usage{CPUCapacity: 8000, CPUUsed: 1000, MemoryCapacity: 100, MemoryUsed: 10, GPUs: gpus}
		return n
	}
	share := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 500}
	whole := Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}
	tests := []struct {
		name     string
		nodes    []*Node
		req      Request
		wantNode string
		wantDev  int
	}{
		{"share: the idle device of one node", []*Node{gpuNode("a", lsBusy, idle)}, share, "a", 1},
		{"share: idle beats batch-busy", []*Node{gpuNode("a", batchBusy, idle, batchBusy)}, share, "a", 1},
		{"share: unhealthy is not idle", []*Node{gpuNode("a", unhealthy, idle)}, share, "a", 1},
		{"share: unhealthy beats LS-busy", []*Node{gpuNode("a", lsBusy, unhealthy)}, share, "a", 1},
		{"share: idle node over LS-busy node", []*Node{gpuNode("busy", lsBusy), gpuNode("idle", idle)}, share, "idle", 0},
		{"whole: idle node over LS-busy node", []*Node{gpuNode("busy", lsBusy), gpuNode("idle", idle)}, whole, "idle", 0},
		{"whole: unknown node over LS-busy", []*Node{gpuNode("busy", lsBusy), gpuNode("unknown", unhealthy)}, whole,
			"unknown", 0},
	}
	p, _ := NewPolicy(PolicyUnderstory, shareWorkload(), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, nodes := range [][]*Node{tc.nodes, reversed(tc.nodes)} {
				best, devs, err := Select(p, nodes, tc.req, nil)
				if err != nil {
					t.Fatal(err)
				}
				if best.Name != tc.wantNode || !slices.Equal(devs, []int{tc.wantDev}) {
					t.Fatalf("chose %s %v, want %s [%d]", best.Name, devs, tc.wantNode, tc.wantDev)
				}
			}
		})
	}
	// Fragmentation still comes first: a half-used device is filled before an
	// idle empty one is broken, whatever the live figures say.
	n := gpuNode("a", lsBusy, idle)
	n.GPUFree[0] = 500
	_, devs, err := Select(p, []*Node{n}, share, nil)
	if err != nil || !slices.Equal(devs, []int{0}) {
		t.Fatalf("devices %v (err %v), want the half-used device 0", devs, err)
	}
}

func reversed(ns []*Node) []*Node {
	out := slices.Clone(ns)
	slices.Reverse(out)
	return out
}

// TestUnderstoryReserve: a pod that may run anywhere goes to the model fewer
// classes can use.
func TestUnderstoryReserve(t *testing.T) {
	t.Parallel()
	// Most pods need T4; few run anywhere.
	w := NewWorkload(append(reqs(8, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000, Models: []string{"T4"}}),
		reqs(2, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000})...), 1)
	p, _ := NewPolicy(PolicyUnderstory, w, nil)
	for _, nodes := range [][]*Node{{placeNode("t4", "T4", 8000, 2), placeNode("v100", "V100", 8000, 2)}, {placeNode("v100", "V100", 8000, 2), placeNode("t4", "T4", 8000, 2)}} {
		best, _, err := Select(p, nodes, Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}, nil)
		if err != nil || best.Name != "v100" {
			t.Fatalf("chose %v, %v", best, err)
		}
	}
}
