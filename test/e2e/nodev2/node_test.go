package nodev2

import (
	"bytes"
	"context"
	"fmt"
	"net"
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
	"github.com/understory/understory/test/e2e/nodev2/vm"
)

const (
	// nodeName is the guest's node name (and the hostname of the image).
	nodeName = "understory-v2"
	// tap is the host end of the guest's link, a port of the control plane's bridge.
	tap = "usv2tap0"
	// guestPodCIDR is the guest's own pod network, masqueraded behind its address.
	guestPodCIDR = "10.218.0.0/24"
	nsSystem     = "understory-system"
	agentLabel   = "app.kubernetes.io/name=understory-koordlet"
	// tierDir is the agent's batch tier under kubelet's systemd driver, below kubepods as the
	// real-node configuration puts it.
	tierDir = "/sys/fs/cgroup/kubepods.slice/kubepods-understory_batch.slice"
)

// cluster is the host's control plane and the guest node joined to it.
type cluster struct {
	repo   string
	env    map[string]string
	client kubernetes.Interface
	guest  *vm.VM
}

// startControlPlane runs scripts/realnode/up.sh --control-plane-only for the guest's node
// name and tears it down (down.sh) in t's cleanup.
func startControlPlane(t *testing.T, repo string) map[string]string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "v2-")
	if err != nil {
		t.Fatal(err)
	}
	scripts := filepath.Join(repo, "scripts", "realnode")
	t.Cleanup(func() {
		args := []string{dir}
		if !t.Failed() {
			args = append(args, "--purge")
		}
		if out, err := exec.Command(filepath.Join(scripts, "down.sh"), args...).CombinedOutput(); err != nil {
			t.Errorf("down.sh %s: %v\n%s", dir, err, out)
		}
	})
	cmd := exec.Command(filepath.Join(scripts, "up.sh"), "-d", dir, "--owner-pid", strconv.Itoa(os.Getpid()),
		"--wait", "600", "--control-plane-only", nodeName)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("up.sh --control-plane-only: %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(k, "#") {
			env[k] = v
		}
	}
	for _, k := range []string{"KUBECONFIG", "API_URL", "API_HOST", "CA_CERT", "NODE_CERT", "NODE_KEY",
		"KUBE_PROXY_CERT", "KUBE_PROXY_KEY", "POD_CIDR", "BRIDGE", "SERVICE_CIDR", "PAUSE_IMAGE"} {
		if env[k] == "" {
			t.Fatalf("up.sh's env has no %s:\n%s", k, b)
		}
	}
	return env
}

// addTap makes the guest's link: a tap on the control plane's bridge, removed in
// t's cleanup (a stale one from a killed run is replaced).
func addTap(t *testing.T, bridge string) {
	t.Helper()
	_ = exec.Command("ip", "link", "delete", tap).Run()
	for _, args := range [][]string{
		{"tuntap", "add", "dev", tap, "mode", "tap"},
		{"link", "set", tap, "master", bridge},
		{"link", "set", tap, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", tap).Run() })
}

// guestIP is the guest's address on the bridge's /24: .250, outside the host's pod range.
func guestIP(t *testing.T, podCIDR string) string {
	t.Helper()
	_, n, err := net.ParseCIDR(podCIDR)
	if err != nil {
		t.Fatal(err)
	}
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], 250).String()
}

// nodePayload writes the payload disk's contents: node-up.sh, node.env, the node's
// and kube-proxy's certificates, the binaries and the images.
func nodePayload(t *testing.T, repo string, env map[string]string, ip string) string {
	t.Helper()
	p := t.TempDir()
	for _, d := range []string{"bin", "pki", "images"} {
		if err := os.Mkdir(filepath.Join(p, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k8s := printDir(t, repo, "scripts/k8s-binaries.sh", "--print-bin-dir")
	cache := filepath.Dir(filepath.Dir(k8s))
	link := func(src, dst string) {
		t.Helper()
		if err := copyFile(src, filepath.Join(p, dst)); err != nil {
			t.Fatal(err)
		}
	}
	link(filepath.Join(repo, "scripts/nodev2/node-up.sh"), "node-up.sh")
	for _, b := range []string{"kubelet", "kube-proxy"} {
		link(filepath.Join(k8s, b), "bin/"+b)
	}
	rt, _ := filepath.Glob(filepath.Join(cache, "containerd-*", "bin"))
	runc, _ := filepath.Glob(filepath.Join(cache, "runc-*", "bin", "runc"))
	if len(rt) != 1 || len(runc) != 1 {
		t.Fatalf("containerd or runc not built in %s (scripts/realnode/build.sh): %v %v", cache, rt, runc)
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		link(filepath.Join(rt[0], b), "bin/"+b)
	}
	link(runc[0], "bin/runc")
	link(env["CA_CERT"], "pki/ca.crt")
	link(env["NODE_CERT"], "pki/node.crt")
	link(env["NODE_KEY"], "pki/node.key")
	link(env["KUBE_PROXY_CERT"], "pki/kube-proxy.crt")
	link(env["KUBE_PROXY_KEY"], "pki/kube-proxy.key")
	for _, img := range []string{"pause.tar", "busybox.tar"} {
		link(filepath.Join(cache, "realnode-images", img), "images/"+img)
	}
	for _, img := range []string{"koordlet-nogpu.tar", "scheduler-extender.tar", "admission.tar", "kube-scheduler.tar"} {
		src := filepath.Join(repo, "bin", "images", img)
		if _, err := os.Stat(src); err != nil {
			testenv.SkipOrFailInCI(t, "image %s not built (make e2e-deps): %v", img, err)
		}
		link(src, "images/"+img)
	}
	_, n, _ := net.ParseCIDR(env["POD_CIDR"])
	prefix, _ := n.Mask.Size()
	nodeEnv := fmt.Sprintf("API_URL=%s\nNODE_NAME=%s\nNODE_IP=%s\nNODE_PREFIX=%d\nGUEST_POD_CIDR=%s\nSERVICE_CIDR=%s\nPAUSE_IMAGE=%s\n",
		env["API_URL"], nodeName, ip, prefix, guestPodCIDR, env["SERVICE_CIDR"], env["PAUSE_IMAGE"])
	if err := os.WriteFile(filepath.Join(p, "node.env"), []byte(nodeEnv), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startCluster brings up the control plane here and the v2 node in the VM, and waits
// for the node to be Ready.
func startCluster(ctx context.Context, t *testing.T) *cluster {
	t.Helper()
	repo := repoRoot(t)
	img := imageDir(t, repo)
	env := startControlPlane(t, repo)
	addTap(t, env["BRIDGE"])
	ip := guestIP(t, env["POD_CIDR"])
	payload := nodePayload(t, repo, env, ip)
	start := time.Now()
	g, err := vm.Start(ctx, t, vm.Config{ImageDir: img, Payload: payload, MemoryMiB: 4096, Tap: tap, MAC: "52:54:00:75:76:32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest up in %v", time.Since(start).Round(time.Second))
	out := g.MustRun(ctx, t, "/opt/understory/node-up.sh 2>&1")
	t.Logf("node-up.sh (%v): %s", time.Since(start).Round(time.Second), strings.TrimSpace(out))
	cfg, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{repo: repo, env: env, client: client, guest: g}
	t.Cleanup(func() {
		if t.Failed() {
			// Bounded: a wedged guest must not hold the teardown.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, _ := g.Run(ctx, "journalctl --no-pager -u kubelet -u containerd | tail -n 30; systemctl list-units --failed --no-pager; "+
				"find /sys/fs/cgroup/kubepods.slice -maxdepth 3 -type d; grep . "+tierDir+"/cgroup.freeze "+tierDir+"/cgroup.events; tail -n 40 /var/log/pods/understory-system_understory-koordlet-*/*/*.log")
			t.Logf("guest journal:\n%s", r.Stdout)
		}
	})
	if !testenv.PollEvery(5*time.Minute, 2*time.Second, func() bool {
		n, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue
			}
		}
		return false
	}) {
		t.Fatalf("node %s not Ready within 5 min", nodeName)
	}
	t.Logf("node %s Ready after %v", nodeName, time.Since(start).Round(time.Second))
	return c
}

func printDir(t *testing.T, repo, script string, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repo, script), args...).Output()
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return strings.TrimSpace(string(out))
}

// copyFile hard-links src to dst, or copies it across filesystems.
func copyFile(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, fi.Mode().Perm())
}

// TestNodeV2 joins the cgroup v2 + systemd VM to a control plane on this host as a
// node the way production runs one (kubelet's systemd driver, containerd's
// SystemdCgroup, kubelet's defaults), installs Understory with the Helm chart, and
// checks what the agent does to the node's cgroups there: the tier exists with cpu.idle
// and a quota, a batch pod's container runs in a scope below it, `systemctl
// daemon-reload` and a kubelet restart (systemd re-applies the slice's own, empty,
// properties) leave it idle and bounded again, and so does a restart of the agent; last,
// an LS pod that fills the pods' memory past the agent's eviction threshold gets the
// batch pod evicted through the Eviction API.
func TestNodeV2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c := startCluster(ctx, t)
	c.helmInstall(ctx, t)
	c.waitAgent(ctx, t)
	before := c.tierState(ctx, t)
	t.Logf("tier %s: %+v", tierDir, before)
	if !before.bounded() {
		t.Fatalf("tier %+v: want cpu.idle 1, a quota and a memory limit (the agent bounds the tier from its start)", before)
	}
	pod := c.batchPod(ctx, t)
	t.Logf("batch pod %s running in a scope below the tier", pod.Name)
	c.lsLoadCutsTier(ctx, t)

	// systemd rewrites the attributes of every unit it knows on daemon-reload; the
	// tier's slice is one once runc started a scope below it.
	out := c.guest.MustRun(ctx, t, "systemctl daemon-reload && systemctl restart kubelet && systemctl show -p CPUWeight,CPUQuotaPerSecUSec,ControlGroup kubepods-understory_batch.slice")
	after := c.tierState(ctx, t)
	t.Logf("right after daemon-reload and a kubelet restart: %+v (systemd: %s)", after, strings.TrimSpace(out))
	var last tierState
	if !testenv.PollEvery(30*time.Second, time.Second, func() bool {
		last = c.tierState(ctx, t)
		return last.bounded()
	}) {
		t.Errorf("after daemon-reload and a kubelet restart the tier is %+v, want cpu.idle 1, a quota and a memory limit", last)
	}
	c.restartAgent(ctx, t)
	c.memoryPressureEvicts(ctx, t, pod)
}

// restartAgent deletes the agent's pod: while the DaemonSet's next one starts, the tier
// keeps the limit in force (a stopped agent leaves batch bounded, a starting one
// continues from what it finds), and the new agent keeps it idle and bounded.
func (c *cluster) restartAgent(ctx context.Context, t *testing.T) {
	t.Helper()
	pods, err := c.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("agent pods: %v (%d)", err, len(pods.Items))
	}
	old := pods.Items[0]
	if err := c.client.CoreV1().Pods(nsSystem).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []tierState
	ready := func() bool {
		pods, err := c.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].UID == old.UID {
			return false
		}
		for _, cond := range pods.Items[0].Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	}
	if !testenv.PollEvery(5*time.Minute, time.Second, func() bool {
		seen = append(seen, c.tierState(ctx, t))
		return ready()
	}) {
		t.Fatalf("no new agent pod ready within 5 min of deleting %s", old.Name)
	}
	for _, st := range seen {
		if st.cores() < 0 || st.mem == "max" {
			t.Errorf("while the agent restarted the tier was unlimited: %+v (all: %+v)", st, seen)
			break
		}
	}
	var last tierState
	if !testenv.PollEvery(30*time.Second, time.Second, func() bool {
		last = c.tierState(ctx, t)
		return last.bounded()
	}) {
		t.Errorf("after the agent's restart the tier is %+v, want cpu.idle 1, a quota and a memory limit", last)
	}
	t.Logf("agent restarted; the tier through the restart: %+v; after: %+v", seen, last)
}

// Throttling bounds, in cores, on the guest's 2 CPUs with LS burning both: the agent's
// budget is then its minBatchCPU (0.1), and batch may be frozen (the real-node values'
// freezeAfter 2s).
const (
	cutBound = 0.3
	// cutWithin is generous: the guest's CPUs are emulated, about 15x slower.
	cutWithin = 90 * time.Second
	// freezeWithin bounds the freeze, which follows LS harm sustained at batch's floor:
	// 34-36 s on an idle host, over 90 s with the host's two cores busy elsewhere too.
	freezeWithin = 3 * time.Minute
)

// lsLoadCutsTier runs an LS pod (Burstable) burning both CPUs and holding 500 MiB: the
// agent cuts the tier to cutBound cores, then freezes it, and lowers the tier's memory
// limit by what LS took; when the LS pod is gone the tier is thawed and its quota raised
// again.
func (c *cluster) lsLoadCutsTier(ctx context.Context, t *testing.T) {
	t.Helper()
	ns := "understory-e2e"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "web", Image: c.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
				// 500 MiB in a memory-backed volume (charged to the pod) and both CPUs.
				Command: []string{"sh", "-c", "head -c 500m /dev/zero > /mem/ballast; while :; do :; done & while :; do :; done"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "mem", MountPath: "/mem"}},
			}},
			Volumes: []corev1.Volume{{Name: "mem", VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(700<<20, resource.BinarySI)}}}},
		},
	}
	memBefore, err := strconv.ParseInt(c.tierState(ctx, t).mem, 10, 64)
	if err != nil {
		t.Fatalf("tier memory.max before LS: %v", err)
	}
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	if !testenv.PollEvery(5*time.Minute, 2*time.Second, func() bool {
		var err error
		pod, err = c.client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodRunning
	}) {
		t.Fatalf("LS pod not running within 5 min: %+v", pod.Status)
	}
	start := time.Now()
	var last tierState
	if !testenv.PollEvery(cutWithin, time.Second, func() bool {
		last = c.tierState(ctx, t)
		q := last.cores()
		return (q > 0 && q <= cutBound) || last.frozen == "1"
	}) {
		t.Fatalf("LS burning both CPUs, but the tier is %+v after %v: want a quota <= %.2f cores or frozen", last, cutWithin, cutBound)
	}
	t.Logf("LS loaded: the tier cut to %.3f cores (frozen %s) %v after the LS pod ran", last.cores(), last.frozen, time.Since(start).Round(time.Second))
	// LS leaves batch less than its floor: after freezeAfter the tier is frozen.
	if !testenv.PollEvery(freezeWithin, time.Second, func() bool {
		last = c.tierState(ctx, t)
		return last.frozen == "1"
	}) {
		t.Fatalf("LS burning both CPUs, but the tier is %+v after %v: want it frozen", last, freezeWithin)
	}
	t.Logf("LS loaded: the tier frozen %v after the LS pod ran", time.Since(start).Round(time.Second))
	// The tier's memory limit follows what LS uses: 500 MiB more of it lowers the limit
	// (326 MiB measured: the LS term is smoothed).
	const memDrop = 200 << 20
	var mem int64
	if !testenv.PollEvery(cutWithin, time.Second, func() bool {
		last = c.tierState(ctx, t)
		mem, err = strconv.ParseInt(last.mem, 10, 64)
		return err == nil && mem <= memBefore-memDrop
	}) {
		t.Fatalf("LS holds 500 MiB more, but the tier's memory.max is %s after %v (before: %d): want at most %d",
			last.mem, cutWithin, memBefore, memBefore-memDrop)
	}
	t.Logf("LS holds 500 MiB: the tier's memory.max %d -> %d bytes", memBefore, mem)
	if err := c.client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	if !testenv.PollEvery(cutWithin, time.Second, func() bool {
		last = c.tierState(ctx, t)
		return last.cores() > cutBound && last.frozen == "0"
	}) {
		t.Errorf("LS gone, but the tier is %+v after %v: want it thawed and raised above %.2f cores", last, cutWithin, cutBound)
	}
	t.Logf("LS gone: the tier thawed and raised to %.3f cores %v later", last.cores(), time.Since(gone).Round(time.Second))
}

// The memory eviction thresholds of the v2 node's agent, as fractions of the pods'
// memory (kubepods' limit): lower than the real-node values' 0.95/0.90 so that the
// eviction stage crosses them quickly on the 4 GiB guest (and far from the kernel's and
// kubelet's own memory pressure), and above what the LS stage's pod holds (~15 %).
const (
	evictThreshold = 0.3
	evictTarget    = 0.2
)

// memoryPressureEvicts fills the pods' memory past evictThreshold with an LS pod holding
// a memory-backed volume, as a service that grows would: the agent evicts the batch pod
// victim through the Eviction API (an Evicted event naming memory pressure, then the pod
// deleted) and leaves the LS pod running. The LS pod fills memory rather than a batch
// pod because the tier's CPU under emulation is a tenth of a core: a batch pod there
// takes minutes to write a gigabyte.
func (c *cluster) memoryPressureEvicts(ctx context.Context, t *testing.T, victim *corev1.Pod) {
	t.Helper()
	ns := victim.Namespace
	// What counts against the threshold is kubepods' working set (usage less inactive
	// page cache) against its limit, kubelet's allocatable.
	limit, ws := c.kubepodsMemory(ctx, t)
	if float64(ws) > 0.8*evictTarget*float64(limit) {
		t.Fatalf("the pods already use %d of %d bytes: too close to the eviction target %.2f for this stage", ws, limit, evictTarget)
	}
	// Past the threshold by a tenth of the limit.
	fillMiB := (int64((evictThreshold+0.1)*float64(limit)) - ws) >> 20
	t.Logf("pods' memory: %d MiB of %d MiB; an LS pod fills %d MiB more", ws>>20, limit>>20, fillMiB)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "grow", Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "grow", Image: c.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", fmt.Sprintf("dd if=/dev/zero of=/mem/ballast bs=1M count=%d; sleep 3600", fillMiB)},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity((fillMiB+200)<<20, resource.BinarySI)},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "mem", MountPath: "/mem"}},
			}},
			Volumes: []corev1.Volume{{Name: "mem", VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity((fillMiB+100)<<20, resource.BinarySI)}}}},
		},
	}
	created, err := c.client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var why string
	if !testenv.PollEvery(4*time.Minute, 2*time.Second, func() bool {
		evs, err := c.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + victim.Name})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "Evicted" && strings.Contains(e.Message, "evicted by Understory") {
				why = e.Message
				return true
			}
		}
		return false
	}) {
		limit, ws := c.kubepodsMemory(ctx, t)
		t.Fatalf("LS filled the pods' memory to %d of %d MiB, but batch pod %s was not evicted within 4 min", ws>>20, limit>>20, victim.Name)
	}
	t.Logf("batch pod %s evicted %v after the LS pod was created: %s", victim.Name, time.Since(start).Round(time.Second), why)
	if !strings.Contains(why, "memory-pressure") {
		t.Errorf("eviction reason %q, want memory-pressure", why)
	}
	if !testenv.PollEvery(2*time.Minute, time.Second, func() bool {
		got, err := c.client.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || err == nil && (got.UID != victim.UID || got.DeletionTimestamp != nil)
	}) {
		t.Errorf("pod %s has an Evicted event but is not being deleted", victim.Name)
	}
	// LS pods are never evicted.
	got, err := c.client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil || got.UID != created.UID || got.DeletionTimestamp != nil || got.Status.Phase != corev1.PodRunning {
		t.Errorf("LS pod %s did not stay running: %v %+v", p.Name, err, got)
	}
}

// kubepodsMemory returns kubepods' memory limit and working set (usage less inactive
// page cache) in bytes.
func (c *cluster) kubepodsMemory(ctx context.Context, t *testing.T) (limit, ws int64) {
	t.Helper()
	out := c.guest.MustRun(ctx, t, "cd /sys/fs/cgroup/kubepods.slice && cat memory.max memory.current && awk '$1==\"inactive_file\"{print $2}' memory.stat")
	f := strings.Fields(out)
	if len(f) != 3 {
		t.Fatalf("kubepods memory files: %q", out)
	}
	var v [3]int64
	for i := range f {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatalf("kubepods memory files %q: %v", out, err)
		}
		v[i] = n
	}
	return v[0], v[1] - v[2]
}

// tierState is what the agent sets on the tier.
type tierState struct{ idle, max, weight, mem, frozen string }

func (c *cluster) tierState(ctx context.Context, t *testing.T) tierState {
	t.Helper()
	out := c.guest.MustRun(ctx, t, fmt.Sprintf("cd %s && cat cpu.idle cpu.max cpu.weight memory.max cgroup.freeze", tierDir))
	f := strings.Split(strings.TrimSpace(out), "\n")
	if len(f) != 5 {
		t.Fatalf("tier files: %q", out)
	}
	return tierState{idle: f[0], max: f[1], weight: f[2], mem: f[3], frozen: f[4]}
}

// cores is the tier's CFS limit in cores (-1 unlimited).
func (st tierState) cores() float64 {
	f := strings.Fields(st.max)
	if len(f) != 2 || f[0] == "max" {
		return -1
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || p == 0 {
		return -1
	}
	return q / p
}

// bounded reports the agent's settings in force: idle, a quota and a memory limit.
func (st tierState) bounded() bool {
	return st.idle == "1" && st.cores() > 0 && st.mem != "" && st.mem != "max"
}

// helmInstall installs the chart with the real-node values, for kubelet's systemd
// driver and without the second scheduler (the host's kube-scheduler places pods).
func (c *cluster) helmInstall(ctx context.Context, t *testing.T) {
	t.Helper()
	helm := filepath.Join(printDir(t, c.repo, "scripts/helm.sh", "--print-bin-dir"), "helm")
	b, err := os.ReadFile(filepath.Join(c.repo, "charts/understory/ci/realnode-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Kubelet's systemd driver, and memory eviction from half the pods' memory down to
	// 40 %: the eviction stage fills the node that far with one batch pod.
	values := string(b)
	for _, r := range [][2]string{
		{"cgroupDriver: cgroupfs", "cgroupDriver: systemd"},
		{"memoryEvictThreshold: 0.95", fmt.Sprintf("memoryEvictThreshold: %v", evictThreshold)},
		{"memoryEvictTarget: 0.90", fmt.Sprintf("memoryEvictTarget: %v", evictTarget)},
		// Thaw once batch has its floor back with a small margin: the system's own pods
		// count as LS and, emulated, take most of the guest's CPU.
		{"freezeAfter: 2s", "freezeAfter: 2s\n      thawMarginCPU: 0.05"},
	} {
		v := strings.Replace(values, r[0], r[1], 1)
		if v == values {
			t.Fatalf("realnode-values.yaml no longer has %q in the agent's config", r[0])
		}
		values = v
	}
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(vf, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, helm, "--kubeconfig", c.env["KUBECONFIG"], "install", "understory",
		filepath.Join(c.repo, "charts/understory"), "-n", nsSystem, "--create-namespace", "-f", vf,
		"--set", "cgroupDriver=systemd", "--set", "secondScheduler.enabled=false")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
}

// waitAgent waits for the agent's DaemonSet pod on the node to be ready.
func (c *cluster) waitAgent(ctx context.Context, t *testing.T) {
	t.Helper()
	start := time.Now()
	var last, guest string
	var probed time.Time
	if !testenv.PollEvery(8*time.Minute, 2*time.Second, func() bool {
		// Whether the guest still answers, every 30 s, bounded.
		if time.Since(probed) > 30*time.Second {
			probed = time.Now()
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			r, err := c.guest.Run(pctx, "cat /proc/loadavg /proc/pressure/cpu /proc/pressure/memory")
			cancel()
			guest = fmt.Sprintf("guest at %v: %q %v", time.Since(start).Round(time.Second), r.Stdout, err)
		}
		pods, err := c.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
		if err != nil || len(pods.Items) == 0 {
			last = fmt.Sprint(err)
			return false
		}
		p := pods.Items[0]
		last = fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("agent pod not ready within 8 min: %s\nlast %s\n%s", last, guest, c.apiDiagnostics(ctx))
	}
	t.Logf("agent ready after %v", time.Since(start).Round(time.Second))
}

// apiDiagnostics is what the API server knows when the guest may not answer: the node's
// conditions and heartbeats, and the events of the system namespace (a readiness
// probe's failures carry the agent's /healthz answer).
func (c *cluster) apiDiagnostics(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	if n, err := c.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
		for _, cond := range n.Status.Conditions {
			fmt.Fprintf(&b, "node %s=%s (heartbeat %v): %s\n", cond.Type, cond.Status, cond.LastHeartbeatTime.Format(time.TimeOnly), cond.Message)
		}
	}
	if evs, err := c.client.CoreV1().Events(nsSystem).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event %s %s/%s x%d (last %v): %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Count,
				e.LastTimestamp.Format(time.TimeOnly), e.Message)
		}
	}
	return b.String()
}

// batchPod runs a busybox CPU burner annotated batch, which the webhook moves to batch
// resources and the agent's NRI plugin places below the tier.
func (c *cluster) batchPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	ns := "understory-e2e"
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crunch", Namespace: ns, Annotations: map[string]string{"understory.io/qos-class": "batch"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "crunch", Image: c.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "while :; do :; done"},
			}},
		},
	}
	created, err := c.client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	if !testenv.PollEvery(5*time.Minute, 2*time.Second, func() bool {
		last, err = c.client.CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
		return err == nil && last.Status.Phase == corev1.PodRunning
	}) {
		t.Fatalf("batch pod not running within 5 min: %+v", last.Status)
	}
	uid := strings.ReplaceAll(string(last.UID), "-", "_")
	slice := fmt.Sprintf("%s/kubepods-understory_batch-pod%s.slice", tierDir, uid)
	c.guest.MustRun(ctx, t, "ls -d "+slice+"/cri-containerd-*.scope")
	return last
}
