package dashboards

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
)

// cgroupRoot is this machine's cgroupfs.
const cgroupRoot = "/sys/fs/cgroup"

// fakeNodePrefix names the private kubelet cgroup roots of this test's fake nodes,
// followed by the test binary's PID: a later run removes those of dead PIDs.
const fakeNodePrefix = "understory-dash-"

// burnerEnv makes the test binary a pod's workload (TestMain):
// "threads:dutyPercent:MiB".
const burnerEnv = "UNDERSTORY_DASH_BURNER"

// runBurner keeps threads OS threads busy for duty percent of every 10 ms and holds
// MiB of memory (touched once it runs in its cgroup, so the pod is charged for it)
// until the process is killed. It never returns.
func runBurner(spec string) {
	var threads, duty, mib int
	if _, err := fmt.Sscanf(spec, "%d:%d:%d", &threads, &duty, &mib); err != nil || threads < 1 || duty < 1 ||
		duty > 100 || mib < 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want threads:dutyPercent:MiB\n", burnerEnv, spec)
		os.Exit(2)
	}
	// The parent moves this process into the pod's cgroup right after starting it, then
	// writes a byte on fd 3: wait for it, so that the memory below is the pod's.
	moved := os.NewFile(3, "moved")
	if _, err := moved.Read(make([]byte, 1)); err != nil {
		fmt.Fprintf(os.Stderr, "burner: the parent did not say it moved this process: %v\n", err)
		os.Exit(2)
	}
	_ = moved.Close()
	mem := make([]byte, mib<<20)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	const slot = 10 * time.Millisecond
	busy := slot * time.Duration(duty) / 100
	for range threads {
		go func() {
			runtime.LockOSThread()
			x := uint64(1)
			for {
				start := time.Now()
				for time.Since(start) < busy {
					for range 1 << 10 {
						x = x*6364136223846793005 + 1442695040888963407
					}
				}
				if x == 0 {
					println()
				}
				if busy < slot {
					time.Sleep(slot - busy)
				}
			}
		}()
	}
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(mem)
	}
}

// fakePod is one pod of the fake node: its manifest and its kubelet cgroup.
type fakePod struct {
	name   string
	uid    types.UID
	qos    cgroups.KubeQOS
	ann    map[string]string
	cpuReq string
	cgroup string // relative to the cgroup root
}

// fakeNode is a kubelet-like cgroup layout under a private --cgroup-root on this
// machine, with static pod manifests and the real agent (static mode) managing it.
type fakeNode struct {
	h     *cgroups.Hierarchy
	base  string // the node's kubelet cgroup root, relative to cgroupRoot
	dir   string
	pods  map[string]*fakePod
	agent *exec.Cmd
	addr  string // the agent's /metrics address

	mu      sync.Mutex
	burners []*exec.Cmd
}

// cleanLeftovers removes the fake nodes of earlier runs whose test binary is gone
// (an aborted run): thaws and kills what runs in them, then removes the cgroups.
func cleanLeftovers(t *testing.T, h *cgroups.Hierarchy) {
	t.Helper()
	// The root's children, in the v2 root or the v1 cpu and v2 unified hierarchies
	// (ListChildren takes no empty path).
	names := map[string]bool{}
	for _, dir := range []string{cgroupRoot, filepath.Join(cgroupRoot, "cpu"), filepath.Join(cgroupRoot, "unified")} {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			if e.IsDir() {
				names[e.Name()] = true
			}
		}
	}
	re := regexp.MustCompile("^" + regexp.QuoteMeta(fakeNodePrefix) + `(\d+)(-gpu)?$`)
	for n := range names {
		m := re.FindStringSubmatch(n)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // a live run's
		}
		t.Logf("removing the leftovers of an aborted run: %s", n)
		if err := reclaim(h, n); err != nil {
			t.Logf("warning: %v", err)
		}
	}
}

// reclaim thaws and kills every process below rel, then removes rel and its
// descendants from every hierarchy.
func reclaim(h *cgroups.Hierarchy, rel string) error {
	var walk func(string)
	var groups []string
	walk = func(r string) {
		groups = append(groups, r)
		kids, _ := h.ListChildren(r)
		for _, k := range kids {
			walk(r + "/" + k)
		}
	}
	walk(rel)
	for i := range 3 {
		busy := false
		for _, r := range groups {
			g, err := h.Load(r)
			if err != nil {
				continue
			}
			_ = g.Thaw() // a frozen task does not die
			pids, _ := g.Procs()
			for _, p := range pids {
				busy = true
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if !busy {
			break
		}
		time.Sleep(time.Duration(i+1) * 100 * time.Millisecond)
	}
	return h.RemoveEmpty(rel)
}

// newFakeNode lays out the node's cgroups (kubelet's cgroupfs layout) and writes
// its pods' static manifests. Everything is removed in t.Cleanup.
func newFakeNode(t *testing.T, h *cgroups.Hierarchy, pods []*fakePod) *fakeNode {
	t.Helper()
	n := &fakeNode{h: h, base: fakeNodePrefix + strconv.Itoa(os.Getpid()), dir: t.TempDir(),
		pods: map[string]*fakePod{}}
	t.Cleanup(func() { n.close(t) })
	ncpu := uint64(max(1, runtime.NumCPU()))
	// The node root and kubepods weigh against the rest of the machine as a real
	// kubepods does; burstable gets its pods' requests, BestEffort kubelet's 2.
	for _, c := range []struct {
		rel    string
		shares uint64
	}{{"", 1024 * ncpu}, {"kubepods", 1024 * ncpu}, {"kubepods/burstable", 1024}, {"kubepods/besteffort", 2}} {
		g, err := h.Create(strings.TrimSuffix(n.base+"/"+c.rel, "/"))
		if err != nil {
			t.Fatalf("creating the fake node's cgroups: %v", err)
		}
		if err := g.SetCPUShares(c.shares); err != nil {
			t.Fatal(err)
		}
	}
	manifests := filepath.Join(n.dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(p.qos, string(p.uid))
		if err != nil {
			t.Fatal(err)
		}
		p.cgroup = n.base + "/" + rel
		g, err := h.Create(p.cgroup)
		if err != nil {
			t.Fatal(err)
		}
		shares := uint64(2)
		var req corev1.ResourceList
		if p.cpuReq != "" {
			q := resource.MustParse(p.cpuReq)
			req = corev1.ResourceList{corev1.ResourceCPU: q}
			shares = max(2, uint64(q.MilliValue()*1024/1000))
		}
		if err := g.SetCPUShares(shares); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "dash", UID: p.uid, Annotations: p.ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "understory/burner",
				Resources: corev1.ResourceRequirements{Requests: req}}}},
		}
		b, err := yaml.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(manifests, p.name+".yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n.pods[p.name] = p
	}
	return n
}

// startAgent runs the koordlet binary in static mode on the node and waits until it
// is healthy.
func (n *fakeNode) startAgent(t *testing.T, bin string) {
	t.Helper()
	cfg := config.Default()
	cfg.NodeName = "e2e-node"
	cfg.CgroupRoot = cgroupRoot
	cfg.KubeletCgroupRoot = "/" + n.base
	cfg.StaticPodDir = filepath.Join(n.dir, "manifests")
	cfg.GPU.Mode = config.GPUModeOff
	// The scripted LS steps must cut and restore batch on every run for the throttle and
	// cut-reaction panels: utilisation decides (signals.mode sampling). With a harm
	// signal (eBPF, PSI) only measured LS harm cuts, which this machine may not show.
	cfg.Signals.Mode = "sampling"
	// Short enough that a long LS phase starves batch into a (dry-run) eviction.
	cfg.Escalation.StarvationTimeout = metav1.Duration{Duration: 8 * time.Second}
	cfg.Escalation.EvictionInterval = metav1.Duration{Duration: 10 * time.Second}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenAddress = addr
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(n.dir, "koordlet.yaml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(n.dir, "koordlet.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	n.agent, n.addr = cmd, addr
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log %s, last lines:\n%s", logPath, controlplane.TailFile(logPath, 30))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent was not healthy within 30s; log:\n%s", controlplane.TailFile(logPath, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// burn starts a burner (threads at duty percent, holding mib MiB) in pod's cgroup
// and returns it; it runs until stop or the node's cleanup.
func (n *fakeNode) burn(t *testing.T, pod string, threads, duty, mib int) *exec.Cmd {
	t.Helper()
	p := n.pods[pod]
	g, err := n.h.Load(p.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	// The burner waits for a byte on its fd 3 (the pipe's read end): sent once it is in
	// the pod's cgroup.
	movedR, movedW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer movedW.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d:%d", burnerEnv, threads, duty, mib))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.ExtraFiles = []*os.File{movedR}
	err = cmd.Start()
	_ = movedR.Close()
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.burners = append(n.burners, cmd)
	n.mu.Unlock()
	if err := g.AddProcMemory(cmd.Process.Pid); err != nil {
		t.Fatalf("moving a burner into %s: %v", p.cgroup, err)
	}
	if _, err := movedW.Write([]byte{1}); err != nil {
		t.Fatalf("telling the burner in %s it moved: %v", p.cgroup, err)
	}
	return cmd
}

// stop kills a burner (thawing its cgroup first: a frozen task does not die).
func (n *fakeNode) stop(pod string, cmd *exec.Cmd) {
	if g, err := n.h.Load(n.pods[pod].cgroup); err == nil {
		_ = g.Thaw()
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, c := range n.burners {
		if c == cmd {
			n.burners = append(n.burners[:i], n.burners[i+1:]...)
			break
		}
	}
}

// close stops the agent (it thaws batch and leaves it bounded), kills the burners
// and removes every cgroup of the node, the agent's tier included.
func (n *fakeNode) close(t *testing.T) {
	if n.agent != nil && n.agent.Process != nil {
		_ = n.agent.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- n.agent.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-n.agent.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	n.mu.Lock()
	burners := n.burners
	n.burners = nil
	n.mu.Unlock()
	for _, p := range n.pods {
		if g, err := n.h.Load(p.cgroup); err == nil {
			_ = g.Thaw()
		}
	}
	for _, c := range burners {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		_ = c.Wait()
	}
	if err := reclaim(n.h, n.base); err != nil && !errors.Is(err, cgroups.ErrNotExist) {
		t.Errorf("removing the fake node's cgroups: %v", err)
	}
}

// nodePods are the fake node's pods: one LS web service, one BE pod and two batch
// pods, as kubelet would classify them.
func nodePods() []*fakePod {
	batch := map[string]string{"understory.io/qos-class": string(qos.ClassBatch)}
	return []*fakePod{
		{name: "ls-web", uid: "da5b0000-0000-4000-8000-000000000001", qos: cgroups.QOSBurstable, cpuReq: "1"},
		{name: "be-cron", uid: "da5b0000-0000-4000-8000-000000000002", qos: cgroups.QOSBestEffort},
		{name: "batch-etl", uid: "da5b0000-0000-4000-8000-000000000003", qos: cgroups.QOSBestEffort, ann: batch},
		{name: "batch-train", uid: "da5b0000-0000-4000-8000-000000000004", qos: cgroups.QOSBestEffort, ann: batch},
	}
}
