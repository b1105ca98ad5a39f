package gpumodel

// Row is one measured phase of `make bench-gpu-real`: LS latencies in milliseconds and
// batch matmuls per second.
type Row struct {
	P50, P90, P99, Mean, FirstSecondP99 float64
	Batch                               float64
}

// Measured is what the model is fitted to: the real GPU's figures of one run.
type Measured struct {
	// Source names the run.
	Source string
	// LSAlone is the LS stand-in alone; BatchAlone and DeepAlone batch alone syncing
	// every SyncEvery and DeepSyncEvery kernels.
	LSAlone               Row
	BatchAlone, DeepAlone float64
	SyncEvery             int
	DeepSyncEvery         int
	// LS's shape: requests per second of Kernels kernels each.
	LSRate    float64
	LSKernels int
	// Nothing and DeepNothing are LS beside batch under the driver's time-slicing
	// (DeepNothing: the mean of the run's two repeats); Freeze is the agent freezing
	// batch while LS works.
	Nothing, DeepNothing, Freeze Row
}

// H200 is `make bench-gpu-real` on an NVIDIA H200 (driver 580.159.04, CUDA 13),
// 2026-11-28 14:36 UTC: bench/out/gpu-real.json, docs/benchmarks.md "Real GPU". LS: 100
// requests/s of 17 bf16 4096³ matmuls; batch: bf16 8192³ matmuls back to back, a
// synchronize every 8 (deep: 64).
func H200() Measured {
	return Measured{
		Source:        "bench/out/gpu-real.json, NVIDIA H200, 2026-11-28 14:36 UTC",
		LSAlone:       Row{P50: 3.1857, P90: 3.2878, P99: 3.4382, Mean: 3.1949, FirstSecondP99: 3.4554},
		BatchAlone:    602.4,
		DeepAlone:     601.6,
		SyncEvery:     8,
		DeepSyncEvery: 64,
		LSRate:        100,
		LSKernels:     17,
		Nothing:       Row{P50: 7.3893, P90: 8.3439, P99: 8.6298, Mean: 7.2559, FirstSecondP99: 8.8029, Batch: 353.6},
		// deep-nothing-1 and -2: p50 7.5045 and 7.4782, p90 8.3644 and 8.3160, p99
		// 8.6405 and 8.6317, mean 7.4787 and 7.4592, first second 10.3183 and 8.8260,
		// batch 352 and 352.
		DeepNothing: Row{P50: 7.4914, P90: 8.3402, P99: 8.6361, Mean: 7.4690, FirstSecondP99: 9.5721, Batch: 352},
		Freeze:      Row{P50: 3.2170, P90: 3.2613, P99: 3.3283, Mean: 3.2129, FirstSecondP99: 3.3896, Batch: 0},
	}
}
