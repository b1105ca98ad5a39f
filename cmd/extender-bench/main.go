// Command extender-bench measures the scheduler extender for `make bench-extender` and
// writes JSON (-out, bench/out/extender.json): latency (filter and prioritize over
// HTTP), lockhold (write-lock holds while a huge gang waits) and memory (the RSS of an
// extender child with real informers). The runs are bench/extenderbench; this is their
// command line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/understory/understory/bench/extenderbench"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run returns the exit status: 2 for refused flags, 1 for a failed run or, with
// -enforce, a missed target.
func run(args []string) int {
	fail := func(code int, prefix string, err error) int {
		fmt.Fprintln(os.Stderr, prefix, err)
		return code
	}
	o := extenderbench.DefaultOptions()
	fs := flag.NewFlagSet("extender-bench", flag.ContinueOnError)
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "nodes in the index (every one a candidate in each call)")
	clients := fs.String("clients", "1,2,4", "concurrent HTTP clients, a comma-separated list: one run each")
	fs.IntVar(&o.Pods, "pods", o.Pods, "distinct pending pods the clients cycle through")
	fs.IntVar(&o.Shapes, "shapes", o.Shapes, "distinct pod templates (jobs) among the pods; pods of a job share requests")
	fs.Int64Var(&o.MaxCalls, "max-calls", o.MaxCalls, "stop a run after this many measured calls")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "stop a run after this long (measured part)")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured warm-up")
	fs.StringVar(&o.Policy, "policy", o.Policy, "placement policy")
	out := fs.String("out", "bench/out/extender.json", "JSON result file ('-' for stdout)")
	fs.Int64Var(&o.Seed, "seed", o.Seed, "seed of the synthetic cluster")
	fs.DurationVar(&o.TargetP99, "target-p99", o.TargetP99, "p99 latency target")
	fs.Float64Var(&o.TargetRate, "target-rate", o.TargetRate, "calls/s target")
	enforce := fs.Bool("enforce", false, "exit 1 when a target is missed")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the measured part here")
	runs := fs.String("runs", "latency,lockhold,memory", "what to measure: latency (filter and prioritize), "+
		"lockhold (write-lock holds while a huge gang waits), memory (RSS of an extender with -nodes and -rss-pods), "+
		"failover (two replicas with leader election on -nodes and -rss-pods: the leader killed, the standby serving; not in the default)")
	fs.IntVar(&o.GangMembers, "gang-members", o.GangMembers, "lockhold: minMember of the waiting gang")
	fs.DurationVar(&o.LockHoldDuration, "lock-hold-duration", o.LockHoldDuration, "lockhold: how long to measure")
	fs.DurationVar(&o.TargetLockP99, "target-lock-p99", o.TargetLockP99, "lockhold: p99 write-lock hold target")
	fs.IntVar(&o.RSSPods, "rss-pods", o.RSSPods, "memory: pods in the cluster (90 % bound, a fifth of those with a GPU share)")
	fs.Float64Var(&o.TargetRSSMiB, "target-rss-mib", o.TargetRSSMiB, "memory: RSS target in MiB")
	fs.DurationVar(&o.TargetFailover, "target-failover", o.TargetFailover, "failover: kill → standby serving target")
	fs.BoolVar(&o.FailoverList, "failover-list", false, "failover: the new leader catches up by listing every bound "+
		"pod instead of through the barrier on its own pod")
	fs.StringVar(&o.MemProfile, "memprofile", "", "memory: write the extender's heap profile (once synced) here")
	childAPI := fs.String("rss-child-api", "", "internal: run as the memory measurement's extender against this API URL")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return fail(2, "extender-bench:", err)
	}
	o.Runs = map[string]bool{}
	for _, r := range strings.Split(*runs, ",") {
		o.Runs[strings.TrimSpace(r)] = true
	}
	o.ClientList = nil
	for _, f := range strings.Split(*clients, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return fail(2, "extender-bench:", fmt.Errorf("bad -clients entry %q", f))
		}
		o.ClientList = append(o.ClientList, c)
	}
	if err := o.Validate(); err != nil {
		return fail(2, "extender-bench:", err)
	}
	if *childAPI != "" {
		if err := extenderbench.MemoryChild(*childAPI, o.MemProfile, os.Stdout); err != nil {
			return fail(1, "extender-bench child:", err)
		}
		return 0
	}
	report, err := extenderbench.Run(context.Background(), o, os.Stderr)
	if err != nil {
		return fail(1, "extender-bench:", err)
	}
	b, _ := json.MarshalIndent(report, "", "  ")
	b = append(b, '\n')
	if *out == "-" {
		_, _ = os.Stdout.Write(b)
	} else {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return fail(1, "extender-bench:", err)
		}
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			return fail(1, "extender-bench:", err)
		}
	}
	if *enforce && !report.Pass {
		return 1
	}
	return 0
}
