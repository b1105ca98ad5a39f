package metrics

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const gpuHelp = `
# HELP understory_gpu_available 1 when the agent can read the node's GPUs through NVML, else 0 (built without cgo, no NVIDIA driver or library, NVML init failed).
# TYPE understory_gpu_available gauge
`

// twoGPUs is a node with one busy, shared GPU and one lost GPU.
func twoGPUs() GPUSnapshot {
	return GPUSnapshot{Available: true, CollectSeconds: 0.0125, Devices: []GPUDeviceUsage{
		{Index: 1, UUID: "GPU-bbbb", Model: "NVIDIA A100-SXM4-40GB", Healthy: false,
			Util: 99, MemUsed: 1, MemTotal: 2, Pods: []GPUPodUsage{{Namespace: "x", Pod: "y", Util: 50}}},
		{Index: 0, UUID: "GPU-aaaa", Model: "NVIDIA A100-SXM4-40GB", Healthy: true,
			Util: 75, MemUtil: 20, MemUsed: 12 << 30, MemTotal: 40 << 30, Pods: []GPUPodUsage{
				{Namespace: "shop", Pod: "web-0", Container: "infer", Util: 60, MemUtil: 15, MemUsed: 4 << 30},
				{Namespace: "ml", Pod: "train-0", Container: "trainer", Util: 10, MemUtil: 4, MemUsed: 6 << 30},
				// A second process of the same container: summed.
				{Namespace: "ml", Pod: "train-0", Container: "trainer", Util: 5, MemUtil: 1, MemUsed: 2 << 30},
			}},
	}}
}

func TestGPUMetricsGolden(t *testing.T) {
	t.Parallel()
	mig := GPUSnapshot{Available: true, CollectSeconds: 0.002, Devices: []GPUDeviceUsage{
		{Index: 0, UUID: "GPU-cccc", Model: "NVIDIA H100 80GB HBM3", Healthy: true, UtilUnknown: true,
			MemUsed: 1 << 30, MemTotal: 80 << 30, Pods: []GPUPodUsage{
				{Namespace: "ml", Pod: "p", Container: "c", MemUsed: 1 << 30}}},
	}}
	for _, tc := range []struct {
		name   string
		update *GPUSnapshot // nil: never updated
		want   string
	}{
		{name: "before the first update", want: gpuHelp + "understory_gpu_available 0\n"},
		{name: "no NVML", update: &GPUSnapshot{Available: false, CollectSeconds: 1,
			Devices: twoGPUs().Devices}, want: gpuHelp + "understory_gpu_available 0\n"},
		{name: "two GPUs, one lost", update: ptr(twoGPUs()), want: gpuHelp + `understory_gpu_available 1
# HELP understory_gpu_collect_duration_seconds Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).
# TYPE understory_gpu_collect_duration_seconds gauge
understory_gpu_collect_duration_seconds 0.0125
# HELP understory_gpu_healthy 1 when every NVML query of the GPU succeeded in the last scrape, else 0 (its other series are then left out).
# TYPE understory_gpu_healthy gauge
understory_gpu_healthy{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 1
understory_gpu_healthy{UUID="GPU-bbbb",gpu="1",modelName="NVIDIA A100-SXM4-40GB"} 0
# HELP understory_gpu_memory_total_bytes GPU memory installed.
# TYPE understory_gpu_memory_total_bytes gauge
understory_gpu_memory_total_bytes{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 4.294967296e+10
# HELP understory_gpu_memory_used_bytes GPU memory in use.
# TYPE understory_gpu_memory_used_bytes gauge
understory_gpu_memory_used_bytes{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 1.2884901888e+10
# HELP understory_gpu_memory_utilization_ratio GPU memory controller utilisation over the driver's last sample period, 0..1.
# TYPE understory_gpu_memory_utilization_ratio gauge
understory_gpu_memory_utilization_ratio{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.2
# HELP understory_gpu_pod_memory_used_bytes GPU memory held by a container's compute processes.
# TYPE understory_gpu_pod_memory_used_bytes gauge
understory_gpu_pod_memory_used_bytes{UUID="GPU-aaaa",container="infer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="shop",pod="web-0"} 4.294967296e+09
understory_gpu_pod_memory_used_bytes{UUID="GPU-aaaa",container="trainer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="ml",pod="train-0"} 8.589934592e+09
# HELP understory_gpu_pod_memory_utilization_ratio A container's share of the GPU's memory controller over the driver's last per-process sample, 0..1.
# TYPE understory_gpu_pod_memory_utilization_ratio gauge
understory_gpu_pod_memory_utilization_ratio{UUID="GPU-aaaa",container="infer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="shop",pod="web-0"} 0.15
understory_gpu_pod_memory_utilization_ratio{UUID="GPU-aaaa",container="trainer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="ml",pod="train-0"} 0.05
# HELP understory_gpu_pod_utilization_ratio A container's share of the GPU's SM time in the driver's newest per-process sample, 0..1, held between the driver's samples (0 once it is seen idle).
# TYPE understory_gpu_pod_utilization_ratio gauge
understory_gpu_pod_utilization_ratio{UUID="GPU-aaaa",container="infer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="shop",pod="web-0"} 0.6
understory_gpu_pod_utilization_ratio{UUID="GPU-aaaa",container="trainer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="ml",pod="train-0"} 0.15
# HELP understory_gpu_utilization_ratio GPU (SM) utilisation over the driver's last sample period, 0..1 (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL / 100).
# TYPE understory_gpu_utilization_ratio gauge
understory_gpu_utilization_ratio{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.75
`},
		{name: "MIG: utilisation unknown, left out", update: &mig, want: gpuHelp + `understory_gpu_available 1
# HELP understory_gpu_collect_duration_seconds Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).
# TYPE understory_gpu_collect_duration_seconds gauge
understory_gpu_collect_duration_seconds 0.002
# HELP understory_gpu_healthy 1 when every NVML query of the GPU succeeded in the last scrape, else 0 (its other series are then left out).
# TYPE understory_gpu_healthy gauge
understory_gpu_healthy{UUID="GPU-cccc",gpu="0",modelName="NVIDIA H100 80GB HBM3"} 1
# HELP understory_gpu_memory_total_bytes GPU memory installed.
# TYPE understory_gpu_memory_total_bytes gauge
understory_gpu_memory_total_bytes{UUID="GPU-cccc",gpu="0",modelName="NVIDIA H100 80GB HBM3"} 8.589934592e+10
# HELP understory_gpu_memory_used_bytes GPU memory in use.
# TYPE understory_gpu_memory_used_bytes gauge
understory_gpu_memory_used_bytes{UUID="GPU-cccc",gpu="0",modelName="NVIDIA H100 80GB HBM3"} 1.073741824e+09
# HELP understory_gpu_pod_memory_used_bytes GPU memory held by a container's compute processes.
# TYPE understory_gpu_pod_memory_used_bytes gauge
understory_gpu_pod_memory_used_bytes{UUID="GPU-cccc",container="c",gpu="0",modelName="NVIDIA H100 80GB HBM3",namespace="ml",pod="p"} 1.073741824e+09
`},
		{name: "throttle: freeze with its reason and lever, held on a lost GPU; MPS caps", update: &GPUSnapshot{Available: true,
			CollectSeconds: 0.001, Devices: []GPUDeviceUsage{
				{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 80, MemTotal: 10,
					Throttle: &GPUThrottle{Duty: 1, LSUtil: 70, Reason: "ls-util-above-threshold", Lever: "freeze",
						BatchMemLimitBytes: 1 << 30}}, // not on the MPS lever: left out
				{Index: 1, UUID: "GPU-b", Model: "m", Healthy: false,
					Throttle: &GPUThrottle{Duty: 1, Reason: "unknown", Lever: "freeze"}},
				{Index: 2, UUID: "GPU-c", Model: "m", Healthy: false,
					Throttle: &GPUThrottle{Duty: 0, Reason: "mps-within-cap", Lever: "mps", LSCapPercent: 75, BatchCapPercent: 25,
						BatchMemLimitBytes: 35942 << 20}},
			}}, want: gpuHelp + `understory_gpu_available 1
# HELP understory_gpu_batch_duty_ratio 1 while the batch pods using the GPU are frozen solid so that LS pods get the device, else 0 (the on/off freeze; the name is the former duty cycle's), with the throttle's reason.
# TYPE understory_gpu_batch_duty_ratio gauge
understory_gpu_batch_duty_ratio{UUID="GPU-a",gpu="0",modelName="m",reason="ls-util-above-threshold"} 1
understory_gpu_batch_duty_ratio{UUID="GPU-b",gpu="1",modelName="m",reason="unknown"} 1
understory_gpu_batch_duty_ratio{UUID="GPU-c",gpu="2",modelName="m",reason="mps-within-cap"} 0
# HELP understory_gpu_collect_duration_seconds Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).
# TYPE understory_gpu_collect_duration_seconds gauge
understory_gpu_collect_duration_seconds 0.001
# HELP understory_gpu_healthy 1 when every NVML query of the GPU succeeded in the last scrape, else 0 (its other series are then left out).
# TYPE understory_gpu_healthy gauge
understory_gpu_healthy{UUID="GPU-a",gpu="0",modelName="m"} 1
understory_gpu_healthy{UUID="GPU-b",gpu="1",modelName="m"} 0
understory_gpu_healthy{UUID="GPU-c",gpu="2",modelName="m"} 0
# HELP understory_gpu_lever 1 for the lever protecting LS on the GPU: lever="freeze" (time-sliced; batch frozen while LS needs the GPU), lever="mps" (LS and batch in MPS partitions) or lever="timeslice" (per-context time slices: every batch context's short slice confirmed, or no batch context yet; batch never frozen).
# TYPE understory_gpu_lever gauge
understory_gpu_lever{UUID="GPU-a",gpu="0",lever="freeze",modelName="m"} 1
understory_gpu_lever{UUID="GPU-b",gpu="1",lever="freeze",modelName="m"} 1
understory_gpu_lever{UUID="GPU-c",gpu="2",lever="mps",modelName="m"} 1
# HELP understory_gpu_ls_utilization_ratio GPU utilisation counted as LS by the throttle (non-batch pods and processes no pod could be attributed to), 0..1.
# TYPE understory_gpu_ls_utilization_ratio gauge
understory_gpu_ls_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.7
# HELP understory_gpu_memory_total_bytes GPU memory installed.
# TYPE understory_gpu_memory_total_bytes gauge
understory_gpu_memory_total_bytes{UUID="GPU-a",gpu="0",modelName="m"} 10
# HELP understory_gpu_memory_used_bytes GPU memory in use.
# TYPE understory_gpu_memory_used_bytes gauge
understory_gpu_memory_used_bytes{UUID="GPU-a",gpu="0",modelName="m"} 0
# HELP understory_gpu_memory_utilization_ratio GPU memory controller utilisation over the driver's last sample period, 0..1.
# TYPE understory_gpu_memory_utilization_ratio gauge
understory_gpu_memory_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0
# HELP understory_gpu_mps_batch_memory_limit_bytes The sum of the device memory limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of the GPU's batch MPS clients: the most batch may allocate on it through CUDA; only on GPUs using the MPS lever, and left out where a batch client has no limit.
# TYPE understory_gpu_mps_batch_memory_limit_bytes gauge
understory_gpu_mps_batch_memory_limit_bytes{UUID="GPU-c",gpu="2",modelName="m"} 3.7687918592e+10
# HELP understory_gpu_mps_sm_cap_ratio The SM cap (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100) of the GPU's MPS clients, by class (ls, batch); only on GPUs using the MPS lever.
# TYPE understory_gpu_mps_sm_cap_ratio gauge
understory_gpu_mps_sm_cap_ratio{UUID="GPU-c",class="batch",gpu="2",modelName="m"} 0.25
understory_gpu_mps_sm_cap_ratio{UUID="GPU-c",class="ls",gpu="2",modelName="m"} 0.75
# HELP understory_gpu_utilization_ratio GPU (SM) utilisation over the driver's last sample period, 0..1 (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL / 100).
# TYPE understory_gpu_utilization_ratio gauge
understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.8
`},
		{name: "time slices: the timeslice lever, per pod asked and read back", update: &GPUSnapshot{Available: true,
			CollectSeconds: 0.001, Devices: []GPUDeviceUsage{
				{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, MemTotal: 10,
					Throttle: &GPUThrottle{Duty: 0, Reason: "timeslice", Lever: "timeslice"},
					Timeslices: []GPUTimesliceUsage{
						{Namespace: "ml", Pod: "train", AskedSeconds: 0.0001, ReadBackSeconds: 0.0001},
						// A second context of the same pod: the longest slices.
						{Namespace: "ml", Pod: "train", AskedSeconds: 0.0001, ReadBackSeconds: 0.01},
						// Asked, nothing read back: the readback series is left out.
						{Namespace: "shop", Pod: "web", AskedSeconds: 0.01},
					}},
			}}, want: gpuHelp + `understory_gpu_available 1
# HELP understory_gpu_batch_duty_ratio 1 while the batch pods using the GPU are frozen solid so that LS pods get the device, else 0 (the on/off freeze; the name is the former duty cycle's), with the throttle's reason.
# TYPE understory_gpu_batch_duty_ratio gauge
understory_gpu_batch_duty_ratio{UUID="GPU-a",gpu="0",modelName="m",reason="timeslice"} 0
# HELP understory_gpu_collect_duration_seconds Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).
# TYPE understory_gpu_collect_duration_seconds gauge
understory_gpu_collect_duration_seconds 0.001
# HELP understory_gpu_healthy 1 when every NVML query of the GPU succeeded in the last scrape, else 0 (its other series are then left out).
# TYPE understory_gpu_healthy gauge
understory_gpu_healthy{UUID="GPU-a",gpu="0",modelName="m"} 1
# HELP understory_gpu_lever 1 for the lever protecting LS on the GPU: lever="freeze" (time-sliced; batch frozen while LS needs the GPU), lever="mps" (LS and batch in MPS partitions) or lever="timeslice" (per-context time slices: every batch context's short slice confirmed, or no batch context yet; batch never frozen).
# TYPE understory_gpu_lever gauge
understory_gpu_lever{UUID="GPU-a",gpu="0",lever="timeslice",modelName="m"} 1
# HELP understory_gpu_ls_utilization_ratio GPU utilisation counted as LS by the throttle (non-batch pods and processes no pod could be attributed to), 0..1.
# TYPE understory_gpu_ls_utilization_ratio gauge
understory_gpu_ls_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0
# HELP understory_gpu_memory_total_bytes GPU memory installed.
# TYPE understory_gpu_memory_total_bytes gauge
understory_gpu_memory_total_bytes{UUID="GPU-a",gpu="0",modelName="m"} 10
# HELP understory_gpu_memory_used_bytes GPU memory in use.
# TYPE understory_gpu_memory_used_bytes gauge
understory_gpu_memory_used_bytes{UUID="GPU-a",gpu="0",modelName="m"} 0
# HELP understory_gpu_memory_utilization_ratio GPU memory controller utilisation over the driver's last sample period, 0..1.
# TYPE understory_gpu_memory_utilization_ratio gauge
understory_gpu_memory_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0
# HELP understory_gpu_timeslice_seconds A pod's GPU time slice on the GPU, the longest over its contexts: kind="asked" the slice the agent asked of its shim, kind="readback" the slice its shim read back from the driver (the tenant's word); only with gpu.timeslice.enabled.
# TYPE understory_gpu_timeslice_seconds gauge
understory_gpu_timeslice_seconds{UUID="GPU-a",gpu="0",kind="asked",modelName="m",namespace="ml",pod="train"} 0.0001
understory_gpu_timeslice_seconds{UUID="GPU-a",gpu="0",kind="readback",modelName="m",namespace="ml",pod="train"} 0.01
understory_gpu_timeslice_seconds{UUID="GPU-a",gpu="0",kind="asked",modelName="m",namespace="shop",pod="web"} 0.01
# HELP understory_gpu_utilization_ratio GPU (SM) utilisation over the driver's last sample period, 0..1 (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL / 100).
# TYPE understory_gpu_utilization_ratio gauge
understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0
`},
		{name: "available, no GPUs", update: &GPUSnapshot{Available: true}, want: gpuHelp + `understory_gpu_available 1
# HELP understory_gpu_collect_duration_seconds Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).
# TYPE understory_gpu_collect_duration_seconds gauge
understory_gpu_collect_duration_seconds 0
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			g, err := NewGPU(reg)
			if err != nil {
				t.Fatal(err)
			}
			if tc.update != nil {
				if err := g.Update(*tc.update); err != nil {
					t.Fatal(err)
				}
			}
			if err := testutil.CollectAndCompare(g, strings.NewReader(tc.want)); err != nil {
				t.Fatal(err)
			}
			// The registry (pedantic: descriptors checked against what is collected)
			// gathers it too.
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestGPUUpdateRepairs: bad parts of a snapshot are dropped or repaired and
// reported; the rest is published, and gathering never fails.
func TestGPUUpdateRepairs(t *testing.T) {
	t.Parallel()
	ok := GPUDeviceUsage{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 10, MemTotal: 100}
	for _, tc := range []struct {
		name string
		snap GPUSnapshot
		want string // the utilisation series after the update
	}{
		{"duplicate index", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{ok,
			{Index: 0, UUID: "GPU-b", Healthy: true, Util: 90}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"duplicate UUID", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{ok,
			{Index: 1, UUID: "GPU-a", Healthy: true, Util: 90}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"negative index", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{ok,
			{Index: -1, UUID: "GPU-b", Healthy: true, Util: 90}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"utilisation out of range", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{
			{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 250},
			{Index: 1, UUID: "GPU-b", Model: "m", Healthy: true, Util: -3},
			{Index: 2, UUID: "GPU-c", Model: "m", Healthy: true, Util: math.NaN()}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 1
understory_gpu_utilization_ratio{UUID="GPU-b",gpu="1",modelName="m"} 0
`},
		{"model not UTF-8", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{
			{Index: 0, UUID: "GPU-a", Model: "m\xff", Healthy: true, Util: 10}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m` + "\uFFFD" + `"} 0.1` + "\n"},
		{"collect duration NaN", GPUSnapshot{Available: true, CollectSeconds: math.NaN(), Devices: []GPUDeviceUsage{ok}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"MPS cap out of range: left out", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{
			{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 10,
				Throttle: &GPUThrottle{Lever: "mps", LSCapPercent: 150, BatchCapPercent: -5}}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"time slice not a duration, or without a pod: left out", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{
			{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 10, Timeslices: []GPUTimesliceUsage{
				{Namespace: "ml", Pod: "p", AskedSeconds: math.NaN(), ReadBackSeconds: -1}, {AskedSeconds: 1}}}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
		{"pod without a name", GPUSnapshot{Available: true, Devices: []GPUDeviceUsage{
			{Index: 0, UUID: "GPU-a", Model: "m", Healthy: true, Util: 10, Pods: []GPUPodUsage{{Namespace: "x"}}}}},
			`understory_gpu_utilization_ratio{UUID="GPU-a",gpu="0",modelName="m"} 0.1` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			g, err := NewGPU(reg)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Update(tc.snap); !errors.Is(err, ErrInvalidGPUSnapshot) {
				t.Fatalf("Update = %v, want ErrInvalidGPUSnapshot", err)
			}
			want := `# HELP understory_gpu_utilization_ratio GPU (SM) utilisation over the driver's last sample period, 0..1 (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL / 100).
# TYPE understory_gpu_utilization_ratio gauge
` + tc.want
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "understory_gpu_utilization_ratio"); err != nil {
				t.Fatal(err)
			}
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGPUUpdateCopies: the caller may reuse its snapshot's slices after Update.
func TestGPUUpdateCopies(t *testing.T) {
	t.Parallel()
	g, err := NewGPU(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := twoGPUs()
	if err := g.Update(s); err != nil {
		t.Fatal(err)
	}
	s.Devices[1].Pods[0].Util = 0
	s.Devices[1].Pods = append(s.Devices[1].Pods[:1], GPUPodUsage{Namespace: "x", Pod: "new"})
	s.Devices[1].UUID = "GPU-changed"
	s.Devices[0].Healthy = true
	const want = `
# HELP understory_gpu_healthy 1 when every NVML query of the GPU succeeded in the last scrape, else 0 (its other series are then left out).
# TYPE understory_gpu_healthy gauge
understory_gpu_healthy{UUID="GPU-aaaa",gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 1
understory_gpu_healthy{UUID="GPU-bbbb",gpu="1",modelName="NVIDIA A100-SXM4-40GB"} 0
# HELP understory_gpu_pod_utilization_ratio A container's share of the GPU's SM time in the driver's newest per-process sample, 0..1, held between the driver's samples (0 once it is seen idle).
# TYPE understory_gpu_pod_utilization_ratio gauge
understory_gpu_pod_utilization_ratio{UUID="GPU-aaaa",container="infer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="shop",pod="web-0"} 0.6
understory_gpu_pod_utilization_ratio{UUID="GPU-aaaa",container="trainer",gpu="0",modelName="NVIDIA A100-SXM4-40GB",namespace="ml",pod="train-0"} 0.15
`
	if err := testutil.CollectAndCompare(g, strings.NewReader(want), "understory_gpu_healthy",
		"understory_gpu_pod_utilization_ratio"); err != nil {
		t.Fatal(err)
	}
}

// TestGPUConcurrent: updates and scrapes race freely (run with -race).
func TestGPUConcurrent(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	g, err := NewGPU(reg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 50 {
			_ = g.Update(twoGPUs())
		}
	})
	wg.Go(func() {
		for range 50 {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
}

func TestGPUMetricsRegister(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := NewGPU(reg); err != nil {
		t.Fatal(err)
	}
	// A second registration on the same registry is an error, not a panic.
	if _, err := NewGPU(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	// It coexists with the agent's other sets.
	if _, err := NewAgent(reg); err != nil {
		t.Fatalf("NewAgent next to NewGPU: %v", err)
	}
	if _, err := NewEscalation(reg); err != nil {
		t.Fatalf("NewEscalation next to NewGPU: %v", err)
	}
}
