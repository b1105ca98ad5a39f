package koordlet

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/google/go-cmp/cmp"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/qos"
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

func TestGPUConfigValidate(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*GPUConfig){
		"mode":       func(c *GPUConfig) { c.Mode = "on" },
		"loopPeriod": func(c *GPUConfig) { c.LoopPeriod.Duration = 0 },
		"fullScrapePeriod below loopPeriod": func(c *GPUConfig) {
			c.LoopPeriod.Duration, c.FullScrapePeriod.Duration = 100*time.Millisecond, 50*time.Millisecond
		},
		"fullScrapePeriod zero":     func(c *GPUConfig) { c.FullScrapePeriod.Duration = 0 },
		"fullScrapePeriod too long": func(c *GPUConfig) { c.FullScrapePeriod.Duration = 11 * time.Second },
		"throttle":                  func(c *GPUConfig) { c.Throttle.LSUtilOnPercent = 200 },
		"throttle mps":              func(c *GPUConfig) { c.Throttle.MPS.MaxBatchPercent = 100 },
		"suspend":                   func(c *GPUConfig) { c.Suspend.Path = "" },
		"devices":                   func(c *GPUConfig) { c.Devices.Mode = "magic" },
		"socket":                    func(c *GPUConfig) { c.PodResourcesSocket = "relative.sock" },
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
	cfg, err := LoadConfig([]byte("gpu:\n  mode: disabled\n  throttle:\n    hold: 2s\n    lsUtilOnPercent: 5\n" +
		"    mps:\n      maxBatchPercent: 20\n"))
	if err != nil || cfg.GPU.Throttle.Hold.Duration != 2*time.Second || cfg.GPU.Throttle.MPS.MaxBatchPercent != 20 {
		t.Fatalf("loading a GPU config: %+v, %v", cfg.GPU.Throttle, err)
	}
	// The fractional duty cycle's keys are refused, naming the key and what replaces it.
	for _, key := range []string{"maxDuty: 0.5", "activeDuty: 0.2", "restorePerSecond: 0.1"} {
		_, err := LoadConfig([]byte("gpu:\n  throttle:\n    " + key + "\n"))
		name := strings.SplitN(key, ":", 2)[0]
		if !errors.Is(err, qos.ErrInvalidConfig) || !errors.Is(err, qos.ErrGPUThrottleKeyRemoved) ||
			!strings.Contains(err.Error(), "gpu.throttle: gpu throttle "+name) || !strings.Contains(err.Error(), "frozen solid") {
			t.Errorf("%s: %v", key, err)
		}
	}
	for yaml, want := range map[string]time.Duration{
		"gpu:\n  fullScrapePeriod: 2s\n":                         2 * time.Second,
		"gpu:\n  loopPeriod: 100ms\n  fullScrapePeriod: 100ms\n": 100 * time.Millisecond,
	} {
		cfg, err := LoadConfig([]byte(yaml))
		if err != nil || cfg.GPU.FullScrapePeriod.Duration != want {
			t.Errorf("%q: full-scrape period %v, %v; want %v", yaml, cfg.GPU.FullScrapePeriod.Duration, err, want)
		}
	}
	if _, err := LoadConfig([]byte("gpu:\n  loopPeriod: 2s\n")); err == nil {
		t.Error("a loop period above the default full-scrape period (1s) was accepted")
	}
}

// TestPublishGPUPods: the snapshot carries every field the GPU loop reads, for every pod.
func TestPublishGPUPods(t *testing.T) {
	t.Parallel()
	if n := reflect.TypeFor[gpu.PodInfo]().NumField(); n != 9 {
		t.Fatalf("gpu.PodInfo has %d fields: fill the new ones in gpuBridge.publish, then fix this count", n)
	}
	started := time.Unix(1_700_000_000, 0)
	b := &gpuBridge{mgr: &gpu.Manager{}}
	b.publish([]*podState{
		{uid: "u1", namespace: "ml", name: "train", class: qos.ClassBatch, read: podRead{cgroup: "kubepods/pod-u1"},
			terminating: true, spec: podSpec{priority: 5, started: started, containers: map[string]string{"c1": "trainer"}}},
		{uid: "u2", namespace: "web", name: "infer", class: qos.ClassLS},
	})
	want := gpu.PodMap{
		"u1": {UID: "u1", Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: "kubepods/pod-u1",
			Containers: map[string]string{"c1": "trainer"}, Priority: 5, StartTime: started, Terminating: true},
		"u2": {UID: "u2", Namespace: "web", Name: "infer", Class: qos.ClassLS},
	}
	if diff := cmp.Diff(want, b.podView()); diff != "" {
		t.Fatalf("snapshot (-want +got):\n%s", diff)
	}
}

// TestAgentRepublishesGPUPods: the control loop hands the GPU loop a new snapshot on the
// next slow period after a pod changed (here: one became terminating), and keeps the old
// one while nothing changed.
func TestAgentRepublishesGPUPods(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	r.agent.gpu.mgr = &gpu.Manager{} // the snapshot is kept only with GPU features on
	for i := 0; i < 2*slowEvery; i++ {
		r.step(0.5, nil)
	}
	first := r.agent.gpu.pods.Load()
	if first == nil || len(*first) != 4 {
		t.Fatalf("snapshot %v, want the rig's 4 pods", first)
	}
	for i := 0; i < slowEvery; i++ {
		r.step(0.5, nil)
	}
	if r.agent.gpu.pods.Load() != first {
		t.Fatal("snapshot replaced although no pod changed")
	}
	r.changePods(func(i int, p *corev1.Pod) {
		if i == 1 {
			p.DeletionTimestamp = &metav1.Time{Time: r.now}
		}
	})
	for i := 0; i < slowEvery; i++ {
		r.step(0.5, nil)
	}
	if p, ok := r.agent.gpu.podView().Pod(batchUID1); !ok || !p.Terminating {
		t.Fatalf("pod after the change %+v (found %t), want terminating", p, ok)
	}
}
