package colo

// The memory-pressure scenario: an LS service with a working set of anonymous memory and
// page cache, and batch jobs whose footprint grows until the node is short. The node is
// small and its memory is modelled the way kubelet models it: kubepods' memory limit is
// the node's allocatable memory, so pressure arises inside the fake node and never on
// this machine. kubelet's oom_score_adj is set on every pod process (Burstable LS from
// its request, BestEffort batch 1000), so the kernel picks OOM victims as on a real node.
//
// Phases, each measured with the open-loop load generator:
//
//  1. LS alone.
//  2. LS + batch with kubelet's BestEffort settings: batch pods in kubelet's BestEffort
//     pod cgroups, no memory limit. The batch footprint grows past what LS leaves, the
//     kubepods limit makes the kernel reclaim across all pods, and LS's page cache goes:
//     its reads go to disk and its allocations stall in reclaim (memory PSI).
//  3. LS + batch with the agent: the batch pods' manifests request and limit
//     understory.io/batch-memory sized from what the node publishes (what a scheduler
//     grants), the agent runs, and the same batch jobs run below its tier. The agent's
//     per-pod limits and tier limit keep batch reclaim inside batch.
//
// The batch jobs are the same program with the same settings in phases 2 and 3. Each
// sizes its heap as batch_heap_share of the memory it sees, as the JVM
// (MaxRAMPercentage), Spark or Ray do, and re-reads a dataset larger than its request
// epoch after epoch through the page cache. Without the agent a BestEffort pod has no
// limit of its own, so it sees kubepods' (v1 hierarchical_memory_limit): the whole node.
// The jobs grow until the node is short, the kernel takes LS's page cache (anonymous
// memory cannot go: no swap, as on kubelet nodes), and the OOM killer ends a batch job
// (oom_score_adj 1000), which restarts and grows again. With the agent each pod sees its
// batch-memory limit and sizes itself to it; what it reads beyond is reclaimed inside
// its own cgroup.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
)

const mib = 1 << 20

// memoryConfig sizes the memory scenario. Sizes are bytes.
type memoryConfig struct {
	Node      int64 // kubepods memory limit: the fake node's allocatable memory
	LSAnon    int64 // LS anonymous working set
	LSFile    int64 // LS data file, read through the page cache
	LSRequest int64 // LS pod's memory request (manifest; kubelet's oom_score_adj)
	LSReads   int   // random 4 KiB reads of the data file per request
	LSTouches int   // random pages of the anonymous working set touched per request
	LSRounds  int   // SHA-256 rounds per request
	Rate      float64
	Conns     int

	BatchPods int
	// BatchMemory is each batch pod's understory.io/batch-memory request and limit in
	// the agent phase; 0 takes what the agent publishes (its /status), split evenly.
	BatchMemory int64
	HeapShare   float64 // share of the memory a job sees that it grows its heap to
	BatchData   int64   // dataset size of each batch job
	GrowRate    int64   // heap growth, bytes/s
	ReadRate    int64   // dataset read rate of each job, bytes/s
	Threshold   float64 // the agent's batchResources.memory.threshold

	Phase        time.Duration // measured part of each phase
	Ramp         time.Duration // batch running before a phase is measured
	Warmup       time.Duration // agent running before batch starts
	RestartDelay time.Duration // before an exited pod is started again
	Period       time.Duration // agent control period
	InTier       bool          // agent phase: batch below the agent's tier (NRI), else in place
}

// defaultMemoryConfig is a 2 GiB node with an LS service of about 800 MiB and two
// batch jobs.
func defaultMemoryConfig() memoryConfig {
	return memoryConfig{
		Node: 2048 * mib, LSAnon: 256 * mib, LSFile: 512 * mib, LSRequest: 832 * mib,
		LSReads: 16, LSTouches: 64, LSRounds: 50, Rate: 400, Conns: 64,
		BatchPods: 2, HeapShare: 0.7, BatchData: 640 * mib, GrowRate: 128 * mib, ReadRate: 160 * mib,
		Threshold: qos.DefaultReclaimMemoryThreshold,
		Phase:     15 * time.Second, Ramp: 6 * time.Second, Warmup: time.Second,
		RestartDelay: time.Second, Period: config.DefaultPeriod, InTier: true,
	}
}

func (c memoryConfig) validate() error {
	switch {
	case c.Node < 64*mib:
		return fmt.Errorf("memory scenario: node memory %d MiB: at least 64 MiB", c.Node/mib)
	case c.LSAnon < pageSize || c.LSFile < pageSize || c.LSRequest < 0:
		return errors.New("memory scenario: LS anonymous and file sizes must be ≥ 4 KiB, its request ≥ 0")
	case c.LSAnon+c.LSFile >= c.Node:
		return fmt.Errorf("memory scenario: the LS working set (%d MiB) must fit the node (%d MiB)",
			(c.LSAnon+c.LSFile)/mib, c.Node/mib)
	case c.LSRequest > c.Node:
		return errors.New("memory scenario: the LS request exceeds the node")
	case c.LSReads < 0 || c.LSTouches < 0 || c.LSRounds < 0 || c.Rate <= 0 || c.Conns < 1:
		return errors.New("memory scenario: LS reads, touches, rounds ≥ 0; rate and connections > 0")
	case c.BatchPods < 1 || c.BatchPods > 20:
		return errors.New("memory scenario: 1..20 batch pods")
	case c.BatchMemory < 0 || c.HeapShare < 0 || c.HeapShare > 1 || c.BatchData < 0:
		return errors.New("memory scenario: batch memory and dataset ≥ 0, heap share within [0, 1]")
	case c.GrowRate <= 0 || c.ReadRate <= 0:
		return errors.New("memory scenario: batch grow and read rates must be > 0")
	case c.Threshold <= 0 || c.Threshold > 1:
		return fmt.Errorf("memory scenario: threshold %v must be within (0, 1]", c.Threshold)
	case c.Phase <= 0 || c.Ramp < 0 || c.Warmup < 0 || c.RestartDelay < 0 || c.Period <= 0:
		return errors.New("memory scenario: phase and period must be > 0, ramp, warm-up and restart delay ≥ 0")
	}
	return nil
}

// memoryConfigReport is the configuration as colo.json records it.
type memoryConfigReport struct {
	NodeMiB        int64   `json:"node_mib"`
	LSAnonMiB      int64   `json:"ls_anon_mib"`
	LSFileMiB      int64   `json:"ls_file_mib"`
	LSRequestMiB   int64   `json:"ls_request_mib"`
	LSReads        int     `json:"ls_reads_per_request"`
	Rate           float64 `json:"rate"`
	BatchPods      int     `json:"batch_pods"`
	BatchMemoryMiB int64   `json:"batch_memory_mib_per_pod"`
	HeapShare      float64 `json:"batch_heap_share"`
	BatchDataMiB   int64   `json:"batch_data_mib_per_pod"`
	ReadMiBps      int64   `json:"batch_read_mib_per_s"`
	Threshold      float64 `json:"memory_threshold"`
	PhaseS         float64 `json:"phase_s"`
	RampS          float64 `json:"ramp_s"`
	Placement      string  `json:"agent_placement"`
}

// memoryPhase is what one phase measured. Memory figures are averages over the phase.
type memoryPhase struct {
	Name     string  `json:"name"`
	Seconds  float64 `json:"seconds"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	P999ms   float64 `json:"p999_ms"`
	// LSOOMKills are the kernel's OOM kills in the LS pod's memory cgroup; LSRestarts the
	// times the LS service died and was started again (any cause).
	LSOOMKills uint64 `json:"ls_oom_kills"`
	LSRestarts int    `json:"ls_restarts"`
	// LSPSISome is the share of the phase (percent) in which some LS task stalled on
	// memory (the total of memory.pressure "some" over the phase); LSPSIAvg10 its avg10
	// at the end.
	LSPSISome  float64 `json:"ls_psi_some_pct"`
	LSPSIAvg10 float64 `json:"ls_psi_some_avg10"`
	// LSRefaultMiB is LS page cache read again after it was reclaimed.
	LSRefaultMiB float64 `json:"ls_refault_mib"`
	LSMiB        float64 `json:"ls_working_set_mib"`
	// LeftMiB is what LS left of the node: kubepods limit − LS working set.
	LeftMiB    float64 `json:"ls_left_mib"`
	BatchMiB   float64 `json:"batch_used_mib"`
	BatchWSMiB float64 `json:"batch_working_set_mib"`
	BatchShare float64 `json:"batch_share"`
	BatchOOM   uint64  `json:"batch_oom_kills"`
	BatchExits int     `json:"batch_restarts"`
	// BatchCPUs is the cores the batch pods used on average: that they worked.
	BatchCPUs float64 `json:"batch_cpus"`
	// BatchHeapMiB is the heap each batch job sized itself to (at its last start).
	BatchHeapMiB float64 `json:"batch_heap_mib_per_pod,omitempty"`
	KubepodsMiB  float64 `json:"kubepods_mib"`
	BatchLimMiB  float64 `json:"batch_pod_limits_mib,omitempty"`
	TierLimitMiB float64 `json:"tier_limit_mib,omitempty"`
	// KdamondMs is the CPU time (ms) the kernel's DAMON threads (kdamond.*) ran during the
	// phase, -1 when unreadable; KdamondThreads how many there are (0: DAMON is off).
	// Their memory sampling runs in no cgroup, grows with the memory in use, and under a
	// non-preemptible kernel delays whatever waits for that CPU, LS included.
	KdamondMs      float64 `json:"kdamond_cpu_ms"`
	KdamondThreads int     `json:"kdamond_threads"`
}

// kdamondPrefix names the kernel's DAMON worker threads (kdamond.0, ...).
const kdamondPrefix = "kdamond."

// memoryResult is the memory scenario's part of bench/out/colo.json.
type memoryResult struct {
	LSP99SoloMs    float64 `json:"mem_ls_p99_solo_ms"`
	LSP99VanillaMs float64 `json:"mem_ls_p99_vanilla_ms"`
	LSP99AgentMs   float64 `json:"mem_ls_p99_agent_ms"`
	RatioVanilla   float64 `json:"mem_ls_p99_ratio_vanilla"`
	RatioAgent     float64 `json:"mem_ls_p99_ratio_agent"`
	LSOOMVanilla   uint64  `json:"mem_ls_oom_kills_vanilla"`
	LSOOMAgent     uint64  `json:"mem_ls_oom_kills_agent"`
	LSPSIVanilla   float64 `json:"mem_ls_psi_some_vanilla"`
	LSPSIAgent     float64 `json:"mem_ls_psi_some_agent"`
	ShareAgent     float64 `json:"mem_batch_share_agent"`
	ShareVanilla   float64 `json:"mem_batch_share_vanilla"`
	// EvictionsAgent is the agent's count of memory evictions (static mode reports them,
	// it does not evict); -1 when the agent exposes no such metric.
	EvictionsAgent int64  `json:"mem_evictions_agent"`
	BatchOOMAgent  uint64 `json:"mem_batch_oom_kills_agent"`

	Config memoryConfigReport `json:"mem_config"`
	Phases []memoryPhase      `json:"mem_phases"`
}

// agentEvictionsMetric is the agent's counter of memory evictions it decided on.
const agentEvictionsMetric = "understory_evictions_total"

// Pod identities of the memory scenario.
const memLSUID = types.UID("3e3e0000-0000-4000-8000-000000000001")

func memBatchUID(i int) types.UID {
	return types.UID(fmt.Sprintf("3eba0000-0000-4000-8000-%012d", i+1))
}

// newMemoryScenario prepares a bare fake node for memoryBench: checked machine, its
// kubelet cgroup root name and a temp dir, nothing created yet. close removes it.
func newMemoryScenario(cfg scenarioConfig) (*scenario, error) {
	h, err := checkMachine(cfg.cgroupRoot)
	if err != nil {
		return nil, err
	}
	if _, err := openMemHier(h); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errNotSupported)
	}
	dir, err := os.MkdirTemp("", "understory-colo-mem-")
	if err != nil {
		return nil, err
	}
	return &scenario{cfg: cfg, hier: h, base: fmt.Sprintf("understory-demo-%d", os.Getpid()), dir: dir,
		tierParent: cfg.tierParent}, nil
}

// runMemory is the memory scenario on its own node: set up, three phases, table, removed.
func runMemory(ctx context.Context, sc scenarioConfig, mc memoryConfig, printf func(string, ...any)) (memoryResult, error) {
	// The pods' supervisors log from their own goroutines.
	var mu sync.Mutex
	out := printf
	printf = func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		out(f, a...)
	}
	logf := func(f string, a ...any) { printf("  "+f+"\n", a...) }
	sc.logf = logf
	s, err := newMemoryScenario(sc)
	if err != nil {
		return memoryResult{}, err
	}
	defer s.close()
	res, err := s.memoryBench(ctx, mc, logf)
	if err != nil {
		return res, err
	}
	printMemoryTable(printf, res)
	return res, nil
}

// memRun is one run of the memory scenario on a scenario's fake node.
type memRun struct {
	s    *scenario
	cfg  memoryConfig
	mh   memHier
	logf func(string, ...any)

	lsCg     string // LS pod cgroup (every controller)
	lsAddr   string
	ls       *memPod
	batch    []*memPod
	lsData   string
	dataDir  string
	batchDat []string
	perPod   int64 // batch memory per pod
}

// memoryBench runs the three phases on s, a bare scenario from newMemoryScenario, and
// removes the processes and data it created before it returns, also when ctx ends;
// s.close removes the cgroups (memory included).
func (s *scenario) memoryBench(ctx context.Context, cfg memoryConfig, logf func(string, ...any)) (res memoryResult, err error) {
	if s.ls != nil || len(s.batch) > 0 {
		return res, errors.New("memoryBench needs a bare scenario (newMemoryScenario), not one with the CPU pods")
	}
	if err := cfg.validate(); err != nil {
		return res, err
	}
	mh, err := openMemHier(s.hier)
	if err != nil {
		return res, fmt.Errorf("%v: %w", err, errNotSupported)
	}
	m := &memRun{s: s, cfg: cfg, mh: mh, logf: logf}
	defer func() {
		if cerr := m.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := m.setUp(ctx); err != nil {
		return res, err
	}

	logf("memory phase 1/3: LS alone (%v)", cfg.Phase)
	solo, err := m.measure(ctx, "LS alone", nil)
	if err != nil {
		return res, err
	}
	logf("jobs size their heap to %.0f%% of the memory they see; dataset %d MiB", 100*cfg.HeapShare, cfg.BatchData/mib)
	logf("memory phase 2/3: LS + %d batch pods, kubelet BestEffort settings, no agent (%v + %v)", cfg.BatchPods, cfg.Ramp, cfg.Phase)
	vanilla, err := m.batchPhase(ctx, "LS + batch, no agent", false)
	if err != nil {
		return res, err
	}

	logf("memory phase 3/3: LS + batch, agent (%v + %v)", cfg.Ramp, cfg.Phase)
	s.memThreshold = cfg.Threshold
	a, err := s.startAgent(qos.DefaultThreshold, cfg.Period)
	if err != nil {
		return res, err
	}
	if err := sleep(ctx, cfg.Warmup); err != nil {
		return res, err
	}
	// The batch pods ask for what the agent publishes, split evenly, as a scheduler
	// would grant it: batch-memory = capacity × threshold − max(LS usage, LS requests) −
	// BE − system (the agent's /status).
	m.perPod = cfg.BatchMemory
	if m.perPod == 0 {
		// The agent publishes after its first second (one period that read every pod).
		var published float64
		for deadline := time.Now().Add(15 * time.Second); ; {
			st, err := a.status()
			if err != nil {
				return res, fmt.Errorf("reading what the agent publishes: %w", err)
			}
			published = st.BatchResources.Memory.Published
			if st.BatchResources.Memory.Reason != "" || time.Now().After(deadline) {
				break
			}
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return res, err
			}
		}
		m.perPod = int64(published) / int64(cfg.BatchPods)
		if m.perPod < 16*mib {
			return res, fmt.Errorf("memory scenario: the agent publishes %d MiB per batch pod; make the node larger or LS smaller", m.perPod/mib)
		}
	}
	logf("batch-memory per pod, from what the agent publishes: %d MiB", m.perPod/mib)
	if err := m.writeBatchManifests(); err != nil {
		return res, err
	}
	agent, err := m.batchPhase(ctx, "LS + batch, agent", true)
	if err != nil {
		return res, err
	}
	res.EvictionsAgent, err = agentEvictions(a)
	if err != nil {
		logf("warning: reading the agent's evictions: %v", err)
		res.EvictionsAgent = -1
	}
	if err := s.stopAgent(); err != nil {
		logf("warning: agent exit: %v", err)
	}

	res.Phases = []memoryPhase{solo, vanilla, agent}
	res.LSP99SoloMs, res.LSP99VanillaMs, res.LSP99AgentMs = solo.P99ms, vanilla.P99ms, agent.P99ms
	if solo.P99ms > 0 {
		res.RatioVanilla, res.RatioAgent = vanilla.P99ms/solo.P99ms, agent.P99ms/solo.P99ms
	}
	res.LSOOMVanilla, res.LSOOMAgent = vanilla.LSOOMKills, agent.LSOOMKills
	res.LSPSIVanilla, res.LSPSIAgent = vanilla.LSPSISome, agent.LSPSISome
	res.ShareVanilla, res.ShareAgent = vanilla.BatchShare, agent.BatchShare
	res.BatchOOMAgent = agent.BatchOOM
	placement := "in-place"
	if cfg.InTier {
		placement = "tier"
	}
	res.Config = memoryConfigReport{NodeMiB: cfg.Node / mib, LSAnonMiB: cfg.LSAnon / mib, LSFileMiB: cfg.LSFile / mib,
		LSRequestMiB: cfg.LSRequest / mib, LSReads: cfg.LSReads, Rate: cfg.Rate, BatchPods: cfg.BatchPods,
		BatchMemoryMiB: m.perPod / mib, HeapShare: cfg.HeapShare,
		BatchDataMiB: cfg.BatchData / mib, ReadMiBps: cfg.ReadRate / mib, Threshold: cfg.Threshold,
		PhaseS: cfg.Phase.Seconds(), RampS: cfg.Ramp.Seconds(), Placement: placement}
	return res, nil
}

// setUp lays out the node (kubelet's cgroups, kubepods' memory limit), writes the data
// files and the LS manifest, and starts the LS service.
func (m *memRun) setUp(ctx context.Context) error {
	s, cfg := m.s, m.cfg
	cpus := 1024 * uint64(max(1, numCPU()))
	// As in setUp: the node's cgroups (cgroupfs driver) and the load generator's, which
	// stands for clients on other machines (largest weight; it stays outside kubepods'
	// memory, in the root memory cgroup).
	for _, c := range []struct {
		rel    string
		shares uint64
	}{
		{"", cpus}, {"kubepods", cpus}, {"kubepods/burstable", 1024}, {"kubepods/besteffort", 2},
		{"loadgen", cgroups.MaxShares},
	} {
		if _, err := s.create(s.cg(c.rel), c.shares); err != nil {
			return fmt.Errorf("creating %s: %w", c.rel, err)
		}
	}
	kubepods := s.cg("kubepods")
	for _, rel := range []string{"kubepods/burstable", "kubepods/besteffort"} {
		if err := m.mh.enableMemory(s.cg(rel)); err != nil {
			return err
		}
	}
	// kubelet sets kubepods' limit to the node's allocatable memory.
	kg, err := s.hier.Load(kubepods)
	if err != nil {
		return err
	}
	if err := kg.SetMemoryLimit(cfg.Node, cgroups.UnlimitedMemory); err != nil {
		return err
	}
	if err := s.enterLoadgen(); err != nil {
		return err
	}

	m.dataDir = filepath.Join(s.dir, "data")
	if err := os.Mkdir(m.dataDir, 0o755); err != nil {
		return err
	}
	m.lsData = filepath.Join(m.dataDir, "ls.dat")
	files := map[string]int64{m.lsData: cfg.LSFile}
	for i := range cfg.BatchPods {
		p := filepath.Join(m.dataDir, fmt.Sprintf("batch-%d.dat", i+1))
		m.batchDat = append(m.batchDat, p)
		files[p] = cfg.BatchData
	}
	t0 := time.Now()
	for p, size := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := writeDataFile(p, size); err != nil {
			return err
		}
	}
	m.logf("wrote %d data files in %v (outside the pods' memory; their cache dropped)", len(files), time.Since(t0).Round(time.Millisecond))

	manifests := filepath.Join(s.dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		return err
	}
	cpuReq := resource.MustParse(s.cfg.lsCPU)
	lsPod := pod("ls-kv", memLSUID, nil, corev1.ResourceList{
		corev1.ResourceCPU: cpuReq, corev1.ResourceMemory: *resource.NewQuantity(cfg.LSRequest, resource.BinarySI)})
	if err := writeManifest(manifests, lsPod); err != nil {
		return err
	}
	lsRel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBurstable, string(memLSUID))
	if err != nil {
		return err
	}
	m.lsCg = s.cg(lsRel)
	if _, err := s.create(m.lsCg, lsShares(cpuReq)); err != nil {
		return err
	}
	if err := m.mh.enableMemory(m.lsCg); err != nil {
		return err
	}
	m.lsAddr, err = freeAddr()
	if err != nil {
		return err
	}
	m.ls = &memPod{name: "ls-kv", cgroup: m.lsCg, restartDelay: cfg.RestartDelay, logf: m.logf,
		argv: []string{s.cfg.self, memLSCmd, "-listen", m.lsAddr,
			"-cgroup-root", s.cfg.cgroupRoot, "-cgroup", m.lsCg,
			"-oom-score-adj", strconv.Itoa(burstableOOMScoreAdj(cfg.LSRequest, cfg.Node)),
			"-anon", strconv.FormatInt(cfg.LSAnon, 10), "-data", m.lsData,
			"-reads", strconv.Itoa(cfg.LSReads), "-touches", strconv.Itoa(cfg.LSTouches),
			"-rounds", strconv.Itoa(cfg.LSRounds)}}
	return m.ls.start(ctx)
}

// burstableOOMScoreAdj is kubelet's oom_score_adj for a Burstable container
// (pkg/kubelet/qos/policy.go): 1000 − 1000 × memory request / memory capacity, kept
// within [2, 999] so that it stays above Guaranteed and below BestEffort.
func burstableOOMScoreAdj(request, capacity int64) int {
	adj := 1000 - int(1000*request/max(capacity, 1))
	return min(max(adj, 2), 999)
}

// bestEffortOOMScoreAdj is kubelet's oom_score_adj for BestEffort containers.
const bestEffortOOMScoreAdj = 1000

// writeDataFile writes size bytes to path, syncs them and drops them from the page
// cache, so that the pod reading them first is the one charged for them.
func writeDataFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4*mib)
	for i := range buf {
		buf[i] = byte(i*7 + i>>12)
	}
	w := bufio.NewWriterSize(f, len(buf))
	for left := size; left > 0; left -= int64(len(buf)) {
		if _, err := w.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return dropCache(f)
}

func dropCache(f *os.File) error {
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the page cache of %s: %w", f.Name(), err)
	}
	return nil
}

func dropCacheOf(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return dropCache(f)
}

// writeBatchManifests writes the batch pods' manifests as the admission webhook leaves
// them: annotated batch, requests and limits of understory.io/batch-memory only (so
// kubelet classes them BestEffort).
func (m *memRun) writeBatchManifests() error {
	q := *resource.NewQuantity(m.perPod, resource.BinarySI)
	for i := range m.cfg.BatchPods {
		p := pod(fmt.Sprintf("batch-mem-%d", i+1), memBatchUID(i), map[string]string{contract.AnnotationQOSClass: "batch"}, nil)
		res := corev1.ResourceList{contract.ResourceBatchMemory: q}
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: res, Limits: res}
		if err := writeManifest(filepath.Join(m.s.dir, "manifests"), p); err != nil {
			return err
		}
	}
	return nil
}

// batchPhase starts the batch jobs (in kubelet's BestEffort pod cgroups, or where the
// agent holds them), lets them ramp up, measures, and stops them.
func (m *memRun) batchPhase(ctx context.Context, name string, agent bool) (memoryPhase, error) {
	s, cfg := m.s, m.cfg
	var cgs []string
	for i := range cfg.BatchPods {
		uid := memBatchUID(i)
		var rel string
		var err error
		if agent && cfg.InTier {
			rel, err = s.tierPodCgroup(string(uid))
		} else {
			rel, err = cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBestEffort, string(uid))
			rel = s.cg(rel)
		}
		if err != nil {
			return memoryPhase{}, err
		}
		// Created as kubelet (pod cgroups) or the runtime (below the tier) would.
		if _, err := s.hier.Create(rel); err != nil {
			return memoryPhase{}, err
		}
		if !contains(s.created, rel) {
			s.created = append(s.created, rel)
		}
		if err := m.mh.enableMemory(rel); err != nil {
			return memoryPhase{}, err
		}
		cgs = append(cgs, rel)
	}
	if agent {
		m.waitForLimits(ctx, cgs)
	}
	for i, rel := range cgs {
		p := &memPod{name: fmt.Sprintf("batch-mem-%d", i+1), cgroup: rel, restartDelay: cfg.RestartDelay, logf: m.logf,
			argv: []string{s.cfg.self, memBatchCmd,
				"-cgroup-root", s.cfg.cgroupRoot, "-cgroup", rel, "-oom-score-adj", strconv.Itoa(bestEffortOOMScoreAdj),
				"-heap-share", strconv.FormatFloat(cfg.HeapShare, 'f', -1, 64), "-grow", strconv.FormatInt(cfg.GrowRate, 10),
				"-data", m.batchDat[i], "-read", strconv.FormatInt(cfg.ReadRate, 10)}}
		m.batch = append(m.batch, p)
		if err := p.start(ctx); err != nil {
			return memoryPhase{}, err
		}
	}
	oom0 := make([]uint64, len(cgs))
	for i, rel := range cgs {
		oom0[i], _ = m.mh.oomKills(rel)
	}
	if err := sleep(ctx, cfg.Ramp); err != nil {
		return memoryPhase{}, err
	}
	r, err := m.measure(ctx, name, cgs)
	if err != nil {
		return memoryPhase{}, err
	}
	for i, rel := range cgs {
		if n, err := m.mh.oomKills(rel); err == nil {
			r.BatchOOM += n - oom0[i]
		}
	}
	m.stopBatch()
	for _, p := range m.batch {
		r.BatchExits += p.exits()
		r.BatchHeapMiB += float64(p.readyInfo()) / mib / float64(len(m.batch))
	}
	m.batch = nil
	// The next phase starts from the same state: batch's page cache dropped (the pod
	// cgroups stay, as kubelet's do while the pods exist), LS's cache warm again.
	for _, p := range m.batchDat {
		if err := dropCacheOf(p); err != nil {
			return r, err
		}
	}
	if err := m.warmLS(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// waitForLimits waits until the agent has given every batch pod cgroup a memory limit,
// as its NRI plugin does before a container starts, so that the jobs see their limits
// when they size themselves. After a few seconds it goes on without (an agent without
// memory limits): the jobs then see the node, and the phase shows it.
func (m *memRun) waitForLimits(ctx context.Context, cgs []string) {
	const wait = 5 * time.Second
	deadline := time.Now().Add(wait)
	for {
		missing := 0
		for _, rel := range cgs {
			if l, err := m.mh.limit(rel); err != nil || l < 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.logf("warning: after %v the agent had set no memory limit on %d of %d batch pod cgroups", wait, missing, len(cgs))
			return
		}
		if sleep(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
}

// warmLS makes the LS service read its data again, as it does at start. The service may
// be restarting (OOM-killed): it is waited for.
func (m *memRun) warmLS(ctx context.Context) error {
	const wait = time.Minute
	var (
		resp     *http.Response
		err      error
		deadline = time.Now().Add(wait)
	)
	for {
		req, rerr := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+m.lsAddr+"/warm", nil)
		if rerr != nil {
			return rerr
		}
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warming the LS service (not answering for %v): %w", wait, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("warming the LS service: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

// memSample is one sample of the node's memory during a phase.
type memSample struct {
	lsWS           uint64 // LS working set
	batch, batchWS uint64 // batch pods' charged memory (page cache included) and working set
	kubepods       uint64 // kubepods' charged memory
}

// measure drives the LS service for cfg.Phase and samples memory every 200 ms.
func (m *memRun) measure(ctx context.Context, name string, batchCgs []string) (memoryPhase, error) {
	_ = setSlice(loadgenSlice)
	psi0, err := m.mh.pressure(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	oom0, err := m.mh.oomKills(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	refault0, err := m.mh.refaults(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	restarts0 := m.ls.exits()
	var (
		samples []memSample
		mu      sync.Mutex
		wg      sync.WaitGroup
	)
	sampleCtx, stop := context.WithCancel(ctx)
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
			var smp memSample
			var err error
			if smp.lsWS, err = m.mh.workingSet(m.lsCg); err != nil {
				continue
			}
			for _, rel := range batchCgs {
				if u, err := m.mh.usage(rel); err == nil {
					smp.batch += u
				}
				if ws, err := m.mh.workingSet(rel); err == nil {
					smp.batchWS += ws
				}
			}
			if k, err := m.mh.usage(m.s.cg("kubepods")); err == nil {
				smp.kubepods = k
			}
			mu.Lock()
			samples = append(samples, smp)
			mu.Unlock()
		}
	})
	var r memoryPhase
	// Limits as the agent left them, read while the phase runs.
	if len(batchCgs) > 0 {
		// The sum of the pods' limits, 0 when one of them has none.
		var sum int64
		for _, rel := range batchCgs {
			l, err := m.mh.limit(rel)
			if err != nil || l < 0 {
				sum = 0
				break
			}
			sum += l
		}
		r.BatchLimMiB = float64(sum) / mib
		if l, err := m.mh.limit(m.s.tier()); err == nil && l > 0 {
			r.TierLimitMiB = float64(l) / mib
		}
	}
	cpu0 := m.batchCPU(batchCgs)
	kd0, _, kdErr0 := proc.ReadThreadsCPU("/proc", kdamondPrefix)
	gen := newOpenLoop("http://"+m.lsAddr+"/work", m.cfg.Rate, m.cfg.Conns)
	res, err := gen.run(ctx, m.cfg.Phase)
	stop()
	wg.Wait()
	if err != nil {
		return memoryPhase{}, err
	}
	cpu1 := m.batchCPU(batchCgs)
	kd1, kdN, kdErr1 := proc.ReadThreadsCPU("/proc", kdamondPrefix)
	r.KdamondMs, r.KdamondThreads = float64(kd1-kd0)/float64(time.Millisecond), kdN
	if kdErr0 != nil || kdErr1 != nil {
		r.KdamondMs = -1
	}
	psi1, err := m.mh.pressure(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	oom1, err := m.mh.oomKills(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	refault1, err := m.mh.refaults(m.lsCg)
	if err != nil {
		return memoryPhase{}, err
	}
	wall := res.End.Sub(res.Start).Seconds()
	r.Name, r.Seconds, r.Requests, r.Errors = name, wall, res.Sent, res.Errors
	r.P50ms, r.P99ms, r.P999ms = ms(quantile(res.Latencies, .5)), ms(quantile(res.Latencies, .99)), ms(quantile(res.Latencies, .999))
	if wall > 0 {
		r.BatchCPUs = (cpu1 - cpu0).Seconds() / wall
	}
	r.LSOOMKills = oom1 - oom0
	r.LSRestarts = m.ls.exits() - restarts0
	if wall > 0 {
		r.LSPSISome = 100 * (psi1.Some.Total - psi0.Some.Total).Seconds() / wall
	}
	r.LSPSIAvg10 = psi1.Some.Avg10
	r.LSRefaultMiB = float64((refault1-refault0)*pageSize) / mib
	if n := float64(len(samples)); n > 0 {
		var ls, batch, batchWS, kp float64
		for _, smp := range samples {
			ls += float64(smp.lsWS)
			batch += float64(smp.batch)
			batchWS += float64(smp.batchWS)
			kp += float64(smp.kubepods)
		}
		r.LSMiB, r.BatchMiB, r.BatchWSMiB, r.KubepodsMiB = ls/n/mib, batch/n/mib, batchWS/n/mib, kp/n/mib
		r.LeftMiB = float64(m.cfg.Node)/mib - r.LSMiB
		if r.LeftMiB > 0 {
			r.BatchShare = r.BatchMiB / r.LeftMiB
		}
	}
	return r, nil
}

// batchCPU is the CPU time the batch pods' cgroups used so far: whether batch worked,
// not only held its memory (a frozen or starved job holds memory too).
func (m *memRun) batchCPU(cgs []string) time.Duration {
	var sum time.Duration
	for _, rel := range cgs {
		if g, err := m.s.hier.Load(rel); err == nil {
			if st, err := g.Stats(); err == nil {
				sum += st.Usage
			}
		}
	}
	return sum
}

func (m *memRun) stopBatch() {
	for _, p := range m.batch {
		p.stop()
	}
}

// close stops the agent and every pod and removes the data files. The cgroups, memory
// included, are the scenario's: s.close deletes them (Group.Delete removes the v1
// memory directories too) once this process has left them.
func (m *memRun) close() error {
	_ = m.s.stopAgent()
	m.stopBatch()
	if m.ls != nil {
		m.ls.stop()
	}
	if m.dataDir != "" {
		return os.RemoveAll(m.dataDir)
	}
	return nil
}

// agentEvictions reads the agent's count of memory evictions from its /metrics.
func agentEvictions(a *agentProc) (int64, error) {
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("parsing the agent's metrics: %w", err)
	}
	f, ok := fams[agentEvictionsMetric]
	if !ok {
		return -1, nil
	}
	var n float64
	for _, mt := range f.GetMetric() {
		n += mt.GetCounter().GetValue()
	}
	return int64(n), nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// memPod is one pod's container, restarted when it exits as kubelet restarts it (LS:
// restartPolicy Always; batch: a Job's OnFailure), after restartDelay.
type memPod struct {
	name         string
	cgroup       string
	argv         []string
	restartDelay time.Duration
	logf         func(string, ...any)

	mu     sync.Mutex
	nExits int
	info   int64 // the number on the last ready line (a batch job's heap)
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *memPod) readyInfo() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

func (p *memPod) exits() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nExits
}

// start runs the container and returns once it is ready; it is then kept running until
// stop.
func (p *memPod) start(ctx context.Context) error {
	cmd, err := p.launch(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go p.supervise(runCtx, cmd)
	return nil
}

func (p *memPod) supervise(ctx context.Context, cmd *exec.Cmd) {
	defer close(p.done)
	for {
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return
		case err := <-exited:
			p.mu.Lock()
			p.nExits++
			p.mu.Unlock()
			how := fmt.Sprintf("exited (%v)", err)
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				how = "was killed by signal " + ws.Signal().String()
			}
			p.logf("%s %s; restarting in %v", p.name, how, p.restartDelay)
		}
		for {
			if sleep(ctx, p.restartDelay) != nil {
				return
			}
			var err error
			if cmd, err = p.launch(ctx); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			p.logf("restarting %s: %v", p.name, err)
		}
	}
}

// launch starts one container process and waits for its ready line.
func (p *memPod) launch(ctx context.Context) (*exec.Cmd, error) {
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := startDefaultSlice(cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), memReady)
		switch {
		case err != nil:
		case !ok:
			err = fmt.Errorf("read %q", line)
		case strings.TrimSpace(rest) != "":
			var n int64
			if n, err = strconv.ParseInt(strings.TrimSpace(rest), 10, 64); err == nil {
				p.mu.Lock()
				p.info = n
				p.mu.Unlock()
			}
		}
		ready <- err
	}()
	fail := func(err error) (*exec.Cmd, error) {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, err
	}
	select {
	case err := <-ready:
		if err != nil {
			return fail(fmt.Errorf("%s did not start in %s: %w", p.name, p.cgroup, err))
		}
		return cmd, nil
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(2 * time.Minute):
		return fail(fmt.Errorf("%s was not ready within 2 minutes", p.name))
	}
}

// stop kills the container (its process group) and ends the restarts.
func (p *memPod) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel = nil
}

// printMemoryTable prints one row per phase of the memory scenario.
func printMemoryTable(w func(string, ...any), r memoryResult) {
	w("\nMemory pressure (node %d MiB; LS %d MiB anonymous + %d MiB page cache; %d batch pods of %d MiB, %s)\n",
		r.Config.NodeMiB, r.Config.LSAnonMiB, r.Config.LSFileMiB, r.Config.BatchPods, r.Config.BatchMemoryMiB, r.Config.Placement)
	w("%-22s %8s %8s %8s %6s %7s %11s %7s %8s %9s %6s %9s %9s %10s\n", "phase", "p50 ms", "p99 ms", "p99/solo",
		"LS OOM", "LS PSI%", "refault MiB", "LS MiB", "left MiB", "batch MiB", "share", "batch OOM", "heap MiB", "batch CPUs")
	solo := 0.0
	if len(r.Phases) > 0 {
		solo = r.Phases[0].P99ms
	}
	for _, p := range r.Phases {
		ratio := "-"
		if solo > 0 {
			ratio = fmt.Sprintf("%.2f", p.P99ms/solo)
		}
		w("%-22s %8.2f %8.2f %8s %6d %7.2f %11.0f %7.0f %8.0f %9.0f %6.2f %9d %9.0f %10.2f\n", p.Name, p.P50ms, p.P99ms, ratio,
			p.LSOOMKills, p.LSPSISome, p.LSRefaultMiB, p.LSMiB, p.LeftMiB, p.BatchMiB, p.BatchShare, p.BatchOOM, p.BatchHeapMiB,
			p.BatchCPUs)
	}
	if len(r.Phases) == 3 {
		a := r.Phases[2]
		lim, tier := "none", "none"
		if a.BatchLimMiB > 0 {
			lim = fmt.Sprintf("%.0f MiB", a.BatchLimMiB)
		}
		if a.TierLimitMiB > 0 {
			tier = fmt.Sprintf("%.0f MiB", a.TierLimitMiB)
		}
		ev := "not reported"
		if r.EvictionsAgent >= 0 {
			ev = strconv.FormatInt(r.EvictionsAgent, 10)
		}
		w("agent phase: batch pod memory limits %s, tier limit %s, evictions %s\n", lim, tier, ev)
	}
	printKdamond(w, r.Phases)
}

// printKdamond prints what the kernel's DAMON threads ran in each phase, when the
// machine runs DAMON: its sampling stalls LS in proportion to the memory in use, with or
// without the agent (docs/benchmarks.md, "Memory protection").
func printKdamond(w func(string, ...any), phases []memoryPhase) {
	var parts []string
	on := false
	for _, p := range phases {
		on = on || p.KdamondThreads > 0
		v := "unreadable"
		if p.KdamondMs >= 0 {
			v = fmt.Sprintf("%.0f ms", p.KdamondMs)
		}
		parts = append(parts, fmt.Sprintf("%s %s", p.Name, v))
	}
	if !on {
		return
	}
	w("the kernel's DAMON (kdamond) ran: %s; its memory sampling, charged to no cgroup, delays LS\n", strings.Join(parts, ", "))
	w("  by more the more memory is in use, whoever uses it (docs/benchmarks.md, memory protection)\n")
}
