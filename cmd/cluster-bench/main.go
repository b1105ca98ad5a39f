// Command cluster-bench is the command line around the cluster benchmark
// (bench/clusterbench, `make bench-cluster`) for what needs no cluster:
//
//	cluster-bench report -in bench/out/cluster.json [-png docs/img/cluster-bench.png]
//	    print a report's table (and draw its plot again)
//	cluster-bench check-ls -in trace.csv
//	    read an LS trace exported from Prometheus (docs/cluster-bench.md) and
//	    summarise it, or say which line is wrong
//	cluster-bench synth-ls -nodes 100 -length 24h -step 15s -seed 42 -out trace.csv
//	    write the synthetic LS trace in the same format
//
// The benchmark itself starts a control plane through the test harness
// (test/e2e/controlplane), so it runs as `go test ./bench/clusterbench -bench
// Cluster`; see docs/cluster-bench.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/understory/understory/bench/clusterbench"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = "usage: cluster-bench report|check-ls|synth-ls [flags] (-h for each)"

// run returns the exit status: 2 for a bad command line, 1 for a failure.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("cluster-bench "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var err error
	switch args[0] {
	case "report":
		in := fs.String("in", "bench/out/cluster.json", "report written by the benchmark")
		png := fs.String("png", "", "draw the plot again into this PNG")
		if code := parse(fs, args[1:]); code >= 0 {
			return code
		}
		err = report(*in, *png, stdout)
	case "check-ls":
		in := fs.String("in", "", "LS trace CSV")
		if code := parse(fs, args[1:]); code >= 0 {
			return code
		}
		err = checkLS(*in, stdout)
	case "synth-ls":
		nodes := fs.Int("nodes", 100, "nodes")
		length := fs.Duration("length", 24*time.Hour, "trace length (one day cycle)")
		step := fs.Duration("step", 15*time.Second, "sample step")
		seed := fs.Int64("seed", 42, "seed")
		out := fs.String("out", "-", "output CSV ('-': stdout)")
		if code := parse(fs, args[1:]); code >= 0 {
			return code
		}
		if *nodes < 1 || *length < *step || *step < time.Second {
			fmt.Fprintln(stderr, "cluster-bench synth-ls: want -nodes >= 1 and 1s <= -step <= -length")
			return 2
		}
		err = synthLS(*nodes, *length, *step, *seed, *out, stdout)
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "cluster-bench:", err)
		return 1
	}
	return 0
}

// parse returns -1 to go on, else the exit status.
func parse(fs *flag.FlagSet, args []string) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments %q\n", fs.Args())
		return 2
	}
	return -1
}

func report(in, png string, w io.Writer) error {
	r, err := clusterbench.ReadReport(in)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tCPU util LS only %\tco-located %\tgain pts\toversub node-s\tpods done/h\tqueue p50 s\tp99 s\t"+
		"sched pods/s\tfilter p99 ms\text CPU\text RSS MiB\twebhook calls/s\tp50 ms\tp99 ms\tCPU\tRSS MiB\tunconverted\t"+
		"agent writes/s\tAPI req/s\t")
	for _, s := range r.Sizes {
		adm := "off\t-\t-\t-\t-"
		if s.Admission {
			adm = fmt.Sprintf("%.1f\t%.2f\t%.2f\t%.2f\t%.0f", s.AdmissionCallsPerSec, s.AdmissionMutateP50Ms,
				s.AdmissionMutateP99Ms, s.AdmissionCPUCores, s.AdmissionRSSMiB)
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.1f\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.0f\t%s\t%d\t%.1f\t%.0f\t\n",
			s.Nodes, 100*s.CPUUtilWithout, 100*s.CPUUtilWith, s.CPUUtilGainPoints,
			s.LSOversubscribedCPUNodeSecs+s.LSOversubscribedMemNodeSecs, s.BatchCompletedPerHour,
			s.QueueDelayP50Secs, s.QueueDelayP99Secs, s.SchedulerPodsPerSec, s.ExtenderFilterP99Ms,
			s.ExtenderCPUCores, s.ExtenderRSSMiB, adm, s.BatchUnconverted, s.AgentNodeWritesPerSec, s.APIRequestsPerSec)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	for _, s := range r.Sizes {
		if s.ExtenderRunqueueWaitShare > 0 || s.ExtenderLockHoldP99Ms > 0 {
			fmt.Fprintf(w, "%d nodes: extender waited for a CPU %.0f %% of its runnable time (%.2f ms per filter), "+
				"index write-lock hold p99 %.3f ms, nice %d\n", s.Nodes, 100*s.ExtenderRunqueueWaitShare,
				s.ExtenderRunqueueWaitMsPerFilter, s.ExtenderLockHoldP99Ms, s.ComponentNice)
		}
		if len(s.AgentMetricsWritesByReason) == 0 {
			continue
		}
		fmt.Fprintf(w, "%d nodes: agent writes/s: %.1f batch-resource, %.1f node-metrics (", s.Nodes,
			s.AgentStatusPatchesPerSec, s.AgentMetricsPatchesPerSec)
		for i, reason := range slices.Sorted(maps.Keys(s.AgentMetricsWritesByReason)) {
			if i > 0 {
				fmt.Fprint(w, ", ")
			}
			fmt.Fprintf(w, "%s %.1f", reason, s.AgentMetricsWritesByReason[reason])
		}
		fmt.Fprintf(w, "; maxInterval %gs, change %g)\n", s.NodeMetricsMaxIntervalS, s.NodeMetricsChange)
	}
	for _, s := range r.Sizes {
		if s.Kueue {
			kueueLine(w, s)
		}
	}
	for _, s := range r.Slopes {
		fmt.Fprintf(w, "slope %-26s %10.4f per node, exponent %.2f (linear or better: %v)\n", s.Metric, s.PerNode, s.Exponent, s.Linear)
	}
	for _, t := range r.Targets {
		fmt.Fprintf(w, "target %-26s at %5d nodes: %8.2f (limit %v) met=%v\n", t.Name, t.Nodes, t.Value, t.Limit, t.Met)
	}
	if png == "" {
		return nil
	}
	f, err := os.Create(png)
	if err != nil {
		return fmt.Errorf("creating %s: %w", png, err)
	}
	if err := clusterbench.Plot(r, f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", png, err)
	}
	return nil
}

// kueueLine prints the Kueue figures of a size run with -clusterbench.kueue.
func kueueLine(w io.Writer, s clusterbench.SizeResult) {
	fmt.Fprintf(w, "%d nodes: kueue Workloads %d created, %d admitted, %d finished, %d pending at end; admission wait p50 %.1f s, p99 %.1f s; "+
		"tenant batch-cpu shares", s.Nodes, s.KueueWorkloadsCreated, s.KueueWorkloadsAdmitted, s.KueueWorkloadsFinished,
		s.KueueWorkloadsPendingAtEnd, s.KueueAdmissionWaitP50Secs, s.KueueAdmissionWaitP99Secs)
	for _, t := range slices.Sorted(maps.Keys(s.KueueTenantCPUShares)) {
		fmt.Fprintf(w, " %s %.2f", t, s.KueueTenantCPUShares[t])
	}
	fmt.Fprintf(w, " (fair-share error %.2f, %d samples); %d evicted", s.KueueFairShareError, s.KueueShareSamples, s.KueueWorkloadsEvicted)
	for i, r := range slices.Sorted(maps.Keys(s.KueueEvictionsByReason)) {
		sep := ", "
		if i == 0 {
			sep = " ("
		}
		fmt.Fprintf(w, "%s%s %d", sep, r, s.KueueEvictionsByReason[r])
	}
	if len(s.KueueEvictionsByReason) > 0 {
		fmt.Fprint(w, ")")
	}
	fmt.Fprintf(w, "; partial gangs %d; kueue CPU %.2f RSS %.0f MiB (%d Job and Workload workers), quota follower CPU %.3f RSS %.0f MiB\n",
		s.KueuePartialGangs, s.KueueCPUCores, s.KueueRSSMiB, s.KueueWorkers, s.KueueQuotaCPUCores, s.KueueQuotaRSSMiB)
}

func checkLS(in string, w io.Writer) error {
	if in == "" {
		return fmt.Errorf("check-ls: -in is required: %w", clusterbench.ErrBadTrace)
	}
	tr, err := clusterbench.ReadLSTrace(in)
	if err != nil {
		return err
	}
	var sum, peak float64
	n := 0
	for _, nt := range tr.Nodes {
		for _, s := range nt.Samples {
			sum += s.CPU
			peak = max(peak, s.CPU)
			n++
		}
	}
	fmt.Fprintf(w, "%s: %d nodes, %d samples, %v long; LS CPU mean %.1f%% of allocatable, peak %.1f%%\n",
		in, len(tr.Nodes), n, tr.Length, 100*sum/float64(n), 100*peak)
	return nil
}

func synthLS(nodes int, length, step time.Duration, seed int64, out string, stdout io.Writer) error {
	p := clusterbench.DefaultSynthParams(nodes, length, seed)
	p.Step = step
	tr := clusterbench.Synthesize(p)
	if out == "-" {
		return tr.WriteCSV(stdout)
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	if err := tr.WriteCSV(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}
