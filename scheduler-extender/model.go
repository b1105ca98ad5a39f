package extender

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
