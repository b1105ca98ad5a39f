// Package podtest builds the pods the extender's tests schedule: Pod is a pod asking
// for 100m CPU in one container "main", and each Opt changes one thing of it (GPUs,
// shared-GPU milli, CPU, annotations, labels, the node, the creation time, a Volcano
// gang). The core, gang and wire test packages share it, so a pod means the same in
// each. It is imported by tests only.
package podtest

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
)

// Opt changes a test pod.
type Opt func(*corev1.Pod)

// Pod is a pod of namespace ns named name (UID uid-ns-name) asking for 100m CPU,
// changed by opts in order.
func Pod(ns, name string, opts ...Opt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name),
			Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Limits:   corev1.ResourceList{},
		}}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// GPUs sets a limit of n whole GPUs.
func GPUs(n int) Opt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits[contract.ResourceGPU] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
}

// Milli sets a limit of m thousandths of a shared GPU.
func Milli(m int) Opt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits[contract.ResourceGPUMilli] = *resource.NewQuantity(int64(m), resource.DecimalSI)
	}
}

// CPU sets the CPU request in millicores.
func CPU(millicores int64) Opt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(millicores, resource.DecimalSI)
	}
}

// Annotate sets annotation k to v.
func Annotate(k, v string) Opt { return func(p *corev1.Pod) { p.Annotations[k] = v } }

// Label sets label k to v.
func Label(k, v string) Opt { return func(p *corev1.Pod) { p.Labels[k] = v } }

// OnNode binds the pod to node n.
func OnNode(n string) Opt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

// Created sets the creation time to sec seconds into 2026.
func Created(sec int) Opt {
	return func(p *corev1.Pod) {
		p.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, sec, 0, time.UTC))
	}
}

// Volcano makes the pod a member of Volcano gang group of minMember members.
func Volcano(group string, minMember int) []Opt {
	return []Opt{Annotate(contract.AnnotationVolcanoGroupName, group),
		Annotate(contract.AnnotationVolcanoMinMember, fmt.Sprint(minMember))}
}
