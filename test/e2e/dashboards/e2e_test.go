package dashboards

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/cmd/dashboard-render/grafana"
	"github.com/understory/understory/internal/kueueharness"
	"github.com/understory/understory/internal/testenv"
)

// renderDir, when set, makes TestDashboardsOnPrometheus render every dashboard from
// the run's data into it (`make dashboards`: docs/img/dashboards).
var renderDir = flag.String("dashboards.png", "", "render each dashboard from the end-to-end run's data as "+
	"<uid>.png into this directory")

func TestMain(m *testing.M) {
	if spec := os.Getenv(burnerEnv); spec != "" {
		runBurner(spec) // a pod's CPU burner (node_test.go); never returns
	}
	os.Exit(m.Run())
}

// lsPhase is one step of the LS load script: LS loaded (a second, heavy burner in
// the LS pod and the inference services on GPUs 0 and 3) or not, for d.
type lsPhase struct {
	on bool
	d  time.Duration
}

// TestDashboardsOnPrometheus proves every panel of every shipped dashboard on real
// data: Debian's Prometheus scrapes
//   - the real agent (cmd/koordlet, static mode) on this machine's cgroups, holding
//     two batch pods that burn CPU below an LS pod whose load steps up and down (cuts,
//     restores, freezes, a dry-run eviction of starved batch) and a BE pod;
//   - a GPU node: the agent's real GPU loop and metrics over go-nvml's 8-GPU mock
//     with scripted LS and batch processes (no GPU here), freezing real cgroups;
//   - the real scheduler extender on a real control plane, called by kube-scheduler
//     as the second scheduler (its shipped configuration, profile understory-scheduler)
//     for a stream of GPU, GPU-share and batch pods and two gangs;
//   - that kube-scheduler's own /metrics, as a Prometheus in the cluster scrapes the
//     second scheduler: with a service account's token, the account bound to the
//     shipped ClusterRole understory-scheduler-metrics-reader (anonymous and unbound
//     callers are refused first);
//   - the real Kueue quota follower (cmd/kueue-quota) following two nodes' batch
//     capacity into the shipped ClusterQueues (Kueue's CRDs from the Kueue build, no
//     Kueue manager: the test admits one Workload and evicts it as Kueue would); the
//     capacity falls mid-run, so the follower lowers the quotas, deactivates the
//     Workload and requeues it once evicted, then raises them again;
//
// then Check (cmd/dashboard-render/grafana) must find data in every panel and every variable. Root; about 2 min.
func TestDashboardsOnPrometheus(t *testing.T) {
	if testing.Short() { // asked for, as the other end-to-end tests: no missing dependency
		t.Skip("runs the agent, a control plane and Prometheus for about 2 minutes; skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "must run as root: the agent and the fake nodes write cgroups under %s", cgroupRoot)
	}
	if !haveGPUNode {
		testenv.SkipOrFailInCI(t, "needs cgo: the GPU node runs go-nvml's mock (build with CGO_ENABLED=1)")
	}
	// Kueue's CRDs for the quota follower (skips without the Kueue build, or builds it
	// under CI=true: make test builds it first).
	kueue := kueueharness.Find(t)
	ds, err := grafana.Load(shippedDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h, err := cgroups.Open(cgroupRoot)
	if err != nil {
		testenv.SkipOrFailInCI(t, "no writable cgroup filesystem at %s: %v", cgroupRoot, err)
	}
	// CPU burners on the machine's real cgroups, and an agent that reads what they leave:
	// not at the same time as the other packages' CPU tests (test/e2e's TestLoop
	// published no batch CPU for 90 s beside this one on 2 cores).
	cgroupstest.LockCPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	began := time.Now()
	cleanLeftovers(t, h)

	// The agent and the quota follower build while the control plane starts.
	type built struct {
		agent, follower string
		err             error
	}
	binDir := t.TempDir()
	bins := make(chan built, 1)
	go func() {
		var b built
		if b.agent, b.err = buildBinary(ctx, binDir, "./cmd/koordlet"); b.err == nil {
			b.follower, b.err = buildBinary(ctx, binDir, "./cmd/kueue-quota")
		}
		bins <- b
	}()
	c := startCluster(ctx, t)
	setUpKueue(ctx, t, c.cp, kueue)
	schedJob := c.schedulerScrapeJob(ctx, t)
	tCluster := time.Since(began)
	b := <-bins
	if b.err != nil {
		t.Fatal(b.err)
	}
	follower := startQuotaFollower(ctx, t, c.cp, b.follower)
	node := newFakeNode(t, h, nodePods())
	node.startAgent(t, b.agent)
	gpuNode := startGPUNode(ctx, t, h, node.base+"-gpu")
	gpuNode.lsLoad(false)
	// The steady load: batch burns what it is given, BE a little, LS a base; each holds
	// some memory.
	node.burn(t, "batch-etl", 1, 100, 256)
	node.burn(t, "batch-train", 1, 100, 384)
	node.burn(t, "be-cron", 1, 15, 64)
	node.burn(t, "ls-web", 1, 25, 192)

	prom := StartPrometheus(ctx, t, PrometheusOptions{Jobs: []ScrapeJob{
		{Name: "understory-koordlet", Targets: []ScrapeTarget{
			{Address: node.addr, Labels: map[string]string{"node": "e2e-node"}},
			{Address: gpuNode.addr(), Labels: map[string]string{"node": "e2e-gpu-node"}},
		}},
		{Name: "understory-scheduler-extender", Targets: []ScrapeTarget{{Address: c.metricsAddr()}}},
		schedJob,
		{Name: "understory-kueue-quota", Targets: []ScrapeTarget{{Address: follower.addr}}},
	}})
	if err := prom.WaitTargetsUp(ctx, 5); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tSetUp := start.Sub(began)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	trafficDone := make(chan error, 1)
	go func() { trafficDone <- c.traffic(trafficCtx, 2*time.Second, 8*time.Second) }()
	kueueDone := make(chan error, 1)
	go func() { kueueDone <- playKueue(trafficCtx, c.cp) }()
	// Gangs: "train" (2 × 2 GPUs) is admitted whole at once. After the first loaded
	// phase it finishes, "finetune" (2 × 1 GPU) is admitted in its place and "sweep"
	// (3 × 4 GPUs) never fits the two 4-GPU nodes. The gang event counters are born
	// with train's events, so the later ones show as rates.
	train := gang{"train", 2, 2}
	if err := c.createGangs(ctx, train); err != nil {
		t.Fatal(err)
	}
	// The LS script: long loaded phases starve batch (freeze, then a dry-run eviction
	// after escalation.starvationTimeout, 8 s here), a short one only cuts.
	script := []lsPhase{{false, 5 * time.Second}, {true, 11 * time.Second}, {false, 6 * time.Second},
		{true, 4 * time.Second}, {false, 6 * time.Second}, {true, 11 * time.Second}, {false, 7 * time.Second}}
	// The quota nodes' batch capacity falls with the second phase (the follower lowers
	// the quotas at once) and again with the third (below what is admitted: 2 s later
	// the follower deactivates the Workload, the test evicts it as Kueue, the follower
	// requeues it), and comes back with the sixth (the quotas climb again and the
	// Workload is admitted again).
	for i, ph := range script {
		if i == 2 {
			if err := c.deleteGang(ctx, train); err != nil {
				t.Fatal(err)
			}
			if err := c.createGangs(ctx, gang{"finetune", 2, 1}, gang{"sweep", 3, 4}); err != nil {
				t.Fatal(err)
			}
		}
		if cpu, ok := map[int]int64{1: quotaNodeCPUMid, 2: quotaNodeCPULow, 5: quotaNodeCPU}[i]; ok {
			if err := setQuotaCapacity(ctx, c.cp, cpu); err != nil {
				t.Fatal(err)
			}
		}
		if !ph.on {
			sleep(ctx, ph.d)
			continue
		}
		heavy := node.burn(t, "ls-web", 2, 85, 128)
		gpuNode.lsLoad(true)
		sleep(ctx, ph.d)
		node.stop("ls-web", heavy)
		gpuNode.lsLoad(false)
	}
	stopTraffic()
	if err := <-trafficDone; err != nil {
		t.Fatalf("scheduling traffic: %v", err)
	}
	if err := <-kueueDone; err != nil {
		t.Fatalf("playing Kueue for the quota follower: %v", err)
	}
	sleep(ctx, 2*time.Second) // the last scrapes
	end := time.Now()
	if ctx.Err() != nil {
		t.Fatal(ctx.Err())
	}

	// The follower went the whole way: the quotas fell below the admitted Workload, it
	// was deactivated, evicted (by the test, as Kueue) and reactivated.
	for _, q := range []string{"sum(understory_kueue_quota_evictions_total)", "sum(understory_kueue_quota_requeues_total)"} {
		v, _, _, err := prom.API().Query(ctx, q, end)
		if err != nil {
			t.Fatal(err)
		}
		if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || vec[0].Value < 1 {
			t.Errorf("%s = %v, want at least 1", q, v)
		}
	}

	w := grafana.Window{Start: start, End: end, Step: 2 * time.Second, RateInterval: 4 * time.Second}
	report, err := grafana.Check(ctx, prom.API(), ds, w)
	if err != nil {
		t.Fatal(err)
	}
	points := 0
	for _, p := range report.Panels {
		for _, tr := range p.Targets {
			points += tr.Points
		}
	}
	t.Logf("%d panels of %d dashboards, %d variables, %d points checked", len(report.Panels), len(ds),
		len(report.Variables), points)
	for _, p := range report.Failed() {
		t.Errorf("no data: %v", p)
	}
	for _, v := range report.FailedVariables() {
		t.Errorf("%s variable %s lists nothing: %v", v.Dashboard, v.Name, v.Err)
	}
	if *renderDir != "" {
		if err := renderAll(ctx, prom.API(), ds, w, *renderDir); err != nil {
			t.Error(err)
		}
	}
	t.Logf("control plane %v, set-up %v, script %v, whole test %v", tCluster.Round(time.Second),
		tSetUp.Round(time.Second), end.Sub(start).Round(time.Second), time.Since(began).Round(time.Second))
}

// renderAll writes <dir>/<uid>.png for every dashboard.
func renderAll(ctx context.Context, api grafana.API, ds []grafana.Dashboard, w grafana.Window, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, d := range ds {
		path := filepath.Join(dir, strings.TrimPrefix(d.UID, "understory-")+".png")
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = grafana.Render(ctx, api, d, grafana.RenderOptions{Window: w}, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rendering %s: %w", d.UID, err))
		}
	}
	return errors.Join(errs...)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
