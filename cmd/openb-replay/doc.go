// Command openb-replay replays the openb GPU-cluster trace through the extender's
// placement policies and reports the GPU allocation ratio the FGD paper reports.
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
