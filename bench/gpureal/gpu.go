package gpureal

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoGPU: the machine has no NVIDIA GPU; the message says where to run.
var ErrNoGPU = errors.New("no NVIDIA GPU: run on the GPU machine, see docs/benchmarks.md (\"Real GPU: make bench-gpu-real\")")

// findGPU says whether the machine has an NVIDIA GPU: a /dev/nvidia<N> device node, or
// nvidia-smi listing one. devRoot is normally /dev.
func findGPU(ctx context.Context, devRoot string) error {
	if m, _ := filepath.Glob(filepath.Join(devRoot, "nvidia[0-9]*")); len(m) > 0 {
		return nil
	}
	if out, err := runTool(ctx, 10*time.Second, "nvidia-smi", "-L"); err == nil && strings.Contains(out, "GPU ") {
		return nil
	}
	return ErrNoGPU
}

// runTool runs a tool with a timeout and returns its trimmed output.
func runTool(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// gpuInfo is the GPU's name and driver (nvidia-smi), and nvidia-smi's summary.
func gpuInfo(ctx context.Context) (gpu, smi string) {
	gpu, _ = runTool(ctx, 20*time.Second, "nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
		"--format=csv,noheader")
	smi, _ = runTool(ctx, 20*time.Second, "nvidia-smi")
	return gpu, smi
}

// gpuProcesses is nvidia-smi's list of compute processes (MPS clients show as M+C).
func gpuProcesses(ctx context.Context) string {
	out, err := runTool(ctx, 20*time.Second, "nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
		"--format=csv,noheader")
	if err != nil {
		return "nvidia-smi: " + err.Error() + ": " + out
	}
	return out
}

// quitMPS stops an MPS control daemon still serving the bench's pipe directory after
// the agent stopped (the agent stops the daemon it started; this is the safety net, so
// the bench leaves no daemon behind). It returns a note when it had to.
func quitMPS(ctx context.Context, pipeDir string) string {
	if _, err := os.Stat(filepath.Join(pipeDir, "control")); err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nvidia-cuda-mps-control")
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipeDir)
	cmd.Stdin = strings.NewReader("quit\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "an MPS control socket was left in " + pipeDir + "; quit failed: " + err.Error() + " " +
			strings.TrimSpace(string(out))
	}
	return "the MPS control daemon of " + pipeDir + " was still running after the agent stopped; the bench quit it"
}
