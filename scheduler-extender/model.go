package extender

import (
	"github.com/understory/understory/scheduler-extender/placement"
)

// Names the extender alone reads (the shared ones, gpu-milli, batch-cpu, batch-memory,
// nvidia.com/gpu and gpu-devices, are package contract's).
const (
	// LabelGPUProduct is the node label naming its GPU model.
	LabelGPUProduct = "nvidia.com/gpu.product"
	// AnnotationGPUModel lists the GPU models a pod accepts, comma-separated.
	AnnotationGPUModel = "understory.io/gpu-model"
)

// ErrGPUModel is the reason a node's GPU model is refused (placement.ErrGPUModel);
// filter reports it verbatim.
var ErrGPUModel = placement.ErrGPUModel
