package extender

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// The informers keep only what the index reads (cache.TransformFunc): at
// 100 000 pods the informer's store would otherwise hold every pod's
// managedFields, env, volumes, probes, status and every annotation
// (kubectl's last-applied-configuration alone is a copy of the pod). The pod
// informer stores a podRecord, not a pod: what the index reads, computed here.
// A new field the index reads must be kept here too (in podRecord for pods);
// TestSlimObjectsKeepWhatTheIndexReads compares what the index makes of a full
// and a slim object.

// nodeAnnotationsRead are the node annotations the index reads (a node's
// labels are all kept: pods' node selectors and affinities match them).
var nodeAnnotationsRead = []string{contract.AnnotationNodeMetrics, contract.AnnotationNodeMetricsV2}

// slimObject is the informers' transform: it returns a pod's podRecord, the
// part of a node or PodGroup the index reads, and anything else (a record
// included) unchanged. Idempotent.
func slimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return podRecordOf(o), nil
	case *corev1.Node:
		return slimNode(o), nil
	case *unstructured.Unstructured:
		return gang.SlimPodGroup(o), nil
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

// podRecord is what the pod informer stores of a pod: exactly what the index
// reads (UpsertPod, upsertRecord, upsertPodLocked), computed by the transform
// outside the index lock. A slimmed *corev1.Pod still cost about 1.5 KB a pod (Pod and
// Container structs, resource maps); a record of a pod outside any gang is a
// few hundred bytes. It embeds a trimmed ObjectMeta (name, namespace, uid,
// resourceVersion, creationTimestamp) so that the informer's store can key it
// (metav1.Object) and hands it to the event handlers in place of the pod.
// Records are never modified once made: the index shares their pointers.
type podRecord struct {
	metav1.ObjectMeta
	req      placement.Request
	reqErr   error        // why PodRequest failed (req then holds what it could read)
	gang     *gang.Record // its gang, constraints and recorded plan; nil: no gang
	nodeName string
	phase    corev1.PodPhase
	devices  []int // the contract.AnnotationGPUDevices annotation, parsed; nil when missing or malformed
}

var (
	_ metav1.Object  = (*podRecord)(nil)
	_ runtime.Object = (*podRecord)(nil)
)

// GetObjectKind: a record has no kind of its own.
func (r *podRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the record; what it points to is immutable and shared.
func (r *podRecord) DeepCopyObject() runtime.Object {
	c := *r
	r.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// podRecordOf computes what the index reads of pod: PodRequest, its gang
// (gang.RecordOf: membership, and for members their node constraints and
// recorded plan), spec.nodeName, status.phase and the devices annotation
// (parsed here, outside the index lock). Its strings are copies made now,
// after the informer decoded its list, so that they lie together instead of
// pinning, a few bytes each, the memory spans the decoded pods are freed
// from. A gang member's constraints still share the strings of its selector,
// affinity and tolerations with the decoded pod; gang members are few.
func podRecordOf(pod *corev1.Pod) *podRecord {
	r := &podRecord{
		ObjectMeta: metav1.ObjectMeta{Name: strings.Clone(pod.Name), Namespace: strings.Clone(pod.Namespace),
			UID: types.UID(strings.Clone(string(pod.UID))), ResourceVersion: strings.Clone(pod.ResourceVersion),
			CreationTimestamp: pod.CreationTimestamp},
		nodeName: strings.Clone(pod.Spec.NodeName), phase: canonicalPhase(pod.Status.Phase),
	}
	r.req, r.reqErr = wire.PodRequest(pod)
	for i, m := range r.req.Models {
		if i == 0 {
			r.req.Models = slices.Clone(r.req.Models)
		}
		r.req.Models[i] = strings.Clone(m)
	}
	r.gang = gang.RecordOf(pod)
	if v, ok := pod.Annotations[contract.AnnotationGPUDevices]; ok {
		r.devices, _ = contract.ParseGPUDevices(v) // malformed: nil, and the index infers devices
	}
	return r
}

// canonicalPhase returns the package constant for a known phase, so that
// 100 000 records do not each keep their own copy of "Running".
func canonicalPhase(p corev1.PodPhase) corev1.PodPhase {
	for _, c := range []corev1.PodPhase{corev1.PodRunning, corev1.PodPending, corev1.PodSucceeded,
		corev1.PodFailed, corev1.PodUnknown} {
		if p == c {
			return c
		}
	}
	return p
}

// slimNode keeps identity, labels, the node-metrics annotations, taints and
// allocatable: what nodeFromAPI, nodeMeta and the metrics decoding read.
func slimNode(n *corev1.Node) *corev1.Node {
	m := &n.ObjectMeta
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID,
			ResourceVersion: m.ResourceVersion, CreationTimestamp: m.CreationTimestamp,
			DeletionTimestamp: m.DeletionTimestamp, Labels: m.Labels, Annotations: keep(m.Annotations, nodeAnnotationsRead)},
		Spec:   corev1.NodeSpec{Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Allocatable: n.Status.Allocatable},
	}
}
