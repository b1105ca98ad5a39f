package devices

import "k8s.io/apimachinery/pkg/types"

// MPSRequest is one container asking, at its creation, whether and how it runs as a
// client of the node's MPS server on GPU.
type MPSRequest struct {
	// GPU is the device the container gets (the extender's annotation).
	GPU GPU
	// PodUID, Namespace, Name and Container name the container.
	PodUID          types.UID
	Namespace, Name string
	Container       string
	// Batch: the pod is of the batch class (client priority 1, a cap below 100).
	Batch bool
	// RequestMilli is the container's understory.io/gpu-milli request (0..1000).
	RequestMilli int64
	// Devices is how many GPUs the container gets (one request per GPU): the CUDA
	// device ordinals its memory limit covers.
	Devices int
}

// MPSClient is how a container runs as an MPS client: the environment the NRI plugin
// injects (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// CUDA_MPS_CLIENT_PRIORITY, and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where PinnedMemLimitMiB
// is set). The zero value is no client.
type MPSClient struct {
	PipeDir             string
	ActiveThreadPercent int
	Priority            int
	// PinnedMemLimitMiB is the device memory the client may allocate on each of its GPUs,
	// MiB; 0: no limit.
	PinnedMemLimitMiB uint64
}

// MPSPlanner decides a container's MPS client. ok is false (with no error) when the
// container is not to be an MPS client (MPS off or not ready for its GPU): it then runs
// time-sliced, and the agent's freeze protects LS. An error refuses the request.
type MPSPlanner interface {
	MPSClient(req MPSRequest) (MPSClient, bool, error)
}
