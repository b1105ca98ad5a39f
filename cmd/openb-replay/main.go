// Command openb-replay replays the openb GPU-cluster trace through the extender's
// placement policies and reports the GPU allocation ratio the FGD paper reports. The
// replay, its probes and ablations are bench/openb; this is their command line.
//
// One replay (the last stdout line is a JSON object with policy, seed, workload,
// tune, pods, failed, alloc_at_100, alloc_at_130, elapsed, ...):
//
//	openb-replay -nodes openb_node_list_gpu_node.csv -pods openb_pod_list_default.csv -policy fgd -seed 42 -tune 1.3
//
// The whole table (every workload of the paper's table × policies × seeds, run on
// -workers goroutines; writes -out as JSON and prints a Markdown table):
//
//	openb-replay -workloads all -policy random,bestfit,fgd,understory -seeds 42-51 -out bench/out/openb.json
//
// -understory-params "key=value,..." (quant, blend, reserve, usage, gpuusage, coverage)
// overrides the understory policy's weights and target coverage for ablations
// (openb.Ablation; see docs/scoring.md). -lookahead K,H,FROM makes every replay the
// clairvoyant upper-bound probe (openb.Lookahead: from arrival FROM on, the
// policy's best K distinct nodes rolled out over the next H real pods), and in
// table mode -compare FILE prints the run against an earlier table's JSON:
//
//	openb-replay -workloads all -policy understory -seeds 42 -lookahead 4,500,0.8 -compare bench/out/openb.json -out bench/out/openb-lookahead.json
//
// -search TRIES,CANDIDATES,CHANGES,FROM,TO runs every replay as the clairvoyant
// search (openb.Config.Search): TRIES more replays, each changing CHANGES choices of
// GPU pods that arrive between FROM and TO to another of the policy's best
// CANDIDATES distinct nodes, keeping the best:
//
//	openb-replay -workloads all -policy understory -seeds 42 -search 80,4,20,0,1.3 -compare bench/out/openb.json -out bench/out/openb-search.json
//
// Exit status 1 on any error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/understory/understory/bench/openb"
	"github.com/understory/understory/scheduler-extender/placement"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "openb-replay:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		nodesPath = flag.String("nodes", "", "openb node list CSV (single replay)")
		podsPath  = flag.String("pods", "", "openb pod list CSV (single replay)")
		policy    = flag.String("policy", "understory", "placement policy: random, bestfit, fgd, understory; a comma list in table mode")
		seed      = flag.Int64("seed", 42, "random seed (single replay)")
		tune      = flag.Float64("tune", 1.3, "arrived GPU demand to reach, as a multiple of GPU capacity (<= 0: trace as is)")
		maxPods   = flag.Int("max-pods", openb.DefaultMaxPods, "pod capacity of every node (single replay)")
		workloads = flag.String("workloads", "", `table mode: "all" (every workload in the paper's table) or a comma list of pod list names`)
		traceDir  = flag.String("trace-dir", "/work/shared/traces/openb", "table mode: directory with the node list, pod lists and paper-results/")
		seeds     = flag.String("seeds", "42-51", `table mode: seeds, "42-51" or "42,43"`)
		out       = flag.String("out", "bench/out/openb.json", "table mode: JSON output file")
		workers   = flag.Int("workers", runtime.NumCPU(), "table mode: replays run in parallel")
		quiet     = flag.Bool("quiet", false, "table mode: no per-replay progress on stderr")
		lookahead = flag.String("lookahead", "", `clairvoyant upper-bound probe, "CANDIDATES,HORIZON,FROM" (e.g. "4,500,0.8"): from arrival FROM on, roll the policy's best CANDIDATES nodes out over the next HORIZON pods of the real order and keep the best; empty: off`)
		search    = flag.String("search", "", `clairvoyant search, "TRIES,CANDIDATES,CHANGES,FROM,TO" (e.g. "200,4,20,0,0.6"): after the policy's own replay, TRIES replays each change CHANGES choices of GPU pods arriving between FROM and TO (fractions of capacity) to another of the policy's best CANDIDATES nodes, keeping the best; empty: off`)
		compare   = flag.String("compare", "", "table mode: an earlier table's JSON (e.g. bench/out/openb.json) to print this run against, over this run's seeds")
		uparams   = flag.String("understory-params", "", `weights of the understory policy, "key=value,..." (see docs/scoring.md); empty: the defaults`)
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	ablation, err := openb.ParseAblation(*uparams)
	if err != nil {
		return err
	}
	look, err := openb.ParseLookahead(*lookahead)
	if err != nil {
		return err
	}
	srch, err := openb.ParseSearch(*search)
	if err != nil {
		return err
	}
	if *workloads != "" {
		return table(ctx, *traceDir, *workloads, *policy, *seeds, *tune, *workers, *out, *quiet, ablation, look, srch, *compare)
	}
	if *nodesPath == "" || *podsPath == "" {
		return fmt.Errorf("-nodes and -pods are required (or -workloads for the table)")
	}
	nodes, err := openb.ReadNodes(*nodesPath, *maxPods)
	if err != nil {
		return err
	}
	pods, err := openb.ReadPods(*podsPath)
	if err != nil {
		return err
	}
	var f openb.PolicyFactory
	var coverage float64
	if *policy == placement.PolicyUnderstory {
		f, coverage = ablation.Factory(), ablation.Coverage
	}
	res, err := openb.Run(ctx, nodes, pods, openb.Config{
		Policy: *policy, Seed: *seed, Tune: *tune, Factory: f, Coverage: coverage, Lookahead: look, Search: srch,
		Workload: strings.TrimSuffix(filepath.Base(*podsPath), ".csv"),
	})
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

func table(ctx context.Context, dir, workloads, policies, seeds string, tune float64, workers int, out string, quiet bool, understory openb.Ablation, look openb.Lookahead, srch openb.Search, compare string) error {
	ss, err := openb.ParseSeeds(seeds)
	if err != nil {
		return err
	}
	var base *openb.Table
	if compare != "" {
		if base, err = openb.ReadTable(compare); err != nil {
			return err
		}
	}
	cfg := openb.TableConfig{Dir: dir, Policies: strings.Split(policies, ","), Seeds: ss, Tune: tune, Workers: workers,
		Factories: map[string]openb.PolicyFactory{placement.PolicyUnderstory: understory.Factory()},
		Coverages: map[string]float64{placement.PolicyUnderstory: understory.Coverage}, Lookahead: look, Search: srch}
	if workloads != "all" {
		cfg.Workloads = strings.Split(workloads, ",")
	}
	if !quiet {
		cfg.Progress = os.Stderr
	}
	t, err := openb.RunTable(ctx, cfg)
	if err != nil {
		return err
	}
	if err := t.CheckLevels(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print(t.Markdown())
	fmt.Println()
	fmt.Print(t.LeftoverMarkdown())
	fmt.Println()
	if base != nil {
		fmt.Printf("Against %s:\n\n", compare)
		fmt.Print(t.CompareMarkdown(base))
		fmt.Println()
	}
	s, err := json.Marshal(t.Mean)
	if err != nil {
		return err
	}
	fmt.Println(string(s))
	return nil
}
