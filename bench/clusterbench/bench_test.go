package clusterbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/qos"
)

var (
	flagSizes    = flag.String("clusterbench.sizes", "500,1000,2000,5000", "node counts, comma-separated: one run each")
	flagDuration = flag.Duration("clusterbench.duration", 8*time.Minute, "measured part of each run")
	flagWarmup   = flag.Duration("clusterbench.warmup", time.Minute, "agents running before jobs arrive")
	flagLSTrace  = flag.String("clusterbench.ls-trace", "", "LS trace CSV (docs/cluster-bench.md); empty: synthetic")
	flagCPULoad  = flag.Float64("clusterbench.cpu-load", 0.9, "offered batch CPU as a fraction of the spare CPU")
	flagGPULoad  = flag.Float64("clusterbench.gpu-load", 0.7, "offered GPU as a fraction of the GPUs")
	flagGPUShare = flag.Float64("clusterbench.gpu-node-share", 0.2, "share of GPU nodes")
	flagNMPeriod = flag.Duration("clusterbench.node-metrics-period", 10*time.Second, "the agents' nodeMetricsPeriod")
	flagNMMax    = flag.Duration("clusterbench.node-metrics-max-interval", qos.DefaultReportMaxInterval, "the agents' nodeMetricsReport.maxInterval")
	flagNice     = flag.Int("clusterbench.component-nice", -10, "niceness of the extender and the webhook (0: as the control plane)")
	flagNMChange = flag.Float64("clusterbench.node-metrics-change", qos.DefaultReportChange, "the agents' nodeMetricsReport.change (0: every window)")
	flagCompress = flag.Float64("clusterbench.compression", 20, "openb durations are divided by this (a larger value: shorter jobs, more pods per second)")
	flagMaxDur   = flag.Duration("clusterbench.max-duration", 4*time.Minute, "longest job after compression")
	flagSeed     = flag.Int64("clusterbench.seed", 42, "seed of the traces")
	flagAdmit    = flag.Bool("clusterbench.admission", true, "run the admission webhook and create batch pods as users write them; false: create them in its output form, no webhook")
	flagKueue    = flag.Bool("clusterbench.kueue", false, "put Kueue in front: trace jobs become suspended Jobs in the shipped component's tenant queues (kueue.go)")
	flagKueueInt = flag.Duration("clusterbench.kueue-quota-interval", 30*time.Second, "the quota follower's -interval (with -clusterbench.kueue)")
	flagKueueW   = flag.Int("clusterbench.kueue-workers", DefaultOptions(1).KueueWorkers, "workers of Kueue's Job and Workload reconcilers (Kueue's install ships 5)")
	flagOut      = flag.String("clusterbench.out", "", "JSON report (default <repo>/bench/out/cluster.json)")
	flagPNG      = flag.String("clusterbench.png", "", "PNG plot (default <repo>/docs/img/cluster-bench.png)")
)

// moduleRoot is the directory above the working directory holding go.mod.
func moduleRoot(tb testing.TB) string {
	root, err := testenv.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

// kwokBinary finds kwok (UNDERSTORY_KWOK_BIN, else scripts/kwok.sh's cache); when
// missing it builds it under CI=true or UNDERSTORY_BUILD_KWOK=1 and skips otherwise.
func kwokBinary(tb testing.TB, root string) string {
	script := filepath.Join(root, "scripts", "kwok.sh")
	out, err := exec.Command(script, "--print-bin-dir").Output()
	if err != nil {
		tb.Fatalf("%s --print-bin-dir: %v", script, err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "kwok")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if !testenv.InCI() && os.Getenv("UNDERSTORY_BUILD_KWOK") != "1" {
		tb.Skipf("kwok missing at %s: run scripts/kwok.sh (or set UNDERSTORY_BUILD_KWOK=1)", bin)
	}
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("building kwok: %v", err)
	}
	return bin
}

func openbDir(tb testing.TB, root string) string {
	d := filepath.Join(root, "..", "shared", "traces", "openb")
	if _, err := os.Stat(filepath.Join(d, "openb_pod_list_default.csv")); err != nil {
		testenv.SkipOrFailInCI(tb, "openb trace missing at %s", d)
	}
	return d
}

// BenchmarkCluster is `make bench-cluster`: every size of -clusterbench.sizes on
// its own control plane, then bench/out/cluster.json and the plot.
//
//	go test ./bench/clusterbench -run '^$' -bench Cluster -benchtime 1x -timeout 3h -args -clusterbench.sizes 1000
func BenchmarkCluster(b *testing.B) {
	root := moduleRoot(b)
	kwok := kwokBinary(b, root)
	openb := openbDir(b, root)
	var sizes []int
	for _, f := range strings.Split(*flagSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("bad -clusterbench.sizes entry %q", f)
		}
		sizes = append(sizes, n)
	}
	var results []SizeResult
	var last Options
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for range b.N {
				o := DefaultOptions(n)
				o.Duration, o.Warmup, o.LSTrace = *flagDuration, *flagWarmup, *flagLSTrace
				o.CPULoad, o.GPULoad, o.GPUNodeShare, o.Seed = *flagCPULoad, *flagGPULoad, *flagGPUShare, *flagSeed
				o.NodeMetricsPeriod, o.Compression, o.MaxDuration = *flagNMPeriod, *flagCompress, *flagMaxDur
				o.NodeMetricsReport.MaxInterval.Duration, o.NodeMetricsReport.Change = *flagNMMax, *flagNMChange
				o.Admission, o.ComponentNice = *flagAdmit, *flagNice
				o.Kueue, o.KueueQuotaInterval, o.KueueWorkers = *flagKueue, *flagKueueInt, *flagKueueW
				o.KwokBin, o.ModuleRoot, o.OpenbDir, o.Log = kwok, root, openb, os.Stderr
				r, err := Run(context.Background(), b, o)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.CPUUtilGainPoints, "util-gain-points")
				b.ReportMetric(r.ExtenderFilterP99Ms, "filter-p99-ms")
				results, last = append(results, r), o
			}
		})
	}
	if len(results) == 0 {
		return
	}
	rep := NewReport(last, controlplane.K8sVersion, "v0.7.0", results)
	out, png := *flagOut, *flagPNG
	if out == "" {
		out = filepath.Join(root, "bench", "out", "cluster.json")
	}
	if png == "" {
		png = filepath.Join(root, "docs", "img", "cluster-bench.png")
	}
	if err := WriteReport(out, rep); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(png), 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(png)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := Plot(rep, f); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s and %s", out, png)
}

// BenchmarkClusterSmoke runs the whole benchmark on 20 nodes for a minute and
// checks it: jobs are placed through the extender and completed by kwok, the
// agents publish, LS is never oversubscribed, and (unless -clusterbench.admission
// =false) the admission webhook was called and converted every batch pod, and
// with -clusterbench.kueue that Kueue admitted and finished Workloads and no gang
// was left partially bound. `make bench-cluster` runs it
// before the sizes. It is a benchmark, not a test, so that `make test` does not
// build kwok (about 12 minutes cold on 2 cores) for it.
//
//	go test ./bench/clusterbench -run '^$' -bench ClusterSmoke -benchtime 1x
func BenchmarkClusterSmoke(b *testing.B) {
	t := b
	root := moduleRoot(t)
	o := DefaultOptions(20)
	o.KwokBin, o.ModuleRoot, o.OpenbDir = kwokBinary(t, root), root, openbDir(t, root)
	o.Warmup, o.Duration, o.MaxDuration = 15*time.Second, 60*time.Second, 20*time.Second
	// Heartbeats within the measured minute, whatever the trace does.
	o.NodeMetricsReport.MaxInterval.Duration = 30 * time.Second
	o.Admission, o.ComponentNice = *flagAdmit, *flagNice
	// With Kueue the follower starts the quotas from 0: a pass every 10 s (the
	// shipped 30 s) lets them rise within the smoke's warm-up and minute.
	o.Kueue, o.KueueQuotaInterval = *flagKueue, 10*time.Second
	o.Log = testWriter{t}
	b.ResetTimer()
	r, err := Run(context.Background(), t, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	switch {
	case r.BatchBound == 0 || r.BatchCompleted == 0:
		t.Errorf("bound %d, completed %d of %d batch pods: want some of each", r.BatchBound, r.BatchCompleted, r.BatchSubmitted)
	case r.AgentStatusPatchesPerSec == 0 || r.AgentMetricsPatchesPerSec == 0:
		t.Errorf("agents wrote %.2f status and %.2f metrics patches/s: want both", r.AgentStatusPatchesPerSec, r.AgentMetricsPatchesPerSec)
	case r.LSOversubscribedCPUNodeSecs+r.LSOversubscribedMemNodeSecs != 0:
		t.Errorf("LS oversubscribed for %d CPU and %d memory node-seconds, want 0", r.LSOversubscribedCPUNodeSecs, r.LSOversubscribedMemNodeSecs)
	case r.ExtenderFilterCalls == 0 || r.APIRequestsPerSec == 0:
		t.Errorf("extender filter calls %d, API requests/s %.1f: want both", r.ExtenderFilterCalls, r.APIRequestsPerSec)
	case r.AgentPatchErrors != 0:
		t.Errorf("%d agent patches failed", r.AgentPatchErrors)
	}
	if msg := admissionCheck(r, o.Admission); msg != "" {
		t.Error(msg)
	}
	if msg := kueueCheck(r, o.Kueue); msg != "" {
		t.Error(msg)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
