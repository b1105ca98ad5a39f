package qos_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/qos"
)

func TestComputeKubeQOSClass(t *testing.T) {
	t.Parallel()
	const (
		G  = corev1.PodQOSGuaranteed
		Bu = corev1.PodQOSBurstable
		BE = corev1.PodQOSBestEffort
	)
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name     string
		init     []corev1.ResourceRequirements
		sidecars []corev1.ResourceRequirements // init containers with restartPolicy Always
		regular  []corev1.ResourceRequirements
		eph      []corev1.ResourceRequirements
		podLevel *corev1.ResourceRequirements
		want     corev1.PodQOSClass
	}{
		{name: "no containers", want: BE},
		{name: "one empty container", regular: []corev1.ResourceRequirements{bestEffort()}, want: BE},
		{name: "equal cpu+mem", regular: []corev1.ResourceRequirements{guaranteed()}, want: G},
		{name: "two guaranteed()", regular: []corev1.ResourceRequirements{guaranteed(), res("cpu=2,memory=1", "cpu=2,memory=1")}, want: G},
		{name: "equal in different units", regular: []corev1.ResourceRequirements{res("cpu=1,memory=1Gi", "cpu=1000m,memory=1024Mi")}, want: G},
		{name: "limits only (undefaulted)", regular: []corev1.ResourceRequirements{res("", "cpu=1,memory=1Gi")}, want: Bu},
		{name: "requests only", regular: []corev1.ResourceRequirements{res("cpu=1,memory=1Gi", "")}, want: Bu},
		{name: "cpu only, equal", regular: []corev1.ResourceRequirements{res("cpu=1", "cpu=1")}, want: Bu},
		{name: "memory only, equal", regular: []corev1.ResourceRequirements{res("memory=1Gi", "memory=1Gi")}, want: Bu},
		{name: "request below limit", regular: []corev1.ResourceRequirements{res("cpu=500m,memory=1Gi", "cpu=1,memory=1Gi")}, want: Bu},
		{name: "guaranteed + besteffort", regular: []corev1.ResourceRequirements{guaranteed(), bestEffort()}, want: Bu},
		{name: "besteffort + guaranteed()", regular: []corev1.ResourceRequirements{bestEffort(), guaranteed()}, want: Bu},
		{name: "burstable + guaranteed()", regular: []corev1.ResourceRequirements{burstable(), guaranteed()}, want: Bu},
		{name: "only other resources", regular: []corev1.ResourceRequirements{res("ephemeral-storage=1Gi,nvidia.com/gpu=1", "nvidia.com/gpu=1")}, want: BE},
		{name: "other resources do not break guaranteed()",
			regular: []corev1.ResourceRequirements{res("cpu=1,memory=1Gi,nvidia.com/gpu=1", "cpu=1,memory=1Gi,nvidia.com/gpu=2")}, want: G},
		{name: "hugepages ignored", regular: []corev1.ResourceRequirements{res("cpu=1,memory=1Gi,hugepages-2Mi=2Mi", "cpu=1,memory=1Gi")}, want: G},
		{name: "zero quantities are unset", regular: []corev1.ResourceRequirements{res("cpu=0,memory=0", "cpu=0,memory=0")}, want: BE},
		{name: "zero limit not guaranteed()", regular: []corev1.ResourceRequirements{res("cpu=1,memory=1Gi", "cpu=0,memory=1Gi")}, want: Bu},

		// Init containers count.
		{name: "burstable init", init: []corev1.ResourceRequirements{burstable()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: Bu},
		{name: "guaranteed init + guaranteed()", init: []corev1.ResourceRequirements{guaranteed()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: G},
		{name: "empty init + guaranteed()", init: []corev1.ResourceRequirements{bestEffort()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: Bu},
		{name: "init with resources, app without", init: []corev1.ResourceRequirements{guaranteed()},
			regular: []corev1.ResourceRequirements{bestEffort()}, want: Bu},
		{name: "only init, requests", init: []corev1.ResourceRequirements{burstable()}, want: Bu},
		{name: "sidecar counts", sidecars: []corev1.ResourceRequirements{burstable()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: Bu},
		{name: "guaranteed sidecar", sidecars: []corev1.ResourceRequirements{guaranteed()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: G},

		// Ephemeral containers do not count (they cannot set resources, but
		// make sure a hand-built object with some is not misread).
		{name: "ephemeral ignored", eph: []corev1.ResourceRequirements{burstable()},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: G},

		// Pod-level resources override containers.
		{name: "pod-level guaranteed() over burstable() containers", podLevel: ptr(guaranteed()),
			regular: []corev1.ResourceRequirements{burstable(), bestEffort()}, want: G},
		{name: "pod-level burstable() over guaranteed() containers", podLevel: ptr(burstable()),
			regular: []corev1.ResourceRequirements{guaranteed()}, want: Bu},
		{name: "pod-level empty is besteffort", podLevel: &corev1.ResourceRequirements{},
			regular: []corev1.ResourceRequirements{guaranteed()}, want: BE},
		{name: "pod-level requests only", podLevel: ptr(res("cpu=1,memory=1Gi", "")),
			regular: []corev1.ResourceRequirements{guaranteed()}, want: Bu},
		{name: "pod-level cpu limit only", podLevel: ptr(res("cpu=1", "cpu=1")), want: Bu},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := podWith(nil, nil, tt.regular...)
			for _, r := range tt.init {
				p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "i", Resources: r})
			}
			for _, r := range tt.sidecars {
				p.Spec.InitContainers = append(p.Spec.InitContainers,
					corev1.Container{Name: "s", Resources: r, RestartPolicy: &always})
			}
			for _, r := range tt.eph {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
					EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "e", Resources: r},
				})
			}
			p.Spec.Resources = tt.podLevel
			if got := qos.ComputeKubeQOSClass(p); got != tt.want {
				t.Errorf("ComputeKubeQOSClass = %q, want %q", got, tt.want)
			}
			// Without a status, KubeQOSClass computes the same thing.
			if got := qos.KubeQOSClass(p); got != tt.want {
				t.Errorf("KubeQOSClass = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKubeQOSClassPrefersStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status corev1.PodQOSClass
		spec   corev1.ResourceRequirements
		want   corev1.PodQOSClass
	}{
		{"status set", corev1.PodQOSBurstable, guaranteed(), corev1.PodQOSBurstable},
		{"status empty", "", guaranteed(), corev1.PodQOSGuaranteed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := podWith(nil, nil, tt.spec)
			p.Status.QOSClass = tt.status
			if got := qos.KubeQOSClass(p); got != tt.want {
				t.Errorf("KubeQOSClass = %q, want %q", got, tt.want)
			}
		})
	}
	if got := qos.KubeQOSClass(nil); got != "" {
		t.Errorf("KubeQOSClass(nil) = %q, want empty", got)
	}
	if got := qos.ComputeKubeQOSClass(nil); got != "" {
		t.Errorf("ComputeKubeQOSClass(nil) = %q, want empty", got)
	}
}

func ptr[T any](v T) *T { return &v }
