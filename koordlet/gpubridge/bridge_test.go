package gpubridge

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/podsource"
)

// TestAllocation: kubelet's device IDs become GPU indices, its pods get the UIDs the
// agent knows; IDs of no known GPU (MIG, another plugin) are dropped.
func TestAllocation(t *testing.T) {
	t.Parallel()
	inv := []devices.GPU{{Index: 0, UUID: "GPU-aaa"}, {Index: 1, UUID: "GPU-bbb"}, {Index: 2, UUID: "GPU-ccc"}}
	pods := gpu.PodMap{"u1": {UID: "u1", Namespace: "ml", Name: "train"}}
	in := podsource.DeviceAllocation{Resource: "nvidia.com/gpu", Pods: []podsource.PodDevices{
		{Namespace: "ml", Name: "train", IDs: []string{"GPU-ccc", "GPU-aaa"}},
		{Namespace: "ml", Name: "unknown-pod", IDs: []string{"1"}},
		{Namespace: "ml", Name: "shared", IDs: []string{"GPU-bbb::0", "GPU-bbb::1"}},
		{Namespace: "ml", Name: "mig", IDs: []string{"MIG-0123"}},
	}}
	want := &contract.GPUAllocation{Pods: []contract.PodGPUs{
		{Namespace: "ml", Name: "train", UID: "u1", Devices: []int{0, 2}},
		{Namespace: "ml", Name: "unknown-pod", Devices: []int{1}},
		{Namespace: "ml", Name: "shared", Devices: []int{1}},
	}}
	if diff := cmp.Diff(want, allocation(in, inv, pods)); diff != "" {
		t.Fatalf("allocation (-want +got):\n%s", diff)
	}
}
