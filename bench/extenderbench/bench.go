package extenderbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/scheduler-extender/placement"
)

// Options size a run: DefaultOptions is `make bench-extender`, cmd/extender-bench's
// flags change it.
type Options struct {
	ClientList []int // concurrent HTTP clients: one latency run each
	Nodes      int   // nodes in the index (every one a candidate in each call)
	Pods       int   // distinct pending pods the clients cycle through
	Shapes     int   // distinct pod templates (jobs) among the pods
	MaxCalls   int64 // stop a latency run after this many measured calls
	Duration   time.Duration
	Warmup     time.Duration // unmeasured warm-up
	Policy     string        // placement policy
	Seed       int64         // seed of the synthetic cluster
	TargetP99  time.Duration
	TargetRate float64 // calls/s
	CPUProfile string  // write a CPU profile of the measured part here

	Runs             map[string]bool // latency, lockhold, memory
	GangMembers      int             // lockhold: minMember of the waiting gang
	LockHoldDuration time.Duration
	TargetLockP99    time.Duration
	RSSPods          int // memory: pods in the cluster
	TargetRSSMiB     float64
	MemProfile       string        // memory: the extender's heap profile, once synced
	TargetFailover   time.Duration // failover: kill → the standby serving
	// FailoverList makes the new leader catch up by listing every bound pod
	// (no own pod to write its barrier on), as before the barrier.
	FailoverList bool

	leader *extender.LeaderConfig // failover: lease durations other than the shipped ones (tests)

	clients int // this latency run's clients (one of ClientList)
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
func openbMix() []nodeType {
	return []nodeType{
		{0.30, "", 0, 96, 512},
		{0.25, "V100M16", 8, 96, 512},
		{0.15, "V100M32", 8, 96, 768},
		{0.10, "P100", 2, 64, 256},
		{0.10, "T4", 2, 64, 256},
		{0.05, "A10", 4, 64, 256},
		{0.05, "G2", 1, 32, 128},
	}
}

func mkNode(i int, t nodeType) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{}}}
	n.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(t.cpus), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(t.memGi)<<30, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	if t.gpus > 0 {
		n.Status.Allocatable[contract.ResourceGPU] = *resource.NewQuantity(int64(t.gpus), resource.DecimalSI)
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
		lim[contract.ResourceGPUMilli] = *resource.NewQuantity(int64([]int{250, 500, 300, 600}[rng.Intn(4)]), resource.DecimalSI)
	case x < 0.85:
		lim[contract.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
	case x < 0.95:
		lim[contract.ResourceGPU] = *resource.NewQuantity(2, resource.DecimalSI)
	default:
		lim[contract.ResourceGPU] = *resource.NewQuantity(8, resource.DecimalSI)
	}
	if rng.Float64() < 0.1 {
		p.Annotations[extender.AnnotationGPUModel] = "V100M16,V100M32"
	}
	if len(devs) > 0 {
		p.Annotations[contract.AnnotationGPUDevices] = contract.FormatGPUDevices(devs)
	}
	return p
}

// DefaultOptions is `make bench-extender`: 1, 2 and 4 clients on 5 000 nodes, a gang of
// 1 000 waiting, and the RSS at 100 000 pods.
func DefaultOptions() Options {
	return Options{ClientList: []int{1, 2, 4}, Nodes: 5000, Pods: 64, Shapes: 8, MaxCalls: 60000,
		Duration: 10 * time.Second, Warmup: 2 * time.Second, Policy: placement.DefaultPolicy, Seed: 1,
		TargetP99: 5 * time.Millisecond, TargetRate: 2000,
		Runs:        map[string]bool{RunLatency: true, RunLockHold: true, RunMemory: true},
		GangMembers: 1000, LockHoldDuration: 10 * time.Second, TargetLockP99: 10 * time.Millisecond,
		RSSPods: 100000, TargetRSSMiB: 400, TargetFailover: 15 * time.Second}
}

// The runs (Options.Runs).
const (
	RunLatency  = "latency"  // filter and prioritize over HTTP
	RunLockHold = "lockhold" // write-lock holds while a huge gang waits
	RunMemory   = "memory"   // RSS of an extender child at Nodes and RSSPods
	RunFailover = "failover" // leader killed → the synced standby serving, at Nodes and RSSPods
)

// Validate checks o (naming the flags that set it).
func (o Options) Validate() error {
	for r := range o.Runs {
		if r != RunLatency && r != RunLockHold && r != RunMemory && r != RunFailover {
			return fmt.Errorf("bad -runs entry %q", r)
		}
	}
	if o.GangMembers < 1 || o.GangMembers > contract.MaxGangSize || o.LockHoldDuration <= 0 || o.RSSPods < 1 {
		return fmt.Errorf("need -gang-members in 1..%d, -lock-hold-duration > 0 and -rss-pods >= 1", contract.MaxGangSize)
	}
	clients := 0
	for _, c := range o.ClientList {
		if c < 1 {
			return fmt.Errorf("bad -clients entry %d", c)
		}
		clients = max(clients, c)
	}
	if o.Nodes < 1 || clients < 1 || o.Pods < clients || o.MaxCalls < 1 || o.Duration <= 0 || o.Shapes < 1 {
		return errors.New("need nodes, clients, max-calls, duration > 0 and pods >= clients")
	}
	return nil
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

func run(ctx context.Context, o Options) (Result, error) {
	cfg := benchConfig(o)
	c, err := newCluster(o, cfg, extender.Deps{})
	if err != nil {
		return Result{}, err
	}
	return measure(ctx, o, c.srv, cfg, c.rng, c.names, c.gpus, c.used)
}

// benchConfig is the extender's default configuration with -policy and -seed.
func benchConfig(o Options) extender.Config {
	cfg := extender.DefaultConfig()
	cfg.Policy, cfg.Seed = o.Policy, o.Seed
	return cfg
}

// cluster is an in-process extender loaded with the synthetic cluster.
type cluster struct {
	srv        *extender.Server
	state      *extender.State // srv's index, fed directly (no informers)
	rng        *rand.Rand      // seeded with -seed, past the cluster's draws
	names      []string        // the nodes
	gpus, used int             // GPUs, GPUs bound
}

// newCluster starts an extender with cfg and deps (logging discarded), loads
// -nodes nodes of the openb mix into it (populate) and builds its workload.
func newCluster(o Options, cfg extender.Config, deps extender.Deps) (cluster, error) {
	st, err := extender.NewState(cfg, deps.Now)
	if err != nil {
		return cluster{}, err
	}
	deps.Logger, deps.State = slog.New(slog.DiscardHandler), st
	srv, err := extender.NewServer(cfg, deps)
	if err != nil {
		return cluster{}, err
	}
	c := cluster{srv: srv, state: st, rng: newRand(o.Seed)}
	c.names, c.gpus, c.used = populate(st, o.Nodes, c.rng)
	return c, st.RefreshWorkload()
}

// pickNodeType draws a line of openbMix by its share.
func pickNodeType(rng *rand.Rand) nodeType {
	mix := openbMix()
	x := rng.Float64()
	for _, m := range mix {
		if x < m.share {
			return m
		}
		x -= m.share
	}
	return mix[len(mix)-1]
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
				delete(lim, contract.ResourceGPUMilli)
				delete(p.Annotations, extender.AnnotationGPUModel)
				lim[contract.ResourceGPU] = *resource.NewQuantity(1, resource.DecimalSI)
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
func measure(ctx context.Context, o Options, srv *extender.Server, cfg extender.Config, rng *rand.Rand,
	names []string, gpus, used int) (Result, error) {
	type bodies struct{ filter, prio []byte }
	pods := make([]bodies, o.Pods)
	templates := make([]*corev1.Pod, o.Shapes)
	for i := range templates {
		templates[i] = mkPod("template", rng, "", nil)
	}
	for i := range pods {
		p := templates[i%o.Shapes].DeepCopy()
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
				b := pods[i%o.Pods]
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
					if calls.Add(1) > o.MaxCalls {
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
	case <-time.After(o.Warmup):
	case <-ctx.Done():
	}
	measuring.Store(true)
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
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
	case <-time.After(o.Duration):
	case <-runCtx.Done():
	}
	cancel()
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	cpuUsed := (cpuTime() - cpu0).Seconds()
	all := append(slices.Clone(filterLat), prioLat...)
	res := Result{
		Date: time.Now().UTC(), Nodes: o.Nodes, GPUs: gpus, GPUsBound: used, Clients: o.clients, Pods: o.Pods, Shapes: o.Shapes, Policy: o.Policy,
		BodyBytes: len(pods[0].filter), Seconds: elapsed, CallsPerSec: float64(len(all)) / elapsed,
		Filter: summarise(filterLat), Prioritize: summarise(prioLat), All: summarise(all),
		Errors: errs.Load(), FilterPass: passes.Load(),
		TargetP99Ms: float64(o.TargetP99.Microseconds()) / 1000, TargetRate: o.TargetRate,
		Machine: thisMachine(),
	}
	if n := len(all); n > 0 {
		res.CPUMsPerCall = cpuUsed * 1000 / float64(n)
	}
	res.CPUShare = cpuUsed / elapsed
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.LoadAvg1, _, _ = strings.Cut(string(b), " ")
	}
	res.Pass = res.Errors == 0 && res.All.P99Ms <= res.TargetP99Ms && res.CallsPerSec >= o.TargetRate
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

// Run runs o.Runs (each latency run once per client count) and returns the report;
// a line per run goes to log. It gives up after a deadline sized from o.
func Run(ctx context.Context, o Options, log io.Writer) (Report, error) {
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	ctx, cancel := context.WithTimeout(ctx,
		time.Duration(len(o.ClientList))*(o.Warmup+o.Duration+time.Minute)+o.LockHoldDuration+15*time.Minute)
	defer cancel()
	report := Report{Pass: true}
	for _, c := range o.ClientList {
		if !o.Runs[RunLatency] {
			break
		}
		ro := o
		ro.clients = c
		res, err := run(ctx, ro)
		if err != nil {
			return report, err
		}
		report.Runs = append(report.Runs, res)
		report.Pass = report.Pass && res.Pass
		fmt.Fprintf(log, "extender-bench: %d nodes, %d clients: %.0f calls/s, p50 %.2f ms, p99 %.2f ms (filter p99 %.2f, prioritize p99 %.2f), %.3f cpu-ms/call on %.2f cores (load %s), errors %d: pass=%v\n",
			res.Nodes, res.Clients, res.CallsPerSec, res.All.P50Ms, res.All.P99Ms, res.Filter.P99Ms, res.Prioritize.P99Ms,
			res.CPUMsPerCall, res.CPUShare, res.LoadAvg1, res.Errors, res.Pass)
	}
	if o.Runs[RunLockHold] {
		lh, err := runLockHold(ctx, o)
		if err != nil {
			return report, fmt.Errorf("lockhold: %w", err)
		}
		report.LockHold, report.Pass = &lh, report.Pass && lh.Pass
		fmt.Fprintf(log, "extender-bench: %d nodes, gang of %d waiting: %d write-lock holds, p50 %.3f ms, p99 %.3f ms, "+
			"p99.9 %.3f ms, max %.3f ms; %d gang filters (%d waiting), %d plain filters (p99 %.2f ms), %d informer events: pass=%v\n",
			lh.Nodes, lh.GangMembers, lh.Holds, lh.P50Ms, lh.P99Ms, lh.P999Ms, lh.MaxMs, lh.GangFilters, lh.GangPlans,
			lh.PlainFilters, lh.PlainFilterP99Ms, lh.InformerEvents, lh.Pass)
	}
	if o.Runs[RunMemory] {
		m, err := runMemory(ctx, o)
		if err != nil {
			return report, fmt.Errorf("memory: %w", err)
		}
		report.Memory, report.Pass = &m, report.Pass && m.Pass
		fmt.Fprintf(log, "extender-bench: %d nodes, %d pods (%d bound, %d with a GPU share, %d B of JSON each): "+
			"synced in %.1f s, RSS %.0f MiB (peak %.0f MiB, heap %.0f MiB): pass=%v\n",
			m.Nodes, m.Pods, m.BoundPods, m.GPUPods, m.PodBytes, m.SyncSeconds, m.RSSMiB, m.PeakRSSMiB, m.HeapMiB, m.Pass)
	}
	if o.Runs[RunFailover] {
		f, err := runFailover(ctx, o)
		if err != nil {
			return report, fmt.Errorf("failover: %w", err)
		}
		report.Failover, report.Pass = &f, report.Pass && f.Pass
		fmt.Fprintf(log, "extender-bench: %d nodes, %d pods, lease %.0f s / renew %.0f s / retry %.0f s: leader killed, "+
			"standby serving after %.2f s (catch-up %.3f s; its cold sync took %.1f s): pass=%v\n", f.Nodes, f.Pods,
			f.LeaseSeconds, f.RenewSeconds, f.RetrySeconds, f.FailoverSecs, f.CatchUpSecs, f.SyncSeconds, f.Pass)
	}
	return report, nil
}

// Report is the file the benchmark writes: one run per client count.
type Report struct {
	Runs []Result `json:"runs"`
	// LockHold is the write-lock hold while a huge gang waits (-runs lockhold).
	LockHold *LockHold `json:"lock_hold,omitempty"`
	// Memory is the RSS at -nodes and -rss-pods (-runs memory).
	Memory *Memory `json:"memory,omitempty"`
	// Failover is the leader-to-standby handover at -nodes and -rss-pods (-runs failover).
	Failover *Failover `json:"failover,omitempty"`
	// Pass: every run met its targets.
	Pass bool `json:"pass"`
}
