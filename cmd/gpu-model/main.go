// Command gpu-model runs the discrete-event model of the GPU's time-slicing
// (bench/gpumodel, `make bench-gpu-model`): it fits the model to the real GPU's rows,
// predicts the per-context timeslice and launch-gate rows, prints the tables and writes
// bench/out/gpu-model.json. A model, not a measurement; no GPU is needed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/understory/understory/bench/gpumodel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "gpu-model: interrupted")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "gpu-model:", err)
		os.Exit(1)
	}
}

// run parses the flags and runs the model; tables go to stdout, flag errors to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpu-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := gpumodel.DefaultConfig()
	fs.StringVar(&cfg.Out, "out", cfg.Out, "output file")
	fs.DurationVar(&cfg.Window, "window", cfg.Window, "simulated window of each run (the real bench's phases are 20 s)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (kernel jitter)")
	fs.IntVar(&cfg.Seeds, "seeds", cfg.Seeds, "seeds the fit is repeated with, from -seed on, for its spread")
	fs.BoolVar(&cfg.Search, "search", cfg.Search, "calibrate by grid search; false: the package's calibrated values")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return gpumodel.Bench(ctx, cfg, func(f string, a ...any) { fmt.Fprintf(stdout, f, a...) })
}
