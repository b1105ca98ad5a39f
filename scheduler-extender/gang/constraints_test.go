package gang

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

func nodeSelector(k, v string) podtest.Opt {
	return func(p *corev1.Pod) {
		if p.Spec.NodeSelector == nil {
			p.Spec.NodeSelector = map[string]string{}
		}
		p.Spec.NodeSelector[k] = v
	}
}

// requiredAffinity adds one required node selector term with req.
func requiredAffinity(req corev1.NodeSelectorRequirement, byField bool) podtest.Opt {
	return func(p *corev1.Pod) {
		term := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req}}
		if byField {
			term = corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req}}
		}
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}}}
	}
}

func tolerate(key, value string, effect corev1.TaintEffect) podtest.Opt {
	return func(p *corev1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpEqual, Value: value, Effect: effect})
	}
}

func metaNode(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
}

var (
	taintDedicated = corev1.Taint{Key: "dedicated", Value: "train", Effect: corev1.TaintEffectNoSchedule}
	taintCordoned  = corev1.Taint{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}
	taintPrefer    = corev1.Taint{Key: "dedicated", Value: "train", Effect: corev1.TaintEffectPreferNoSchedule}
	taintEvict     = corev1.Taint{Key: "gpu-broken", Effect: corev1.TaintEffectNoExecute}
)

func TestPodConstraintsAllows(t *testing.T) {
	t.Parallel()
	big := map[string]string{"pool": "big"}
	in := func(k string, v ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: v}
	}
	tests := []struct {
		name       string
		pod        *corev1.Pod
		node       *corev1.Node
		conditions bool
		want       bool
	}{
		{"no constraints, plain node", podtest.Pod("ns", "p"), metaNode("n", big), true, true},
		{"selector matches", podtest.Pod("ns", "p", nodeSelector("pool", "big")), metaNode("n", big), true, true},
		{"selector misses", podtest.Pod("ns", "p", nodeSelector("pool", "small")), metaNode("n", big), true, false},
		{"selector on unlabelled node", podtest.Pod("ns", "p", nodeSelector("pool", "big")), metaNode("n", nil), true, false},
		{"affinity In matches", podtest.Pod("ns", "p", requiredAffinity(in("pool", "small", "big"), false)), metaNode("n", big), true, true},
		{"affinity NotIn excludes", podtest.Pod("ns", "p", requiredAffinity(corev1.NodeSelectorRequirement{
			Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"big"}}, false)), metaNode("n", big), true, false},
		{"affinity by node name", podtest.Pod("ns", "p", requiredAffinity(in("metadata.name", "n"), true)), metaNode("n", nil), true, true},
		{"affinity by other node name", podtest.Pod("ns", "p", requiredAffinity(in("metadata.name", "m"), true)), metaNode("n", nil), true, false},
		{"malformed affinity matches nothing", podtest.Pod("ns", "p", requiredAffinity(corev1.NodeSelectorRequirement{
			Key: "pool", Operator: "Near", Values: []string{"big"}}, false)), metaNode("n", big), true, false},
		{"untolerated NoSchedule taint", podtest.Pod("ns", "p"), metaNode("n", nil, taintDedicated), true, false},
		{"tolerated NoSchedule taint", podtest.Pod("ns", "p", tolerate("dedicated", "train", corev1.TaintEffectNoSchedule)), metaNode("n", nil, taintDedicated), true, true},
		{"toleration of another value", podtest.Pod("ns", "p", tolerate("dedicated", "serve", corev1.TaintEffectNoSchedule)), metaNode("n", nil, taintDedicated), true, false},
		{"untolerated NoExecute taint", podtest.Pod("ns", "p"), metaNode("n", nil, taintEvict), true, false},
		{"PreferNoSchedule never excludes", podtest.Pod("ns", "p"), metaNode("n", nil, taintPrefer), true, true},
		{"cordoned node, now", podtest.Pod("ns", "p"), metaNode("n", nil, taintCordoned), true, false},
		{"cordoned node, ever", podtest.Pod("ns", "p"), metaNode("n", nil, taintCordoned), false, true},
		{"real taint counts for ever", podtest.Pod("ns", "p"), metaNode("n", nil, taintDedicated), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := constraintsOf(tc.pod)
			if got := c.allows(tc.node, tc.conditions); got != tc.want {
				t.Fatalf("allows = %v, want %v (constraints %+v)", got, tc.want, c)
			}
		})
	}
}

func TestConstraintsKey(t *testing.T) {
	t.Parallel()
	a := podtest.Pod("ns", "a", nodeSelector("pool", "big"), nodeSelector("zone", "z1"))
	b := podtest.Pod("ns", "b", nodeSelector("zone", "z1"), nodeSelector("pool", "big"))
	c := podtest.Pod("ns", "c", nodeSelector("pool", "small"), nodeSelector("zone", "z1"))
	if constraintsOf(podtest.Pod("ns", "plain")) != nil {
		t.Fatal("a pod without selector, affinity or tolerations has constraints")
	}
	ka, kb, kc := constraintsOf(a).cacheKey(), constraintsOf(b).cacheKey(), constraintsOf(c).cacheKey()
	if ka != kb || ka == kc || ka == "" {
		t.Fatalf("keys %q %q %q: equal constraints must share a key, different ones not", ka, kb, kc)
	}
}
