package placement

// Best-fit normalisation: the largest node the openb trace knows.
const (
	bestFitMaxCPUMilli = 128000
	bestFitMaxGPUMilli = 8000
)

// bestFitPolicy prefers the node left with the least free CPU and GPU:
// ⌊100·(1 − [0.5·(cpuFree − cpuReq)/128000 + 0.5·(gpuFree − gpuReq)/8000])⌋.
// (The artifact then min-max rescales over the feasible nodes, which keeps the
// order, so Select does not need it.) A share takes the device with the least free
// milli that holds it; whole GPUs the lowest-index free ones.
type bestFitPolicy struct{}

var _ Policy = bestFitPolicy{}

func (bestFitPolicy) Name() string { return PolicyBestFit }

func (p bestFitPolicy) Score(n *Node, r Request) (float64, []int, bool) { return scoreVia(p, n, r) }

func (bestFitPolicy) score(n *Node, r *Request) (float64, deviceSet, bool) {
	if n.Check(r) != nil {
		return 0, 0, false
	}
	var devs deviceSet
	if r.Sharing() {
		devs = 1 << uint(bestFitDeviceIn(n.GPUFree, r.GPUMilli, lsFitSet(n, r)))
	} else {
		devs = lowestFree(n.GPUFree, r.GPUMilli, r.NumGPU)
	}
	cpuFree, cpuReq := float64(n.FreeCPUMilli()), float64(r.ScoreCPUMilli())
	gpuFree, gpuReq := float64(n.FreeGPUMilli()), float64(r.GPUTotalMilli())
	if cpuFree < cpuReq {
		return 0, devs, true
	}
	s := 0.0
	s += (cpuFree - cpuReq) / bestFitMaxCPUMilli * 0.5
	s += (gpuFree - gpuReq) / bestFitMaxGPUMilli * 0.5
	return float64(int64((1.0 - s) * 100)), devs, true
}
