package gang

import (
	"cmp"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// placeAllBySelect is placeAll without the scores it keeps between members:
// one placement.Select per member over the nodes its constraints allow, the
// plain reference. TestPlaceAllSameAsSelect holds placeAll to it.
func placeAllBySelect(pol placement.Policy, nodes []*placement.Node, meta []*corev1.Node, idx map[string]int, members []planMember, conditions bool) []planSlot {
	order := slices.Clone(members)
	slices.SortStableFunc(order, func(a, b planMember) int {
		return cmp.Or(cmp.Compare(b.req.GPUTotalMilli(), a.req.GPUTotalMilli()), cmp.Compare(b.req.CPUMilli, a.req.CPUMilli))
	})
	cloned := make(map[int]bool)
	var slots []planSlot
	for _, m := range order {
		var cand []*placement.Node
		for i := range nodes {
			if m.cons.allows(meta[i], conditions) {
				cand = append(cand, nodes[i])
			}
		}
		best, devs, err := placement.Select(pol, cand, m.req, nil)
		if err != nil {
			continue
		}
		i := idx[best.Name]
		if !cloned[i] {
			nodes[i], cloned[i] = nodes[i].Clone(), true
		}
		if nodes[i].Place(m.req, devs) != nil {
			continue
		}
		slots = append(slots, planSlot{p: m.p, node: best.Name, devs: devs})
	}
	return slots
}

// placeAllCase is a random partly used cluster of 80 nodes (zones, a tainted
// and a cordoned share of them, some with live usage) and a gang of 150
// members, some pinned to a zone, a model or tolerating the taint, built alike
// for every call with one seed. mixed: members of many shapes (most pairs of
// shape and constraints come once or twice, and more pairs than placeAll
// keeps rankings for); else of two shapes (every pair comes often).
func placeAllCase(t *testing.T, seed int64, mixed bool) ([]*placement.Node, []*corev1.Node, map[string]int, []planMember) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	var nodes []*placement.Node
	var meta []*corev1.Node
	idx := map[string]int{}
	for i := range 80 {
		model := []string{"A100", "T4", "V100"}[rng.Intn(3)]
		g := []int{0, 1, 2, 4, 8, 8}[rng.Intn(6)]
		n, obj := testNode(fmt.Sprintf("n%02d", i), model, g, 32+rng.Intn(64), 256)
		obj.Labels["zone"] = []string{"a", "b"}[rng.Intn(2)]
		switch rng.Intn(6) {
		case 0:
			obj.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
		case 1:
			obj.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}
		}
		n.UsedCPUMilli = rng.Int63n(n.CPUMilli/2 + 1)
		for d := range n.GPUFree {
			n.GPUFree[d] = []int{0, 250, 530, 1000, 1000}[rng.Intn(5)]
		}
		if rng.Intn(3) == 0 {
			n.Usage = &placement.Usage{CPUCapacity: n.CPUMilli, CPUUsed: rng.Int63n(n.CPUMilli + 1), MemoryCapacity: 1 << 20}
		}
		idx[n.Name] = len(nodes)
		nodes, meta = append(nodes, n), append(meta, obj)
	}
	shapes, cpus := []podtest.Opt{podtest.GPUs(1), podtest.GPUs(2), podtest.GPUs(8), podtest.Milli(250), podtest.Milli(470), podtest.CPU(2000), podtest.CPU(8000)}, 8
	if !mixed {
		shapes, cpus = []podtest.Opt{podtest.GPUs(2), podtest.Milli(470)}, 1
	}
	members := make([]planMember, 150)
	for i := range members {
		pod := podtest.Pod("ns", fmt.Sprintf("m%03d", i), shapes[rng.Intn(len(shapes))], podtest.CPU(int64(500*(1+rng.Intn(cpus)))))
		switch rng.Intn(5) {
		case 0:
			pod.Spec.NodeSelector = map[string]string{"zone": "a"}
		case 1:
			pod.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		case 2:
			pod.Annotations[wire.AnnotationGPUModel] = "T4,V100"
		}
		req, err := wire.PodRequest(pod)
		if err != nil {
			t.Fatal(err)
		}
		members[i] = planMember{p: &fakePod{uid: types.UID(pod.Name), name: pod.Name}, req: req, cons: constraintsOf(pod)}
	}
	return nodes, meta, idx, members
}

// TestPlaceAllSameAsSelect: placeAll plans every gang exactly as one
// placement.Select per member did (the same members on the same nodes and
// devices, the same ledgers after), for every policy, with and without
// condition taints counting, for gangs of many shapes and of few.
func TestPlaceAllSameAsSelect(t *testing.T) {
	t.Parallel()
	_, _, _, all := placeAllCase(t, 0, true)
	reqs := make([]placement.Request, len(all))
	for i, m := range all {
		reqs[i] = m.req
	}
	w := placement.NewWorkload(reqs, placement.DefaultUnderstoryCoverage)
	policy := func(name string) placement.Policy {
		p, err := placement.NewPolicy(name, w, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, name := range placement.PolicyNames() {
		for _, c := range []struct{ conditions, mixed bool }{{true, true}, {false, true}, {true, false}, {false, false}} {
			for seed := range int64(4) {
				t.Run(fmt.Sprintf("%s/conditions=%v/mixed=%v/seed=%d", name, c.conditions, c.mixed, seed), func(t *testing.T) {
					t.Parallel()
					conditions := c.conditions
					nodes, meta, idx, members := placeAllCase(t, seed, c.mixed)
					pol := policy(name)
					got := placeAll(pol, placement.Concurrent(pol), nodes, meta, idx, members, conditions)
					wantNodes, _, _, wantMembers := placeAllCase(t, seed, c.mixed)
					want := placeAllBySelect(policy(name), wantNodes, meta, idx, wantMembers, conditions)
					if len(got) == 0 || len(got) == len(members) {
						t.Fatalf("%d of %d members placed: the case tests nothing", len(got), len(members))
					}
					if len(got) != len(want) {
						t.Fatalf("%d members placed, %d by Select", len(got), len(want))
					}
					for i := range got {
						g, w := got[i], want[i]
						if g.p.Name() != w.p.Name() || g.node != w.node || !slices.Equal(g.devs, w.devs) {
							t.Fatalf("slot %d: %s on %s %v, by Select %s on %s %v", i, g.p.Name(), g.node, g.devs, w.p.Name(), w.node, w.devs)
						}
					}
					for i := range nodes {
						if a, b := *nodes[i], *wantNodes[i]; !slices.Equal(a.GPUFree, b.GPUFree) || a.UsedCPUMilli != b.UsedCPUMilli || a.Pods != b.Pods {
							t.Fatalf("node %s: %+v, by Select %+v", a.Name, a, b)
						}
					}
				})
			}
		}
	}
}
