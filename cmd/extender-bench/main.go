// Command extender-bench measures the scheduler extender for `make
// bench-extender` and writes JSON:
//
//   - latency: filter and prioritize over real HTTP on loopback: it starts the
//     server in-process, loads a synthetic openb-like cluster into the index,
//     and fires pre-encoded ExtenderArgs (NodeNames form, every node a
//     candidate) from several concurrent clients, bounded in calls and time
//     (p50/p99 latency, calls/s);
//   - lockhold: every hold of the index's write lock while a 1 000-member gang
//     waits on 5 000 nodes under filters and informer events (lockhold.go);
//   - memory: the RSS of the extender, a child process with its real
//     informers, at 5 000 nodes and 100 000 pods served by a fake API server
//     (memory.go).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/scheduler-extender/placement"
)

type options struct {
	clientList           []int
	nodes, clients, pods int
	shapes               int
	maxCalls             int64
	duration, warmup     time.Duration
	policy, out          string
	seed                 int64
	targetP99            time.Duration
	targetRate           float64
	enforce              bool
	cpuprofile           string

	runs             map[string]bool // latency, lockhold, memory
	gangMembers      int
	lockHoldDuration time.Duration
	targetLockP99    time.Duration
	rssPods          int
	targetRSSMiB     float64
	rssChildAPI      string // set: run as the memory measurement's extender child
	memprofile       string
}

// nodeType is one line of the synthetic cluster mix.
type nodeType struct {
	share      float64
	model      string
	gpus, cpus int
	memGi      int
}

// openbMix approximates the node mix of Alibaba's openb GPU cluster trace
// (CPU-only nodes, 8-GPU V100 nodes, 2-GPU P100/T4 nodes, a few others).
var openbMix = []nodeType{
	{0.30, "", 0, 96, 512},
	{0.25, "V100M16", 8, 96, 512},
	{0.15, "V100M32", 8, 96, 768},
	{0.10, "P100", 2, 64, 256},
	{0.10, "T4", 2, 64, 256},
	{0.05, "A10", 4, 64, 256},
	{0.05, "G2", 1, 32, 128},
}

func mkNode(i int, t nodeType) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{}}}
	n.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(t.cpus), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(t.memGi)<<30, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	if t.gpus > 0 {
		n.Status.Allocatable[extender.ResourceGPU] = *resource.NewQuantity(int64(t.gpus), resource.DecimalSI)
		n.Labels[extender.LabelGPUProduct] = t.model
	}
	return n
}

// mkPod returns a GPU pod of the openb-like request mix.
func mkPod(name string, rng *rand.Rand, nodeName string, devs []int) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(1000+rng.Intn(8)*1000), resource.DecimalSI),
				corev1.ResourceMemory: *resource.NewQuantity(int64(4+rng.Intn(28))<<30, resource.BinarySI),
			},
			Limits: corev1.ResourceList{},
		}}}},
	}
	lim := p.Spec.Containers[0].Resources.Limits
	switch x := rng.Float64(); {
	case x < 0.45:
		lim[extender.ResourceGPUMilli] = *resource.NewQuantity(int64([]int{250, 500, 300, 600}[rng.Intn(4)]), resource.DecimalSI)
	case x < 0.85:
		lim[extender.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
	case x < 0.95:
		lim[extender.ResourceGPU] = *resource.NewQuantity(2, resource.DecimalSI)
	default:
		lim[extender.ResourceGPU] = *resource.NewQuantity(8, resource.DecimalSI)
	}
	if rng.Float64() < 0.1 {
		p.Annotations[extender.AnnotationGPUModel] = "V100M16,V100M32"
	}
	if len(devs) > 0 {
		p.Annotations[extender.AnnotationGPUDevices] = extender.FormatDevices(devs)
	}
	return p
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("extender-bench", flag.ContinueOnError)
	fs.IntVar(&o.nodes, "nodes", 5000, "nodes in the index (every one a candidate in each call)")
	clients := fs.String("clients", "1,2,4", "concurrent HTTP clients, a comma-separated list: one run each")
	fs.IntVar(&o.pods, "pods", 64, "distinct pending pods the clients cycle through")
	fs.IntVar(&o.shapes, "shapes", 8, "distinct pod templates (jobs) among the pods; pods of a job share requests")
	fs.Int64Var(&o.maxCalls, "max-calls", 60000, "stop a run after this many measured calls")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "stop a run after this long (measured part)")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured warm-up")
	fs.StringVar(&o.policy, "policy", placement.DefaultPolicy, "placement policy")
	fs.StringVar(&o.out, "out", "bench/out/extender.json", "JSON result file ('-' for stdout)")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the synthetic cluster")
	fs.DurationVar(&o.targetP99, "target-p99", 5*time.Millisecond, "p99 latency target")
	fs.Float64Var(&o.targetRate, "target-rate", 2000, "calls/s target")
	fs.BoolVar(&o.enforce, "enforce", false, "exit 1 when a target is missed")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the measured part here")
	runs := fs.String("runs", "latency,lockhold,memory", "what to measure: latency (filter and prioritize), "+
		"lockhold (write-lock holds while a huge gang waits), memory (RSS of an extender with -nodes and -rss-pods)")
	fs.IntVar(&o.gangMembers, "gang-members", 1000, "lockhold: minMember of the waiting gang")
	fs.DurationVar(&o.lockHoldDuration, "lock-hold-duration", 10*time.Second, "lockhold: how long to measure")
	fs.DurationVar(&o.targetLockP99, "target-lock-p99", 10*time.Millisecond, "lockhold: p99 write-lock hold target")
	fs.IntVar(&o.rssPods, "rss-pods", 100000, "memory: pods in the cluster (90 % bound, a fifth of those with a GPU share)")
	fs.Float64Var(&o.targetRSSMiB, "target-rss-mib", 400, "memory: RSS target in MiB")
	fs.StringVar(&o.memprofile, "memprofile", "", "memory: write the extender's heap profile (once synced) here")
	fs.StringVar(&o.rssChildAPI, "rss-child-api", "", "internal: run as the memory measurement's extender against this API URL")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.runs = map[string]bool{}
	for _, r := range strings.Split(*runs, ",") {
		switch r = strings.TrimSpace(r); r {
		case "latency", "lockhold", "memory":
			o.runs[r] = true
		default:
			return o, fmt.Errorf("bad -runs entry %q", r)
		}
	}
	if o.gangMembers < 1 || o.gangMembers > extender.MaxGangSize || o.lockHoldDuration <= 0 || o.rssPods < 1 {
		return o, fmt.Errorf("need -gang-members in 1..%d, -lock-hold-duration > 0 and -rss-pods >= 1", extender.MaxGangSize)
	}
	for _, f := range strings.Split(*clients, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return o, fmt.Errorf("bad -clients entry %q", f)
		}
		o.clientList = append(o.clientList, c)
		o.clients = max(o.clients, c)
	}
	if o.nodes < 1 || o.clients < 1 || o.pods < o.clients || o.maxCalls < 1 || o.duration <= 0 || o.shapes < 1 {
		return o, errors.New("need nodes, clients, max-calls, duration > 0 and pods >= clients")
	}
	return o, nil
}

// Stats summarises latencies.
type Stats struct {
	Calls int64   `json:"calls"`
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

func summarise(d []time.Duration) Stats {
	if len(d) == 0 {
		return Stats{}
	}
	slices.Sort(d)
	q := func(p float64) float64 {
		i := int(p * float64(len(d)-1))
		return float64(d[i].Microseconds()) / 1000
	}
	return Stats{Calls: int64(len(d)), P50Ms: q(0.50), P90Ms: q(0.90), P99Ms: q(0.99), MaxMs: q(1)}
}

// Result is the JSON the benchmark writes.
type Result struct {
	Date        time.Time `json:"date"`
	Machine     Machine   `json:"machine"`
	Nodes       int       `json:"nodes"`
	GPUs        int       `json:"gpus"`
	GPUsBound   int       `json:"gpus_bound"`
	Clients     int       `json:"clients"`
	Pods        int       `json:"pods"`
	Shapes      int       `json:"pod_shapes"`
	Policy      string    `json:"policy"`
	BodyBytes   int       `json:"request_body_bytes"`
	Seconds     float64   `json:"seconds"`
	CallsPerSec float64   `json:"calls_per_sec"`
	All         Stats     `json:"all"`
	Filter      Stats     `json:"filter"`
	Prioritize  Stats     `json:"prioritize"`
	// CPUMsPerCall is the process's CPU time (server and clients) per measured call:
	// a figure that stays meaningful when other work shares the machine.
	CPUMsPerCall float64 `json:"cpu_ms_per_call"`
	// CPUShare is the CPU the process got during the run, in cores.
	CPUShare float64 `json:"cpu_cores_used"`
	// LoadAvg1 is the 1-minute load average at the end of the run.
	LoadAvg1    string  `json:"loadavg_1m"`
	Errors      int64   `json:"errors"`
	FilterPass  int64   `json:"filter_calls_with_a_node"`
	TargetP99Ms float64 `json:"target_p99_ms"`
	TargetRate  float64 `json:"target_calls_per_sec"`
	Pass        bool    `json:"pass"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	GoVersion string `json:"go"`
	OS        string `json:"os"`
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func run(ctx context.Context, o options) (Result, error) {
	cfg := benchConfig(o)
	c, err := newCluster(o, cfg, extender.Deps{})
	if err != nil {
		return Result{}, err
	}
	return measure(ctx, o, c.srv, cfg, c.rng, c.names, c.gpus, c.used)
}

// benchConfig is the extender's default configuration with -policy and -seed.
func benchConfig(o options) extender.Config {
	cfg := extender.DefaultConfig()
	cfg.Policy, cfg.Seed = o.policy, o.seed
	return cfg
}

// cluster is an in-process extender loaded with the synthetic cluster.
type cluster struct {
	srv        *extender.Server
	rng        *rand.Rand // seeded with -seed, past the cluster's draws
	names      []string   // the nodes
	gpus, used int        // GPUs, GPUs bound
}

// newCluster starts an extender with cfg and deps (logging discarded), loads
// -nodes nodes of the openb mix into it (populate) and builds its workload.
func newCluster(o options, cfg extender.Config, deps extender.Deps) (cluster, error) {
	deps.Logger = slog.New(slog.DiscardHandler)
	srv, err := extender.NewServer(cfg, deps)
	if err != nil {
		return cluster{}, err
	}
	c := cluster{srv: srv, rng: newRand(o.seed)}
	c.names, c.gpus, c.used = populate(srv.State(), o.nodes, c.rng)
	return c, srv.State().RefreshWorkload()
}

// pickNodeType draws a line of openbMix by its share.
func pickNodeType(rng *rand.Rand) nodeType {
	x := rng.Float64()
	for _, m := range openbMix {
		if x < m.share {
			return m
		}
		x -= m.share
	}
	return openbMix[len(openbMix)-1]
}

// thisMachine describes the machine the benchmark runs on.
func thisMachine() Machine {
	return Machine{CPUs: runtime.NumCPU(), CPUModel: cpuModel(), GoVersion: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH}
}

// populate loads n nodes of the openb mix into st, about 40 % of each GPU
// node's devices taken by bound 1-GPU pods; it returns the node names, the
// GPU count and the GPUs bound.
func populate(st *extender.State, n int, rng *rand.Rand) (names []string, gpus, used int) {
	names = make([]string, n)
	for i := range n {
		t := pickNodeType(rng)
		n := mkNode(i, t)
		st.UpsertNode(n)
		names[i] = n.Name
		gpus += t.gpus
		// About 40% of each GPU node is taken by bound whole-GPU pods.
		for d := 0; d < t.gpus; d++ {
			if rng.Float64() < 0.4 {
				p := mkPod(fmt.Sprintf("bound-%d-%d", i, d), rng, n.Name, []int{d})
				lim := p.Spec.Containers[0].Resources.Limits
				delete(lim, extender.ResourceGPUMilli)
				delete(p.Annotations, extender.AnnotationGPUModel)
				lim[extender.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
				p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("1")
				p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory] = resource.MustParse("4Gi")
				st.UpsertPod(p)
				used++
			}
		}
	}
	return names, gpus, used
}

// measure fires the filter and prioritize load of o at srv (index already
// loaded) and summarises it.
func measure(ctx context.Context, o options, srv *extender.Server, cfg extender.Config, rng *rand.Rand,
	names []string, gpus, used int) (Result, error) {
	type bodies struct{ filter, prio []byte }
	pods := make([]bodies, o.pods)
	templates := make([]*corev1.Pod, o.shapes)
	for i := range templates {
		templates[i] = mkPod("template", rng, "", nil)
	}
	for i := range pods {
		p := templates[i%o.shapes].DeepCopy()
		p.Name = fmt.Sprintf("pending-%d", i)
		p.UID = types.UID("uid-" + p.Name)
		b, err := json.Marshal(extenderv1.ExtenderArgs{Pod: p, NodeNames: &names})
		if err != nil {
			return Result{}, err
		}
		pods[i] = bodies{filter: b, prio: b}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	hs := extender.NewHTTPServer(ln.Addr().String(), srv.Handler(), cfg)
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients, MaxConnsPerHost: o.clients,
		DisableCompression: true}, Timeout: 10 * time.Second}

	var (
		calls, errs, passes, checks atomic.Int64
		measuring                   atomic.Bool
		mu                          sync.Mutex
		filterLat, prioLat          []time.Duration
	)
	call := func(url string, body []byte, isFilter bool) (time.Duration, error) {
		start := time.Now()
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		var out []byte
		if isFilter {
			out, err = io.ReadAll(resp.Body)
		} else {
			_, err = io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
		d := time.Since(start)
		if err != nil {
			return d, err
		}
		if resp.StatusCode != http.StatusOK {
			return d, fmt.Errorf("status %d", resp.StatusCode)
		}
		if isFilter {
			// Check a filter result fully now and then; count passes cheaply.
			if checks.Add(1)%50 == 0 {
				var r extenderv1.ExtenderFilterResult
				if err := json.Unmarshal(out, &r); err != nil {
					return d, err
				}
			}
			if bytes.HasPrefix(out, []byte(`{"Nodes":null,"NodeNames":["`)) && measuring.Load() {
				passes.Add(1)
			}
		}
		return d, nil
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for c := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var fl, pl []time.Duration
			for i := c; runCtx.Err() == nil; i += o.clients {
				b := pods[i%o.pods]
				for _, v := range []struct {
					path   string
					body   []byte
					filter bool
				}{{"/filter", b.filter, true}, {"/prioritize", b.prio, false}} {
					d, err := call(base+v.path, v.body, v.filter)
					if !measuring.Load() {
						continue
					}
					if err != nil {
						errs.Add(1)
						continue
					}
					if calls.Add(1) > o.maxCalls {
						cancel()
						break
					}
					if v.filter {
						fl = append(fl, d)
					} else {
						pl = append(pl, d)
					}
				}
			}
			mu.Lock()
			filterLat = append(filterLat, fl...)
			prioLat = append(prioLat, pl...)
			mu.Unlock()
		}()
	}
	select {
	case <-time.After(o.warmup):
	case <-ctx.Done():
	}
	measuring.Store(true)
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return Result{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return Result{}, err
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	cpu0 := cpuTime()
	select {
	case <-time.After(o.duration):
	case <-runCtx.Done():
	}
	cancel()
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	cpuUsed := (cpuTime() - cpu0).Seconds()
	all := append(slices.Clone(filterLat), prioLat...)
	res := Result{
		Date: time.Now().UTC(), Nodes: o.nodes, GPUs: gpus, GPUsBound: used, Clients: o.clients, Pods: o.pods, Shapes: o.shapes, Policy: o.policy,
		BodyBytes: len(pods[0].filter), Seconds: elapsed, CallsPerSec: float64(len(all)) / elapsed,
		Filter: summarise(filterLat), Prioritize: summarise(prioLat), All: summarise(all),
		Errors: errs.Load(), FilterPass: passes.Load(),
		TargetP99Ms: float64(o.targetP99.Microseconds()) / 1000, TargetRate: o.targetRate,
		Machine: thisMachine(),
	}
	if n := len(all); n > 0 {
		res.CPUMsPerCall = cpuUsed * 1000 / float64(n)
	}
	res.CPUShare = cpuUsed / elapsed
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.LoadAvg1, _, _ = strings.Cut(string(b), " ")
	}
	res.Pass = res.Errors == 0 && res.All.P99Ms <= res.TargetP99Ms && res.CallsPerSec >= o.targetRate
	return res, nil
}

// cpuTime is the user+system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "extender-bench:", err)
		os.Exit(2)
	}
	if o.rssChildAPI != "" {
		if err := memoryChild(o.rssChildAPI, o.memprofile); err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(),
		time.Duration(len(o.clientList))*(o.warmup+o.duration+time.Minute)+o.lockHoldDuration+15*time.Minute)
	defer cancel()
	var report Report
	report.Pass = true
	for _, c := range o.clientList {
		if !o.runs["latency"] {
			break
		}
		ro := o
		ro.clients = c
		res, err := run(ctx, ro)
		if err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench:", err)
			os.Exit(1)
		}
		report.Runs = append(report.Runs, res)
		report.Pass = report.Pass && res.Pass
		fmt.Fprintf(os.Stderr, "extender-bench: %d nodes, %d clients: %.0f calls/s, p50 %.2f ms, p99 %.2f ms (filter p99 %.2f, prioritize p99 %.2f), %.3f cpu-ms/call on %.2f cores (load %s), errors %d: pass=%v\n",
			res.Nodes, res.Clients, res.CallsPerSec, res.All.P50Ms, res.All.P99Ms, res.Filter.P99Ms, res.Prioritize.P99Ms,
			res.CPUMsPerCall, res.CPUShare, res.LoadAvg1, res.Errors, res.Pass)
	}
	if o.runs["lockhold"] {
		lh, err := runLockHold(ctx, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench: lockhold:", err)
			os.Exit(1)
		}
		report.LockHold, report.Pass = &lh, report.Pass && lh.Pass
		fmt.Fprintf(os.Stderr, "extender-bench: %d nodes, gang of %d waiting: %d write-lock holds, p50 %.3f ms, p99 %.3f ms, "+
			"p99.9 %.3f ms, max %.3f ms; %d gang filters (%d waiting), %d plain filters (p99 %.2f ms), %d informer events: pass=%v\n",
			lh.Nodes, lh.GangMembers, lh.Holds, lh.P50Ms, lh.P99Ms, lh.P999Ms, lh.MaxMs, lh.GangFilters, lh.GangPlans,
			lh.PlainFilters, lh.PlainFilterP99Ms, lh.InformerEvents, lh.Pass)
	}
	if o.runs["memory"] {
		m, err := runMemory(ctx, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench: memory:", err)
			os.Exit(1)
		}
		report.Memory, report.Pass = &m, report.Pass && m.Pass
		fmt.Fprintf(os.Stderr, "extender-bench: %d nodes, %d pods (%d bound, %d with a GPU share, %d B of JSON each): "+
			"synced in %.1f s, RSS %.0f MiB (peak %.0f MiB, heap %.0f MiB): pass=%v\n",
			m.Nodes, m.Pods, m.BoundPods, m.GPUPods, m.PodBytes, m.SyncSeconds, m.RSSMiB, m.PeakRSSMiB, m.HeapMiB, m.Pass)
	}
	b, _ := json.MarshalIndent(report, "", "  ")
	b = append(b, '\n')
	if o.out == "-" {
		_, _ = os.Stdout.Write(b)
	} else {
		if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(o.out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "extender-bench:", err)
			os.Exit(1)
		}
	}
	if o.enforce && !report.Pass {
		os.Exit(1)
	}
}

// Report is the file the benchmark writes: one run per client count.
type Report struct {
	Runs []Result `json:"runs"`
	// LockHold is the write-lock hold while a huge gang waits (-runs lockhold).
	LockHold *LockHold `json:"lock_hold,omitempty"`
	// Memory is the RSS at -nodes and -rss-pods (-runs memory).
	Memory *Memory `json:"memory,omitempty"`
	// Pass: every run met its targets.
	Pass bool `json:"pass"`
}
