package schedbench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/understory/understory/test/e2e/controlplane"
)

// Flags of the test binary (the benchmark's own main).
var (
	flagNodes   = flag.Int("schedbench.nodes", 5000, "fake nodes")
	flagPods    = flag.Int("schedbench.pods", 3000, "pending pods per scenario")
	flagQPS     = flag.Int("schedbench.qps", 5000, "kube-scheduler clientConnection qps and burst")
	flagTimeout = flag.Duration("schedbench.timeout", 10*time.Minute, "bound on one scenario")
	flagOut     = flag.String("schedbench.out", "", "JSON report (default <module>/bench/out/scheduler-throughput.json)")
)

// scenario is one scheduler configuration under test.
type scenario struct {
	name string
	// extender, if set, returns the handler of an in-process HTTP extender
	// (served with httptest) and its configuration (URLPrefix is filled in).
	// calls, if set, reports the extender's filter/prioritize call counts.
	extender func(tb testing.TB, cp *controlplane.ControlPlane) (h http.Handler, cfg controlplane.Extender, calls func() (int64, int64))
}

// scenarios lists the configurations in the order they run. To measure
// Understory's extender, add (scheduler-extender, package extender):
//
//	{name: "understory-extender", extender: func(tb testing.TB, cp *controlplane.ControlPlane) (http.Handler, controlplane.Extender, func() (int64, int64)) {
//		srv, err := extender.NewServer(extender.DefaultConfig(), extender.Deps{Client: cp.Client()})
//		if err != nil { tb.Fatal(err) }
//		ctx, cancel := context.WithCancel(context.Background()); tb.Cleanup(cancel)
//		go srv.Run(ctx)
//		return srv.Handler(), controlplane.Extender{FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: 1, NodeCacheCapable: true}, nil
//	}},
func scenarios() []scenario {
	return []scenario{
		{name: "kube-scheduler"},
		{name: "noop-extender", extender: func(testing.TB, *controlplane.ControlPlane) (http.Handler, controlplane.Extender, func() (int64, int64)) {
			e := &NoopExtender{}
			return e, controlplane.Extender{
				FilterVerb:       "filter",
				PrioritizeVerb:   "prioritize",
				Weight:           1,
				NodeCacheCapable: true,
			}, e.Calls
		}},
	}
}

func BenchmarkSchedulerThroughput(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	cp := controlplane.Start(ctx, b, controlplane.Options{EtcdOnTmpfs: true})

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("128Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	began := time.Now()
	if _, err := cp.CreateNodes(ctx, "bench", *flagNodes, capacity, nil); err != nil {
		b.Fatal(err)
	}
	nodeSecs := time.Since(began).Seconds()
	b.Logf("created %d nodes in %.1fs", *flagNodes, nodeSecs)

	report := Report{
		Benchmark:       "scheduler-throughput",
		Date:            nowRFC3339(),
		Kubernetes:      controlplane.K8sVersion,
		Nodes:           *flagNodes,
		Pods:            *flagPods,
		SchedulerQPS:    *flagQPS,
		Etcd:            "3.4 on tmpfs",
		CreateNodesSecs: nodeSecs,
		Machine:         describeMachine(),
	}
	for _, sc := range scenarios() {
		b.Run(sc.name, func(b *testing.B) {
			var runs []Result
			for i := range b.N {
				runs = append(runs, runScenario(ctx, b, cp, sc, fmt.Sprintf("%s-%d", sc.name, i)))
			}
			s := summarize(sc.name, runs)
			b.ReportMetric(s.MedianPodsPerSec, "pods/s")
			// With -benchtime Nx (N > 1) the framework calls this twice
			// (b.N = 1, then N): keep the last call's runs.
			report.set(s, runs)
		})
	}
	if len(report.Results) == 0 {
		return
	}
	out := *flagOut
	if out == "" {
		var err error
		if out, err = defaultOut(); err != nil {
			b.Fatal(err)
		}
	}
	if err := writeReport(out, report); err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %s", out)
}

// runScenario creates the pending pods, starts the scheduler and times the
// binds, then removes the scheduler and the pods.
func runScenario(ctx context.Context, b *testing.B, cp *controlplane.ControlPlane, sc scenario, ns string) Result {
	ctx, cancel := context.WithTimeout(ctx, *flagTimeout)
	defer cancel()
	n := *flagPods
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		b.Fatal(err)
	}
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = controlplane.NewPod(ns, fmt.Sprintf("p-%d", i), requests)
	}
	began := time.Now()
	if err := cp.CreatePods(ctx, pods); err != nil {
		b.Fatal(err)
	}
	createRate := float64(n) / time.Since(began).Seconds()

	binds, err := watchBinds(ctx, cp, ns, n)
	if err != nil {
		b.Fatal(err)
	}

	cfg := ""
	var calls func() (int64, int64)
	if sc.extender != nil {
		h, ext, c := sc.extender(b, cp)
		srv := httptest.NewServer(h)
		defer srv.Close()
		ext.URLPrefix = srv.URL
		if cfg, err = controlplane.SchedulerConfig(ext); err != nil {
			b.Fatal(err)
		}
		calls = c
	}
	load := loadAvg()
	start := time.Now()
	sched := cp.StartScheduler(b, cfg, controlplane.WithClientRate(float32(*flagQPS), int32(*flagQPS)))

	var times []time.Time
	select {
	case times = <-binds:
	case <-ctx.Done():
		b.Fatalf("%s: pods not all bound within %v", sc.name, *flagTimeout)
	}
	sched.Stop()
	if len(times) != n {
		b.Fatalf("%s: %d binds recorded, want %d", sc.name, len(times), n)
	}

	r := Result{
		Name:             sc.name,
		Pods:             n,
		CreatePodsPerSec: createRate,
		LoadAvgBefore:    load,
		WallSeconds:      times[n-1].Sub(start).Seconds(),
		FirstBindSeconds: times[0].Sub(start).Seconds(),
		BindSpanSeconds:  times[n-1].Sub(times[0]).Seconds(),
	}
	if n > 1 && r.BindSpanSeconds > 0 {
		r.PodsPerSec = float64(n-1) / r.BindSpanSeconds
	}
	if calls != nil {
		r.ExtenderFilterCalls, r.ExtenderPriorityCalls = calls()
		// A do-nothing extender that was never asked would make the number a lie.
		if r.ExtenderFilterCalls < int64(n) || r.ExtenderPriorityCalls < int64(n) {
			b.Fatalf("%s: extender answered %d filter / %d prioritize calls for %d pods", sc.name, r.ExtenderFilterCalls, r.ExtenderPriorityCalls, n)
		}
	}
	b.Logf("%s: %d pods bound at %.0f pods/s (span %.2fs, first bind %.2fs after start, wall %.2fs; created at %.0f pods/s; load %s)",
		sc.name, n, r.PodsPerSec, r.BindSpanSeconds, r.FirstBindSeconds, r.WallSeconds, createRate, load)

	zero := int64(0)
	if err := cp.Client().CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		b.Fatalf("deleting pods of %s: %v", ns, err)
	}
	return r
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
