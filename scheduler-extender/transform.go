package extender

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/understory/understory/metrics"
)

// The informers keep only what the index reads (cache.TransformFunc): at
// 100 000 pods the informer's store would otherwise hold every pod's
// managedFields, env, volumes, probes, status and every annotation
// (kubectl's last-applied-configuration alone is a copy of the pod). A new
// field the index reads must be kept here too; TestSlimObjectsKeepWhatTheIndexReads
// compares what the index makes of a full and a slim object.

// podAnnotationsRead are the pod annotations the index reads.
var podAnnotationsRead = []string{
	AnnotationGPUDevices, AnnotationGPUModel, AnnotationGangState,
	AnnotationVolcanoGroupName, AnnotationVolcanoGroupNameAlt, AnnotationVolcanoMinMember,
	AnnotationKoordinatorName, AnnotationKoordinatorMinAvailable,
}

// podLabelsRead are the pod labels the index reads.
var podLabelsRead = []string{LabelPodGroup}

// nodeAnnotationsRead are the node annotations the index reads (a node's
// labels are all kept: pods' node selectors and affinities match them).
var nodeAnnotationsRead = []string{metrics.AnnotationNodeMetrics}

// slimObject is the informers' transform: it returns the part of a pod, node
// or PodGroup the index reads, and anything else unchanged. Idempotent.
func slimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return slimPod(o), nil
	case *corev1.Node:
		return slimNode(o), nil
	case *unstructured.Unstructured:
		return slimPodGroup(o), nil
	}
	return obj, nil
}

// keep copies the entries of m under keys; nil when none.
func keep(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, 2)
			}
			out[k] = v
		}
	}
	return out
}

func slimMeta(m *metav1.ObjectMeta, labels, annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: labels, Annotations: annotations}
}

// slimPod keeps identity, the gang labels and annotations, devices and model
// annotations, spec.nodeName, status.phase, every container's name and
// resources (init containers' restart policy too), overhead, node selector,
// required node affinity and tolerations: what PodRequest, podGang,
// constraintsOf, persistedOf and UpsertPod read.
func slimPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: slimMeta(&p.ObjectMeta, keep(p.Labels, podLabelsRead), keep(p.Annotations, podAnnotationsRead)),
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, NodeSelector: p.Spec.NodeSelector,
			Tolerations: p.Spec.Tolerations, Overhead: p.Spec.Overhead},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		out.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution}}
	}
	slim := func(cs []corev1.Container) []corev1.Container {
		if len(cs) == 0 {
			return nil
		}
		out := make([]corev1.Container, len(cs))
		for i := range cs {
			out[i] = corev1.Container{Name: cs[i].Name, Resources: corev1.ResourceRequirements{
				Requests: cs[i].Resources.Requests, Limits: cs[i].Resources.Limits}, RestartPolicy: cs[i].RestartPolicy}
		}
		return out
	}
	out.Spec.Containers, out.Spec.InitContainers = slim(p.Spec.Containers), slim(p.Spec.InitContainers)
	return out
}

// slimNode keeps identity, labels, the node-metrics annotation, taints and
// allocatable: what nodeFromAPI, nodeMeta and the metrics decoding read.
func slimNode(n *corev1.Node) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: slimMeta(&n.ObjectMeta, n.Labels, keep(n.Annotations, nodeAnnotationsRead)),
		Spec:       corev1.NodeSpec{Taints: n.Spec.Taints},
		Status:     corev1.NodeStatus{Allocatable: n.Status.Allocatable},
	}
}

// slimPodGroup keeps apiVersion, kind, identity and spec.minMember and
// spec.scheduleTimeoutSeconds: what parsePodGroup and parseVolcanoPodGroup read.
func slimPodGroup(u *unstructured.Unstructured) *unstructured.Unstructured {
	meta := map[string]any{"name": u.GetName(), "namespace": u.GetNamespace()}
	if v := u.GetUID(); v != "" {
		meta["uid"] = string(v)
	}
	if v := u.GetResourceVersion(); v != "" {
		meta["resourceVersion"] = v
	}
	out := &unstructured.Unstructured{Object: map[string]any{"metadata": meta}}
	for _, k := range []string{"apiVersion", "kind"} {
		if v, ok := u.Object[k]; ok {
			out.Object[k] = v
		}
	}
	if spec, ok := u.Object["spec"].(map[string]any); ok {
		s := map[string]any{}
		for _, k := range []string{"minMember", "scheduleTimeoutSeconds"} {
			if v, ok := spec[k]; ok {
				s[k] = v
			}
		}
		out.Object["spec"] = s
	} else if spec, ok := u.Object["spec"]; ok {
		out.Object["spec"] = spec // malformed: the decoder says so
	}
	return out
}
