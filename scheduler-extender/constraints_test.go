package extender

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/placement"
)

func nodeSelector(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Spec.NodeSelector == nil {
			p.Spec.NodeSelector = map[string]string{}
		}
		p.Spec.NodeSelector[k] = v
	}
}

// requiredAffinity adds one required node selector term with req.
func requiredAffinity(req corev1.NodeSelectorRequirement, byField bool) podOpt {
	return func(p *corev1.Pod) {
		term := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req}}
		if byField {
			term = corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req}}
		}
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}}}
	}
}

func tolerate(key, value string, effect corev1.TaintEffect) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpEqual, Value: value, Effect: effect})
	}
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
		s.State().UpsertNode(node)
	}
}

// TestGangNeverFitsHonoursNodeConstraints: a gang of two 2-GPU members fits
// the big nodes only. Pinned to the small ones (by selector, affinity or an
// untolerated taint on the big ones) it can never fit and is refused as
// unresolvable; otherwise it waits for capacity. The candidates are the small
// nodes, as kube-scheduler would send them for a pinned pod (and for any pod
// while the big nodes are busy).
func TestGangNeverFitsHonoursNodeConstraints(t *testing.T) {
	t.Parallel()
	const never = "gang ns/g: minMember 2 can never fit the cluster (at most 0 fit on empty nodes)"
	const waiting = "gang ns/g: 0/2 members fit"
	tests := []struct {
		name      string
		bigTaints []corev1.Taint
		opts      []podOpt
		want      string
	}{
		{"unconstrained waits", nil, nil, waiting},
		{"node selector pins to small nodes", nil, []podOpt{nodeSelector("pool", "small")}, never},
		{"required affinity pins to small nodes", nil, []podOpt{requiredAffinity(corev1.NodeSelectorRequirement{
			Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"small"}}, false)}, never},
		{"affinity allowing big nodes waits", nil, []podOpt{requiredAffinity(corev1.NodeSelectorRequirement{
			Key: "pool", Operator: corev1.NodeSelectorOpExists}, false)}, waiting},
		{"untolerated taint on big nodes", []corev1.Taint{taintDedicated}, nil, never},
		{"tolerated taint on big nodes waits", []corev1.Taint{taintDedicated}, []podOpt{tolerate("dedicated", "train", corev1.TaintEffectNoSchedule)}, waiting},
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
				opts := append(append(volcano("g", 2), gpus(2), created(i)), tc.opts...)
				p := testPod("ns", "m"+string(rune('0'+i)), opts...)
				s.State().UpsertPod(p)
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
		p := testPod("ns", "m"+string(rune('0'+i)), append(volcano("g", 2), gpus(2), created(i), nodeSelector("pool", "small"))...)
		s.State().UpsertPod(p)
		members = append(members, p)
	}
	if res := filter(t, url, members[0], "small0", "small1"); !strings.Contains(res.FailedAndUnresolvableNodes["small0"], "can never fit") {
		t.Fatalf("before relabelling: %+v", res)
	}
	big0 := testNode("big0", "A100", 4, 64, 256)
	big0.Labels["pool"] = "small"
	s.State().UpsertNode(big0)
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
		s.State().UpsertNode(node)
	}
	url := startHTTP(t, s)
	m0 := testPod("ns", "m0", append(volcano("g", 2), gpus(1), created(0))...)
	m1 := testPod("ns", "m1", append(volcano("g", 2), gpus(1), created(1), nodeSelector("pool", "b"))...)
	s.State().UpsertPod(m0)
	s.State().UpsertPod(m1)
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
