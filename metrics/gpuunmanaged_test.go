package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestUnmanagedGPUs(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 8} {
		reg := prometheus.NewPedanticRegistry()
		if err := RegisterUnmanagedGPUs(reg, n); err != nil {
			t.Fatal(err)
		}
		want := `# HELP understory_gpu_unmanaged NVIDIA GPUs on the node's PCI bus that the agent cannot manage (GPU features off here): label the node nvidia.com/gpu.present=true so that the GPU agent runs there.
# TYPE understory_gpu_unmanaged gauge
understory_gpu_unmanaged ` + map[int]string{0: "0", 8: "8"}[n] + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "understory_gpu_unmanaged"); err != nil {
			t.Error(err)
		}
	}
}
