package qos

// Extended resources and annotations that carry a batch pod's CPU and memory. The node
// agent publishes the resources on its Node; the admission webhook moves an opted-in
// pod's cpu and memory requests and limits onto them; kube-scheduler and the extender
// count batch pods against them; the agent enforces a batch pod's limits of them.
const (
	// ResourceBatchCPU is reclaimable batch CPU in millicores (1 = one millicore).
	ResourceBatchCPU = "understory.io/batch-cpu"
	// ResourceBatchMemory is reclaimable batch memory in bytes.
	ResourceBatchMemory = "understory.io/batch-memory"
	// AnnotationOriginalResources holds, as JSON, the cpu and memory requests and
	// limits a batch pod's containers had before the admission webhook moved them to
	// the batch resources (see package admission).
	AnnotationOriginalResources = "understory.io/original-resources"
)
