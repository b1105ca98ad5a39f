package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// GPUSnapshot is one scrape of the node's GPUs, as the agent publishes it. It is
// plain data so that this package imports nothing of the agent.
type GPUSnapshot struct {
	// Available is false when NVML cannot be used (built without cgo, no driver or
	// library, init failed): only understory_gpu_available 0 is published then.
	Available bool
	// CollectSeconds is how long the GPU loop's last read took (full reads and probes).
	CollectSeconds float64
	// Devices are the node's GPUs.
	Devices []GPUDeviceUsage
}

// GPUDeviceUsage is one GPU in a GPUSnapshot. Utilisation is percent (0..100), as
// NVML reports it; it is published as a ratio (0..1).
type GPUDeviceUsage struct {
	// Index is the NVML device index (dcgm-exporter's "gpu" label).
	Index int
	UUID  string
	Model string
	// Util is the SM utilisation, MemUtil the memory controller's.
	Util, MemUtil float64
	// UtilUnknown: the driver reports no utilisation for the device (MIG mode); the
	// utilisation series of the device and its pods are left out, never shown as 0.
	UtilUnknown bool
	// MemUsed and MemTotal are bytes.
	MemUsed, MemTotal uint64
	// Healthy is false when a query of the device failed; only its
	// understory_gpu_healthy 0 is published then, as its figures are not to be trusted.
	Healthy bool
	// Pods is the GPU's use by pod container (processes no pod could be attributed to
	// are left out). Entries with the same namespace, pod and container are summed.
	Pods []GPUPodUsage
	// Throttle is the GPU throttle's decision for the device; nil leaves its series out.
	Throttle *GPUThrottle
	// Timeslices are the per-context time slices of the GPU's pods (gpu.timeslice on),
	// one entry per pod; entries with the same namespace and pod keep the longest slices.
	Timeslices []GPUTimesliceUsage
}

// GPUTimesliceUsage is one pod's GPU time slices on one GPU: the longest over its
// contexts there. A value of 0 leaves its series out.
type GPUTimesliceUsage struct {
	Namespace, Pod string
	// AskedSeconds is the slice the agent asked (UNDERSTORY_TSG_TIMESLICE_US);
	// ReadBackSeconds the slice the pod's shim read back from the driver (the tenant's
	// word: the shim runs in the pod's processes).
	AskedSeconds, ReadBackSeconds float64
}

// GPUThrottle is the GPU-aware batch throttle's state of one GPU.
type GPUThrottle struct {
	// Duty is 1 while the GPU's batch pods are frozen solid, else 0 (the on/off freeze;
	// values between are accepted and published as they are).
	Duty float64
	// LSUtil is the utilisation (percent) counted as LS: non-batch pods' processes and
	// processes no pod could be attributed to.
	LSUtil float64
	// Reason is the throttle's reason (qos.GPUReason*).
	Reason string
	// Lever is how LS is protected on the GPU: "freeze", "mps" or "timeslice"
	// (qos.GPULever*).
	Lever string
	// LSCapPercent and BatchCapPercent are the MPS SM caps of the GPU's LS and batch
	// clients (1..100; 0: none, the series is left out). Published with Lever "mps" only.
	LSCapPercent, BatchCapPercent int
	// BatchMemLimitBytes is the sum of the pinned device memory limits of the GPU's batch
	// MPS clients (0: unbounded, the series is left out). Published with Lever "mps" only.
	BatchMemLimitBytes uint64
}

// GPUPodUsage is one container's use of one GPU.
type GPUPodUsage struct {
	Namespace, Pod, Container string
	// Util and MemUtil are percent (0..100) of the device.
	Util, MemUtil float64
	// MemUsed is bytes of device memory.
	MemUsed uint64
}

// ErrInvalidGPUSnapshot is wrapped by GPU.Update for parts of a snapshot it had to
// drop or repair.
var ErrInvalidGPUSnapshot = errors.New("invalid GPU snapshot")

// GPU is the node agent's GPU metric set: a prometheus.Collector that publishes the
// last snapshot given to Update. Label keys match NVIDIA's dcgm-exporter (gpu, UUID,
// modelName; namespace, pod, container) so that its series and these join.
type GPU struct {
	available, duration            *prometheus.Desc
	healthy, util, memUtil         *prometheus.Desc
	memUsed, memTotal              *prometheus.Desc
	podUtil, podMemUtil, podMemUse *prometheus.Desc
	duty, lsUtil, lever, mpsCap    *prometheus.Desc
	mpsBatchMem, timeslice         *prometheus.Desc

	mu   sync.Mutex
	snap GPUSnapshot
}

var _ prometheus.Collector = (*GPU)(nil)

// Label keys, dcgm-exporter's spelling.
var (
	gpuLabels    = []string{"gpu", "UUID", "modelName"}
	gpuPodLabels = []string{"gpu", "UUID", "modelName", "namespace", "pod", "container"}
)

// NewGPU creates the GPU metrics and registers them on reg. Until the first Update
// they read "not available".
func NewGPU(reg prometheus.Registerer) (*GPU, error) {
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("understory", "gpu", name), help, labels, nil)
	}
	g := &GPU{
		available: d("available", "1 when the agent can read the node's GPUs through NVML, else 0 "+
			"(built without cgo, no NVIDIA driver or library, NVML init failed).", nil),
		duration: d("collect_duration_seconds", "Time the GPU loop's last read of the GPUs through NVML took (full reads and probes).", nil),
		healthy: d("healthy", "1 when every NVML query of the GPU succeeded in the last scrape, "+
			"else 0 (its other series are then left out).", gpuLabels),
		util: d("utilization_ratio", "GPU (SM) utilisation over the driver's last sample period, 0..1 "+
			"(dcgm-exporter's DCGM_FI_DEV_GPU_UTIL / 100).", gpuLabels),
		memUtil: d("memory_utilization_ratio", "GPU memory controller utilisation over the driver's "+
			"last sample period, 0..1.", gpuLabels),
		memUsed:  d("memory_used_bytes", "GPU memory in use.", gpuLabels),
		memTotal: d("memory_total_bytes", "GPU memory installed.", gpuLabels),
		podUtil: d("pod_utilization_ratio", "A container's share of the GPU's SM time in the driver's "+
			"newest per-process sample, 0..1, held between the driver's samples (0 once it is seen idle).", gpuPodLabels),
		podMemUtil: d("pod_memory_utilization_ratio", "A container's share of the GPU's memory "+
			"controller over the driver's last per-process sample, 0..1.", gpuPodLabels),
		podMemUse: d("pod_memory_used_bytes", "GPU memory held by a container's compute processes.", gpuPodLabels),
		duty: d("batch_duty_ratio", "1 while the batch pods using the GPU are frozen solid so that LS pods "+
			"get the device, else 0 (the on/off freeze; the name is the former duty cycle's), with the "+
			"throttle's reason.", append(gpuLabels[:3:3], "reason")),
		lever: d("lever", "1 for the lever protecting LS on the GPU: lever=\"freeze\" (time-sliced; batch "+
			"frozen while LS needs the GPU), lever=\"mps\" (LS and batch in MPS partitions) or "+
			"lever=\"timeslice\" (per-context time slices: every batch context's short slice confirmed, or no batch "+
			"context yet; batch never frozen).",
			append(gpuLabels[:3:3], "lever")),
		timeslice: d("timeslice_seconds", "A pod's GPU time slice on the GPU, the longest over its contexts: "+
			"kind=\"asked\" the slice the agent asked of its shim, kind=\"readback\" the slice its shim read "+
			"back from the driver (the tenant's word); only with gpu.timeslice.enabled.",
			append(gpuLabels[:3:3], "namespace", "pod", "kind")),
		mpsCap: d("mps_sm_cap_ratio", "The SM cap (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100) of the GPU's "+
			"MPS clients, by class (ls, batch); only on GPUs using the MPS lever.", append(gpuLabels[:3:3], "class")),
		mpsBatchMem: d("mps_batch_memory_limit_bytes", "The sum of the device memory limits "+
			"(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of the GPU's batch MPS clients: the most batch may allocate "+
			"on it through CUDA; only on GPUs using the MPS lever, and left out where a batch client has no limit.",
			gpuLabels),
		lsUtil: d("ls_utilization_ratio", "GPU utilisation counted as LS by the throttle (non-batch pods "+
			"and processes no pod could be attributed to), 0..1.", gpuLabels),
	}
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("registering GPU metrics: %w", err)
	}
	return g, nil
}

// Update replaces the published snapshot. Parts that cannot be published are
// dropped or repaired and reported in the error (wrapping ErrInvalidGPUSnapshot);
// the rest is published all the same: a second device with the same index or
// UUID, a negative index, a pod entry without a pod name are dropped; label
// values that are not UTF-8 are repaired; utilisation outside 0..100 is clamped,
// and NaN leaves the series out. The sum of a container's entries is bounded to 100
// without complaint (per-process samples add up to a little over the device). Update keeps no reference to s.
func (g *GPU) Update(s GPUSnapshot) error {
	snap, err := cleanGPUSnapshot(s)
	g.mu.Lock()
	g.snap = snap
	g.mu.Unlock()
	return err
}

// cleanGPUSnapshot returns a deep copy of s that Collect can publish as is.
func cleanGPUSnapshot(s GPUSnapshot) (GPUSnapshot, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(args, ErrInvalidGPUSnapshot)...))
	}
	out := GPUSnapshot{Available: s.Available, CollectSeconds: s.CollectSeconds}
	if math.IsNaN(s.CollectSeconds) || math.IsInf(s.CollectSeconds, 0) || s.CollectSeconds < 0 {
		bad("collect duration %v", s.CollectSeconds)
		out.CollectSeconds = math.NaN() // left out
	}
	seenIndex := make(map[int]bool, len(s.Devices))
	seenUUID := make(map[string]bool, len(s.Devices))
	for _, d := range s.Devices {
		switch {
		case d.Index < 0:
			bad("GPU index %d", d.Index)
			continue
		case seenIndex[d.Index]:
			bad("GPU index %d twice", d.Index)
			continue
		case d.UUID != "" && seenUUID[d.UUID]:
			bad("GPU UUID %q twice", d.UUID)
			continue
		}
		seenIndex[d.Index], seenUUID[d.UUID] = true, true
		c := d
		c.UUID, c.Model = validLabel(d.UUID, "GPU UUID", bad), validLabel(d.Model, "GPU model", bad)
		// pod is "" for the device's own figures; the message is built only when one is
		// bad (this runs every GPU loop step).
		checkPercent := func(v float64, pod, what string) {
			if !(math.IsNaN(v) || v < 0 || v > 100) {
				return
			}
			if pod != "" {
				what = "pod " + pod + " " + what
			}
			bad("GPU %d: %s %v is not a percentage", d.Index, what, v)
		}
		checkPercent(d.Util, "", "utilisation")
		checkPercent(d.MemUtil, "", "memory utilisation")
		c.Util, c.MemUtil = clampPercent(d.Util), clampPercent(d.MemUtil)
		if d.Throttle != nil {
			t := *d.Throttle
			if math.IsNaN(t.Duty) || t.Duty < 0 || t.Duty > 1 {
				bad("GPU %d: duty %v is not in 0..1", d.Index, t.Duty)
				t.Duty = min(max(t.Duty, 0), 1) // NaN stays NaN: left out
			}
			t.LSUtil = clampPercent(t.LSUtil)
			t.Reason = validLabel(t.Reason, "throttle reason", bad)
			t.Lever = validLabel(t.Lever, "throttle lever", bad)
			for _, c := range []*int{&t.LSCapPercent, &t.BatchCapPercent} {
				if *c < 0 || *c > 100 {
					bad("GPU %d: MPS cap %d is not in 0..100", d.Index, *c)
					*c = 0 // left out
				}
			}
			c.Throttle = &t
		}
		c.Timeslices = cleanTimeslices(d.Index, d.Timeslices, bad)
		c.Pods = nil
		type key struct{ ns, pod, ctr string }
		at := make(map[key]int, len(d.Pods))
		for _, p := range d.Pods {
			if p.Pod == "" {
				bad("GPU %d: a pod entry without a pod name", d.Index)
				continue
			}
			checkPercent(p.Util, p.Pod, "utilisation")
			checkPercent(p.MemUtil, p.Pod, "memory utilisation")
			p.Namespace = validLabel(p.Namespace, "namespace", bad)
			p.Pod = validLabel(p.Pod, "pod", bad)
			p.Container = validLabel(p.Container, "container", bad)
			k := key{p.Namespace, p.Pod, p.Container}
			if i, ok := at[k]; ok {
				q := &c.Pods[i]
				q.Util, q.MemUtil, q.MemUsed = q.Util+p.Util, q.MemUtil+p.MemUtil, q.MemUsed+p.MemUsed
				continue
			}
			at[k] = len(c.Pods)
			c.Pods = append(c.Pods, p)
		}
		// Sums of several processes may pass 100 by sampling noise: bounded, not reported.
		for i := range c.Pods {
			c.Pods[i].Util, c.Pods[i].MemUtil = clampPercent(c.Pods[i].Util), clampPercent(c.Pods[i].MemUtil)
		}
		out.Devices = append(out.Devices, c)
	}
	slices.SortFunc(out.Devices, func(a, b GPUDeviceUsage) int { return cmp.Compare(a.Index, b.Index) })
	return out, errors.Join(errs...)
}

// cleanTimeslices copies a GPU's pod slices: an entry without a pod name is dropped,
// labels are repaired, a slice that is not a finite non-negative number is left out
// (0), and entries of the same pod are merged into their longest slices.
func cleanTimeslices(gpu int, in []GPUTimesliceUsage, bad func(string, ...any)) []GPUTimesliceUsage {
	if len(in) == 0 {
		return nil
	}
	out := make([]GPUTimesliceUsage, 0, len(in))
	for _, u := range in {
		if u.Pod == "" {
			bad("GPU %d: a time-slice entry without a pod name", gpu)
			continue
		}
		u.Namespace = validLabel(u.Namespace, "namespace", bad)
		u.Pod = validLabel(u.Pod, "pod", bad)
		for _, v := range []*float64{&u.AskedSeconds, &u.ReadBackSeconds} {
			if math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0 {
				bad("GPU %d: pod %s time slice %v is not a duration", gpu, u.Pod, *v)
				*v = 0
			}
		}
		i := slices.IndexFunc(out, func(o GPUTimesliceUsage) bool { return o.Namespace == u.Namespace && o.Pod == u.Pod })
		if i < 0 {
			out = append(out, u)
			continue
		}
		out[i].AskedSeconds = max(out[i].AskedSeconds, u.AskedSeconds)
		out[i].ReadBackSeconds = max(out[i].ReadBackSeconds, u.ReadBackSeconds)
	}
	return out
}

// validLabel returns s, or s with invalid UTF-8 replaced (reported through bad).
func validLabel(s, what string, bad func(string, ...any)) string {
	if utf8.ValidString(s) {
		return s
	}
	bad("%s %q is not UTF-8", what, s)
	return strings.ToValidUTF8(s, "\uFFFD")
}

// clampPercent bounds a percentage to 0..100; NaN stays NaN (the series is left out).
func clampPercent(v float64) float64 {
	if math.IsNaN(v) {
		return v
	}
	return min(max(v, 0), 100)
}

// Describe sends every descriptor.
func (g *GPU) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.available, g.duration, g.healthy, g.util, g.memUtil, g.memUsed,
		g.memTotal, g.podUtil, g.podMemUtil, g.podMemUse, g.duty, g.lsUtil, g.lever, g.mpsCap, g.mpsBatchMem,
		g.timeslice} {
		ch <- d
	}
}

// Collect publishes the last snapshot.
func (g *GPU) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	s := g.snap // Update replaces it whole and never writes into it
	g.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		if math.IsNaN(v) {
			return
		}
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	if !s.Available {
		gauge(g.available, 0)
		return
	}
	gauge(g.available, 1)
	gauge(g.duration, s.CollectSeconds)
	for _, d := range s.Devices {
		labels := []string{strconv.Itoa(d.Index), d.UUID, d.Model}
		if t := d.Throttle; t != nil {
			// Published for an unhealthy GPU too: its duty is held, and still in force.
			gauge(g.duty, t.Duty, append(labels[:3:3], t.Reason)...)
			if t.Lever != "" {
				gauge(g.lever, 1, append(labels[:3:3], t.Lever)...)
			}
			if t.Lever == "mps" {
				for _, c := range []struct {
					class string
					pct   int
				}{{"ls", t.LSCapPercent}, {"batch", t.BatchCapPercent}} {
					if c.pct > 0 {
						gauge(g.mpsCap, float64(c.pct)/100, append(labels[:3:3], c.class)...)
					}
				}
				if t.BatchMemLimitBytes > 0 {
					gauge(g.mpsBatchMem, float64(t.BatchMemLimitBytes), labels...)
				}
			}
			if d.Healthy && !d.UtilUnknown {
				gauge(g.lsUtil, t.LSUtil/100, labels...)
			}
		}
		// The pods' slices as the agent gives them (none for a GPU it could not read).
		for _, u := range d.Timeslices {
			for _, k := range []struct {
				kind string
				v    float64
			}{{"asked", u.AskedSeconds}, {"readback", u.ReadBackSeconds}} {
				if k.v > 0 {
					gauge(g.timeslice, k.v, append(labels[:3:3], u.Namespace, u.Pod, k.kind)...)
				}
			}
		}
		if !d.Healthy {
			gauge(g.healthy, 0, labels...)
			continue
		}
		gauge(g.healthy, 1, labels...)
		if !d.UtilUnknown {
			gauge(g.util, d.Util/100, labels...)
			gauge(g.memUtil, d.MemUtil/100, labels...)
		}
		gauge(g.memUsed, float64(d.MemUsed), labels...)
		gauge(g.memTotal, float64(d.MemTotal), labels...)
		for _, p := range d.Pods {
			pl := append(labels[:3:3], p.Namespace, p.Pod, p.Container)
			if !d.UtilUnknown {
				gauge(g.podUtil, p.Util/100, pl...)
				gauge(g.podMemUtil, p.MemUtil/100, pl...)
			}
			gauge(g.podMemUse, float64(p.MemUsed), pl...)
		}
	}
}
