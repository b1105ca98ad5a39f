package gpureal

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Dispatch runs the sub-commands this binary is re-executed as (the launcher, the
// fakes); handled is false for a bench run, which Main runs.
func Dispatch(args []string, in io.Reader, out, errw io.Writer) (handled bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case launcherCmd:
		return true, runLauncher(args[1:], errw)
	case fakeLSCmd:
		return true, runFakeLS(args[1:], in, out)
	case fakeBatchCmd:
		return true, runFakeBatch(args[1:], in, out)
	}
	return false, nil
}

// Main parses the bench's command line (args without the program name) and runs the
// benchmark; ErrNoGPU when the machine has no NVIDIA GPU.
func Main(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	o.Stdout = stdout
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if !o.Fake {
		if err := findGPU(ctx, "/dev"); err != nil {
			return err
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("run as root: the bench creates cgroups and runs the agent, which writes them")
	}
	res, err := run(ctx, o)
	if res != nil {
		fmt.Fprintln(stdout)
		printTable(stdout, res)
		if werr := writeResult(o.Out, res); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Fprintf(stdout, "\nwrote %s (%.0f s)\n", o.Out, res.DurationS)
		}
	}
	return err
}

// parseFlags reads the command line into options.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("gpureal-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pc := defaultPlanConfig()
	o := &options{Self: self}
	fs.StringVar(&o.Out, "out", "bench/out/gpu-real.json", "result JSON")
	fs.StringVar(&o.LogDir, "log-dir", "", "where the agent's and the stand-ins' logs go (default: a temporary directory)")
	fs.StringVar(&o.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup filesystem mount")
	agent := fs.String("agent", "bin/koordlet", "the agent binary (cgo build, for NVML)")
	fs.StringVar(&o.Python, "python", "python3", "the Python with PyTorch and CUDA")
	fs.StringVar(&o.Workloads, "workloads", "", "directory of ls.py and batch.py (default: bench/gpureal/workloads)")
	fs.BoolVar(&o.Fake, "fake", false, "GPU-free fake stand-ins (a dry run of the orchestration; no GPU figures)")
	fs.DurationVar(&o.FakeLSWork, "fake-ls-work", 2*time.Millisecond, "-fake: CPU time of an LS request")
	fs.DurationVar(&o.FakeBatchWork, "fake-batch-work", time.Millisecond, "-fake: time of a batch matmul (asleep)")
	fs.StringVar(&o.MPS, "mps", mpsRun, "run: an MPS section (gpu.mps.mode run); off: gpu.mps.mode disabled and no MPS "+
		"section; none: no gpu.mps key at all (an agent without MPS support)")
	cpuFreeze := fs.Bool("cpu-freeze", true, "leave the agent's CPU escalation (escalation.freezeAfter) at its default; "+
		"false turns it off (a dry run on a busy small machine, where it freezes batch for CPU, not GPU, reasons)")
	fs.StringVar(&o.MPSPipe, "mps-pipe", "", "the MPS section's pipe directory (default: a fresh one of the run's)")
	profile := fs.Bool("agent-pprof", true, "serve the agent's /debug/pprof and save a CPU profile of it over the "+
		"steady agent phases into -log-dir (agent-<phase>.pprof)")
	sections := fs.String("sections", "", "comma-separated sections to run (nothing, agent, agent-mps; default: all)")
	lsCap := fs.Int("mps-ls-cap", 0, "gpu.throttle.mps.lsCapPercent of the agent (0: its default, LS gets 100 − batch's cap)")
	fs.DurationVar(&pc.Phase, "phase", pc.Phase, "length of the main phases")
	fs.DurationVar(&pc.Short, "short", pc.Short, "length of the deep-alone, idle, wake and arrival windows")
	fs.DurationVar(&pc.Lead, "lead", pc.Lead, "lead-in of the idle, wake and arrival phases")
	fs.BoolVar(&pc.MemCap, "memcap", pc.MemCap, "the MPS section ends with the memory-cap check: batch allocates until "+
		"CUDA refuses (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), LS keeps its memory and allocates more")
	fs.Float64Var(&o.LSRate, "ls-rate", 100, "LS requests per second (open loop)")
	fs.IntVar(&o.LSMatmuls, "ls-matmuls", 17, "LS matmuls per request")
	fs.IntVar(&o.LSSize, "ls-size", 4096, "LS matrix size (bf16)")
	fs.IntVar(&o.BatchSize, "batch-size", 8192, "batch matrix size (bf16)")
	fs.IntVar(&o.BatchEvery, "batch-every", 8, "batch: matmuls per synchronize")
	fs.IntVar(&o.DeepEvery, "deep-every", 64, "deep-queue batch: matmuls per synchronize")
	fs.IntVar(&o.LSGPUMilli, "ls-gpu-milli", 500, "LS pod's understory.io/gpu-milli (0: no shared-GPU request)")
	fs.IntVar(&o.BatchGPUMilli, "batch-gpu-milli", 500, "batch pods' understory.io/gpu-milli (0: none)")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", 3*time.Minute, "how long a stand-in may take to start")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *sections != "" {
		pc.Sections = strings.Split(*sections, ",")
	}
	o.Plan = pc
	o.AgentConfigExtra = map[string]map[string]any{}
	if !*cpuFreeze {
		o.AgentConfigExtra["escalation"] = map[string]any{"freezeAfter": "0s"}
	}
	if *lsCap < 0 || *lsCap > 100 {
		return nil, fmt.Errorf("-mps-ls-cap %d: want [0, 100]", *lsCap)
	}
	if *lsCap > 0 {
		o.AgentConfigExtra["gpu"] = map[string]any{"throttle": map[string]any{"mps": map[string]any{"lsCapPercent": *lsCap}}}
	}
	if err := validatePlan(pc); err != nil {
		return nil, err
	}
	switch o.MPS {
	case mpsRun:
	case mpsOff, mpsNone:
		o.Plan.MPS = false
	default:
		return nil, fmt.Errorf("-mps %q: want %s, %s or %s", o.MPS, mpsRun, mpsOff, mpsNone)
	}
	if o.Fake && o.MPS == mpsRun {
		o.Plan.MPS = false // no MPS daemon without a GPU
	}
	if o.LSRate <= 0 || o.LSMatmuls <= 0 || o.LSSize <= 0 || o.BatchSize <= 0 || o.BatchEvery <= 0 ||
		o.DeepEvery <= 0 || o.LSGPUMilli < 0 || o.LSGPUMilli > 1000 || o.BatchGPUMilli < 0 || o.BatchGPUMilli > 1000 {
		return nil, errors.New("the workload sizes must be positive and the gpu-milli requests within [0, 1000]")
	}
	if o.Workloads == "" {
		o.Workloads = filepath.Join("bench", "gpureal", "workloads")
	}
	if o.Workloads, err = filepath.Abs(o.Workloads); err != nil {
		return nil, err
	}
	if !o.Fake {
		for _, f := range []string{"ls.py", "batch.py", "standin.py"} {
			if _, err := os.Stat(filepath.Join(o.Workloads, f)); err != nil {
				return nil, fmt.Errorf("stand-in %s: %w", f, err)
			}
		}
	}
	if *agent == "" {
		return nil, errors.New("-agent is required")
	}
	a, err := filepath.Abs(*agent)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(a); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("agent %s is not an executable (make bench-gpu-real-build): %v", a, err)
	}
	o.AgentCmd = []string{a}
	if *profile {
		// The agent's CPU target is judged on the steady phases: a CPU profile of the
		// agent over the freeze and MPS phases says where it goes (-log-dir).
		o.AgentCmd = append(o.AgentCmd, "-pprof")
		o.ProfileAgent = true
	}
	return o, nil
}
