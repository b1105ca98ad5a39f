package koordlet

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/metrics"
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
	want := &metrics.GPUAllocation{Pods: []metrics.PodGPUs{
		{Namespace: "ml", Name: "train", UID: "u1", Devices: []int{0, 2}},
		{Namespace: "ml", Name: "unknown-pod", Devices: []int{1}},
		{Namespace: "ml", Name: "shared", Devices: []int{1}},
	}}
	if diff := cmp.Diff(want, allocation(in, inv, pods)); diff != "" {
		t.Fatalf("allocation (-want +got):\n%s", diff)
	}
}

func TestGPUConfigValidate(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*GPUConfig){
		"mode":       func(c *GPUConfig) { c.Mode = "on" },
		"loopPeriod": func(c *GPUConfig) { c.LoopPeriod.Duration = 0 },
		"throttle":   func(c *GPUConfig) { c.Throttle.MaxDuty = 2 },
		"suspend":    func(c *GPUConfig) { c.Suspend.Path = "" },
		"devices":    func(c *GPUConfig) { c.Devices.Mode = "magic" },
		"socket":     func(c *GPUConfig) { c.PodResourcesSocket = "relative.sock" },
	} {
		c := DefaultGPUConfig()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: bad config accepted", name)
		}
	}
	if err := DefaultGPUConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if _, err := LoadConfig([]byte("gpu:\n  mode: disabled\n  throttle:\n    maxDuty: 0.5\n    activeDuty: 0.2\n")); err != nil {
		t.Fatalf("loading a GPU config: %v", err)
	}
}
