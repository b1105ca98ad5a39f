//go:build cgo

package gpubench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu/gpumock"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/qos"
)

// The agent_cpu part's node: agentPods pods, of which the GPU pods of the GPU roles
// (-agent-gpus), the rest idle pods without processes (a third each batch, Burstable LS,
// BestEffort), as bench-colo's overhead run has them.
const agentPods = 110

// Per-pod utilisation on the mock, percent: LS on a shared GPU is above the throttle's
// lsUtilOnPercent (2), so batch there is frozen solid (the on/off freeze), the common
// state of a GPU shared with a lightly loaded inference server without MPS.
const (
	agentLSSharedUtil = 6
	agentLSUtil       = 20
	agentBatchUtil    = 40
)

// nodeSpec is what the child needs of the parent's node (JSON in a file).
type nodeSpec struct {
	CgroupRoot       string        `json:"cgroupRoot"`
	KubeletRoot      string        `json:"kubeletCgroupRoot"`
	Manifests        string        `json:"manifests"`
	Listen           string        `json:"listen"`
	GPU              bool          `json:"gpu"`
	LoopPeriod       time.Duration `json:"loopPeriod"`
	FullScrapePeriod time.Duration `json:"fullScrapePeriod"`
	// Procs are the processes on each mock GPU, by index.
	Procs [][]specProc `json:"procs"`
	// CPUProfile, when set, is where the agent writes its CPU profile, from its start to
	// its stop.
	CPUProfile string `json:"cpuProfile,omitempty"`
	// Signals is the agent's signals.mode; empty: its default.
	Signals string `json:"signals,omitempty"`
}

type specProc struct {
	PID     uint32 `json:"pid"`
	SMUtil  uint32 `json:"smUtil"`
	MemUtil uint32 `json:"memUtil"`
	MemUsed uint64 `json:"memUsed"`
}

// agentNode is the parent's side of the node: cgroups, manifests, the pods' processes.
type agentNode struct {
	hier    *cgroups.Hierarchy
	base    string // kubelet's --cgroup-root of the fake node
	dir     string
	spec    nodeSpec
	procs   []*exec.Cmd
	batch   []string // batch pod cgroups (thawed before the processes are killed)
	roles   []string // by GPU index
	want    [mockGPUs]struct{ ls, batch int }
	gpuProc int
}

// runAgentCPU measures the agent's CPU with GPU features on (and, with cfg.GPUOff, off)
// over the same node, each run in its own process.
func runAgentCPU(ctx context.Context, cfg AgentCPUConfig, printf func(string, ...any)) (res *agentCPURun,
	err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the agent_cpu bench creates cgroups and runs the agent: run it as root")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	n, err := newAgentNode(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := n.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	res = &agentCPURun{Pods: agentPods, GPUs: mockGPUs, GPUProcesses: n.gpuProc, ProcsPerPod: cfg.ProcsPerPod,
		DurationS: cfg.Duration.Seconds(), LoopPeriodMs: ms(cfg.LoopPeriod),
		FullScrapePeriodMs: ms(cfg.FullScrapePeriod), Included: agentCPUIncluded}
	on, st, err := n.measure(ctx, self, cfg, true, printf)
	if err != nil {
		return nil, fmt.Errorf("GPU features on: %w", err)
	}
	res.CPUPctOfCore, res.RSSMiB, res.PeakRSSMiB = on.cpuPct, on.rssMiB, on.peakMiB
	for _, g := range st.GPU.GPUs {
		res.GPUsSeen = append(res.GPUsSeen, agentGPU{Index: g.Index, Role: n.roles[g.Index],
			Cadence: g.Cadence, Duty: g.Decision.Duty, Reason: g.Decision.Reason, LSPods: len(g.LSPods),
			BatchPods: len(g.BatchPods)})
	}
	printf("agent_cpu: %.3f %% of a core with 8 mock GPUs and %d pods (RSS %.1f MiB, peak %.1f)\n",
		res.CPUPctOfCore, agentPods, res.RSSMiB, res.PeakRSSMiB)
	if cfg.GPUOff {
		off, _, err := n.measure(ctx, self, cfg, false, printf)
		if err != nil {
			return nil, fmt.Errorf("GPU features off: %w", err)
		}
		res.GPUOff = &agentSample{CPUPctOfCore: off.cpuPct, RSSMiB: off.rssMiB, PeakRSSMiB: off.peakMiB}
		d := res.CPUPctOfCore - off.cpuPct
		res.GPUShareOfCorePct = &d
		printf("agent_cpu, GPU features off: %.3f %% of a core (RSS %.1f MiB); the GPU loop's share %.3f %%\n",
			off.cpuPct, off.rssMiB, d)
	}
	return res, nil
}

// agentCPUIncluded says what agent_cpu_pct_of_core counts.
const agentCPUIncluded = "user+system CPU of one koordlet agent process (/proc/<pid>/stat; the bench re-executes " +
	"itself as the agent, so no harness runs in that process and no baseline is subtracted) over the window, " +
	"after a warm-up: the control loop every 100 ms over 110 static pods with real cgroups (kubelet's cgroupfs " +
	"layout under a private cgroup root), the static pod source, the evictor, the HTTP server (not scraped), and " +
	"the GPU loop with the agent's GPU defaults: the NVML collector over go-nvml's 8-GPU dgxa100 mock, PID " +
	"attribution through the real /proc, the throttle, and the on/off freeze of the shared GPUs' batch pods " +
	"on real cgroups. The pods' processes sleep (no CPU load to react to, unlike bench-colo's overhead run). " +
	"The mock answers each NVML call in well under a microsecond; a real driver's calls (ioctls) cost more and " +
	"are not in this figure. gpu_off is the same agent over the same node with GPU features off."

// newAgentNode makes the node: cgroups, manifests and the GPU pods' processes. On error
// it removes what it made.
func newAgentNode(cfg AgentCPUConfig) (n *agentNode, err error) {
	if _, err := exec.LookPath("sleep"); err != nil {
		return nil, fmt.Errorf("the GPU pods' processes are sleep(1): %w", err)
	}
	h, err := cgroups.Open(cfg.CgroupRoot)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "understory-gpu-bench-agent-")
	if err != nil {
		return nil, err
	}
	n = &agentNode{hier: h, base: "understory-gpu-bench-" + hex.EncodeToString(b), dir: dir, roles: cfg.Roles}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.close())
		}
	}()
	n.spec = nodeSpec{CgroupRoot: cfg.CgroupRoot, KubeletRoot: "/" + n.base,
		Manifests: filepath.Join(dir, "manifests"), LoopPeriod: cfg.LoopPeriod,
		FullScrapePeriod: cfg.FullScrapePeriod, Procs: make([][]specProc, mockGPUs), Signals: cfg.Signals}
	if err := os.Mkdir(n.spec.Manifests, 0o755); err != nil {
		return nil, err
	}
	for _, rel := range []string{"", "kubepods", "kubepods/burstable", "kubepods/besteffort"} {
		if _, err := h.Create(filepath.Join(n.base, rel)); err != nil {
			return nil, err
		}
	}
	k := 0
	addPod := func(name string, class qos.Class) (*cgroups.Group, string, error) {
		k++
		uid := podUID(1000 + k)
		var ann map[string]string
		var req corev1.ResourceList
		q := cgroups.QOSBestEffort
		switch class {
		case qos.ClassBatch:
			ann = map[string]string{contract.AnnotationQOSClass: "batch"}
		case qos.ClassLS:
			req, q = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}, cgroups.QOSBurstable
		}
		if err := writePod(n.spec.Manifests, name, types.UID(uid), ann, req); err != nil {
			return nil, "", err
		}
		rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(q, uid)
		if err != nil {
			return nil, "", err
		}
		rel = filepath.Join(n.base, rel)
		g, err := h.Create(rel)
		return g, rel, err
	}
	// The GPU pods: each runs procs processes, in a container cgroup below its pod
	// cgroup as a runtime makes it, on the mock GPU.
	gpuPod := func(g int, class qos.Class, util uint32) error {
		name := fmt.Sprintf("gpu%d-%s", g, strings.ToLower(string(class)))
		_, rel, err := addPod(name, class)
		if err != nil {
			return err
		}
		if class == qos.ClassBatch {
			n.batch = append(n.batch, rel)
			n.want[g].batch++
		} else {
			n.want[g].ls++
		}
		ctr, err := h.Create(filepath.Join(rel, containerID(1000+k)))
		if err != nil {
			return err
		}
		for range cfg.ProcsPerPod {
			p := exec.Command("sleep", "infinity")
			p.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := p.Start(); err != nil {
				return err
			}
			n.procs = append(n.procs, p)
			// The memory hierarchy too: attribution reads its line on v1 and hybrid.
			if err := ctr.AddProcMemory(p.Process.Pid); err != nil {
				return err
			}
			n.spec.Procs[g] = append(n.spec.Procs[g], specProc{PID: uint32(p.Process.Pid), SMUtil: util / uint32(cfg.ProcsPerPod),
				MemUtil: 5, MemUsed: 4 << 30})
			n.gpuProc++
		}
		return nil
	}
	for g, role := range cfg.Roles {
		var err error
		switch role {
		case roleShared:
			err = errors.Join(gpuPod(g, qos.ClassLS, agentLSSharedUtil), gpuPod(g, qos.ClassBatch, agentBatchUtil))
		case roleLS:
			err = gpuPod(g, qos.ClassLS, agentLSUtil)
		case roleBatch:
			err = gpuPod(g, qos.ClassBatch, agentBatchUtil)
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %d's pods: %w", g, err)
		}
	}
	for i := 0; k < agentPods; i++ {
		class := []qos.Class{qos.ClassBatch, qos.ClassLS, qos.ClassBE}[i%3]
		if _, _, err := addPod(fmt.Sprintf("idle-%d", i+1), class); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// writePod writes a static pod manifest.
func writePod(dir, name string, uid types.UID, ann map[string]string, req corev1.ResourceList) error {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", UID: uid, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "understory/gpu-bench", Resources: corev1.ResourceRequirements{Requests: req},
		}}},
	}
	b, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".yaml"), b, 0o644)
}

// close thaws the batch pods (a frozen v1 task does not die), kills the processes and
// removes the cgroups (the agent's tier too) and the files.
func (n *agentNode) close() error {
	for _, rel := range n.batch {
		if g, err := n.hier.Load(rel); err == nil {
			_ = g.Thaw()
		}
	}
	for _, p := range n.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	n.procs = nil
	var err error
	for range 100 { // the killed tasks leave their cgroups asynchronously
		if err = n.hier.RemoveEmpty(n.base); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.Join(err, os.RemoveAll(n.dir))
}

// agentUsage is one run's measurement.
type agentUsage struct {
	cpuPct, rssMiB, peakMiB float64
}

// measure starts the agent (GPU features on or off), waits until it tracks the node,
// measures its CPU over cfg.Duration after cfg.Warmup, checks it still tracks the node,
// and stops it.
func (n *agentNode) measure(ctx context.Context, self string, cfg AgentCPUConfig, gpuOn bool,
	printf func(string, ...any)) (u agentUsage, st koordlet.Status, err error) {
	spec := n.spec
	spec.GPU = gpuOn
	if gpuOn {
		spec.CPUProfile = cfg.CPUProfile
	}
	if spec.Listen, err = freeAddr(); err != nil {
		return u, st, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return u, st, err
	}
	specPath := filepath.Join(n.dir, "node.json")
	if err := os.WriteFile(specPath, b, 0o644); err != nil {
		return u, st, err
	}
	logPath := filepath.Join(n.dir, fmt.Sprintf("agent-gpu-%t.log", gpuOn))
	logFile, err := os.Create(logPath)
	if err != nil {
		return u, st, err
	}
	defer logFile.Close()
	cmd := exec.Command(self, agentNodeCmd, "-spec", specPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return u, st, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if serr := stopAgent(cmd, exited); serr != nil && err == nil {
			err = fmt.Errorf("stopping the agent: %w; its log:\n%s", serr, tail(logPath))
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w\nagent log (%s):\n%s", err, logPath, tail(logPath))
		}
	}()
	addr := "http://" + spec.Listen
	if st, err = waitTracking(ctx, addr, n, gpuOn, exited); err != nil {
		return u, st, err
	}
	if err := sleepUntil(ctx, time.Now().Add(cfg.Warmup)); err != nil {
		return u, st, err
	}
	pid := cmd.Process.Pid
	c0, err := proc.ReadCPU("/proc", pid)
	if err != nil {
		return u, st, err
	}
	t0 := time.Now()
	if err := sleepUntil(ctx, t0.Add(cfg.Duration)); err != nil {
		return u, st, err
	}
	c1, err := proc.ReadCPU("/proc", pid)
	if err != nil {
		return u, st, err
	}
	wall := time.Since(t0)
	rss, peak, err := proc.ReadRSS("/proc", pid)
	if err != nil {
		return u, st, err
	}
	if st, err = fetchStatus(addr); err != nil {
		return u, st, err
	}
	if err := n.check(st, gpuOn); err != nil {
		return u, st, fmt.Errorf("after the window: %w", err)
	}
	u = agentUsage{cpuPct: 100 * (c1 - c0).Seconds() / wall.Seconds(), rssMiB: float64(rss) / (1 << 20),
		peakMiB: float64(peak) / (1 << 20)}
	return u, st, nil
}

// waitTracking waits (at most agentReadyWait) until the agent tracks every pod and, with
// GPU features on, shows each GPU's pods.
func waitTracking(ctx context.Context, addr string, n *agentNode, gpuOn bool, exited <-chan error) (koordlet.Status,
	error) {
	deadline := time.Now().Add(agentReadyWait)
	var last error
	for {
		select {
		case err := <-exited:
			return koordlet.Status{}, fmt.Errorf("the agent exited: %v", err)
		default:
		}
		st, err := fetchStatus(addr)
		if err == nil {
			if err = n.check(st, gpuOn); err == nil {
				return st, nil
			}
		}
		last = err
		if time.Now().After(deadline) {
			return st, fmt.Errorf("the agent did not track the node within %v: %w", agentReadyWait, last)
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return st, err
		}
	}
}

// agentReadyWait bounds the agent's start: pods found, the GPU loop's pod snapshot, the
// start-up cut restored (hold 2 s, then 0.1 duty per second from 0.9 to 0.3).
const agentReadyWait = time.Minute

// check says whether st shows the node: every pod, and each GPU's LS and batch pods.
func (n *agentNode) check(st koordlet.Status, gpuOn bool) error {
	pods := 0
	for _, ps := range st.Pods {
		pods += len(ps)
	}
	if pods != agentPods {
		return fmt.Errorf("the agent tracks %d pods, want %d", pods, agentPods)
	}
	if !gpuOn {
		if st.GPU != nil {
			return errors.New("GPU features on in the run without them")
		}
		return nil
	}
	if st.GPU == nil || !st.GPU.Available || len(st.GPU.GPUs) != mockGPUs {
		return fmt.Errorf("GPU status %+v, want %d GPUs available", st.GPU, mockGPUs)
	}
	for _, g := range st.GPU.GPUs {
		w := n.want[g.Index]
		if !g.Healthy || len(g.LSPods) != w.ls || len(g.BatchPods) != w.batch {
			return fmt.Errorf("GPU %d: healthy %t, LS pods %v, batch pods %v; want %d LS and %d batch pods",
				g.Index, g.Healthy, g.LSPods, g.BatchPods, w.ls, w.batch)
		}
		// The steady state: batch frozen solid next to an LS pod above the threshold,
		// free alone. Until the agent has published its pods to the GPU loop, every
		// process counts as LS (the safe side) and batch is frozen; that start-up freeze
		// is thawed after the hold, and is not what the window measures.
		switch role := n.roles[g.Index]; {
		case role == roleShared && g.Decision.Reason != qos.GPUReasonLSUtil:
			return fmt.Errorf("GPU %d shared by LS and batch: duty %v (%s), want %s", g.Index, g.Decision.Duty,
				g.Decision.Reason, qos.GPUReasonLSUtil)
		case role == roleBatch && g.Decision.Duty != 0:
			return fmt.Errorf("GPU %d with batch alone: duty %v (%s), want 0", g.Index, g.Decision.Duty,
				g.Decision.Reason)
		}
	}
	return nil
}

func fetchStatus(addr string) (koordlet.Status, error) {
	var st koordlet.Status
	resp, err := http.Get(addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// stopAgent asks the agent to stop (it thaws what it froze) and waits; it kills it after
// 10 s.
func stopAgent(cmd *exec.Cmd, exited <-chan error) error {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		return err
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return errors.New("the agent did not stop within 10s of SIGTERM; killed")
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tail returns the end of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// runAgentNode is the child: the koordlet agent over the parent's node, GPU features on
// the NVML mock, until ctx ends (SIGTERM).
func runAgentNode(ctx context.Context, specPath string, stderr io.Writer) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec nodeSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	if len(spec.Procs) > mockGPUs {
		return fmt.Errorf("%s: %d GPUs, the mock has %d", specPath, len(spec.Procs), mockGPUs)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cfg := config.Default()
	cfg.CgroupRoot, cfg.KubeletCgroupRoot, cfg.StaticPodDir = spec.CgroupRoot, spec.KubeletRoot, spec.Manifests
	cfg.ListenAddress = spec.Listen
	cfg.GPU.LoopPeriod.Duration, cfg.GPU.FullScrapePeriod.Duration = spec.LoopPeriod, spec.FullScrapePeriod
	if !spec.GPU {
		cfg.GPU.Mode = config.GPUModeOff
	}
	if spec.Signals != "" {
		cfg.Signals.Mode = spec.Signals
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	src := podsource.NewStatic(cfg.StaticPodDir, log)
	deps := koordlet.Deps{Registry: reg, Logger: log, Pods: src, Events: podsource.NewLogSink(log)}
	if spec.GPU {
		node := gpumock.New()
		for g, procs := range spec.Procs {
			var ps []gpumock.Proc
			for _, p := range procs {
				ps = append(ps, gpumock.Proc{PID: p.PID, SMUtil: p.SMUtil, MemUtil: p.MemUtil, MemUsed: p.MemUsed})
			}
			node.Set(g, ps...)
		}
		c, err := node.Collector(cfg.ProcRoot)
		if err != nil {
			return err
		}
		deps.GPU = c // the agent closes it
	}
	agent, err := koordlet.New(cfg, deps)
	if err != nil {
		if deps.GPU != nil {
			_ = deps.GPU.Close()
		}
		return err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: agent.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcDone := make(chan error, 1)
	go func() { srcDone <- src.Run(ctx) }()
	err = agent.Run(ctx)
	cancel()
	_ = srv.Close()
	if serr := <-srcDone; serr != nil && !errors.Is(serr, context.Canceled) && err == nil {
		err = serr
	}
	return err
}
