package gang

import (
	"encoding/json"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// podConstraints is what a pod says about the nodes it may run on, read as
// kube-scheduler's NodeAffinity and TaintToleration filters read it:
// spec.nodeSelector, required node affinity, and tolerations against a node's
// NoSchedule and NoExecute taints. kube-scheduler applies them to the nodes it
// sends to filter; the extender needs them only where it places pods on nodes
// kube-scheduler did not filter for them: the gang members other than the one
// being filtered, and the gang "can never fit" check over the whole cluster.
// A nil *podConstraints is a pod without selector, affinity or tolerations.
type podConstraints struct {
	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	key         string // canonical form: equal keys, equal constraints ("" for none)
}

// constraintsOf returns pod's constraints; nil when it has none.
func constraintsOf(pod *corev1.Pod) *podConstraints {
	spec := &pod.Spec
	var required *corev1.NodeSelector
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil {
		required = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	if len(spec.NodeSelector) == 0 && required == nil && len(spec.Tolerations) == 0 {
		return nil
	}
	// encoding/json writes map keys sorted: the key is canonical.
	key, err := json.Marshal(struct {
		S map[string]string    `json:"s,omitempty"`
		A *corev1.NodeSelector `json:"a,omitempty"`
		T []corev1.Toleration  `json:"t,omitempty"`
	}{spec.NodeSelector, required, spec.Tolerations})
	if err != nil {
		// Cannot happen for these types; a key of the pod's own keeps the
		// verdicts cached for it apart from every other pod's.
		key = []byte("uid:" + string(pod.UID))
	}
	return &podConstraints{affinity: nodeaffinity.GetRequiredNodeAffinity(pod), tolerations: spec.Tolerations, key: string(key)}
}

func (c *podConstraints) cacheKey() string {
	if c == nil {
		return ""
	}
	return c.key
}

// conditionTaint reports whether a taint is one the node lifecycle and cloud
// controllers put on and take off nodes as their condition changes (not
// ready, unreachable, cordoned, under pressure, not initialised yet).
func conditionTaint(t *corev1.Taint) bool {
	return strings.HasPrefix(t.Key, "node.kubernetes.io/") || strings.HasPrefix(t.Key, "node.cloudprovider.kubernetes.io/")
}

// allows reports whether node n (its name, labels and taints) passes the
// constraints. With conditions false, condition taints (conditionTaint) do not
// count: they say whether a pod can run on the node now, not whether it ever can.
func (c *podConstraints) allows(n *corev1.Node, conditions bool) bool {
	var tolerations []corev1.Toleration
	if c != nil {
		if ok, err := c.affinity.Match(n); err != nil || !ok {
			return false // kube-scheduler also reads a malformed affinity as no match
		}
		tolerations = c.tolerations
	}
	// kube-scheduler's TaintToleration filter, with condition taints left out on request.
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(n.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
		return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) &&
			(conditions || !conditionTaint(t))
	})
	return !untolerated
}

// constraintsPart is a deep copy of what constraintsOf reads of pod.
func constraintsPart(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: pod.UID}}
	spec := &pod.Spec
	for k, v := range spec.NodeSelector {
		if out.Spec.NodeSelector == nil {
			out.Spec.NodeSelector = make(map[string]string, len(spec.NodeSelector))
		}
		out.Spec.NodeSelector[strings.Clone(k)] = strings.Clone(v)
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		out.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.DeepCopy()}}
	}
	if spec.Tolerations != nil {
		out.Spec.Tolerations = make([]corev1.Toleration, len(spec.Tolerations))
		for i := range spec.Tolerations {
			spec.Tolerations[i].DeepCopyInto(&out.Spec.Tolerations[i])
		}
	}
	return out
}
