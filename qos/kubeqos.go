package qos

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// KubeQOSClass returns the Kubernetes QoS class of pod: pod.Status.QOSClass
// when the API server has set it (it is immutable after creation), else
// [ComputeKubeQOSClass]. It returns "" for a nil pod.
func KubeQOSClass(pod *corev1.Pod) corev1.PodQOSClass {
	if pod == nil {
		return ""
	}
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass
	}
	return ComputeKubeQOSClass(pod)
}

// ComputeKubeQOSClass derives the Kubernetes QoS class from the pod spec,
// following the documented kubelet rules:
//
//   - only cpu and memory count; a quantity that is not > 0 counts as unset;
//   - if pod-level resources (spec.resources) are set, they alone decide and
//     container resources are ignored;
//   - otherwise every init container (sidecars included) and every regular
//     container is looked at; ephemeral containers are not;
//   - BestEffort: no cpu/memory request or limit anywhere;
//   - Guaranteed: every container (or the pod level) sets cpu and memory
//     limits, and the requests equal them;
//   - Burstable: anything else.
//
// Kubernetes <= 1.34 compares the per-resource sums over containers while
// later versions classify container by container; both give the same answer
// for any pod the API server accepts (request <= limit), and this function
// uses the per-container form. It returns "" for a nil pod.
func ComputeKubeQOSClass(pod *corev1.Pod) corev1.PodQOSClass {
	if pod == nil {
		return ""
	}
	if pod.Spec.Resources != nil {
		return requirementsQOS(pod.Spec.Resources)
	}
	var podQOS corev1.PodQOSClass
	merge := func(c corev1.PodQOSClass) bool { // false: pod is Burstable
		switch {
		case c == corev1.PodQOSBurstable:
			return false
		case podQOS == "":
			podQOS = c
		case podQOS != c: // Guaranteed next to BestEffort
			return false
		}
		return true
	}
	for i := range pod.Spec.InitContainers {
		if !merge(requirementsQOS(&pod.Spec.InitContainers[i].Resources)) {
			return corev1.PodQOSBurstable
		}
	}
	for i := range pod.Spec.Containers {
		if !merge(requirementsQOS(&pod.Spec.Containers[i].Resources)) {
			return corev1.PodQOSBurstable
		}
	}
	if podQOS == "" { // no containers at all
		return corev1.PodQOSBestEffort
	}
	return podQOS
}

// requirementsQOS classifies one set of requests and limits on its own.
func requirementsQOS(r *corev1.ResourceRequirements) corev1.PodQOSClass {
	unset, guaranteed := 0, 0
	for _, name := range [...]corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := positive(r.Requests, name)
		lim, hasLim := positive(r.Limits, name)
		switch {
		case !hasReq && !hasLim:
			unset++
		case hasReq && hasLim && req.Cmp(lim) == 0:
			guaranteed++
		default:
			return corev1.PodQOSBurstable
		}
	}
	switch {
	case unset == 2:
		return corev1.PodQOSBestEffort
	case guaranteed == 2:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// positive returns list[name] when it is set and > 0.
func positive(list corev1.ResourceList, name corev1.ResourceName) (resource.Quantity, bool) {
	q, ok := list[name]
	if !ok || q.Sign() <= 0 {
		return resource.Quantity{}, false
	}
	return q, true
}
