package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
)

// upgradeDir holds the previous release for TestUpgrade: its chart package
// (understory-<tag>.tgz, as `make release` writes it under dist/charts) and the
// real-node values of that release (realnode-values-<tag>.yaml: this release's values
// file may set keys the older schema refuses). Replace both with each release
// (docs/operations.md, "Upgrading").
const upgradeDir = "testdata/upgrade"

// gangName is the Koordinator-dialect gang TestUpgrade runs across the upgrade.
const gangName = "pair"

// previousRelease is the chart TestUpgrade upgrades from.
type previousRelease struct {
	chart, values, tag string
}

// previousChart finds the one chart package in upgradeDir and its values.
func previousChart(t *testing.T) previousRelease {
	t.Helper()
	charts, err := filepath.Glob(filepath.Join(upgradeDir, "understory-*.tgz"))
	if err != nil || len(charts) != 1 {
		t.Fatalf("%s: want exactly one understory-<tag>.tgz, found %v (%v)", upgradeDir, charts, err)
	}
	tag := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(charts[0]), "understory-"), ".tgz")
	prev := previousRelease{chart: charts[0], values: filepath.Join(upgradeDir, "realnode-values-"+tag+".yaml"), tag: tag}
	for _, p := range []*string{&prev.chart, &prev.values} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("the previous release: %v", err)
		}
		*p = abs
	}
	return prev
}

// upgrade carries TestUpgrade's state between its stages.
type upgrade struct {
	*install
	prev previousRelease
	// Before the upgrade: the workload pods, the extender's bookings and the
	// certificates Helm issued.
	pods     map[string]podRecord
	bookings string
	certs    map[string][]byte
}

// podRecord is what must not change of a pod across the upgrade: the same object
// (UID), the same container, no restart, on the same node.
type podRecord struct {
	UID       types.UID
	Container string
	Restarts  int32
	Node      string
}

// TestUpgrade upgrades the previous release's chart to this one with batch pods
// running, as a user does (`helm upgrade` with the new chart and new image tags):
//
//  1. the previous chart (upgradeDir), its images tagged as that release's, installed
//     with its own real-node values, rolls out;
//  2. its second scheduler and extender serve;
//  3. an LS Deployment, a batch Job and a Koordinator-dialect gang of two batch pods
//     run, placed by the extender (the gang admitted whole);
//  4. `helm upgrade` to charts/understory with this release's images and the
//     Koordinator migration turned on replaces every component's pod, and loses
//     nothing: every workload pod is the same object, with the same container and no
//     restart, still classified and in the tier; the new extender leader's ledger
//     agrees with the API server and holds the gang as before; the certificates are
//     the ones Helm issued at install;
//  5. Koordinator's colocation example pod (its PriorityClass, koord-scheduler, its
//     batch resource names and labels) goes through the upgraded admission, placement
//     by the second scheduler and the extender, and runs in the agent's tier.
func TestUpgrade(t *testing.T) {
	requireRealNode(t, installHow)
	repo := repoRoot(t)
	version, tars := builtImages(t, repo)
	prev := previousChart(t)
	if prev.tag == version {
		t.Fatalf("the previous release's tag %s is this build's: the images would not change", version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	in := &install{ctx: ctx, repo: repo, version: version, certs: t.TempDir()}
	in.helmBin = controlplane.HelmBinary(t, repo)
	tars = append(tars, schedulerImage(t, repo))
	in.n = startNode(t, repo, tars...)
	u := &upgrade{install: in, prev: prev}

	stages := []struct {
		name string
		run  func(*testing.T)
	}{
		{"1-install-previous-release", u.installPrevious},
		{"2-second-scheduler-and-extender", in.secondSchedulerRuns},
		{"3-workloads-and-gang-running", u.workloads},
		{"4-upgrade-loses-no-pod-and-no-booking", u.upgrade},
		{"5-koordinator-pod-placed-and-in-tier", u.koordinatorPod},
	}
	for _, s := range stages {
		if !t.Run(s.name, s.run) {
			t.Fatalf("stage %s failed; the later stages build on it", s.name)
		}
	}
}

// installPrevious tags this build's images as the previous release's (containerd
// holds both names for the same image, so the upgrade changes every pod's image
// reference) and installs the previous chart with them.
func (u *upgrade) installPrevious(t *testing.T) {
	ctx, n := u.ctx, u.n
	for _, name := range installImages {
		from, to := "docker.io/understory/"+name+":"+u.version, "docker.io/understory/"+name+":"+u.prev.tag
		out, err := exec.CommandContext(ctx, n.env["CTR"], "--address", n.env["CONTAINERD_ADDRESS"], "--namespace",
			"k8s.io", "images", "tag", "--force", from, to).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr images tag %s %s: %v: %s", from, to, err, out)
		}
	}
	out, err := n.helm(ctx, u.helmBin, "install", helmRelease, u.prev.chart, "-n", nsSystem, "--create-namespace",
		"-f", u.prev.values, "--set", "image.tag="+u.prev.tag)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "STATUS: deployed") {
		t.Fatalf("helm install: no STATUS: deployed in\n%s", out)
	}
	u.rolledOut(t)
	u.agentPod = n.readyPod(ctx, t, nsSystem, agentLabel, "", 2*time.Minute)
	u.agent = newAgentClient(u.agentPod.Status.PodIP)
	if img := u.agentPod.Spec.Containers[0].Image; img != "understory/koordlet-nogpu:"+u.prev.tag {
		t.Errorf("agent image %s, want the previous release's understory/koordlet-nogpu:%s", img, u.prev.tag)
	}
	leader := u.extenderLeader(t, 60*time.Second)
	u.certsFromSecret(t)
	u.certs = u.certSecrets(t)
	t.Logf("helm install %s (the previous release) with images :%s: rolled out, extender leader %s",
		filepath.Base(u.prev.chart), u.prev.tag, leader.Name)
}

// workloads runs TestInstall's LS Deployment and batch Job, then a gang of two batch
// pods in Koordinator's dialect, which the extender admits whole.
func (u *upgrade) workloads(t *testing.T) {
	u.install.workloads(t)
	if t.Failed() {
		return
	}
	ctx, n := u.ctx, u.n
	for i := range 2 {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", gangName, i), Namespace: workNS,
				Annotations: map[string]string{contract.AnnotationQOSClass: "batch",
					contract.AnnotationKoordinatorName: gangName, contract.AnnotationKoordinatorMinAvailable: "2"}},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr(int64(2)),
				Containers: []corev1.Container{{Name: "c", Image: n.env["BUSYBOX_IMAGE"],
					ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "100000"},
					Resources: corev1.ResourceRequirements{Requests: cpuMem("100m", "16Mi")}}}},
		}
		if _, err := n.client.CoreV1().Pods(workNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var state string
	err := poll(ctx, 3*time.Minute, func() (bool, error) {
		st, err := u.ext.status(ctx)
		if err != nil {
			return false, nil
		}
		g, ok := gangOf(st)
		state = fmt.Sprintf("%+v", g)
		if !ok || g.State != extender.GangAdmitted || g.Bound != 2 {
			return false, nil
		}
		for i := range 2 {
			p, err := n.client.CoreV1().Pods(workNS).Get(ctx, fmt.Sprintf("%s-%d", gangName, i), metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("gang %s: %s; want admitted with both members bound and running: %v", gangName, state, err)
	}
	t.Logf("gang %s admitted whole: %s", gangName, state)
}

// gangOf returns the extender's record of the test's gang.
func gangOf(st extender.Status) (extender.GangStatus, bool) {
	for _, g := range st.Gangs {
		if strings.HasSuffix(g.Gang, "/"+gangName) {
			return g, true
		}
	}
	return extender.GangStatus{}, false
}

// upgrade runs `helm upgrade` to this release and checks that nothing is lost.
func (u *upgrade) upgrade(t *testing.T) {
	ctx, n := u.ctx, u.n
	u.pods = u.workPods(t)
	var err error
	if u.bookings, err = u.ledgerAgrees(ctx); err != nil {
		t.Fatalf("before the upgrade: %v", err)
	}
	oldPods := u.systemPods(t)
	t.Logf("before: %d workload pods; extender: %s", len(u.pods), u.bookings)

	start := time.Now()
	out, err := n.helm(ctx, u.helmBin, "upgrade", helmRelease, filepath.Join(u.repo, chartDir), "-n", nsSystem,
		"-f", filepath.Join(u.repo, realnodeValues), "--set", "koordinator.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, "REVISION: 2") {
		t.Fatalf("helm upgrade: want STATUS: deployed, REVISION: 2 in\n%s", out)
	}
	u.rolledOut(t)
	// Every pod of the project's images is new, with this release's tag.
	var stale []string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		stale = stale[:0]
		for _, p := range u.systemPods(t) {
			for _, c := range p.Spec.Containers {
				_, old := oldPods[p.Name]
				if strings.HasPrefix(c.Image, "understory/") && (old || !strings.HasSuffix(c.Image, ":"+u.version)) {
					stale = append(stale, p.Name+" "+c.Image)
				}
			}
		}
		return len(stale) == 0, nil
	})
	if err != nil {
		t.Errorf("pods of the previous release after the rollout: %v (want every one replaced, with :%s): %v", stale,
			u.version, err)
	}
	u.agentPod = n.readyPod(ctx, t, nsSystem, agentLabel, u.agentPod.Name, 2*time.Minute)
	u.agent = newAgentClient(u.agentPod.Status.PodIP)
	leader := u.extenderLeader(t, 90*time.Second)
	t.Logf("helm upgrade to %s :%s rolled out in %v; extender leader %s", chartDir, u.version,
		time.Since(start).Round(time.Second), leader.Name)

	// No workload pod lost, restarted or moved.
	after := u.workPods(t)
	for name, was := range u.pods {
		now, ok := after[name]
		switch {
		case !ok:
			t.Errorf("pod %s is gone after the upgrade (was %+v)", name, was)
		case now != was:
			t.Errorf("pod %s: %+v after the upgrade, was %+v: want the same pod, container and restart count", name,
				now, was)
		}
	}
	// The new leader's ledger agrees with the API server and holds the gang as before.
	var got string
	err = poll(ctx, 90*time.Second, func() (bool, error) {
		var err error
		got, err = u.ledgerAgrees(ctx)
		return err == nil && got == u.bookings, nil
	})
	if err != nil {
		t.Errorf("extender after the upgrade: %s; before: %s", got, u.bookings)
	}
	// The new agent holds the batch pods in the tier, not frozen.
	var mismatch string
	err = poll(ctx, 30*time.Second, func() (bool, error) {
		st, err := u.agent.status(ctx)
		if err != nil {
			mismatch = err.Error()
			return false, nil
		}
		mismatch = ""
		for name := range u.pods {
			e, class, ok := podEntry(st, name)
			if strings.HasPrefix(name, "web-") {
				if class != qos.ClassLS.String() {
					mismatch += fmt.Sprintf("%s: class %q; ", name, class)
				}
				continue
			}
			if !ok || class != qos.ClassBatch.String() || e.Placement != "tier" {
				mismatch += fmt.Sprintf("%s: class %q %+v; ", name, class, e)
			}
		}
		return mismatch == "", nil
	})
	if err != nil {
		t.Errorf("the new agent's /status: %s", mismatch)
	}
	if frozen(tierCgroup) {
		t.Errorf("the tier %s is frozen after the upgrade with no LS load", tierCgroup)
	}
	// The certificates Helm issued at install are kept.
	for name, crt := range u.certSecrets(t) {
		if string(crt) != string(u.certs[name]) {
			t.Errorf("Secret %s/%s: its certificate changed in the upgrade", nsSystem, name)
		}
	}
	t.Logf("after: the same %d workload pods; extender: %s", len(after), got)
}

// workPods records every pod of the workload namespace, each running.
func (u *upgrade) workPods(t *testing.T) map[string]podRecord {
	t.Helper()
	l, err := u.n.client.CoreV1().Pods(workNS).List(u.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]podRecord{}
	for _, p := range l.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s: %+v, want running", p.Name, statusOf(&p))
		}
		out[p.Name] = podRecord{UID: p.UID, Container: containerID(&p), Restarts: restarts(&p), Node: p.Spec.NodeName}
	}
	return out
}

// systemPods are the release's pods, by name.
func (u *upgrade) systemPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	l, err := u.n.client.CoreV1().Pods(nsSystem).List(u.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range l.Items {
		out[l.Items[i].Name] = &l.Items[i]
	}
	return out
}

// certSecrets returns the certificate of each TLS Secret of the release.
func (u *upgrade) certSecrets(t *testing.T) map[string][]byte {
	t.Helper()
	l, err := u.n.client.CoreV1().Secrets(nsSystem).List(u.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, s := range l.Items {
		if s.Type == corev1.SecretTypeTLS {
			out[s.Name] = s.Data[corev1.TLSCertKey]
		}
	}
	if len(out) == 0 {
		t.Fatalf("no TLS Secret in %s", nsSystem)
	}
	return out
}

// ledgerAgrees reads the leading extender's /status and checks its ledger against
// the API server: the node holds as many pods as are bound there and not finished,
// nothing is assumed (held without the informer's word), and the test's gang is
// admitted with both members bound. It returns the bookings as a line to compare.
func (u *upgrade) ledgerAgrees(ctx context.Context) (string, error) {
	st, err := u.ext.status(ctx)
	if err != nil {
		return "", err
	}
	node := u.n.env["NODE_NAME"]
	l, err := u.n.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	live := 0
	for _, p := range l.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live++
		}
	}
	i := slices.IndexFunc(st.Nodes, func(n extender.NodeStatus) bool { return n.Name == node })
	if i < 0 {
		return "", fmt.Errorf("extender /status has no node %s", node)
	}
	ns := st.Nodes[i]
	g, ok := gangOf(st)
	line := fmt.Sprintf("node %s: %d pods, cpu %d/%dm, memory %d/%dMi; assumed %d; gang %+v", node, ns.Pods,
		ns.UsedCPUMilli, ns.CPUMilli, ns.UsedMemoryMiB, ns.MemoryMiB, len(st.AssumedPods), g)
	switch {
	case !st.Synced || st.Refused != "":
		return line, fmt.Errorf("extender not serving (synced %v, refused %q): %s", st.Synced, st.Refused, line)
	case ns.Pods != live:
		return line, fmt.Errorf("the API server has %d live pods on %s: %s", live, node, line)
	case len(st.AssumedPods) != 0:
		return line, fmt.Errorf("pods assumed without the informer: %+v: %s", st.AssumedPods, line)
	case !ok || g.State != extender.GangAdmitted || g.Bound != 2:
		return line, fmt.Errorf("gang %s not admitted with both members bound: %s", gangName, line)
	}
	// The node's pod count moves while the release's own pods roll: compare the
	// workload's part (the gang) and the counts the API server confirmed.
	return fmt.Sprintf("gang %s %s %d/%d bound, plan %v; ledger matches the API server", g.Gang, g.State, g.Bound,
		g.MinMember, g.Plan), nil
}

// koordinatorPod takes the pod of Koordinator's colocation example, as a Koordinator
// user wrote it, through the upgraded release: the webhook renames its batch
// resources, replaces koord-scheduler and makes it batch (the from-koordinator
// profile in a namespace labelled for colocation); the second scheduler places it
// through the extender; it runs below the tier and the agent classifies it batch.
func (u *upgrade) koordinatorPod(t *testing.T) {
	ctx, n := u.ctx, u.n
	const ns = "colo"
	if _, err := n.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"koordinator.sh/enable-colocation": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound0, err := u.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	if err != nil {
		t.Fatal(err)
	}
	res := corev1.ResourceList{contract.ResourceKoordinatorBatchCPU: resource.MustParse("200"),
		contract.ResourceKoordinatorBatchMemory: resource.MustParse("64Mi")}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "koord-be", Namespace: ns,
			Labels: map[string]string{"koordinator.sh/enable-colocation": "true", "koordinator.sh/qosClass": "BE"}},
		Spec: corev1.PodSpec{PriorityClassName: "koord-batch", SchedulerName: admission.KoordinatorScheduler,
			TerminationGracePeriodSeconds: ptr(int64(2)),
			Containers: []corev1.Container{{Name: "c", Image: n.env["BUSYBOX_IMAGE"], ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sleep", "100000"},
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()}}}},
	}
	got, err := n.client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Koordinator's example pod: %v", err)
	}
	req := got.Spec.Containers[0].Resources.Requests
	bcpu, bmem := req[contract.ResourceBatchCPU], req[contract.ResourceBatchMemory]
	if got.Spec.SchedulerName != secondScheduler || got.Annotations[contract.AnnotationQOSClass] != "batch" ||
		got.Spec.Priority == nil || *got.Spec.Priority != 5000 ||
		bcpu.Cmp(resource.MustParse("200")) != 0 || bmem.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Fatalf("admitted as schedulerName %q, class %q, priority %v, requests %v: want %s, batch, koord-batch's "+
			"5000, understory.io/batch-cpu 200 and batch-memory 64Mi", got.Spec.SchedulerName,
			got.Annotations[contract.AnnotationQOSClass], got.Spec.Priority, req, secondScheduler)
	}
	run := n.waitRunningIn(ctx, t, ns, got.Name)
	if by := u.scheduledBy(t, ns, run.Name); !slices.Equal(by, []string{secondScheduler}) {
		t.Errorf("Scheduled by %v, want %s", by, secondScheduler)
	}
	bound, err := u.ext.counter(ctx, "understory_extender_binds_total", map[string]string{"result": "bound"})
	if err != nil {
		t.Fatal(err)
	}
	if bound < bound0+1 {
		t.Errorf("extender binds bound %v -> %v: want the pod bound by the extender", bound0, bound)
	}
	rel := tierCgroup + "/pod" + string(run.UID)
	cid := containerID(run)
	procs, err := processesOf(cid)
	if err != nil || len(procs) == 0 {
		t.Fatalf("no process of the container %s: %v", cid, err)
	}
	for pid, cg := range procs {
		if cg["cpu"] != "/"+rel+"/"+cid {
			t.Errorf("process %d in cpu cgroup %s, want /%s/%s (below the tier)", pid, cg["cpu"], rel, cid)
		}
	}
	var entry string
	err = poll(ctx, 20*time.Second, func() (bool, error) {
		st, err := u.agent.status(ctx)
		if err != nil {
			return false, nil
		}
		e, class, _ := podEntry(st, run.Name)
		entry = fmt.Sprintf("class %q %+v", class, e)
		return class == qos.ClassBatch.String() && e.Placement == "tier" && e.Cgroup == rel, nil
	})
	if err != nil {
		t.Errorf("agent /status for %s: %s; want batch in the tier at %s", run.Name, entry, rel)
	}
	t.Logf("Koordinator's example pod: admitted as batch for %s (priority 5000), bound by the extender, running "+
		"at %s", secondScheduler, rel)
}
