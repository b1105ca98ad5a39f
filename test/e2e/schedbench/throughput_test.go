package schedbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/controlplane"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/extenderharness"
)

// Flags of the test binary (the benchmark's own main).
var (
	flagNodes      = flag.Int("schedbench.nodes", 5000, "fake nodes")
	flagGPUs       = flag.Int("schedbench.gpus", 8, "nvidia.com/gpu of every node")
	flagPods       = flag.Int("schedbench.pods", 3000, "pending pods per scenario")
	flagQPS        = flag.Int("schedbench.qps", 5000, "kube-scheduler clientConnection qps and burst")
	flagPercentage = flag.Int("schedbench.percentage", 0, "percentageOfNodesToScore of every scenario (0: kube-scheduler's adaptive default)")
	flagTimeout    = flag.Duration("schedbench.timeout", 10*time.Minute, "bound on one scenario")
	flagOut        = flag.String("schedbench.out", "", "JSON report (default <module>/bench/out/scheduler-throughput.json)")
	flagProfiles   = flag.String("schedbench.cpuprofile-dir", "", "write a CPU profile of the benchmark process (the in-process extender) per scenario run, scheduler start to last bind")
	flagRounds     = flag.Int("schedbench.rounds", 1, "rounds; each runs every scenario once, in order, so drifting machine load spreads over all scenarios")
	flagProtobuf   = flag.Bool("schedbench.extender-protobuf", true, "give the real extender a protobuf clientset, as cmd/scheduler-extender does (false: JSON)")
)

// gpuModel is the nvidia.com/gpu.product label of every node.
const gpuModel = "NVIDIA-A100-SXM4-80GB"

// Workloads (Result.Workload).
const (
	workloadCPU = "cpu"
	workloadGPU = "gpu"
)

// extenderRun is an extender serving one scenario run.
type extenderRun struct {
	cfg   controlplane.Extender // URLPrefix filled in
	calls func() extenderharness.Calls
	stop  func() error
	// verify checks the bound pods of the run (nil: nothing to check).
	verify func(ctx context.Context, cp *controlplane.ControlPlane, ns string) error
}

// scenario is one scheduler configuration under test.
type scenario struct {
	name     string
	workload string
	// extender, if set, starts the extender kube-scheduler is configured with.
	extender func(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, manifest []byte) extenderRun
	// checkCalls judges the extender's calls for n bound pods.
	checkCalls func(c extenderharness.Calls, n int) error
}

// Scenario names: (a)-(d) of docs/benchmarks-controlplane.md.
const (
	scenarioAlone     = "kube-scheduler"
	scenarioNoop      = "noop-extender"
	scenarioReal      = "understory-extender"
	scenarioUnmanaged = "understory-extender-unmanaged"
)

var errCalls = errors.New("unexpected extender calls")

// scenarios lists the configurations in the order they run. Every extender
// uses the extender entry of manifests/scheduler/kube-scheduler-config.yaml
// (nodeCacheCapable, managedResources, weight, httpTimeout); the do-nothing
// extender has no bindVerb (it cannot bind). The rest of the manifest
// (percentageOfNodesToScore: 100) is not applied: every scenario runs with
// -schedbench.percentage, so they differ only in the extender.
func scenarios() []scenario {
	understory := func(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, manifest []byte) extenderRun {
		e := extenderharness.Start(ctx, tb, cp, extenderharness.Options{SyncTimeout: 5 * time.Minute, Protobuf: *flagProtobuf})
		cfg, err := controlplane.ManifestExtender(manifest, e.URL())
		if err != nil {
			tb.Fatal(err)
		}
		return extenderRun{cfg: cfg, calls: e.Calls, stop: e.Stop, verify: verifyDevices}
	}
	return []scenario{
		{name: scenarioAlone, workload: workloadCPU},
		{name: scenarioNoop, workload: workloadGPU,
			extender: func(_ context.Context, tb testing.TB, _ *controlplane.ControlPlane, manifest []byte) extenderRun {
				e := &NoopExtender{}
				srv := httptest.NewServer(e)
				cfg, err := controlplane.ManifestExtender(manifest, srv.URL)
				if err != nil {
					srv.Close()
					tb.Fatal(err)
				}
				cfg.BindVerb = ""
				return extenderRun{cfg: cfg, stop: func() error { srv.Close(); return nil },
					calls: func() extenderharness.Calls {
						f, p := e.Calls()
						return extenderharness.Calls{Filter: f, Prioritize: p}
					}}
			},
			checkCalls: func(c extenderharness.Calls, n int) error {
				// A do-nothing extender that was never asked would make the number a lie.
				if c.Filter < int64(n) || c.Prioritize < int64(n) {
					return fmt.Errorf("%d filter / %d prioritize calls for %d pods: %w", c.Filter, c.Prioritize, n, errCalls)
				}
				return nil
			}},
		{name: scenarioReal, workload: workloadGPU, extender: understory,
			checkCalls: func(c extenderharness.Calls, n int) error {
				// Filter passes one node, so kube-scheduler skips scoring
				// (no prioritize call) and binds through the extender.
				if c.Filter < int64(n) || c.Bind < int64(n) {
					return fmt.Errorf("%d filter / %d bind calls for %d pods: %w", c.Filter, c.Bind, n, errCalls)
				}
				return nil
			}},
		{name: scenarioUnmanaged, workload: workloadCPU, extender: understory,
			checkCalls: func(c extenderharness.Calls, n int) error {
				// managedResources: pods asking for none never reach the extender.
				if c.Total() != 0 {
					return fmt.Errorf("%+v for %d pods without managed resources, want none: %w", c, n, errCalls)
				}
				return nil
			}},
	}
}

// targets are the throughput ratios the extender must keep (docs/benchmarks-controlplane.md).
func targets() []ratioSpec {
	return []ratioSpec{
		{name: "understory/noop", num: scenarioReal, den: scenarioNoop, target: 0.9},
		{name: "unmanaged/alone", num: scenarioUnmanaged, den: scenarioAlone, target: 0.95},
		{name: "noop/alone", num: scenarioNoop, den: scenarioAlone},
	}
}

func BenchmarkSchedulerThroughput(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		b.Fatal(err)
	}
	cp := controlplane.Start(ctx, b, controlplane.Options{EtcdOnTmpfs: true})
	// As in a cluster running gangs: the extender watches PodGroups.
	if _, err := cp.InstallCRD(ctx, controlplane.PodGroupCRD()); err != nil {
		b.Fatal(err)
	}

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("128Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	var labels map[string]string
	if *flagGPUs > 0 {
		capacity[contract.ResourceGPU] = *resource.NewQuantity(int64(*flagGPUs), resource.DecimalSI)
		labels = map[string]string{extender.LabelGPUProduct: gpuModel}
	}
	began := time.Now()
	if _, err := cp.CreateNodes(ctx, "bench", *flagNodes, capacity, labels); err != nil {
		b.Fatal(err)
	}
	nodeSecs := time.Since(began).Seconds()
	b.Logf("created %d nodes in %.1fs", *flagNodes, nodeSecs)

	report := Report{
		Benchmark:                "scheduler-throughput",
		Date:                     nowRFC3339(),
		Kubernetes:               controlplane.K8sVersion,
		Nodes:                    *flagNodes,
		GPUsPerNode:              *flagGPUs,
		Pods:                     *flagPods,
		SchedulerQPS:             *flagQPS,
		PercentageOfNodesToScore: *flagPercentage,
		Rounds:                   max(*flagRounds, 1),
		ExtenderProtobuf:         *flagProtobuf,
		Etcd:                     "3.4 on tmpfs",
		CreateNodesSecs:          nodeSecs,
		Machine:                  describeMachine(),
	}
	runs := map[string][]Result{}
	for round := range max(*flagRounds, 1) {
		for _, sc := range scenarios() {
			var last []Result
			b.Run(sc.name, func(b *testing.B) {
				// With -benchtime Nx (N > 1) the framework calls this twice
				// (b.N = 1, then N): keep the last call's runs.
				last = last[:0]
				for i := range b.N {
					last = append(last, runScenario(ctx, b, cp, sc, manifest, fmt.Sprintf("%s-%d-%d", sc.name, round, i)))
				}
				b.ReportMetric(summarize(sc.name, last).MedianPodsPerSec, "pods/s")
			})
			runs[sc.name] = append(runs[sc.name], last...)
		}
	}
	for _, sc := range scenarios() {
		if len(runs[sc.name]) > 0 {
			report.set(summarize(sc.name, runs[sc.name]), runs[sc.name])
		}
	}
	if len(report.Results) == 0 {
		return
	}
	report.Ratios = ratios(report.Summary, targets())
	for _, r := range report.Ratios {
		b.Logf("ratio %s = %.2f (target %.2f, met %v)", r.Name, r.Value, r.Target, r.Met)
	}
	out := *flagOut
	if out == "" {
		if out, err = defaultOut(); err != nil {
			b.Fatal(err)
		}
	}
	if err := writeReport(out, report); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", out)
}

// benchPods returns n pending pods of workload w in namespace ns. GPU pods
// cycle through nvidia.com/gpu 1 and 2 and understory.io/gpu-milli 500 and
// 250 (extended resources need limit = request).
func benchPods(ns string, n int, w string) []*corev1.Pod {
	base := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		p := controlplane.NewPod(ns, fmt.Sprintf("p-%d", i), base)
		if w == workloadGPU {
			name, v := corev1.ResourceName(contract.ResourceGPU), int64(1+i%2)
			if i%4 >= 2 {
				name, v = contract.ResourceGPUMilli, int64(500/(1+i%2))
			}
			q := *resource.NewQuantity(v, resource.DecimalSI)
			res := &p.Spec.Containers[0].Resources
			res.Requests[name] = q
			res.Limits = corev1.ResourceList{name: q}
		}
		pods[i] = p
	}
	return pods
}

var errDevices = errors.New("gpu pod without a valid devices annotation")

// verifyDevices checks that every bound GPU pod in ns has as many devices in
// its understory.io/gpu-devices annotation as it asks for.
func verifyDevices(ctx context.Context, cp *controlplane.ControlPlane, ns string) error {
	pods, err := cp.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		req, err := extender.PodRequest(p)
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		if req.NumGPU == 0 {
			continue
		}
		d, err := contract.ParseGPUDevices(p.Annotations[contract.AnnotationGPUDevices])
		if err != nil || len(d) != req.NumGPU {
			return fmt.Errorf("pod %s (%d gpus) has %q (%v): %w", p.Name, req.NumGPU, p.Annotations[contract.AnnotationGPUDevices], err, errDevices)
		}
	}
	return nil
}

// schedulerConfig is the KubeSchedulerConfiguration of a scenario.
func schedulerConfig(exts ...controlplane.Extender) (string, error) {
	cfg, err := controlplane.SchedulerConfig(exts...)
	if err != nil || *flagPercentage <= 0 {
		return cfg, err
	}
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(cfg), &m); err != nil {
		return "", fmt.Errorf("parsing scheduler configuration: %w", err)
	}
	m["percentageOfNodesToScore"] = *flagPercentage
	out, err := yaml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encoding scheduler configuration: %w", err)
	}
	return string(out), nil
}

// runScenario creates the pending pods, starts the extender (if any) and the
// scheduler and times the binds, then removes the scheduler, the extender
// and the pods.
func runScenario(ctx context.Context, b *testing.B, cp *controlplane.ControlPlane, sc scenario, manifest []byte, ns string) Result {
	ctx, cancel := context.WithTimeout(ctx, *flagTimeout)
	defer cancel()
	n := *flagPods
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	if err := cp.CreatePods(ctx, benchPods(ns, n, sc.workload)); err != nil {
		b.Fatal(err)
	}
	createRate := float64(n) / time.Since(began).Seconds()

	binds, err := watchBinds(ctx, cp, ns, n)
	if err != nil {
		b.Fatal(err)
	}

	var ext extenderRun
	var exts []controlplane.Extender
	if sc.extender != nil {
		ext = sc.extender(ctx, b, cp, manifest)
		exts = append(exts, ext.cfg)
	}
	cfg, err := schedulerConfig(exts...)
	if err != nil {
		b.Fatal(err)
	}
	stopProfile := func() {}
	if *flagProfiles != "" {
		stopProfile = startProfile(b, filepath.Join(*flagProfiles, ns+".pprof"))
		defer stopProfile()
	}
	load := loadAvg()
	cpuBefore := cpuTimes("/proc", os.Getpid())
	start := time.Now()
	sched := cp.StartScheduler(b, cfg, controlplane.WithClientRate(float32(*flagQPS), int32(*flagQPS)))

	var times []time.Time
	select {
	case times = <-binds:
	case <-ctx.Done():
		b.Fatalf("%s: pods not all bound within %v", sc.name, *flagTimeout)
	}
	cpu := cpuDelta(cpuBefore, cpuTimes("/proc", os.Getpid()))
	loadAfter := loadAvg()
	stopProfile()
	sched.Stop()
	if len(times) != n {
		b.Fatalf("%s: %d binds recorded, want %d", sc.name, len(times), n)
	}

	r := Result{
		Name:             sc.name,
		Workload:         sc.workload,
		Pods:             n,
		CreatePodsPerSec: createRate,
		LoadAvgBefore:    load,
		LoadAvgAfter:     loadAfter,
		WallSeconds:      times[n-1].Sub(start).Seconds(),
		FirstBindSeconds: times[0].Sub(start).Seconds(),
		BindSpanSeconds:  times[n-1].Sub(times[0]).Seconds(),
		CPUSeconds:       cpu,
	}
	total := 0.0
	for _, v := range cpu {
		total += v
	}
	r.CPUMillisPerPod = 1000 * total / float64(n)
	if n > 1 && r.BindSpanSeconds > 0 {
		r.PodsPerSec = float64(n-1) / r.BindSpanSeconds
	}
	if sc.extender != nil {
		if ext.verify != nil {
			if err := ext.verify(ctx, cp, ns); err != nil {
				b.Fatalf("%s: %v", sc.name, err)
			}
		}
		c := ext.calls()
		r.ExtenderFilterCalls, r.ExtenderPriorityCalls, r.ExtenderBindCalls = c.Filter, c.Prioritize, c.Bind
		if err := ext.stop(); err != nil {
			b.Fatalf("%s: stopping the extender: %v", sc.name, err)
		}
		if sc.checkCalls != nil {
			if err := sc.checkCalls(c, n); err != nil {
				b.Fatalf("%s: %v", sc.name, err)
			}
		}
	}
	b.Logf("%s: %d %s pods bound at %.0f pods/s (span %.2fs, first bind %.2fs after start, wall %.2fs; created at %.0f pods/s; load %s -> %s; cpu %.1f ms/pod %v; extender calls f/p/b %d/%d/%d)",
		sc.name, n, sc.workload, r.PodsPerSec, r.BindSpanSeconds, r.FirstBindSeconds, r.WallSeconds, createRate, load, loadAfter,
		r.CPUMillisPerPod, roundMap(cpu), r.ExtenderFilterCalls, r.ExtenderPriorityCalls, r.ExtenderBindCalls)

	zero := int64(0)
	if err := cp.Client().CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		b.Fatalf("deleting pods of %s: %v", ns, err)
	}
	return r
}

func roundMap(m map[string]float64) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = strconv.FormatFloat(v, 'f', 1, 64) + "s"
	}
	return out
}

// startProfile writes a CPU profile of this process to path until the
// returned function is first called.
func startProfile(tb testing.TB, path string) func() {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				tb.Errorf("writing %s: %v", path, err)
			}
			tb.Logf("CPU profile %s", path)
		})
	}
}

// watchBinds watches namespace ns and sends, once want distinct pods have
// been seen with spec.nodeName set, the times they were first seen bound,
// sorted. The pods must exist and be unbound when it is called.
func watchBinds(ctx context.Context, cp *controlplane.ControlPlane, ns string, want int) (<-chan []time.Time, error) {
	pods := cp.Client().CoreV1().Pods(ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	if len(list.Items) != want {
		return nil, fmt.Errorf("namespace %s has %d pods, want %d", ns, len(list.Items), want)
	}
	for i := range list.Items {
		if list.Items[i].Spec.NodeName != "" {
			return nil, fmt.Errorf("pod %s already bound before the scheduler started", list.Items[i].Name)
		}
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return pods.Watch(ctx, o)
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, lw)
	if err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	out := make(chan []time.Time, 1)
	go func() {
		defer rw.Stop()
		seen := make(map[types.UID]bool, want)
		times := make([]time.Time, 0, want)
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				p, isPod := ev.Object.(*corev1.Pod)
				if !isPod || p.Spec.NodeName == "" || seen[p.UID] {
					continue
				}
				seen[p.UID] = true
				times = append(times, time.Now())
				if len(times) == want {
					slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
					out <- times
					return
				}
			}
		}
	}()
	return out, nil
}
