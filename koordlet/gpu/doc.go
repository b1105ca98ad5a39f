// Package gpu is the agent's GPU room: it reads every GPU through NVML
// (github.com/NVIDIA/go-nvml, passed in as nvml.Interface so tests use its mocks),
// attributes GPU processes to pods through /proc/<pid>/cgroup, and feeds the GPU
// throttle (qos) and the freezer duty cycle (subpackage duty).
//
// Traps:
//   - NVML needs cgo. Files that import go-nvml build only with cgo; without it
//     (CGO_ENABLED=0, the pure-Go build) NewNVML returns ErrNoNVML and GPU features
//     are off. The same happens at run time when libnvidia-ml.so.1 is missing.
package gpu
