package extender

import "github.com/understory/understory/scheduler-extender/placement"

// Resource names and annotations the extender manages.
const (
	// ResourceGPU is a whole-GPU request (device plugin resource).
	ResourceGPU = "nvidia.com/gpu"
	// ResourceGPUMilli is a fractional share of one GPU, 1..1000.
	ResourceGPUMilli = "understory.io/gpu-milli"
	// ResourceBatchCPU is reclaimable batch CPU (millicores) published by the node agent.
	ResourceBatchCPU = "understory.io/batch-cpu"
	// ResourceBatchMemory is reclaimable batch memory (bytes) published by the node agent.
	ResourceBatchMemory = "understory.io/batch-memory"
	// LabelGPUProduct is the node label naming its GPU model.
	LabelGPUProduct = "nvidia.com/gpu.product"
	// AnnotationGPUModel lists the GPU models a pod accepts, comma-separated.
	AnnotationGPUModel = "understory.io/gpu-model"
	// AnnotationGPUDevices holds the device indices bound to a pod, comma-separated.
	AnnotationGPUDevices = "understory.io/gpu-devices"
)

// MilliPerGPU is the capacity of one GPU in milli-GPU (placement.MilliPerGPU),
// the unit of /status and of understory.io/gpu-milli.
const MilliPerGPU = placement.MilliPerGPU

// ErrGPUModel is the reason a node's GPU model is refused (placement.ErrGPUModel);
// filter reports it verbatim.
var ErrGPUModel = placement.ErrGPUModel
