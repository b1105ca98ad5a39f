package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/understory/understory/internal/testenv"
)

// cgroupRoot is where this machine mounts its cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// node is a real single-node cluster started by scripts/realnode/up.sh for one test.
type node struct {
	repo   string
	dir    string
	env    map[string]string
	client kubernetes.Interface
}

// waitForOtherNode is how long up.sh waits for another real node on this machine (a
// parallel test binary, another checkout) to end before it gives up.
const waitForOtherNode = 10 * time.Minute

// requireRealNode skips the test (or fails it under CI=true, where nothing may skip)
// when this machine cannot run a real node: not root, no cgroup v1 cpu controller with
// cpu.idle, or -short. how says how to run it.
func requireRealNode(t *testing.T, how string) {
	t.Helper()
	skip := func(why string) {
		t.Helper()
		testenv.SkipOrFailInCI(t, "the real-node test cannot run: %s; %s", why, how)
	}
	if testing.Short() {
		skip("starts a real node (-short)")
	}
	if os.Geteuid() != 0 {
		skip("needs root (kubelet and containerd manage cgroups, mounts and iptables)")
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cpu", "cpu.idle")); err != nil {
		skip(fmt.Sprintf("needs the cgroup v1 cpu controller with cpu.idle (hybrid layout, Linux >= 5.15): %v", err))
	}
}

// repoRoot is the module root, three levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatalf("repo root: %v", err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.Contains(mod, []byte("module github.com/understory/understory\n")) {
		t.Fatalf("%s is not the understory module root (go.mod: %v)", root, err)
	}
	return root
}

// startNode runs up.sh in a fresh short run dir, importing the image tarballs given,
// and registers the teardown. The run dir (with every component's log) is kept when
// the test failed. Another live node on this machine is waited for (waitForOtherNode).
func startNode(t *testing.T, repo string, images ...string) *node {
	t.Helper()
	return startNodeWith(t, repo, nil, images...)
}

// startNodeWith is startNode with more arguments for up.sh (--insecure-registry).
func startNodeWith(t *testing.T, repo string, upArgs []string, images ...string) *node {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "rn-")
	if err != nil {
		t.Fatalf("run dir: %v", err)
	}
	scripts := filepath.Join(repo, "scripts", "realnode")
	t.Cleanup(func() {
		args := []string{dir}
		if !t.Failed() {
			args = append(args, "--purge")
		}
		start := time.Now()
		out, err := exec.Command(filepath.Join(scripts, "down.sh"), args...).CombinedOutput()
		t.Logf("down.sh (%v): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
		if err != nil {
			t.Errorf("down.sh %s: %v", dir, err)
		}
		if t.Failed() {
			t.Logf("logs kept in %s/logs", dir)
		}
	})
	start := time.Now()
	args := []string{"-d", dir, "--owner-pid", strconv.Itoa(os.Getpid()),
		"--wait", strconv.Itoa(int(waitForOtherNode.Seconds()))}
	for _, img := range images {
		args = append(args, "--import", img)
	}
	args = append(args, upArgs...)
	cmd := exec.Command(filepath.Join(scripts, "up.sh"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("up.sh: %v\n%s", err, out.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatalf("reading the node's env: %v", err)
	}
	env, err := parseEnv(data)
	if err != nil {
		t.Fatalf("node env: %v", err)
	}
	for _, k := range []string{"KUBECONFIG", "NRI_SOCKET", "KUBECTL", "KUBELET_LOG", "BUSYBOX_IMAGE", "NODE_NAME",
		"SCHEDULER_CONFIG", "SCHEDULER_KUBECONFIG", "POD_CIDR"} {
		if env[k] == "" {
			t.Fatalf("node env has no %s", k)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Logf("node up in %v (run dir %s)", time.Since(start).Round(time.Millisecond), dir)
	return &node{repo: repo, dir: dir, env: env, client: client}
}

// kubelet runs scripts/realnode/kubelet.sh stop|start|restart.
func (n *node) kubelet(what string) (string, error) {
	out, err := exec.Command(filepath.Join(n.repo, "scripts", "realnode", "kubelet.sh"), n.dir, what).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubelet.sh %s: %s: %w", what, strings.TrimSpace(string(out)), err)
	}
	return string(out), nil
}

// kubectl runs the node's kubectl with the admin kubeconfig.
func (n *node) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.env["KUBECTL"], append([]string{"--kubeconfig", n.env["KUBECONFIG"]}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %s: %w", strings.Join(args, " "), strings.TrimSpace(string(out)), err)
	}
	return string(out), nil
}

// kubeletLogSize is the current size of kubelet's log, to read what it logs from now on.
func (n *node) kubeletLogSize() int64 {
	fi, err := os.Stat(n.env["KUBELET_LOG"])
	if err != nil {
		return 0
	}
	return fi.Size()
}

// kubeletLogSince returns kubelet's log lines after offset that contain every needle.
func (n *node) kubeletLogSince(offset int64, needles ...string) []string {
	data, err := os.ReadFile(n.env["KUBELET_LOG"])
	if err != nil || int64(len(data)) < offset {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(data[offset:]), "\n") {
		ok := l != ""
		for _, s := range needles {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// kubeletProblems returns kubelet's error and warning lines (klog E/W) after offset
// that contain needle.
func (n *node) kubeletProblems(offset int64, needle string) []string {
	var out []string
	for _, l := range n.kubeletLogSince(offset, needle) {
		if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W") {
			out = append(out, l)
		}
	}
	return out
}

// podSpec is a hostNetwork busybox pod that prints a line and sleeps.
func (n *node) podSpec(name string, annotations map[string]string, res corev1.ResourceRequirements) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: annotations},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: n.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "echo hello from " + name + "; exec sleep 3600"},
				Resources: res,
			}},
		},
	}
}

// cpuMem is a resource list of cpu and memory.
func cpuMem(cpu, mem string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
}

// createRunning creates the pod and waits until its container runs.
func (n *node) createRunning(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	start := time.Now()
	if _, err := n.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	p := n.waitRunning(ctx, t, pod.Name)
	t.Logf("pod %s (%s, uid %s) Running in %v", p.Name, p.Status.QOSClass, p.UID, time.Since(start).Round(time.Millisecond))
	return p
}

// waitRunning waits for the first container of pod default/name to be running.
func (n *node) waitRunning(ctx context.Context, t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return n.waitRunningIn(ctx, t, "default", name)
}

// waitRunningIn waits for the first container of pod ns/name to be running.
func (n *node) waitRunningIn(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := poll(ctx, 90*time.Second, func() (bool, error) {
		p, err := n.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		cs := p.Status.ContainerStatuses
		return p.Status.Phase == corev1.PodRunning && len(cs) > 0 && cs[0].State.Running != nil && cs[0].ContainerID != "", nil
	})
	if err != nil {
		t.Fatalf("pod %s not running: %v (last status %+v)", name, err, statusOf(last))
	}
	return last
}

func statusOf(p *corev1.Pod) any {
	if p == nil {
		return nil
	}
	return p.Status
}

// deleteAndWait deletes the pod and waits until the API server no longer has it.
func (n *node) deleteAndWait(ctx context.Context, t *testing.T, name string) time.Duration {
	t.Helper()
	start := time.Now()
	if err := n.client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	err := poll(ctx, 90*time.Second, func() (bool, error) {
		_, err := n.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s not gone: %v", name, err)
	}
	return time.Since(start)
}

// containerID strips the runtime prefix of a container status ID.
func containerID(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	return id
}

// processesOf returns the PIDs whose cpu cgroup ends in /<id> (a container's
// processes), with their parsed /proc/<pid>/cgroup.
func processesOf(id string) (map[int]procCgroup, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	out := map[int]procCgroup{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue // exited meanwhile
		}
		cg, err := parseProcCgroup(data)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/cgroup: %w", pid, err)
		}
		if filepath.Base(cg["cpu"]) == id {
			out[pid] = cg
		}
	}
	return out, nil
}

// hierarchies are the cgroup hierarchies mounted under cgroupRoot (v1 controllers,
// named hierarchies, and the hybrid cgroup2 mount "unified").
func hierarchies() []string {
	ents, _ := os.ReadDir(cgroupRoot)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// hierarchiesWith lists the hierarchies in which the relative cgroup exists.
func hierarchiesWith(rel string) []string {
	var out []string
	for _, h := range hierarchies() {
		if fi, err := os.Stat(filepath.Join(cgroupRoot, h, rel)); err == nil && fi.IsDir() {
			out = append(out, h)
		}
	}
	return out
}

// cpuFile reads a file of the cpu controller of the relative cgroup.
func cpuFile(rel, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cpu", rel, file))
	return strings.TrimSpace(string(b)), err
}

// cpuSettings is what the agent sets on batch cgroups.
type cpuSettings struct{ Shares, Idle, Quota, Period string }

func (s cpuSettings) String() string {
	return fmt.Sprintf("shares=%s idle=%s quota=%s period=%s", s.Shares, s.Idle, s.Quota, s.Period)
}

func readCPUSettings(rel string) (cpuSettings, error) {
	var s cpuSettings
	var errs []error
	for _, f := range []struct {
		name string
		dst  *string
	}{{"cpu.shares", &s.Shares}, {"cpu.idle", &s.Idle}, {"cpu.cfs_quota_us", &s.Quota}, {"cpu.cfs_period_us", &s.Period}} {
		v, err := cpuFile(rel, f.name)
		*f.dst = v
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

// poll calls cond every 200 ms until it reports done, returns an error, or timeout.
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not met within %v: %w", timeout, ctx.Err())
		case <-tick.C:
		}
	}
}
