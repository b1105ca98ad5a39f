package contract

// Resource names, annotations and labels that cross a binary boundary: one binary writes
// them, another (or kube-scheduler, or a user) reads them. Each is declared here once.
const (
	// ResourceBatchCPU is reclaimable batch CPU in millicores (1 = one millicore). The
	// node agent publishes it on its Node; the admission webhook moves an opted-in pod's
	// cpu requests and limits onto it; kube-scheduler and the extender count batch pods
	// against it; the agent enforces a batch pod's limit of it.
	ResourceBatchCPU = "understory.io/batch-cpu"
	// ResourceBatchMemory is reclaimable batch memory in bytes, like ResourceBatchCPU.
	ResourceBatchMemory = "understory.io/batch-memory"
	// ResourceGPUMilli is a share of one GPU, 1..MilliPerGPU: the agent publishes it on
	// GPU nodes, the extender places it and writes AnnotationGPUDevices, the agent's NRI
	// plugin gives the container those devices.
	ResourceGPUMilli = "understory.io/gpu-milli"
	// ResourceGPU is a whole GPU, allocated by NVIDIA's device plugin.
	ResourceGPU = "nvidia.com/gpu"
	// AnnotationGPUDevices holds the device indices the extender bound a gpu-milli pod
	// to (FormatGPUDevices; read with ParseGPUDevices). Only the extender's identity may
	// set or change it (the admission rules).
	AnnotationGPUDevices = "understory.io/gpu-devices"
	// AnnotationOriginalResources holds, as JSON, the cpu and memory requests and limits
	// a batch pod's containers had before the admission webhook moved them to the batch
	// resources (package admission).
	AnnotationOriginalResources = "understory.io/original-resources"
	// AnnotationQOSClass is a pod's class (LS, BE or batch), written by users or the
	// admission webhook and read by the agent (qos.Classify).
	AnnotationQOSClass = "understory.io/qos-class"
)
