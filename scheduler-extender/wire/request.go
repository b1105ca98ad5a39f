package wire

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/placement"
)

// ErrInvalidPod means a pod's resources or annotations cannot be turned into a Request.
// It is a user error: retrying on another node cannot help until the pod changes.
var ErrInvalidPod = errors.New("invalid pod")

const (
	mib = 1 << 20
	// maxModels bounds the models one understory.io/gpu-model annotation may list.
	maxModels = 32
	// AnnotationGPUModel lists the GPU models a pod accepts, comma-separated.
	AnnotationGPUModel = "understory.io/gpu-model"
	// sharedModelSuffix is what the device plugin's sharing appends to the product
	// label (renameByDefault false): NVIDIA-H100-80GB-HBM3-SHARED.
	sharedModelSuffix = "-SHARED"
)

// PodRequest turns a pod into what it asks of a node. CPU and memory follow
// kube-scheduler's accounting: the sum over app containers and restartable
// (sidecar) init containers, at least the largest plain init container plus the
// sidecars started before it, plus pod overhead. GPUs come from nvidia.com/gpu
// (whole GPUs) or understory.io/gpu-milli (one share of a single GPU, 1..1000);
// accepted models from the understory.io/gpu-model annotation. The error wraps
// ErrInvalidPod and names the offending field.
func PodRequest(pod *corev1.Pod) (placement.Request, error) {
	var r placement.Request
	if pod == nil {
		return r, fmt.Errorf("no pod: %w", ErrInvalidPod)
	}
	sum, err := podSums(pod)
	if err != nil {
		return r, err
	}
	r.CPUMilli = sum.cpuMilli
	r.MemoryMiB = ceilDiv(sum.memBytes, mib)
	r.BatchCPUMilli = sum.batchCPU
	r.BatchMemoryMiB = ceilDiv(sum.batchMem, mib)
	switch {
	case sum.gpus > 0 && sum.milli > 0:
		return r, fmt.Errorf("pod asks for both %s and %s: %w", contract.ResourceGPU, contract.ResourceGPUMilli, ErrInvalidPod)
	case sum.gpus > contract.MaxGPUsPerNode:
		return r, fmt.Errorf("%s %d exceeds %d: %w", contract.ResourceGPU, sum.gpus, contract.MaxGPUsPerNode, ErrInvalidPod)
	case sum.gpus > 0:
		r.NumGPU, r.GPUMilli = int(sum.gpus), contract.MilliPerGPU
	case sum.milli > contract.MilliPerGPU:
		return r, fmt.Errorf("%s %d exceeds one gpu (%d): %w", contract.ResourceGPUMilli, sum.milli, contract.MilliPerGPU, ErrInvalidPod)
	case sum.milli > 0:
		r.NumGPU, r.GPUMilli = 1, int(sum.milli)
	}
	if v, ok := pod.Annotations[AnnotationGPUModel]; ok {
		models, err := ParseModels(v)
		if err != nil {
			return r, fmt.Errorf("annotation %s: %w", AnnotationGPUModel, err)
		}
		r.Models = models
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("pod request: %w: %w", ErrInvalidPod, err)
	}
	return r, nil
}

// podSum is one container's (or the pod's) demand in base units.
type podSum struct {
	cpuMilli, memBytes, batchCPU, batchMem, gpus, milli int64
}

func (a podSum) add(b podSum) podSum {
	return podSum{a.cpuMilli + b.cpuMilli, a.memBytes + b.memBytes, a.batchCPU + b.batchCPU,
		a.batchMem + b.batchMem, a.gpus + b.gpus, a.milli + b.milli}
}

func (a podSum) max(b podSum) podSum {
	return podSum{max(a.cpuMilli, b.cpuMilli), max(a.memBytes, b.memBytes), max(a.batchCPU, b.batchCPU),
		max(a.batchMem, b.batchMem), max(a.gpus, b.gpus), max(a.milli, b.milli)}
}

// maxQuantity bounds every quantity so sums cannot overflow (2^50 ≈ 1 PiB or 10^12 cores).
const maxQuantity = 1 << 50

func podSums(pod *corev1.Pod) (podSum, error) {
	var app, sidecars, initMax podSum
	for i := range pod.Spec.Containers {
		c, err := containerSum(&pod.Spec.Containers[i])
		if err != nil {
			return podSum{}, err
		}
		app = app.add(c)
	}
	for i := range pod.Spec.InitContainers {
		ic := &pod.Spec.InitContainers[i]
		c, err := containerSum(ic)
		if err != nil {
			return podSum{}, err
		}
		if ic.RestartPolicy != nil && *ic.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars = sidecars.add(c)
			initMax = initMax.max(sidecars)
			continue
		}
		initMax = initMax.max(sidecars.add(c))
	}
	total := app.add(sidecars).max(initMax)
	if ov := pod.Spec.Overhead; ov != nil {
		o, err := resourceSum("overhead", ov, nil)
		if err != nil {
			return podSum{}, err
		}
		total.cpuMilli += o.cpuMilli
		total.memBytes += o.memBytes
	}
	return total, nil
}

func containerSum(c *corev1.Container) (podSum, error) {
	return resourceSum("container "+c.Name, c.Resources.Requests, c.Resources.Limits)
}

// resourceSum reads one container's requests; extended resources fall back to the
// limit when no request is given (the API server defaults them to be equal).
func resourceSum(what string, req, lim corev1.ResourceList) (podSum, error) {
	var s podSum
	get := func(name corev1.ResourceName) (resource.Quantity, bool) {
		if q, ok := req[name]; ok {
			return q, true
		}
		q, ok := lim[name]
		return q, ok
	}
	if q, ok := req[corev1.ResourceCPU]; ok {
		if q.Sign() < 0 || q.Cmp(*resource.NewQuantity(maxQuantity/1000, resource.DecimalSI)) > 0 {
			return s, fmt.Errorf("%s: cpu %s out of range: %w", what, q.String(), ErrInvalidPod)
		}
		s.cpuMilli = q.MilliValue()
	}
	if q, ok := req[corev1.ResourceMemory]; ok {
		v, err := boundedInt(q, false)
		if err != nil {
			return s, fmt.Errorf("%s: memory %s: %w: %w", what, q.String(), ErrInvalidPod, err)
		}
		s.memBytes = v
	}
	for _, f := range []struct {
		name corev1.ResourceName
		dst  *int64
	}{
		{contract.ResourceGPU, &s.gpus}, {contract.ResourceGPUMilli, &s.milli},
		{contract.ResourceBatchCPU, &s.batchCPU}, {contract.ResourceBatchMemory, &s.batchMem},
	} {
		q, ok := get(f.name)
		if alias := corev1.ResourceName(contract.KoordinatorAlias(string(f.name))); !ok && alias != "" {
			// Koordinator's name for it, on a pod the admission webhook did not rename.
			q, ok = get(alias)
		}
		if !ok {
			continue
		}
		v, err := boundedInt(q, true)
		if err != nil {
			return s, fmt.Errorf("%s: %s %s: %w: %w", what, f.name, q.String(), ErrInvalidPod, err)
		}
		*f.dst = v
	}
	if s.milli < 0 || (s.milli == 0 && hasResource(req, lim, contract.ResourceGPUMilli)) {
		return s, fmt.Errorf("%s: %s must be 1..%d: %w", what, contract.ResourceGPUMilli, contract.MilliPerGPU, ErrInvalidPod)
	}
	return s, nil
}

func hasResource(req, lim corev1.ResourceList, name corev1.ResourceName) bool {
	_, a := req[name]
	_, b := lim[name]
	return a || b
}

var (
	errNegative   = errors.New("negative")
	errNotInteger = errors.New("not a whole number")
	errTooLarge   = errors.New("too large")
)

// boundedInt is q as a non-negative int64 below maxQuantity; integer demands a whole number.
func boundedInt(q resource.Quantity, integer bool) (int64, error) {
	if q.Sign() < 0 {
		return 0, errNegative
	}
	if q.Cmp(*resource.NewQuantity(maxQuantity, resource.DecimalSI)) > 0 {
		return 0, errTooLarge
	}
	v := q.Value() // rounds up fractions
	if integer && q.Cmp(*resource.NewQuantity(v, resource.DecimalSI)) != 0 {
		return 0, errNotInteger
	}
	return v, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// ParseModels parses the understory.io/gpu-model annotation: a comma-separated list
// of GPU model names as they appear in the nvidia.com/gpu.product label. Blanks
// around names are ignored, the device plugin's -SHARED suffix is dropped
// (NormalizeModel), duplicates too; an empty list, an empty entry or a name that
// is not a valid label value is an error.
func ParseModels(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty model list: %w", ErrInvalidPod)
	}
	// Counted before splitting: the annotation is the tenant's, up to the API server's
	// 256 KiB, and a split would allocate a string for every comma.
	if n := strings.Count(s, ",") + 1; n > maxModels {
		return nil, fmt.Errorf("%d models exceed %d: %w", n, maxModels, ErrInvalidPod)
	}
	parts := strings.Split(s, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("model %d is empty: %w", i, ErrInvalidPod)
		}
		if errs := validation.IsValidLabelValue(p); len(errs) > 0 {
			return nil, fmt.Errorf("model %q: %s: %w", p, strings.Join(errs, "; "), ErrInvalidPod)
		}
		if p = NormalizeModel(p); p == "" {
			return nil, fmt.Errorf("model %d is only %q: %w", i, sharedModelSuffix, ErrInvalidPod)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// NormalizeModel is a GPU model name as model constraints compare it: without
// the -SHARED suffix NVIDIA's device plugin adds to nvidia.com/gpu.product when it
// shares the GPUs (time-slicing, MPS), which names the sharing, not the model.
func NormalizeModel(model string) string {
	return strings.TrimSuffix(strings.TrimSpace(model), sharedModelSuffix)
}

// RequestKey identifies a request shape (placement.Request holds a slice: it is
// no map key).
type RequestKey struct {
	cpu, mem, bcpu, bmem int64
	num, milli           int
	models               string
}

// KeyOf is r's shape.
func KeyOf(r placement.Request) RequestKey {
	return RequestKey{r.CPUMilli, r.MemoryMiB, r.BatchCPUMilli, r.BatchMemoryMiB, r.NumGPU, r.GPUMilli, strings.Join(r.Models, ",")}
}
