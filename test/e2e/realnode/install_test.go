package realnode

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/koordlet"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/dashboards"
)

// installHow says how to run TestInstall.
const installHow = "the install end-to-end test (Understory's images on a real kubelet + containerd + " +
	"kube-proxy node, ~6 min once everything is built); run: make e2e"

// workNS holds the test's workloads.
const workNS = "understory-e2e"

// lsDeployment is an LS service as a user writes it: plain requests and limits, no
// annotation (Burstable pods are LS). busybox's httpd answers the readiness probe; a
// file /tmp/load in the container makes it burn one CPU (the test creates and removes
// it from the host through /proc/<pid>/root, so it works while the API server is down).
const lsDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: understory-e2e}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: understory.local/busybox:realnode
          imagePullPolicy: Never
          command:
            - sh
            - -c
            - >-
              mkdir -p /tmp/www && echo ok > /tmp/www/index.html && httpd -p 8080 -h /tmp/www &&
              while :; do if [ -e /tmp/load ]; then while [ -e /tmp/load ]; do :; done; else sleep 0.2; fi; done
          ports: [{name: http, containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /, port: http}
            periodSeconds: 2
          resources:
            requests: {cpu: 200m, memory: 32Mi}
            limits: {cpu: "1", memory: 64Mi}
`

// batchJob is a batch job as a user writes it: ordinary requests and limits plus the
// opt-in annotation (manifests/examples/batch-job.yaml, sized for a 2-CPU node). The
// webhook moves them to understory.io/batch-cpu 500 and batch-memory 64Mi.
const batchJob = `apiVersion: batch/v1
kind: Job
metadata: {name: crunch, namespace: understory-e2e}
spec:
  backoffLimit: 6
  template:
    metadata:
      annotations: {understory.io/qos-class: batch}
    spec:
      restartPolicy: OnFailure
      terminationGracePeriodSeconds: 2
      containers:
        - name: crunch
          image: understory.local/busybox:realnode
          imagePullPolicy: Never
          command: [sh, -c, "timeout 1800 sh -c 'while :; do :; done'; exit 0"]
          resources:
            requests: {cpu: 250m, memory: 32Mi}
            limits: {cpu: 500m, memory: 64Mi}
`

// Throttling bounds, in cores, on a 2-CPU node with both LS replicas burning a CPU:
// the agent's budget is then its minBatchCPU (0.1), and batch may be frozen.
const (
	cutBound   = 0.3             // the tier's quota once LS is loaded
	cutWithin  = 5 * time.Second // LS load to that quota (or frozen)
	rateSlack  = 0.05            // CFS accounting over a window of seconds
	batchLimit = 0.5             // the Job's batch-cpu limit (its pod's own quota)
)

// install carries state between the ordered stages of TestInstall.
type install struct {
	ctx       context.Context
	repo      string
	version   string
	manifests string // the test's copy, with certificates (for the server dry runs)
	certs     string // the CA and the scheduler's client certificate, from Helm's Secret
	helmBin   string
	n         *node
	w         *writeWatch
	agentPod  *corev1.Pod
	agent     *agentClient
	ext       *extenderClient
	web       []*corev1.Pod
	crunch    *corev1.Pod
	loaded    bool
	// Prometheus (stage 3b to 9, dashboards_test.go): the server, its directory, the
	// window's start, the pods it scrapes and what went wrong following the agent.
	prom       *dashboards.Prometheus
	promDir    string
	promStart  time.Time
	scraped    *corev1.Pod   // the agent's pod scraped now
	extPods    []*corev1.Pod // the extender's pods scraped now (leader and standby)
	schedPods  []*corev1.Pod // the second scheduler's pods scraped now
	schedToken string        // the token file the second scheduler's scrape sends
	scrapeErrs []string
}

// TestInstall installs Understory on a real node the way a user does and checks what
// it does there; see doc.go for the stages and what each asserts.
func TestInstall(t *testing.T) {
	requireRealNode(t, installHow)
	repo := repoRoot(t)
	version, tars := builtImages(t, repo)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	in := &install{ctx: ctx, repo: repo, version: version}
	in.helmBin = controlplane.HelmBinary(t, repo)
	tars = append(tars, schedulerImage(t, repo))
	in.manifests = copyManifests(t, repo, version)
	in.certs = t.TempDir()
	t.Logf("images understory/*:%s, manifests copied to %s", version, in.manifests)
	in.n = startNode(t, repo, tars...)
	in.w = newWriteWatch(t)
	t.Cleanup(func() { in.logTierWrites(t) })
	t.Cleanup(func() {
		if in.loaded {
			in.setLSLoad(t, false)
		}
	})
	// Prometheus runs from stage 3b to the end: stopped before its directory is removed
	// and before the node goes down (cleanups run last-registered first).
	in.promDir = t.TempDir()
	t.Cleanup(func() {
		if in.prom != nil {
			in.prom.Stop()
		}
	})

	// Stages marked base set up what the later ones check: when one fails, the
	// test stops. The others leave a running batch pod behind even when they fail.
	stages := []struct {
		name string
		run  func(*testing.T)
		base bool
	}{
		{"1-helm-install-and-server-dry-run", in.helmInstall, true},
		{"2-agent-runs-as-daemonset-pod", in.agentRuns, true},
		{"3-second-scheduler-and-extender", in.secondSchedulerRuns, true},
		// From here to the end Prometheus scrapes the agent and the extender, so that
		// stage 9 sees the whole run: the workloads placed, the throttling, both
		// restarts and the outage.
		{"3b-prometheus-scrapes-agent-and-extender", in.scrape, false},
		{"4-workloads-mutated-placed-running", in.workloads, true},
		{"4b-kubectl-understory-node-and-why", in.pluginNode, false},
		{"5-batch-throttled-while-ls-loaded", in.throttle, false},
		{"5b-batch-condition-and-why", in.batchCondition, false},
		{"6-kubelet-restarts-cleanly", in.kubeletRestart, false},
		{"7-agent-pod-deleted", in.agentPodDeleted, false},
		{"8-api-server-down-30s", in.apiServerDown, false},
		{"9-dashboards-have-data", in.dashboardsHaveData, false},
	}
	for _, s := range stages {
		ok := t.Run(s.name, s.run)
		// Stage 7 replaces the agent's pod, and its IP with it; a replaced extender pod
		// gets a new IP too.
		in.followPods(t)
		if !ok && s.base {
			t.Fatalf("stage %s failed; the later stages build on it", s.name)
		}
	}
}

// capBits are the capability numbers of <linux/capability.h> the manifests may add.
var capBits = map[corev1.Capability]uint{"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3,
	"KILL": 5, "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_RESOURCE": 24, "PERFMON": 38, "BPF": 39}

// agentRuns: the agent runs as the DaemonSet's pod, with the image `make images`
// built and the privileges its manifest gives (no more: the capabilities of its
// process, its own PID namespace); it sees the node's pods, creates the tier and
// publishes batch-cpu and batch-memory on its Node.
func (in *install) agentRuns(t *testing.T) {
	ctx, n := in.ctx, in.n
	p := n.readyPod(ctx, t, nsSystem, agentLabel, "", 2*time.Minute)
	in.agentPod, in.agent = p, newAgentClient(p.Status.PodIP)
	c := p.Spec.Containers[0]
	if p.Spec.NodeName != n.env["NODE_NAME"] || c.Image != "understory/koordlet-nogpu:"+in.version {
		t.Errorf("agent pod on %q with image %q, want node %s, image understory/koordlet-nogpu:%s",
			p.Spec.NodeName, c.Image, n.env["NODE_NAME"], in.version)
	}
	if cs := p.Status.ContainerStatuses; len(cs) == 0 || cs[0].Image != "docker.io/understory/koordlet-nogpu:"+in.version {
		t.Errorf("agent container status %+v: want the imported image docker.io/understory/koordlet-nogpu:%s", cs, in.version)
	}
	pid, err := hostPID(containerID(p))
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(0)
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("agent container securityContext %+v: want privileged false and capabilities", sc)
	}
	for _, a := range sc.Capabilities.Add {
		bit, ok := capBits[a]
		if !ok {
			t.Fatalf("agent adds capability %s, unknown to this test", a)
		}
		want |= 1 << bit
	}
	capEff, err := procStatusField(pid, "CapEff")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%016x", want); capEff != got {
		t.Errorf("agent process %d: CapEff %s, want %s (only %v)", pid, capEff, got, sc.Capabilities.Add)
	}
	own, _ := os.Readlink("/proc/self/ns/pid")
	its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil || its == own {
		t.Errorf("agent process %d: PID namespace %q (%v), want its own, not the host's %q (no hostPID)", pid, its, err, own)
	}
	t.Logf("agent pod %s (%s) on %s: host PID %d, CapEff %s %v, PID namespace %s", p.Name, p.Status.PodIP,
		p.Spec.NodeName, pid, capEff, sc.Capabilities.Add, its)

	// /status: the install's own pods, classified, in kubelet's cgroups; the tier.
	sys, err := n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st koordlet.Status
	var mismatch string
	err = poll(ctx, 30*time.Second, func() (bool, error) {
		if st, err = in.agent.status(ctx); err != nil {
			mismatch = err.Error()
			return false, nil
		}
		mismatch = ""
		for _, sp := range sys.Items {
			if sp.Status.Phase != corev1.PodRunning {
				continue
			}
			e, class, ok := podEntry(st, sp.Name)
			want := "kubepods/burstable/pod" + string(sp.UID)
			if !ok || class != qos.ClassLS.String() || e.Cgroup != want {
				mismatch += fmt.Sprintf("%s: class %q cgroup %q, want LS %s; ", sp.Name, class, e.Cgroup, want)
			}
		}
		if st.Tier.Cgroup != tierCgroup || st.Tier.QuotaCores == nil || !st.PodSource.Synced {
			mismatch += fmt.Sprintf("tier %+v, pod source %+v; ", st.Tier, st.PodSource)
		}
		return mismatch == "", nil
	})
	if err != nil {
		t.Errorf("agent /status: %s", mismatch)
	}
	tier, err := readCPUSettings(tierCgroup)
	if err != nil || tier.Idle != "1" || tier.Quota == "-1" {
		t.Errorf("tier %s: %v (%v), want cpu.idle=1 and a quota", tierCgroup, tier, err)
	}
	if err := in.w.add(tierCgroup); err != nil {
		t.Fatal(err)
	}

	// The Node: batch resources in status, node-metrics annotation.
	var alloc corev1.ResourceList
	var nm contract.NodeMetrics
	err = poll(ctx, 60*time.Second, func() (bool, error) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.env["NODE_NAME"], metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		alloc = node.Status.Allocatable
		raw := node.Annotations[contract.AnnotationNodeMetrics]
		var derr error
		if nm, derr = contract.DecodeNodeMetrics(raw); raw == "" || derr != nil {
			return false, nil
		}
		_, okCPU := alloc[contract.ResourceBatchCPU]
		mem, okMem := alloc[contract.ResourceBatchMemory]
		return okCPU && okMem && mem.Value() > 0, nil
	})
	if err != nil {
		t.Fatalf("Node %s: allocatable %v, node-metrics %+v: want understory.io/batch-cpu, batch-memory > 0 and the "+
			"annotation (%v)", n.env["NODE_NAME"], alloc, nm, err)
	}
	bc, bm := alloc[contract.ResourceBatchCPU], alloc[contract.ResourceBatchMemory]
	t.Logf("Node allocatable batch-cpu %s, batch-memory %s; node-metrics %+v", bc.String(), bm.String(), nm)
	t.Logf("agent: tier %s quota %s cores; budget %.3f (%s); usage node %.2f LS %.2f system %.2f",
		st.Tier.Cgroup, deref(st.Tier.QuotaCores), st.Budget.Applied, st.Budget.Reason, st.Usage.Node, st.Usage.LS,
		st.Usage.System)
}

// waitWebhook waits until the admission webhook answers: it fails open, so a pod
// created before it does is not mutated (a server dry run of a batch pod runs it).
func (in *install) waitWebhook(t *testing.T) {
	t.Helper()
	ctx, n := in.ctx, in.n
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Namespace: workNS,
		Annotations: map[string]string{contract.AnnotationQOSClass: "batch"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: n.env["BUSYBOX_IMAGE"],
			Resources: corev1.ResourceRequirements{Requests: cpuMem("100m", "16Mi")}}}}}
	err := poll(ctx, 90*time.Second, func() (bool, error) {
		got, err := n.client.CoreV1().Pods(workNS).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil
		}
		_, moved := got.Spec.Containers[0].Resources.Requests[contract.ResourceBatchCPU]
		return moved, nil
	})
	if err != nil {
		t.Fatalf("the admission webhook never mutated a batch pod (server dry run): %v", err)
	}
}

// workloads: the LS Deployment is left as written and placed by kube-scheduler; the
// batch Job's pod is mutated by the webhook, filtered and bound by the extender, runs
// below the tier (NRI), and the agent classifies both.
func (in *install) workloads(t *testing.T) {
	ctx, n := in.ctx, in.n
	if _, err := n.kubectl(ctx, "create", "namespace", workNS); err != nil {
		t.Fatal(err)
	}
	in.waitWebhook(t)
	bound0, err := in.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	if err != nil {
		t.Fatal(err)
	}
	filter0, _ := in.ext.counter(ctx, "understory_extender_requests_total", map[string]string{"verb": "filter", "code": "200"})
	for name, doc := range map[string]string{"ls-deployment.yaml": lsDeployment, "batch-job.yaml": batchJob} {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := n.kubectl(ctx, "apply", "-f", p); err != nil {
			t.Fatal(err)
		}
	}

	// LS: untouched by the webhook (no annotation, not a profile namespace), Burstable.
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		l, err := n.client.CoreV1().Pods(workNS).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		in.web = in.web[:0]
		for i := range l.Items {
			if p := &l.Items[i]; p.Status.Phase == corev1.PodRunning && podReady(p) {
				in.web = append(in.web, p)
			}
		}
		return len(in.web) == 2, nil
	})
	if err != nil {
		t.Fatalf("LS Deployment web: %d of 2 pods ready: %v", len(in.web), err)
	}
	for _, p := range in.web {
		r := p.Spec.Containers[0].Resources
		cpuReq, cpuLim := r.Requests[corev1.ResourceCPU], r.Limits[corev1.ResourceCPU]
		if cpuReq.String() != "200m" || cpuLim.String() != "1" || p.Annotations[contract.AnnotationOriginalResources] != "" ||
			p.Status.QOSClass != corev1.PodQOSBurstable || p.Spec.NodeName != n.env["NODE_NAME"] {
			t.Errorf("LS pod %s: resources %+v, annotations %v, QoS %s, node %q: want it as written, Burstable, on %s",
				p.Name, r, p.Annotations, p.Status.QOSClass, p.Spec.NodeName, n.env["NODE_NAME"])
		}
	}
	for _, p := range in.web {
		if got := in.scheduledBy(t, workNS, p.Name); p.Spec.SchedulerName != defaultScheduler ||
			!slices.Equal(got, []string{defaultScheduler}) {
			t.Errorf("LS pod %s: schedulerName %q, Scheduled by %v: want %s for both (the webhook leaves LS pods "+
				"to the cluster's scheduler)", p.Name, p.Spec.SchedulerName, got, defaultScheduler)
		}
	}
	t.Logf("LS pods %s, %s: as written (cpu 200m/1, Burstable), placed by the node's %s", in.web[0].Name,
		in.web[1].Name, defaultScheduler)

	// Batch: wait for the Job's pod to run. It needs batch-cpu 500 on the Node: on a
	// busy machine the agent publishes less, and the pod waits (as it should).
	err = poll(ctx, 5*time.Minute, func() (bool, error) {
		l, err := n.client.CoreV1().Pods(workNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=crunch"})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		in.crunch = &l.Items[0]
		cs := in.crunch.Status.ContainerStatuses
		return in.crunch.Status.Phase == corev1.PodRunning && len(cs) == 1 && cs[0].State.Running != nil, nil
	})
	if err != nil {
		node, _ := n.client.CoreV1().Nodes().Get(ctx, n.env["NODE_NAME"], metav1.GetOptions{})
		st, _ := in.agent.status(ctx)
		var alloc any
		if node != nil {
			alloc = node.Status.Allocatable
		}
		t.Fatalf("batch Job crunch: pod not running (%v): %+v; Node allocatable %v; agent batch resources %+v",
			err, statusOf(in.crunch), alloc, st.BatchResources.CPU)
	}
	p := in.crunch
	r := p.Spec.Containers[0].Resources
	bcpu, bmem := r.Limits[contract.ResourceBatchCPU], r.Limits[contract.ResourceBatchMemory]
	_, hasCPU := r.Requests[corev1.ResourceCPU]
	_, hasMem := r.Limits[corev1.ResourceMemory]
	if bcpu.Cmp(resource.MustParse("500")) != 0 || bmem.Cmp(resource.MustParse("64Mi")) != 0 || hasCPU || hasMem ||
		p.Annotations[contract.AnnotationOriginalResources] == "" || p.Status.QOSClass != corev1.PodQOSBestEffort {
		t.Errorf("batch pod %s: resources %+v, annotations %v, QoS %s: want batch-cpu 500 and batch-memory 64Mi "+
			"(request = limit), no cpu/memory, the originals annotated, BestEffort", p.Name, r, p.Annotations, p.Status.QOSClass)
	}
	bound, err := in.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	if err != nil {
		t.Fatal(err)
	}
	filter, _ := in.ext.counter(ctx, "understory_extender_requests_total", map[string]string{"verb": "filter", "code": "200"})
	if bound < bound0+1 || filter < filter0+1 {
		t.Errorf("extender: binds bound %v -> %v, filter requests %v -> %v: want the batch pod filtered and bound "+
			"by the extender", bound0, bound, filter0, filter)
	}
	if got := in.scheduledBy(t, workNS, p.Name); p.Spec.SchedulerName != secondScheduler ||
		!slices.Equal(got, []string{secondScheduler}) {
		t.Errorf("batch pod %s: schedulerName %q, Scheduled by %v: want %s for both (the webhook's "+
			"second-scheduler mode)", p.Name, p.Spec.SchedulerName, got, secondScheduler)
	}
	t.Logf("batch pod %s: mutated to batch-cpu %s, batch-memory %s (BestEffort) and schedulerName %s; the "+
		"extender filtered (%v) and bound (%v) it for the second scheduler", p.Name, bcpu.String(), bmem.String(),
		secondScheduler, filter-filter0, bound-bound0)
	tierPod := in.batchRel()
	cid := containerID(p)
	procs, err := processesOf(cid)
	if err != nil || len(procs) == 0 {
		t.Fatalf("no process of the batch container %s: %v", cid, err)
	}
	for pid, cg := range procs {
		if cg["cpu"] != "/"+tierPod+"/"+cid {
			t.Errorf("batch process %d in cpu cgroup %s, want /%s/%s (placed below the tier by the agent's NRI plugin)",
				pid, cg["cpu"], tierPod, cid)
		}
	}
	var mismatch string
	err = poll(ctx, 20*time.Second, func() (bool, error) {
		st, err := in.agent.status(ctx)
		if err != nil {
			return false, nil
		}
		mismatch = ""
		if e, class, _ := podEntry(st, p.Name); class != qos.ClassBatch.String() || e.Placement != "tier" || e.Cgroup != tierPod {
			mismatch += fmt.Sprintf("%s: class %q %+v; ", p.Name, class, e)
		}
		for _, w := range in.web {
			if e, class, _ := podEntry(st, w.Name); class != qos.ClassLS.String() || e.Cgroup != in.webRel(w) {
				mismatch += fmt.Sprintf("%s: class %q %+v; ", w.Name, class, e)
			}
		}
		return mismatch == "", nil
	})
	if err != nil {
		t.Errorf("agent /status does not classify the workloads: %s", mismatch)
	}
}

func (in *install) batchRel() string { return tierCgroup + "/pod" + string(in.crunch.UID) }

func (in *install) webRel(p *corev1.Pod) string { return "kubepods/burstable/pod" + string(p.UID) }

// setLSLoad starts or stops the LS pods' CPU burners: /tmp/load in their containers,
// written from the host (no API server needed).
func (in *install) setLSLoad(t *testing.T, on bool) {
	t.Helper()
	for _, p := range in.web {
		pid, err := hostPID(containerID(p))
		if err != nil {
			t.Fatalf("LS pod %s: %v", p.Name, err)
		}
		f := fmt.Sprintf("/proc/%d/root/tmp/load", pid)
		if on {
			err = os.WriteFile(f, nil, 0o644)
		} else if err = os.Remove(f); os.IsNotExist(err) {
			err = nil
		}
		if err != nil {
			t.Fatalf("LS load %v in %s: %v", on, p.Name, err)
		}
	}
	in.loaded = on
}

// cut waits until the tier is held to cutBound cores (or frozen) and returns how long
// that took from since.
func (in *install) cut(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	var q float64
	err := poll(in.ctx, cutWithin, func() (bool, error) {
		var err error
		q, err = quotaCores(tierCgroup)
		return err == nil && ((q >= 0 && q <= cutBound) || frozen(tierCgroup) || frozen(in.batchRel())), nil
	})
	if err != nil {
		t.Fatalf("LS loaded, but the tier's quota is %.3f cores after %v, not <= %.2f nor frozen", q, cutWithin, cutBound)
	}
	return time.Since(since)
}

// bounded samples the tier every 100 ms for d while LS is loaded and checks that
// batch stays within the tier's quota: it returns the largest quota seen, whether
// batch was frozen, and the cores batch and LS used.
func (in *install) bounded(t *testing.T, d time.Duration, what string) (maxQ float64, wasFrozen bool, batch, ls float64) {
	t.Helper()
	rels := []string{in.batchRel()}
	for _, w := range in.web {
		rels = append(rels, in.webRel(w))
	}
	m, err := newUsageMeter(rels...)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		q, err := quotaCores(tierCgroup)
		if err != nil {
			t.Fatal(err)
		}
		if q < 0 {
			t.Fatalf("%s: the tier is unlimited (cpu.cfs_quota_us -1)", what)
		}
		maxQ = math.Max(maxQ, q)
		wasFrozen = wasFrozen || frozen(tierCgroup) || frozen(in.batchRel())
	}
	r, err := m.rates()
	if err != nil {
		t.Fatal(err)
	}
	batch = r[in.batchRel()]
	for _, w := range in.web {
		ls += r[in.webRel(w)]
	}
	burst, _ := cpuFile(tierCgroup, "cpu.cfs_burst_us")
	if maxQ > cutBound && !wasFrozen {
		t.Errorf("%s: the tier's quota reached %.3f cores, want <= %.2f (or frozen)", what, maxQ, cutBound)
	}
	if limit := math.Max(maxQ, qos.DefaultMinBatchCPU) + rateSlack; batch > limit {
		t.Errorf("%s: batch used %.3f cores over %v, above the tier's quota (%.3f, cpu.cfs_burst_us %s) + %.2f",
			what, batch, d, maxQ, burst, rateSlack)
	}
	return maxQ, wasFrozen, batch, ls
}

// throttle: with both LS pods burning a CPU the agent cuts the tier within
// cutWithin, batch stays within it while LS runs, and the tier follows the
// agent's budget again once LS stops.
func (in *install) throttle(t *testing.T) {
	m, err := newUsageMeter(in.batchRel())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the window batch's idle-LS rate is measured over
	r, err := m.rates()
	if err != nil {
		t.Fatal(err)
	}
	q0, _ := quotaCores(tierCgroup)
	t.Logf("LS idle: batch uses %.3f cores (its own limit %.1f), tier quota %.3f cores", r[in.batchRel()], batchLimit, q0)

	in.w.setPhase("5: LS loaded")
	start := time.Now()
	in.setLSLoad(t, true)
	took := in.cut(t, start)
	maxQ, fr, batch, ls := in.bounded(t, 8*time.Second, "LS loaded")
	t.Logf("LS loaded: tier cut to <= %.2f cores (or frozen) %v after the load began; over 8 s the tier's quota "+
		"was at most %.3f cores, frozen %v; batch used %.3f cores, LS %.3f", cutBound, took.Round(10*time.Millisecond),
		maxQ, fr, batch, ls)

	in.w.setPhase("5: LS idle again")
	in.setLSLoad(t, false)
	var st koordlet.Status
	var q float64
	err = poll(in.ctx, 45*time.Second, func() (bool, error) {
		if st, err = in.agent.status(in.ctx); err != nil {
			return false, nil
		}
		q, _ = quotaCores(tierCgroup)
		raised := q > cutBound || st.Budget.Raw < cutBound+0.1 // a busy machine leaves batch little
		return !frozen(tierCgroup) && !frozen(in.batchRel()) && raised, nil
	})
	if err != nil {
		t.Errorf("LS idle again: tier quota %.3f cores, frozen %v, agent budget %+v after 45 s: want batch thawed "+
			"and the tier raised above %.2f cores", q, frozen(tierCgroup) || frozen(in.batchRel()), st.Budget, cutBound)
	} else {
		t.Logf("LS idle again: batch thawed, tier quota %.3f cores (agent: raw budget %.3f, system %.3f cores)", q,
			st.Budget.Raw, st.Budget.SystemUsage)
	}
}

// podState is what must not change across a kubelet restart.
type podState struct {
	cid      string
	restarts int32
}

func (in *install) podStates(t *testing.T) map[string]podState {
	t.Helper()
	out := map[string]podState{}
	for _, ns := range []string{nsSystem, workNS} {
		l, err := in.n.client.CoreV1().Pods(ns).List(in.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.Items {
			p := &l.Items[i]
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				out[ns+"/"+p.Name] = podState{cid: containerID(p), restarts: restarts(p)}
			}
		}
	}
	return out
}

// kubeletRestart: after the agent has run (tier idle with its settings, a batch
// container below it), kubelet restarts, is healthy and Ready, and leaves every pod
// as it was: same containers, no restarts, batch still below the tier.
func (in *install) kubeletRestart(t *testing.T) {
	if node, err := in.n.client.CoreV1().Nodes().Get(in.ctx, in.n.env["NODE_NAME"], metav1.GetOptions{}); err == nil {
		bc := node.Status.Allocatable[contract.ResourceBatchCPU]
		t.Logf("before the kubelet restart: Node allocatable batch-cpu %s; the running batch pod requests 500",
			bc.String())
	}
	defer in.ensureBatchRunning(t)
	before := in.podStates(t)
	off := in.n.kubeletLogSize()
	in.w.setPhase("6: kubelet restart")
	start := time.Now()
	if _, err := in.n.kubelet("restart"); err != nil {
		t.Fatalf("kubelet restart after the agent ran: %v", err)
	}
	took := time.Since(start)
	err := poll(in.ctx, 60*time.Second, func() (bool, error) {
		node, err := in.n.client.CoreV1().Nodes().Get(in.ctx, in.n.env["NODE_NAME"], metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				// Heartbeats are stored with second precision: a status this kubelet
				// posted in the second the restart began reads as before start.
				return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(start.Truncate(time.Second)), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("node not Ready after the kubelet restart: %v", err)
	}
	// A deliberate "nothing happens" window: a pod the restarted kubelet disturbs shows
	// in its state (restart count, container ID) after it.
	time.Sleep(10 * time.Second)
	after := in.podStates(t)
	same := 0
	for k, b := range before {
		if a, ok := after[k]; !ok || a != b {
			t.Errorf("pod %s changed across the kubelet restart: %+v -> %+v (present %v)", k, b, a, ok)
		} else {
			same++
		}
	}
	// kubelet admits every pod again when it starts, against the Node's allocatable
	// as it is then: a batch pod whose understory.io/batch-cpu the agent no longer
	// publishes (it lowered it while LS was loaded) is rejected and killed.
	if lines := in.n.kubeletLogSince(off, "Pod admission denied"); len(lines) > 0 {
		t.Errorf("kubelet rejected running pods when it restarted (a Node's batch resources below what its "+
			"running batch pods request make kubelet's re-admission kill them):\n%s", strings.Join(tail(lines, 8), "\n"))
	}
	cid := containerID(in.crunch)
	if procs, err := processesOf(cid); err != nil || len(procs) == 0 {
		t.Errorf("batch container %s has no process after the kubelet restart (%v)", cid, err)
	} else {
		for pid, cg := range procs {
			if want := "/" + in.batchRel() + "/" + cid; cg["cpu"] != want {
				t.Errorf("batch process %d in %s after the kubelet restart, want %s", pid, cg["cpu"], want)
			}
		}
	}
	if s, err := readCPUSettings(tierCgroup); err != nil || s.Idle != "1" || s.Quota == "-1" {
		t.Errorf("tier after the kubelet restart: %v (%v), want cpu.idle=1 and a quota", s, err)
	}
	if lines := tierLines(in.n.kubeletLogSince(off, "understory-batch")); len(lines) > 0 {
		t.Errorf("kubelet logged about the tier:\n%s", strings.Join(tail(lines, 8), "\n"))
	}
	if !in.agent.healthy(in.ctx) {
		t.Errorf("agent unhealthy after the kubelet restart")
	}
	t.Logf("kubelet restarted (healthy and Ready) in %v; %d of %d pods unchanged", took.Round(time.Millisecond),
		same, len(before))
}

// driftQuota is the tier quota (cores) the test writes while no agent runs, three
// times the budget the agent keeps with LS loaded: the new agent must put it back.
const driftQuota = 0.3

// agentPodDeleted: with LS loaded (the budget at its minimum), the agent's pod is
// deleted. Until the DaemonSet's new pod runs, batch stays bounded: the tier keeps a
// quota (the old agent's shutdown budget) and SCHED_IDLE. While no agent runs the test
// moves the tier's quota to driftQuota; the new agent adopts the tier and the pods and
// puts the quota back to its budget within one control period of its first healthy
// answer, and its /status shows every pod as before.
func (in *install) agentPodDeleted(t *testing.T) {
	ctx, n := in.ctx, in.n
	in.w.setPhase("7: LS loaded")
	start := time.Now()
	in.setLSLoad(t, true)
	in.cut(t, start)
	old := in.agentPod
	oldPID, err := hostPID(containerID(old))
	if err != nil {
		t.Fatal(err)
	}
	period, err := quotaPeriod(tierCgroup)
	if err != nil {
		t.Fatal(err)
	}
	// kubelet removes a deleted pod's log; an open descriptor keeps it readable, so the
	// old agent's last second (its shutdown) can be shown when this stage fails.
	oldLog := openPodLog(t, in.n, old, "koordlet")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the old agent's log (last 60 lines):\n%s", tailLines(oldLog, 60))
		}
	})
	in.w.setPhase("7: agent pod deleted")
	del := time.Now()
	if err := n.client.CoreV1().Pods(nsSystem).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var (
		oldGone, drifted, newStart, ready time.Time
		newPod                            *corev1.Pod
		newAgent                          *agentClient
		maxQ                              float64
		badIdle                           string
	)
	m, err := newUsageMeter(in.batchRel())
	if err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		q, err := quotaCores(tierCgroup)
		if err != nil {
			return false, err
		}
		if q < 0 {
			return false, fmt.Errorf("the tier became unlimited %v after the agent's pod was deleted", time.Since(del))
		}
		if drifted.IsZero() || !newStart.IsZero() {
			maxQ = math.Max(maxQ, q) // the drift itself is the test's
		}
		if s, _ := cpuFile(tierCgroup, "cpu.idle"); s != "1" && badIdle == "" {
			badIdle = fmt.Sprintf("tier cpu.idle %q at +%v", s, time.Since(del).Round(time.Millisecond))
		}
		if oldGone.IsZero() && !pidAlive(oldPID) {
			oldGone = time.Now()
			t.Logf("old agent gone %v after the delete: the tier's quota is %.3f cores", since(oldGone, del), q)
			in.w.setPhase("7: no agent, drift")
			if err := writeQuota(tierCgroup, driftQuota, period); err != nil {
				return false, err
			}
			drifted = time.Now()
		}
		if newPod == nil {
			l, err := n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
			if err == nil {
				for i := range l.Items {
					if p := &l.Items[i]; p.UID != old.UID && p.Status.PodIP != "" && containerID(p) != "" {
						newPod = p
					}
				}
			}
		}
		if newPod != nil && newStart.IsZero() {
			if pid, err := hostPID(containerID(newPod)); err == nil {
				newStart, _ = processStart(pid)
				in.w.setPhase("7: new agent")
			}
		}
		if newPod != nil && newAgent == nil {
			newAgent = newAgentClient(newPod.Status.PodIP)
		}
		if newAgent != nil && ready.IsZero() && newAgent.healthy(ctx) {
			ready = time.Now()
		}
		return !ready.IsZero() && !newStart.IsZero(), nil
	})
	if err != nil {
		t.Fatalf("agent pod deleted: %v (old process gone %v, new pod %v, started %v, healthy %v)", err,
			!oldGone.IsZero(), newPod != nil, !newStart.IsZero(), !ready.IsZero())
	}
	r, err := m.rates()
	if err != nil {
		t.Fatal(err)
	}
	if badIdle != "" {
		t.Errorf("batch lost SCHED_IDLE while the agent was replaced: %s", badIdle)
	}
	if maxQ > cutBound {
		t.Errorf("the tier's quota reached %.3f cores while the agent was replaced (LS loaded), want <= %.2f", maxQ, cutBound)
	}
	if limit := math.Max(maxQ, driftQuota) + rateSlack; r[in.batchRel()] > limit {
		t.Errorf("batch used %.3f cores while the agent was replaced, above %.3f", r[in.batchRel()], limit)
	}
	t.Logf("agent pod deleted: old agent gone after %s, new one started after %s and healthy after %s; the "+
		"tier's quota stayed <= %.3f cores (but for the test's drift to %.2f) and batch used %.3f cores",
		since(oldGone, del), since(newStart, del), since(ready, del), maxQ, driftQuota, r[in.batchRel()])

	// Reconciled: the tier's quota back to the new agent's budget, and its /status.
	var st koordlet.Status
	var q float64
	var mismatch string
	err = poll(ctx, 10*time.Second, func() (bool, error) {
		if st, err = newAgent.status(ctx); err != nil {
			mismatch = err.Error()
			return false, nil
		}
		q, _ = quotaCores(tierCgroup)
		mismatch = ""
		if st.Tier.QuotaCores == nil || math.Abs(*st.Tier.QuotaCores-q) > 0.002 || q > cutBound {
			mismatch += fmt.Sprintf("tier quota %.3f cores, /status %s; ", q, deref(st.Tier.QuotaCores))
		}
		if e, class, _ := podEntry(st, in.crunch.Name); class != qos.ClassBatch.String() || e.Placement != "tier" {
			mismatch += fmt.Sprintf("%s: %q %+v; ", in.crunch.Name, class, e)
		}
		for _, w := range in.web {
			if _, class, _ := podEntry(st, w.Name); class != qos.ClassLS.String() {
				mismatch += fmt.Sprintf("%s: %q; ", w.Name, class)
			}
		}
		return mismatch == "", nil
	})
	done := time.Now()
	if err != nil {
		t.Errorf("the new agent did not reconcile: %s", mismatch)
	}
	// The quota write that undid the drift.
	var fixed time.Time
	for _, e := range in.w.snapshot(tierCgroup + "/cpu.cfs_quota_us") {
		if at := in.w.start.Add(e.At); at.After(drifted) && e.Value != strconvQuota(driftQuota, period) {
			fixed = at
			break
		}
	}
	agentPeriod := config.DefaultPeriod
	switch {
	case drifted.After(newStart):
		t.Logf("the drift landed %v after the new agent started: only its consistency is checked",
			drifted.Sub(newStart).Round(10*time.Millisecond))
	case fixed.IsZero():
		t.Errorf("the new agent never rewrote the tier's quota the test moved to %.2f cores (now %.3f)", driftQuota, q)
	default:
		late := fixed.Sub(ready)
		t.Logf("new agent: tier quota put back to %.3f cores %v after its process started, %v after its first "+
			"healthy answer (period %v); /status consistent %v after it", q, fixed.Sub(newStart).Round(time.Millisecond),
			late.Round(time.Millisecond), agentPeriod, done.Sub(ready).Round(time.Millisecond))
		// Healthy means its control loop runs; the probe polls every 200 ms.
		if late > agentPeriod+200*time.Millisecond {
			t.Errorf("the new agent put the tier's quota back %v after it was healthy, want within one period (%v, "+
				"+200 ms of polling)", late, agentPeriod)
		}
	}
	in.agentPod, in.agent = n.readyPod(ctx, t, nsSystem, agentLabel, old.Name, time.Minute), newAgent
	in.w.setPhase("7: LS idle")
	in.setLSLoad(t, false)
}

// tierRE matches the tier's path, not another tree's kubepods/understory-batch (a
// demo on the same machine: /understory-demo-N/kubepods/understory-batch).
var tierRE = regexp.MustCompile(`(^|[^/\w.-])/?` + regexp.QuoteMeta(tierCgroup) + `($|[^\w.-])`)

func tierLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if tierRE.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// ensureBatchRunning makes sure a pod of the Job crunch runs below the tier (the one
// seen so far, or the replacement the Job made after a failure) for the later stages.
func (in *install) ensureBatchRunning(t *testing.T) {
	t.Helper()
	var cur *corev1.Pod
	err := poll(in.ctx, 4*time.Minute, func() (bool, error) {
		l, err := in.n.client.CoreV1().Pods(workNS).List(in.ctx, metav1.ListOptions{LabelSelector: "job-name=crunch"})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			p := &l.Items[i]
			cs := p.Status.ContainerStatuses
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && len(cs) == 1 && cs[0].State.Running != nil {
				cur = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no pod of the batch Job runs any more: %v", err)
	}
	if cur.UID != in.crunch.UID {
		t.Logf("the batch Job's pod is now %s (was %s)", cur.Name, in.crunch.Name)
	}
	in.crunch = cur
}

func since(t, from time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(from).Round(10 * time.Millisecond).String()
}

// pidAlive: the process exists.
func pidAlive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// apiServerDown: kube-apiserver stops for 30 s. The agent keeps enforcing (LS load
// started during the outage cuts the tier), the extender refuses binds once its
// informers are staler than -max-cache-staleness (10 s in the realnode overlay), and
// both recover: binds are accepted again, a new batch pod is bound and runs, the
// agent republishes its node metrics, and no pod restarted but the extender's and the
// second scheduler's leaders (they exit when they cannot renew their Lease).
func (in *install) apiServerDown(t *testing.T) {
	ctx, n := in.ctx, in.n
	sysBefore := map[string]int32{}
	l, err := n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		sysBefore[l.Items[i].Name] = restarts(&l.Items[i])
	}
	stale := extenderv1.ExtenderBindingArgs{PodName: "nobody", PodNamespace: workNS, PodUID: types.UID("0"),
		Node: n.env["NODE_NAME"]}

	in.w.setPhase("8: API server down")
	stop := time.Now()
	if err := n.ctl("kube-apiserver", "stop"); err != nil {
		t.Fatal(err)
	}
	// The outage counts from the process' exit: a graceful stop drains requests first.
	down := time.Now()
	t.Logf("kube-apiserver stopped (SIGTERM) in %v", down.Sub(stop).Round(100*time.Millisecond))
	var (
		refusedStatus, refusedBind time.Time
		bindAnswer                 string
		cutAt                      time.Duration
		unhealthy                  int
		loadedAt                   time.Time
		maxQ                       float64
		lastStatus                 time.Time
	)
	for time.Since(down) < 30*time.Second {
		el := time.Since(down)
		if !in.agent.healthy(ctx) {
			unhealthy++
		}
		if st, err := in.agent.status(ctx); err == nil && st.Time.After(lastStatus) {
			lastStatus = st.Time
		}
		if q, err := quotaCores(tierCgroup); err == nil {
			if q < 0 {
				t.Errorf("the tier became unlimited %v into the outage", el)
			}
			// A frozen batch runs nothing, whatever its quota: with a harm signal the
			// agent restores the quota when batch causes LS no harm (SCHED_IDLE batch
			// waits anyway), and the freeze follows the utilisation budget.
			if in.loaded && time.Since(loadedAt) > cutWithin && !frozen(tierCgroup) && !frozen(in.batchRel()) {
				maxQ = math.Max(maxQ, q)
			}
			if !loadedAt.IsZero() && cutAt == 0 && ((q >= 0 && q <= cutBound) || frozen(tierCgroup) || frozen(in.batchRel())) {
				cutAt = time.Since(loadedAt)
			}
		}
		if el > 3*time.Second && loadedAt.IsZero() {
			in.w.setPhase("8: API down, LS loaded")
			loadedAt = time.Now()
			in.setLSLoad(t, true)
		}
		if el > 22*time.Second && in.loaded {
			in.w.setPhase("8: API down, LS idle")
			in.setLSLoad(t, false)
		}
		if refusedStatus.IsZero() {
			if s, err := in.ext.status(ctx); err == nil && s.BindsRefused != "" {
				refusedStatus = time.Now()
				t.Logf("extender /status %v into the outage: bindsRefused %q", el.Round(100*time.Millisecond), s.BindsRefused)
			}
		}
		if !refusedStatus.IsZero() && refusedBind.IsZero() {
			// Refused as stale, or because the leader lost its Lease (it cannot renew it
			// without the API server either, refuses everything and exits; docs/extender.md).
			code, body, err := in.ext.bind(ctx, stale)
			// A replica restarted without the API server answers 503 too (not synced).
			if err == nil && code == 503 {
				refusedBind, bindAnswer = time.Now(), body
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The last look at the agent: its /status is judged against this, not against the
	// API server's readiness below (ctl.sh start waits for /readyz, which took over 5 s on
	// a loaded machine and made a live agent look stalled).
	end := time.Now()
	in.w.setPhase("8: API server up")
	if in.loaded {
		in.setLSLoad(t, false)
	}
	if err := n.ctl("kube-apiserver", "start"); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	t.Logf("kube-apiserver down for %v", up.Sub(down).Round(100*time.Millisecond))

	// During the outage.
	if unhealthy > 0 {
		t.Errorf("the agent answered /healthz unhealthy %d times during the outage", unhealthy)
	}
	if lastStatus.Before(end.Add(-5 * time.Second)) {
		t.Errorf("the agent's /status stopped advancing during the outage (last %v, outage loop ended %v)",
			lastStatus, end)
	}
	if cutAt == 0 || cutAt > cutWithin+200*time.Millisecond {
		t.Errorf("LS loaded during the outage: the agent did not cut the tier to <= %.2f cores (or freeze) within %v",
			cutBound, cutWithin)
	} else if maxQ > cutBound {
		t.Errorf("LS loaded during the outage: the tier's quota reached %.3f cores with batch not frozen", maxQ)
	} else {
		t.Logf("without the API server the agent cut the tier %v after LS load began (quota then <= %.3f cores)",
			cutAt.Round(10*time.Millisecond), math.Max(maxQ, qos.DefaultMinBatchCPU))
	}
	// The API server stops serving during its graceful stop already: the informers may
	// lose contact from SIGTERM on, never before.
	if refusedStatus.IsZero() {
		t.Errorf("the extender's /status never reported bindsRefused during the 30 s outage")
	} else if d, e := refusedStatus.Sub(stop), refusedStatus.Sub(down); d < 9*time.Second || e > 20*time.Second {
		t.Errorf("the extender refused binds %v after the SIGTERM, %v into the outage: want once "+
			"-max-cache-staleness (10s) passed since the API server stopped serving, within 20 s of its exit", d, e)
	}
	if refusedBind.IsZero() {
		t.Errorf("the extender never refused a bind (503: cache stale, the leader lost its Lease, or not synced) " +
			"during the outage")
	} else {
		t.Logf("extender refused a bind %v into the outage: %s", refusedBind.Sub(down).Round(100*time.Millisecond),
			strings.TrimSpace(bindAnswer))
	}

	// Recovery.
	err = poll(ctx, 90*time.Second, func() (bool, error) {
		s, err := in.ext.status(ctx)
		return err == nil && s.BindsRefused == "" && s.Synced, nil
	})
	if err != nil {
		t.Fatalf("the extender still refuses binds after the API server came back: %v", err)
	}
	leader := in.extenderLeader(t, 60*time.Second)
	t.Logf("extender accepts binds again %v after the API server came back (leader %s)",
		time.Since(up).Round(100*time.Millisecond), leader.Name)
	var nm contract.NodeMetrics
	err = poll(ctx, 60*time.Second, func() (bool, error) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.env["NODE_NAME"], metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		nm, err = contract.DecodeNodeMetrics(node.Annotations[contract.AnnotationNodeMetrics])
		return err == nil && nm.Timestamp.After(up), nil
	})
	if err != nil {
		t.Errorf("the agent did not republish its node metrics after the outage (last %v): %v", nm.Timestamp, err)
	}
	// The webhook fails open, and after the outage the API server may call it before
	// it reaches it again: create the pod once it mutates.
	in.waitWebhook(t)
	bound0, err := in.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	if err != nil {
		t.Fatal(err)
	}
	after := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after-outage", Namespace: workNS,
		Annotations: map[string]string{contract.AnnotationQOSClass: "batch"}},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr(int64(1)), Containers: []corev1.Container{{
			Name: "main", Image: n.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
			Command:   []string{"sleep", "3600"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Mi")}},
		}}}}
	if _, err := n.client.CoreV1().Pods(workNS).Create(ctx, after, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var sched string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := n.client.CoreV1().Pods(workNS).Get(ctx, after.Name, metav1.GetOptions{})
		if err == nil {
			sched = p.Spec.SchedulerName
		}
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	// A pod asking for the extender's resources is bound by the extender (bindVerb):
	// Scheduled by the second scheduler means bound through the extender. Its counter
	// is the current leader's, which may not be the one that bound the pod.
	bound, _ := in.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	by := in.scheduledBy(t, workNS, after.Name)
	if err != nil || sched != secondScheduler || !slices.Equal(by, []string{secondScheduler}) {
		t.Errorf("a batch pod created after the outage: running %v, schedulerName %q, Scheduled by %v "+
			"(leader's binds %v -> %v)", err == nil, sched, by, bound0, bound)
		for _, args := range [][]string{{"get", "pods", "-o", "wide"}, {"get", "endpointslices"},
			{"get", "lease", extender.LeaseName, "-o", "yaml"},
			{"logs", "-l", "app.kubernetes.io/name=" + extenderName, "--tail=40", "--prefix"}} {
			out, _ := n.kubectl(ctx, append([]string{"-n", nsSystem}, args...)...)
			t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
		}
		out, _ := n.kubectl(ctx, "-n", workNS, "describe", "pod", after.Name)
		t.Logf("%s", out)
	} else {
		t.Logf("a batch pod created after the outage was bound through the extender by %s and runs (leader's "+
			"binds %v -> %v)", secondScheduler, bound0, bound)
	}
	l, err = n.client.CoreV1().Pods(nsSystem).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The extender's and the second scheduler's replicas that held a Lease exit when
	// they cannot renew it (kubelet restarts them as standbys): they may restart once.
	// Nothing else may.
	for i := range l.Items {
		p := &l.Items[i]
		b, ok := sysBefore[p.Name]
		elected := strings.HasPrefix(p.Name, extenderName+"-") || strings.HasPrefix(p.Name, secondScheduler+"-")
		if !ok || restarts(p) != b && !(elected && restarts(p) == b+1) {
			t.Errorf("pod %s/%s: restarts %d, before the outage %d (present %v)", nsSystem, p.Name, restarts(p), b, ok)
		} else if restarts(p) != b {
			t.Logf("pod %s/%s restarted once: it held a Lease it could not renew", nsSystem, p.Name)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// logTierWrites prints every write to the tier's cpu files seen by inotify, by phase.
func (in *install) logTierWrites(t *testing.T) {
	evs := in.w.snapshot(tierCgroup)
	counts := map[string]int{}
	var order []string
	for _, e := range evs {
		k := fmt.Sprintf("%-28s %s", e.Phase, strings.TrimPrefix(e.File, tierCgroup+"/"))
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var b strings.Builder
	for _, k := range order {
		fmt.Fprintf(&b, "  %5d  %s\n", counts[k], k)
	}
	t.Logf("writes to the tier's cpu files (inotify), %d, per phase and file:\n%s", len(evs), b.String())
}

// openPodLog opens a container's log file as kubelet writes it below the node's run
// directory; nil (logged) when it cannot.
func openPodLog(t *testing.T, n *node, p *corev1.Pod, container string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join(n.dir, "kubelet", "pod-logs",
		fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, "0.log"))
	if err != nil {
		t.Logf("keeping %s's log: %v", p.Name, err)
		return nil
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// tailLines is the last n lines of f, read from its start.
func tailLines(f *os.File, n int) string {
	if f == nil {
		return "(not kept)"
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
	if err != nil {
		return err.Error()
	}
	return controlplane.TailLines(string(b), n)
}
