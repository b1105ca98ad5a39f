// Command gpu-bench measures the node's GPU throttling path and writes
// bench/out/gpu.json (`make bench-gpu`).
//
// Today it measures the freezer duty cycle (duty.go): a CPU burner in a real cgroup,
// duty-cycled by koordlet/gpu/duty at the agent's period, gets a share of the CPU it gets
// unfrozen; duty_error_pct is how far the frozen share is from the target, in percentage
// points, at 25, 50 and 75 %. It needs root and a cgroup filesystem with a freezer (v1
// freezer or cgroup2 cgroup.freeze). The result has slots for the reaction time
// (reaction_ms) and the collector's cost (collect_us_per_device), filled by their parts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "gpu-bench: interrupted; the cgroups it created were removed")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "gpu-bench:", err)
		os.Exit(1)
	}
}

// run parses the flags and runs the bench; progress goes to stdout, flag errors and usage
// to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gpu-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := defaultConfig()
	fs.StringVar(&cfg.Out, "out", cfg.Out, "output file")
	fs.StringVar(&cfg.Duty.CgroupRoot, "cgroup-root", cfg.Duty.CgroupRoot, "cgroup filesystem mount")
	duties := fs.String("duties", "0.25,0.5,0.75", "duty cycles to measure, fractions in (0, 1)")
	fs.DurationVar(&cfg.Duty.Period, "period", cfg.Duty.Period, "duty-cycle period")
	fs.DurationVar(&cfg.Duty.Point, "point", cfg.Duty.Point,
		"duty-cycled time per duty point (as long again is spent unfrozen for the baseline)")
	fs.DurationVar(&cfg.Duty.Window, "window", cfg.Duty.Window,
		"length of one measured window, a multiple of -period; baseline and cycled windows alternate")
	freezers := fs.String("freezers", "v1,v2", "freezers to measure: v1 (freezer.state), v2 (cgroup.freeze); "+
		"the first one available gives duty_error_pct")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Duty.Duties, err = parseDuties(*duties); err != nil {
		return err
	}
	cfg.Duty.Freezers = nil
	for _, f := range strings.Split(*freezers, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.Duty.Freezers = append(cfg.Duty.Freezers, f)
		}
	}
	if err := cfg.Duty.validate(); err != nil {
		return err
	}
	printf := func(f string, a ...any) { fmt.Fprintf(stdout, f, a...) }
	return runBench(ctx, cfg, printf)
}

func parseDuties(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0 && v < 1) {
			return nil, fmt.Errorf("-duties: %q is not a fraction in (0, 1)", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("-duties: no duty given")
	}
	return out, nil
}

// defaultConfig is `make bench-gpu`: 10 s duty-cycled and 10 s unfrozen per point.
func defaultConfig() config {
	return config{
		Out: "bench/out/gpu.json",
		Duty: dutyConfig{
			CgroupRoot: "/sys/fs/cgroup",
			Period:     100 * time.Millisecond,
			Point:      10 * time.Second,
			Window:     500 * time.Millisecond,
			Duties:     []float64{0.25, 0.5, 0.75},
			Freezers:   []string{freezerV1, freezerV2},
		},
	}
}
