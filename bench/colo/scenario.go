package colo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/config"
)

// scenarioConfig sizes the co-location scenario.
type scenarioConfig struct {
	cgroupRoot string // cgroupfs mount
	koordlet   string // path of the koordlet binary
	self       string // path of this binary, re-executed for the LS server and batch workers
	batchPods  int
	threads    int    // burner threads per batch pod
	burner     string // batch workload: burnCPU (default when empty) or burnMemBW
	bufferMiB  int    // burnMemBW: buffer per batch pod
	load       loadShape
	// signalsMode, when set, is the agent's signals.mode (ebpf, psi, sampling, auto).
	signalsMode string
	rounds      int // SHA-256 rounds per LS request
	rate        float64
	workers     int
	lsCPU       string        // LS pod CPU request (kubelet sets its cpu.shares from it)
	extraPods   int           // idle pods (no processes) added to the manifests, for the overhead run
	tierParent  string        // koordlet tierParent
	cfsPeriod   time.Duration // koordlet cfsPeriod (0: its default)
	agentPprof  bool          // start the agent with -pprof
	logf        func(format string, args ...any)
}

// scenario is one fake node: kubelet's cgroup layout under a private --cgroup-root, static
// pod manifests, the LS service and the batch workers. Everything it creates is removed
// by close, also after a failure or Ctrl-C.
type scenario struct {
	cfg     scenarioConfig
	hier    *cgroups.Hierarchy
	base    string // kubelet --cgroup-root of the fake node, e.g. "understory-demo-123"
	dir     string // temp dir: manifests, agent config and logs
	lsAddr  string
	ls      *exec.Cmd
	batch   []*batchPod
	created []string // cgroups to delete, in creation order
	agent   *agentProc
	// tierParent is where the agent creates its tier (koordlet config tierParent).
	tierParent string
	// memThreshold, when set, is the agent's batchResources.memory.threshold.
	memThreshold float64
	// signalsMode, when set, is the agent's signals.mode; the variant runs change it
	// between agent phases.
	signalsMode string
	// lsCg is the LS pod's cgroup, relative to the hierarchy's root.
	lsCg string
}

type batchPod struct {
	uid  types.UID
	name string
	cmd  *exec.Cmd
}

// errNotSupported explains what the machine lacks to run the scenario.
var errNotSupported = errors.New("this machine cannot run the co-location scenario")

// checkMachine says clearly what is missing: root, a cgroup filesystem, write access.
func checkMachine(root string) (*cgroups.Hierarchy, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("must run as root (it creates cgroups and moves processes into them): %w", errNotSupported)
	}
	h, err := cgroups.Open(root)
	if err != nil {
		switch {
		case errors.Is(err, cgroups.ErrNoCgroupFS):
			return nil, fmt.Errorf("no cgroup filesystem at %s (Linux with cgroup v1, hybrid or v2 required): %v: %w", root, err, errNotSupported)
		case errors.Is(err, cgroups.ErrReadOnly):
			return nil, fmt.Errorf("cgroup filesystem at %s is read-only (in a container, run privileged or mount it rw): %v: %w", root, err, errNotSupported)
		}
		return nil, fmt.Errorf("opening cgroups at %s: %v: %w", root, err, errNotSupported)
	}
	return h, nil
}

func newScenario(cfg scenarioConfig) (*scenario, error) {
	h, err := checkMachine(cfg.cgroupRoot)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "understory-colo-")
	if err != nil {
		return nil, err
	}
	s := &scenario{cfg: cfg, hier: h, base: fmt.Sprintf("understory-demo-%d", os.Getpid()), dir: dir, tierParent: cfg.tierParent,
		signalsMode: cfg.signalsMode}
	if err := s.setUp(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// cg returns a path below the fake node's cgroup root.
func (s *scenario) cg(rel string) string { return path.Join(s.base, rel) }

func (s *scenario) create(rel string, shares uint64) (*cgroups.Group, error) {
	g, err := s.hier.Create(rel)
	if err != nil {
		return nil, err
	}
	s.created = append(s.created, rel)
	if shares > 0 {
		if err := g.SetCPUShares(shares); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// lsShares is kubelet's cpu.shares for a CPU request.
func lsShares(q resource.Quantity) uint64 { return max(2, uint64(q.MilliValue()*1024/1000)) }

func (s *scenario) setUp() error {
	lsReq := resource.MustParse(s.cfg.lsCPU)
	// The node's cgroups as kubelet lays them out (cgroupfs driver), plus one cgroup for
	// the load generator, away from the pods. The fake node's root gets the weight a
	// real kubepods would have against the rest of the machine. The load generator
	// stands for clients on other machines: it gets the largest weight, so that batch
	// never delays a send or the reading of a reply. At weight 1024 it competed with
	// kubepods (2048) on equal terms, and its own wake-up delays, not the LS pod's,
	// made the tail (plain BestEffort measured 17x solo that way).
	if _, err := s.create(s.base, 1024*uint64(max(1, numCPU()))); err != nil {
		return err
	}
	for _, c := range []struct {
		rel    string
		shares uint64
	}{
		{"kubepods", 1024 * uint64(max(1, numCPU()))},
		{"kubepods/burstable", lsShares(lsReq)},
		{"kubepods/besteffort", 2},
		{"loadgen", cgroups.MaxShares},
	} {
		if _, err := s.create(s.cg(c.rel), c.shares); err != nil {
			return fmt.Errorf("creating %s: %w", c.rel, err)
		}
	}
	manifests := filepath.Join(s.dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		return err
	}
	// The LS pod.
	lsUID := types.UID("1a5e0000-0000-4000-8000-000000000001")
	lsPod := pod("ls-web", lsUID, nil, corev1.ResourceList{corev1.ResourceCPU: lsReq})
	if err := writeManifest(manifests, lsPod); err != nil {
		return err
	}
	lsCg, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBurstable, string(lsUID))
	if err != nil {
		return err
	}
	if _, err := s.create(s.cg(lsCg), lsShares(lsReq)); err != nil {
		return err
	}
	// The batch pods: BestEffort, annotated batch.
	for i := range s.cfg.batchPods {
		uid := types.UID(fmt.Sprintf("ba7c0000-0000-4000-8000-%012d", i+1))
		name := fmt.Sprintf("batch-%d", i+1)
		p := pod(name, uid, map[string]string{contract.AnnotationQOSClass: "batch"}, nil)
		if err := writeManifest(manifests, p); err != nil {
			return err
		}
		rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBestEffort, string(uid))
		if err != nil {
			return err
		}
		if _, err := s.create(s.cg(rel), 2); err != nil {
			return err
		}
		s.batch = append(s.batch, &batchPod{uid: uid, name: name})
	}
	// Idle pods without processes, so the agent has a realistic pod count to track.
	for i := range s.cfg.extraPods {
		uid := types.UID(fmt.Sprintf("e0000000-0000-4000-8000-%012d", i+1))
		var ann map[string]string
		var req corev1.ResourceList
		q := cgroups.QOSBestEffort
		switch i % 3 {
		case 0:
			ann = map[string]string{contract.AnnotationQOSClass: "batch"}
		case 1:
			req, q = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}, cgroups.QOSBurstable
		}
		if err := writeManifest(manifests, pod(fmt.Sprintf("idle-%d", i+1), uid, ann, req)); err != nil {
			return err
		}
		rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(q, string(uid))
		if err != nil {
			return err
		}
		if _, err := s.create(s.cg(rel), 2); err != nil {
			return err
		}
	}
	if err := s.enterLoadgen(); err != nil {
		return err
	}
	s.lsCg = s.cg(lsCg)
	return s.startLS(s.lsCg)
}

// enterLoadgen moves the load generator (this process) from the root cgroup into its
// own, "loadgen", and gives it the shortest scheduler slice.
func (s *scenario) enterLoadgen() error {
	lg, err := s.hier.Load(s.cg("loadgen"))
	if err != nil {
		return err
	}
	if err := lg.AddProc(os.Getpid()); err != nil {
		return fmt.Errorf("moving the load generator into its cgroup: %w", err)
	}
	if err := setSlice(loadgenSlice); err != nil && s.cfg.logf != nil {
		s.cfg.logf("warning: no short scheduler slice for the load generator (its own wake-ups may add to the LS tail): %v", err)
	}
	return nil
}

func pod(name string, uid types.UID, ann map[string]string, req corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "understory/colo", Resources: corev1.ResourceRequirements{Requests: req},
		}}},
	}
}

func writeManifest(dir string, p *corev1.Pod) error {
	b, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, p.Name+".yaml"), b, 0o644)
}

// startLS starts the LS service in its pod cgroup and waits until it answers.
func (s *scenario) startLS(cgroup string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	s.lsAddr = addr
	cmd := exec.Command(s.cfg.self, lsServerCmd, "-listen", s.lsAddr, "-rounds", strconv.Itoa(s.cfg.rounds),
		"-cgroup-root", s.cfg.cgroupRoot, "-cgroup", cgroup)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := startDefaultSlice(cmd); err != nil {
		return fmt.Errorf("starting the LS server: %w", err)
	}
	s.ls = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + s.lsAddr + "/work")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the LS server did not answer within 10s")
}

// batchCgroup is where batch pod p runs: kubelet's BestEffort pod cgroup, or the pod's
// cgroup below the agent's tier (where the agent's NRI plugin puts batch containers).
func (s *scenario) batchCgroup(p *batchPod, inTier bool) (string, error) {
	if inTier {
		return s.tierPodCgroup(string(p.uid))
	}
	rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBestEffort, string(p.uid))
	return s.cg(rel), err
}

// startBatch starts one burner (CPU or memory bandwidth) per batch pod, in kubelet's BestEffort pod cgroups.
func (s *scenario) startBatch() error {
	for _, p := range s.batch {
		rel, err := s.batchCgroup(p, false)
		if err != nil {
			return err
		}
		args := []string{burnerCmd, "-threads", strconv.Itoa(s.cfg.threads), "-cgroup-root", s.cfg.cgroupRoot, "-cgroup", rel}
		if s.cfg.burner != "" {
			args = append(args, "-kind", s.cfg.burner, "-buffer-mib", strconv.Itoa(s.cfg.bufferMiB))
		}
		cmd := exec.Command(s.cfg.self, args...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := startDefaultSlice(cmd); err != nil {
			return fmt.Errorf("starting batch worker %s: %w", p.name, err)
		}
		p.cmd = cmd
		// Wait until the worker has joined its cgroup, so that placeBatch, which may
		// follow at once, is not undone by the worker's own join.
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != burnerReady {
			return fmt.Errorf("batch worker %s did not start (read %q): %v", p.name, line, err)
		}
	}
	return nil
}

// burnerReady is the line a batch worker prints once it runs in its cgroup.
const burnerReady = "burner ready"

// placeBatch moves the batch workers into kubelet's pod cgroups (inTier false) or below
// the agent's tier (inTier true), creating the latter as the runtime would.
func (s *scenario) placeBatch(inTier bool) error {
	for _, p := range s.batch {
		if p.cmd == nil {
			continue
		}
		rel, err := s.batchCgroup(p, inTier)
		if err != nil {
			return err
		}
		g, err := s.hier.Create(rel)
		if err != nil {
			return err
		}
		if inTier && !contains(s.created, rel) {
			s.created = append(s.created, rel)
		}
		if err := g.AddProc(p.cmd.Process.Pid); err != nil {
			return fmt.Errorf("moving %s to %s: %w", p.name, rel, err)
		}
		if !inTier {
			// Like a runtime whose containers left the tier: nothing stays below it.
			tierRel, err := s.batchCgroup(p, true)
			if err != nil {
				return err
			}
			if tg, err := s.hier.Load(tierRel); err == nil {
				if err := tg.Delete(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// thawBatch thaws every cgroup the agent may have frozen batch in: the tier and each
// batch pod's cgroup, in kubelet's tree and below the tier. An agent that stops while a
// freeze is still pending can leave batch frozen, and a frozen worker never dies of
// SIGKILL, so every stop of the workers (and close) comes after this. It returns how
// many of them it found frozen.
func (s *scenario) thawBatch() int {
	rels := []string{s.tier()}
	for _, p := range s.batch {
		for _, inTier := range []bool{false, true} {
			if rel, err := s.batchCgroup(p, inTier); err == nil {
				rels = append(rels, rel)
			}
		}
	}
	n := 0
	for _, rel := range rels {
		g, err := s.hier.Load(rel)
		if err != nil {
			continue // not there: nothing to thaw
		}
		if frozen, err := g.Frozen(); err == nil && frozen {
			n++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := g.ThawContext(ctx); err != nil && !errors.Is(err, cgroups.ErrUnsupported) && s.cfg.logf != nil {
			s.cfg.logf("warning: thawing %s: %v", rel, err)
		}
		cancel()
	}
	return n
}

// resetBatch gives kubelet's BestEffort pod cgroups back their plain kubelet settings
// (weight 2, no quota, not idle, thawed), undoing what an in-place agent left.
func (s *scenario) resetBatch() error {
	if n := s.thawBatch(); n > 0 && s.cfg.logf != nil {
		s.cfg.logf("warning: the agent left %d batch cgroups frozen when it stopped; thawed", n)
	}
	for _, p := range s.batch {
		rel, err := s.batchCgroup(p, false)
		if err != nil {
			return err
		}
		g, err := s.hier.Load(rel)
		if err != nil {
			return err
		}
		if err := g.SetIdle(false); err != nil && !errors.Is(err, cgroups.ErrUnsupported) {
			return err
		}
		if err := g.SetCPUShares(2); err != nil {
			return err
		}
		if err := g.SetCPULimit(-1, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// batchPIDs returns the batch workers' PIDs.
func (s *scenario) batchPIDs() []int {
	var pids []int
	for _, p := range s.batch {
		if p.cmd != nil {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}

// close stops every process and removes every cgroup the scenario created. It may be
// called again (runDemo closes before the memory scenario, then defers it): what it
// stopped is forgotten, so no reaped pid (perhaps reused) is signalled twice.
func (s *scenario) close() {
	_ = s.stopAgent()
	if s.hier != nil {
		s.thawBatch()
	}
	procs := []*exec.Cmd{s.ls}
	for _, p := range s.batch {
		procs = append(procs, p.cmd)
	}
	s.ls = nil
	for _, c := range procs {
		if c != nil && c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
	}
	for _, p := range s.batch {
		p.cmd = nil
	}
	// Move this process back to the root cgroup before removing its own.
	if root, err := s.hier.LoadRoot(); err == nil {
		_ = root.AddProc(os.Getpid())
	}
	// Also whatever the agent created (its tier), deepest first.
	extra := []string{s.tier()}
	all := append(append([]string{}, s.created...), extra...)
	for i := len(all) - 1; i >= 0; i-- {
		if g, err := s.hier.Load(all[i]); err == nil {
			if err := g.Delete(); err != nil && s.cfg.logf != nil {
				s.cfg.logf("warning: removing cgroup %s: %v", all[i], err)
			}
		}
	}
	if root, err := s.hier.Load(s.base); err == nil {
		_ = root.Delete()
	}
	_ = os.RemoveAll(s.dir)
}

// tier is the agent's tier cgroup on the fake node.
func (s *scenario) tier() string {
	t, _ := config.TierCgroup(cgroups.DriverCgroupfs, s.base, s.tierParent, config.DefaultTierName)
	return t
}

// tierPodCgroup is where the agent's NRI plugin puts a batch pod's containers on the
// fake node (cgroupfs driver): below the tier, in a directory named as kubelet names
// the pod's own ("pod<uid>"), the rule of koordlet's nriPodCgroup. The bench plays the
// NRI plugin, so it writes that rule down itself rather than ask the agent for it: a
// change to the rule must be made here too, or the agent would not find the in-tier
// batch pods.
func (s *scenario) tierPodCgroup(uid string) (string, error) {
	tier, err := config.TierCgroup(cgroups.DriverCgroupfs, s.base, s.tierParent, config.DefaultTierName)
	if err != nil {
		return "", err
	}
	kubelet, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(cgroups.QOSBestEffort, uid)
	if err != nil {
		return "", err
	}
	return path.Join(tier, path.Base(kubelet)), nil
}

func numCPU() int { return runtime.NumCPU() }
