package gpu

import (
	"math"

	"github.com/understory/understory/contract"
)

// What node-metrics publishes of each GPU for the scheduler extender to place batch
// GPU work (docs/node-metrics.md, gpu.devs[].lsFree and .mps): the SM share LS leaves
// free, and whether the GPU runs the agent's MPS server. The window sums are the
// Manager's (gpuWindow); this file turns them into the published figures.

// lsFreeMilli is the SM share LS leaves free on a GPU, in milli-GPU (0..1000):
// 1000 minus the larger of LS's peak SM utilisation over the window (percent) and, on
// an MPS GPU, the largest SM cap of LS's MPS clients there (percent; 0 when none). The
// used part is rounded up: the published share never overstates what is free.
func lsFreeMilli(lsPeakPercent float64, lsCapPercent int) int {
	used := max(lsPeakPercent, float64(lsCapPercent))
	if math.IsNaN(used) {
		return 0 // nothing known to be free
	}
	used = min(max(used, 0), 100)
	return contract.MilliPerGPU - int(math.Ceil(used*contract.MilliPerGPU/100))
}

// publishGPU fills d's LS-free share and MPS flag from the window's LS peak; a GPU not
// Healthy keeps both unknown (nil, false). It may take the Partitions' lock (never the
// other way round).
func (m *Manager) publishGPU(d *contract.GPUDevice, lsPeakPercent float64) {
	if !d.Healthy {
		return
	}
	capPercent := 0
	if p := m.o.Partitions; p != nil && p.MPSOn(d.UUID) {
		d.MPS = true
		for _, c := range p.Clients() {
			if !c.Batch && c.GPU == d.UUID {
				capPercent = max(capPercent, c.CapPercent)
			}
		}
	}
	free := lsFreeMilli(lsPeakPercent, capPercent)
	d.LSFreeMilli = &free
}
