package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterUnmanagedGPUs publishes understory_gpu_unmanaged on reg: the NVIDIA GPUs an
// agent without GPU features found on its node's PCI bus. Above 0, the node is a GPU
// node that the GPU agent does not run on (no GPU label marks it), so its GPUs are
// neither shared nor protected.
func RegisterUnmanagedGPUs(reg prometheus.Registerer, n int) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "understory", Subsystem: "gpu", Name: "unmanaged",
		Help: "NVIDIA GPUs on the node's PCI bus that the agent cannot manage (GPU features off here): label the node nvidia.com/gpu.present=true so that the GPU agent runs there."})
	g.Set(float64(n))
	return reg.Register(g)
}
