// Package gpumodel is a discrete-event model of one NVIDIA GPU's time-slicing between
// two processes' contexts, a latency-sensitive (LS) inference stand-in and a batch
// stand-in, for the weeks without a GPU: it is fitted to the rows `make bench-gpu-real`
// measured on an H200 (Measured, H200) and then predicts the rows of levers not yet
// measured (per-context timeslices, the launch gate). Its figures are a model, never a
// measurement, and never replace a real-GPU row. cmd/gpu-model is its command line
// (`make bench-gpu-model`, bench/out/gpu-model.json); no production package imports it.
//
// What it models (sim.go), in virtual time, deterministic for a seed:
//   - LS: requests at a fixed rate (as bench/gpureal/workloads/ls.py sends them: an open
//     loop, one request at a time, latency from the scheduled time) or Poisson; a request
//     is a chain of kernels put on LS's queue at once, done when its last kernel ends.
//   - Batch: kernels back to back, a synchronize every SyncEvery (8; the deep queue 64)
//     and a host gap before the next burst (bench/gpureal/workloads/batch.py).
//   - The GPU's scheduler: one context (time-slice group) runs at a time; when its slice
//     ends and the other has work, the GPU switches, running nothing for SwitchCost; a
//     context whose queue runs dry hands over at once; a slice that ends with no other
//     work starts again without a switch. Each context has its own slice length (the
//     lever being designed) or the GPU's default. A slice expiry stops the running kernel
//     mid-way (PreemptInstruction, Hopper's compute preemption; the rest runs later) or at
//     its end (PreemptKernel).
//   - Levers: the freeze (batch's process launches nothing from a time on; what it had
//     queued still runs) and the launch gate (batch's launches reach the GPU only while
//     LS has no request in flight, at most Gate.Depth kernels at a time).
//
// The fit (model.go): kernel lengths come from LS alone's mean and batch alone's rate;
// LS's kernel jitter from LS alone's p99; the GPU's default slice, switch cost and
// preemption mode are searched on a grid (Calibrate) to minimise the largest relative
// error of the time-sliced rows (LS p50, LS p99 / alone, batch's rate, syncing every 8
// and 64). Fit reports every measured row the model covers with its error, and which
// rows were inputs, fitted or checks. Predict (predict.go) runs the levers on the fitted
// model; report.go is the run and its JSON.
//
// Traps:
//   - SwitchCost is one lump fitted to batch's lost throughput: whatever a switch costs
//     (state saved and loaded, caches refilled, the preempted kernel's restart) is in it.
//     The predictions for short slices rest on it being the same at 100 µs slices as at
//     the ~2 ms default; Predictions.Sensitivity shows smaller values.
//   - Host overheads are folded into the kernels' lengths (LS) or assumed (batch's
//     SyncGap, the gate's Gap, both 20 µs): the model does not know the CPU side.
//   - Nothing of MPS is modelled: its row is spatial sharing, not time-slicing.
//   - Calibrated() holds the values the recorded run's search found; a change to the
//     simulator or the measured rows means running `make bench-gpu-model` again and
//     updating it (TestCalibrateFindsTheCalibratedValues checks the search still picks it).
package gpumodel
