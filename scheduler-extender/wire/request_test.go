package wire

import (
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
)

func podWith(containers, inits []corev1.ResourceList, ann map[string]string) *corev1.Pod {
	p := &corev1.Pod{}
	p.Annotations = ann
	for _, rl := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Requests: rl}})
	}
	for _, rl := range inits {
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "i", Resources: corev1.ResourceRequirements{Requests: rl}})
	}
	return p
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestPodRequest(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	sidecar := podWith([]corev1.ResourceList{rl("cpu", "1")}, []corev1.ResourceList{rl("cpu", "500m"), rl("cpu", "2")}, nil)
	sidecar.Spec.InitContainers[0].RestartPolicy = &always
	overhead := podWith([]corev1.ResourceList{rl("cpu", "1", "memory", "1Gi")}, nil, nil)
	overhead.Spec.Overhead = rl("cpu", "250m", "memory", "64Mi")
	limitsOnly := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
		Limits: rl(contract.ResourceGPU, "2")}}}}}

	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    placement.Request
		wantErr string
	}{
		{"cpu and memory summed", podWith([]corev1.ResourceList{rl("cpu", "1500m", "memory", "1Gi"), rl("cpu", "500m", "memory", "1")}, nil, nil),
			placement.Request{CPUMilli: 2000, MemoryMiB: 1025}, ""},
		{"init container max", podWith([]corev1.ResourceList{rl("cpu", "1")}, []corev1.ResourceList{rl("cpu", "3")}, nil),
			placement.Request{CPUMilli: 3000}, ""},
		{"sidecars add up", sidecar, placement.Request{CPUMilli: 2500}, ""},
		{"overhead", overhead, placement.Request{CPUMilli: 1250, MemoryMiB: 1088}, ""},
		{"whole gpus", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "2"), rl(contract.ResourceGPU, "1")}, nil, nil),
			placement.Request{NumGPU: 3, GPUMilli: 1000}, ""},
		{"gpu from limits", limitsOnly, placement.Request{NumGPU: 2, GPUMilli: 1000}, ""},
		{"one share", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "300")}, nil, nil), placement.Request{NumGPU: 1, GPUMilli: 300}, ""},
		{"full share", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "1000")}, nil, nil), placement.Request{NumGPU: 1, GPUMilli: 1000}, ""},
		{"share over one gpu", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "1001")}, nil, nil), placement.Request{}, "exceeds one gpu"},
		{"shares summed over containers", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "600"), rl(contract.ResourceGPUMilli, "600")}, nil, nil), placement.Request{}, "exceeds one gpu"},
		{"zero share", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "0")}, nil, nil), placement.Request{}, "must be 1..1000"},
		{"negative share", podWith([]corev1.ResourceList{rl(contract.ResourceGPUMilli, "-5")}, nil, nil), placement.Request{}, "negative"},
		{"fractional gpu", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "500m")}, nil, nil), placement.Request{}, "not a whole number"},
		{"both kinds", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "1", contract.ResourceGPUMilli, "100")}, nil, nil), placement.Request{}, "both"},
		{"too many gpus", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "65")}, nil, nil), placement.Request{}, "exceeds 64"},
		{"huge memory", podWith([]corev1.ResourceList{rl("memory", "10Ei")}, nil, nil), placement.Request{}, "too large"},
		{"batch resources", podWith([]corev1.ResourceList{rl(contract.ResourceBatchCPU, "1500", contract.ResourceBatchMemory, "2Gi")}, nil, nil),
			placement.Request{BatchCPUMilli: 1500, BatchMemoryMiB: 2048}, ""},
		{"Koordinator's batch resources", podWith([]corev1.ResourceList{rl(contract.ResourceKoordinatorBatchCPU, "1500",
			contract.ResourceKoordinatorBatchMemory, "2Gi")}, nil, nil), placement.Request{BatchCPUMilli: 1500, BatchMemoryMiB: 2048}, ""},
		{"Understory's name wins over the alias", podWith([]corev1.ResourceList{rl(contract.ResourceBatchCPU, "300",
			contract.ResourceKoordinatorBatchCPU, "1500")}, nil, nil), placement.Request{BatchCPUMilli: 300}, ""},
		{"models", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "1")}, nil, map[string]string{AnnotationGPUModel: " A100-SXM4-80GB , Tesla-T4,A100-SXM4-80GB"}),
			placement.Request{NumGPU: 1, GPUMilli: 1000, Models: []string{"A100-SXM4-80GB", "Tesla-T4"}}, ""},
		{"empty model list", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "1")}, nil, map[string]string{AnnotationGPUModel: " "}), placement.Request{}, "empty model list"},
		{"bad model", podWith([]corev1.ResourceList{rl(contract.ResourceGPU, "1")}, nil, map[string]string{AnnotationGPUModel: "a b"}), placement.Request{}, "model \"a b\""},
		{"nil pod", nil, placement.Request{}, "no pod"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := PodRequest(tc.pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalidPod) {
					t.Fatalf("err %v, want %q wrapping ErrInvalidPod", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.CPUMilli != tc.want.CPUMilli || got.MemoryMiB != tc.want.MemoryMiB || got.NumGPU != tc.want.NumGPU ||
				got.GPUMilli != tc.want.GPUMilli || !slices.Equal(got.Models, tc.want.Models) ||
				got.BatchCPUMilli != tc.want.BatchCPUMilli || got.BatchMemoryMiB != tc.want.BatchMemoryMiB {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestParseModelsRefusesLongListsCheaply: the annotation is the tenant's, up to the
// API server's 256 KiB; a list over maxModels is refused before any string of it is
// made. Not parallel: it measures the bytes this goroutine allocates.
func TestParseModelsRefusesLongListsCheaply(t *testing.T) {
	s := strings.Repeat("A100,", 50_000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ParseModels(s)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrInvalidPod) || !strings.Contains(err.Error(), "50001 models exceed 32") {
		t.Fatalf("ParseModels of 50 001 models: %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Fatalf("refusing 50 001 models allocated %d bytes, want a few hundred", n)
	}
}

func FuzzParseModels(f *testing.F) {
	for _, s := range []string{"A100", "a, b", "", ",", "Tesla-T4,NVIDIA-A100-SXM4-80GB", "x y", strings.Repeat("a,", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseModels(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidPod) {
				t.Fatalf("error %v does not wrap ErrInvalidPod", err)
			}
			return
		}
		if len(ms) == 0 || len(ms) > maxModels {
			t.Fatalf("%q gave %d models", s, len(ms))
		}
		for _, m := range ms {
			if m == "" || strings.ContainsAny(m, ", \t") || len(m) > 63 {
				t.Fatalf("%q gave bad model %q", s, m)
			}
		}
	})
}

// FuzzPodRequest feeds arbitrary quantities and annotations through PodRequest:
// it must never panic, and whatever it accepts must be a valid request.
func FuzzPodRequest(f *testing.F) {
	f.Add("2", "", "100m", "1Gi", "", "", "A100")
	f.Add("", "500", "1", "0", "1000", "1Mi", "")
	f.Add("1", "1", "-1", "1", "1", "1", "a,,b")
	f.Add("1e3", "1.5", "9Ei", "1e100", "x", "", "x y")
	f.Fuzz(func(t *testing.T, gpu, gpuMilli, cpuQ, memQ, batchCPU, batchMem, models string) {
		res := corev1.ResourceList{}
		for name, v := range map[corev1.ResourceName]string{contract.ResourceGPU: gpu, contract.ResourceGPUMilli: gpuMilli,
			corev1.ResourceCPU: cpuQ, corev1.ResourceMemory: memQ, contract.ResourceBatchCPU: batchCPU, contract.ResourceBatchMemory: batchMem} {
			if q, err := resource.ParseQuantity(v); err == nil {
				res[name] = q
			}
		}
		pod := podWith([]corev1.ResourceList{res}, []corev1.ResourceList{res}, map[string]string{AnnotationGPUModel: models})
		r, err := PodRequest(pod)
		if err != nil {
			if !errors.Is(err, ErrInvalidPod) {
				t.Fatalf("error %v does not wrap ErrInvalidPod", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted invalid request %+v: %v", r, err)
		}
		if r.CPUMilli < 0 || r.MemoryMiB < 0 || r.BatchCPUMilli < 0 || r.BatchMemoryMiB < 0 {
			t.Fatalf("negative request %+v", r)
		}
	})
}
