// Package nodestatus holds the node agent's writers to the API server: the Node's batch
// resources (Publisher), its node-metrics annotations (NodeAnnotator), Warning events on
// the Node (NodeEvents) and the batch pod condition in pods/status
// (PodConditionWriter). None of them blocks the control loop: each stores the latest
// value and writes from its own goroutine, or sends through client-go's event
// broadcaster.
//
// Publisher publishes the batch extended resources (understory.io/batch-cpu in
// millicores, understory.io/batch-memory in bytes) in the status.capacity and
// status.allocatable of the agent's own Node, so that kube-scheduler and the extender
// count batch pods against what the agent reclaims; and the shared-GPU capacity
// understory.io/gpu-milli (1000 per GPU the agent shares), against which they count
// shared-GPU pods.
//
// The agent's control loop decides what and when (policy, deadband, damping) and hands
// the value to Publisher.Set, which only stores it (latest wins) and returns; the GPU
// inventory hands its capacity to Publisher.SetGPUMilli the same way. Each part is
// managed only once set: a node that never calls SetGPUMilli never gets the key. One writer
// goroutine (Publisher.Run) patches the Node, retries failures with a jittered,
// capped exponential back-off, and lets a newer value replace an older one that is still
// waiting for its retry. Publisher.Status is the snapshot for the agent's /status.
//
// Traps:
//   - Extended resources on a Node can only be set through the status subresource
//     (nodes/NAME/status); a patch of the Node itself silently drops status changes.
//   - kubelet patches the same status. The patch is a JSON merge patch naming only the
//     keys it manages: a merge patch of a map merges keys, so kubelet's cpu, memory, pods and
//     device-plugin entries are left alone. Never send whole capacity/allocatable maps.
//   - Capacity and allocatable must carry the same value: kubelet recomputes
//     allocatable from capacity (minus its reservations, none for these keys) at every
//     status update, so an allocatable written alone is reset within seconds.
//   - kubelet zeroes extended resources it does not manage when it re-registers a
//     recreated Node (reboot, lost checkpoint). The writer re-reads its Node every
//     resync interval and rewrites what differs; between two reads the Node may say 0.
//   - A Node whose status.allocatable is empty is not registered by kubelet yet:
//     writing would create allocatable maps holding only the batch keys. Nothing is
//     written until it has allocatable (logged once, retried with the back-off); a
//     Node that does not exist (404) is the same.
//   - The API server may canonicalise a quantity ("3000" is stored as "3k"); compare
//     quantities by value, never by string.
//   - The writer reads its Node before the first write and after every error, from the
//     API server's watch cache (resourceVersion "0"): one cheap GET, never a quorum read
//     from every node at once after an API server restart.
//   - understory.io/gpu-milli is the agent's, not the device plugin's: it does not
//     follow nvidia.com/gpu when NVIDIA's device plugin marks a GPU unhealthy. The agent
//     sets it from its own NVML inventory; set 0 (not nothing) when the GPUs went away,
//     or the last value stays on the Node.
//   - Set never blocks on the API: the mutex it takes is never held during a request,
//     and every request is bounded by its own timeout.
//   - Importing client-go's typed clients (or the fake clientset) outside tests links
//     every API group's scheme into the agent (~10 MiB resident, see
//     podsource.CoreClient); this package needs only the small NodeClient interface.
package nodestatus
