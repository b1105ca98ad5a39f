package extender

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/placement"
)

// nodeSelector sets the pod's node selector to k=v.
func nodeSelector(k, v string) podtest.Opt {
	return func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{k: v} }
}

var (
	taintDedicated = corev1.Taint{Key: "dedicated", Value: "train", Effect: corev1.TaintEffectNoSchedule}
	taintCordoned  = corev1.Taint{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}
)

// pools is a cluster of two 4-GPU nodes labelled pool=big and two 1-GPU nodes
// labelled pool=small; the big ones carry bigTaints.
func pools(s *Server, bigTaints ...corev1.Taint) {
	for _, n := range []struct {
		name, pool string
		gpus       int
	}{{"big0", "big", 4}, {"big1", "big", 4}, {"small0", "small", 1}, {"small1", "small", 1}} {
		node := testNode(n.name, "A100", n.gpus, 64, 256)
		node.Labels["pool"] = n.pool
		if n.pool == "big" {
			node.Spec.Taints = bigTaints
		}
		s.state.UpsertNode(node)
	}
}

// TestGangNeverFitsHonoursNodeConstraints: a gang of two 2-GPU members fits
// the big nodes only. Pinned to the small ones (by a selector, or an
// untolerated taint on the big ones) it can never fit and is refused as
// unresolvable; otherwise (the big nodes only cordoned included: a condition,
// not for ever) it waits for capacity. The candidates are the small nodes, as
// kube-scheduler would send them for a pinned pod (and for any pod while the
// big nodes are busy). What each kind of constraint allows (affinity,
// tolerations, taint effects) is the gang package's TestPodConstraintsAllows;
// this test holds the server to checking the members' constraints against the
// index's nodes.
func TestGangNeverFitsHonoursNodeConstraints(t *testing.T) {
	t.Parallel()
	const never = "gang ns/g: minMember 2 can never fit the cluster (at most 0 fit on empty nodes)"
	const waiting = "gang ns/g: 0/2 members fit"
	tests := []struct {
		name      string
		bigTaints []corev1.Taint
		opts      []podtest.Opt
		want      string
	}{
		{"unconstrained waits", nil, nil, waiting},
		{"node selector pins to small nodes", nil, []podtest.Opt{nodeSelector("pool", "small")}, never},
		{"untolerated taint on big nodes", []corev1.Taint{taintDedicated}, nil, never},
		{"cordoned big nodes wait", []corev1.Taint{taintCordoned}, nil, waiting},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := testServer(t, newFakeClock(), Deps{})
			pools(s, tc.bigTaints...)
			url := startHTTP(t, s)
			var members []*corev1.Pod
			for i := range 2 {
				opts := append(append(podtest.Volcano("g", 2), podtest.GPUs(2), podtest.Created(i)), tc.opts...)
				p := podtest.Pod("ns", "m"+string(rune('0'+i)), opts...)
				s.state.UpsertPod(p)
				members = append(members, p)
			}
			res := filter(t, url, members[0], "small0", "small1")
			got, unresolvable := res.FailedNodes["small0"], false
			if v, ok := res.FailedAndUnresolvableNodes["small0"]; ok {
				got, unresolvable = v, true
			}
			if !strings.HasPrefix(got, tc.want) || unresolvable != (tc.want == never) {
				t.Fatalf("small0: %q (unresolvable %v), want %q", got, unresolvable, tc.want)
			}
			wantState := GangWaiting
			if tc.want == never {
				wantState = gang.GangUnschedulable
			}
			if st := s.Status(); st.Gangs[0].State != wantState {
				t.Fatalf("gang state %q, want %q", st.Gangs[0].State, wantState)
			}
		})
	}
}

// TestGangNeverFitsFollowsNodeLabels: the cached "can never fit" verdict is
// recomputed when a node's labels change.
func TestGangNeverFitsFollowsNodeLabels(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{})
	pools(s)
	url := startHTTP(t, s)
	var members []*corev1.Pod
	for i := range 2 {
		p := podtest.Pod("ns", "m"+string(rune('0'+i)), append(podtest.Volcano("g", 2), podtest.GPUs(2), podtest.Created(i), nodeSelector("pool", "small"))...)
		s.state.UpsertPod(p)
		members = append(members, p)
	}
	if res := filter(t, url, members[0], "small0", "small1"); !strings.Contains(res.FailedAndUnresolvableNodes["small0"], "can never fit") {
		t.Fatalf("before relabelling: %+v", res)
	}
	big0 := testNode("big0", "A100", 4, 64, 256)
	big0.Labels["pool"] = "small"
	s.state.UpsertNode(big0)
	// big0 not among the candidates (say, busy): the gang now waits instead.
	res := filter(t, url, members[0], "small0", "small1")
	if got := res.FailedNodes["small0"]; got != "gang ns/g: 0/2 members fit" || len(res.FailedAndUnresolvableNodes) != 0 {
		t.Fatalf("after relabelling: %+v", res)
	}
	if n := passedOne(t, filter(t, url, members[0], "small0", "small1", "big0")); n != "big0" {
		t.Fatalf("after relabelling big0 into the small pool the gang should be planned there, got %s", n)
	}
	if n := passedOne(t, filter(t, url, members[1], "small0", "small1", "big0")); n != "big0" {
		t.Fatalf("second member planned on %s, want big0", n)
	}
}

// TestGangPlanHonoursMemberConstraints: the plan made while filtering m0 (no
// constraints) puts m1 only where m1's own node selector allows, although
// best fit alone would stack both members on the first node.
func TestGangPlanHonoursMemberConstraints(t *testing.T) {
	t.Parallel()
	s := testServer(t, newFakeClock(), Deps{}, func(c *Config) { c.Policy = placement.PolicyBestFit })
	for _, n := range []struct{ name, pool string }{{"n0", "a"}, {"n1", "b"}} {
		node := testNode(n.name, "A100", 4, 64, 256)
		node.Labels["pool"] = n.pool
		s.state.UpsertNode(node)
	}
	url := startHTTP(t, s)
	m0 := podtest.Pod("ns", "m0", append(podtest.Volcano("g", 2), podtest.GPUs(1), podtest.Created(0))...)
	m1 := podtest.Pod("ns", "m1", append(podtest.Volcano("g", 2), podtest.GPUs(1), podtest.Created(1), nodeSelector("pool", "b"))...)
	s.state.UpsertPod(m0)
	s.state.UpsertPod(m1)
	if n := passedOne(t, filter(t, url, m0, "n0", "n1")); n != "n0" {
		t.Fatalf("m0 planned on %s, want n0 (best fit, first of equals)", n)
	}
	if ph := phaseOf(s, m1.UID); ph != "planned@n1" {
		t.Fatalf("m1 is %s, want planned@n1 (its selector allows only pool=b)", ph)
	}
	// kube-scheduler sends m1 only n1; the plan holds.
	if n := passedOne(t, filter(t, url, m1, "n1")); n != "n1" {
		t.Fatalf("m1 passed %s", n)
	}
}
