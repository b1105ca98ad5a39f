package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/kueueharness"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/kueuequota"
	"github.com/understory/understory/test/e2e/extenderharness"
)

// The component's names (manifests/components/kueue).
const (
	// kueueFollowerSA names the quota follower's Deployment, ServiceAccount,
	// ClusterRole and leader Lease, in understory-system.
	kueueFollowerSA = "understory-kueue-quota"
	kueueTenantA    = "tenant-a"
	kueueTenantB    = "tenant-b"
	kueueQueue      = "batch"
	kueueFlavor     = "understory-batch"
	kueueQueueName  = "kueue.x-k8s.io/queue-name"
)

// kueueNodeCPU is the batch CPU (millicores) each test node publishes; two nodes.
const (
	kueueNodes      = 2
	kueueNodeCPU    = 4000
	kueueNodeMemory = 16 << 30
)

// TestKueueComponentRenders renders manifests/components/kueue with `kubectl
// kustomize` and applies it with kubectl to a real API server that has Kueue
// v0.17.0's CRDs, as a user would: the API server accepts every object (schemas
// included).
func TestKueueComponentRenders(t *testing.T) {
	skipShort(t)
	bin := kueueharness.Find(t)
	ctx, cp := startControlPlane(t, 3*time.Minute)
	kubectl := controlplane.FindKubectl(t)
	kueueharness.InstallCRDs(ctx, t, cp, bin)
	applyKueueComponent(ctx, t, cp, kubectl)
	for _, cq := range []string{kueueTenantA, kueueTenantB} {
		obj, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Get(ctx, cq, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c, _, _ := unstructured.NestedString(obj.Object, "spec", "cohortName"); c != "understory-batch" {
			t.Errorf("ClusterQueue %s: cohort %q", cq, c)
		}
		rgs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "resourceGroups")
		if len(rgs) != 1 {
			t.Fatalf("ClusterQueue %s: %d resource groups", cq, len(rgs))
		}
		covered, _, _ := unstructured.NestedStringSlice(rgs[0].(map[string]any), "coveredResources")
		want := []string{contract.ResourceBatchCPU, contract.ResourceBatchMemory, contract.ResourceGPUMilli, contract.ResourceGPU}
		if !slices.Equal(covered, want) {
			t.Errorf("ClusterQueue %s covers %v, want %v", cq, covered, want)
		}
	}
	if _, err := cp.Dynamic().Resource(kueueharness.GVR("localqueues")).Namespace(kueueTenantB).Get(ctx, kueueQueue, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	d, err := cp.Client().AppsV1().Deployments("understory-system").Get(ctx, kueueFollowerSA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || d.Spec.Template.Spec.ServiceAccountName != kueueFollowerSA {
		t.Errorf("follower Deployment: replicas %v, service account %q", d.Spec.Replicas, d.Spec.Template.Spec.ServiceAccountName)
	}
}

// skipShort skips in -short mode before anything is built (kueueharness.Find builds
// Kueue under CI=true).
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real control plane and Kueue; skipped in -short mode")
	}
}

// applyKueueComponent renders the component alone (a kustomization with no
// resources but the component) and applies it with kubectl, into the namespace
// understory-system created first (the base's).
func applyKueueComponent(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, kubectl string) {
	t.Helper()
	comp, err := filepath.Abs("../../manifests/components/kueue")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, comp)
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n  - " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	rendered := filepath.Join(dir, "rendered.yaml")
	if err := os.WriteFile(rendered, out, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"kind: ResourceFlavor", "kind: ClusterQueue", "kind: LocalQueue",
		"kind: Deployment", "kind: ClusterRole", "kind: Role", "kind: ValidatingAdmissionPolicy"} {
		if !strings.Contains(string(out), kind) {
			t.Fatalf("rendered component has no %q:\n%s", kind, out)
		}
	}
	// The component owns no tenant data: the tenants' namespaces are created apart,
	// before it, from tenant-namespaces.yaml (as docs/kueue.md says).
	if strings.Contains(string(out), "kind: Namespace") {
		t.Fatalf("rendered component has a Namespace (kubectl delete -k would delete a tenant's data):\n%s", out)
	}
	// The follower's objects live in the base's namespace (the component is used
	// on top of manifests/base). No Deployment controller runs here: its pods are
	// never created.
	if err := cp.CreateNamespace(ctx, "understory-system"); err != nil {
		t.Fatal(err)
	}
	tenants, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig(), "apply", "-f",
		filepath.Join(comp, "tenant-namespaces.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply tenant-namespaces.yaml: %v\n%s", err, tenants)
	}
	apply, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig(), "apply", "--server-side", "-f", rendered).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, apply)
	}
	// The namespaces have no default ServiceAccount without a controller for it.
	for _, ns := range []string{kueueTenantA, kueueTenantB} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
		if _, err := cp.Client().CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// kueueCluster is what TestKueueInFrontOfExtender's steps share.
type kueueCluster struct {
	ctx   context.Context
	cp    *controlplane.ControlPlane
	ext   *extenderharness.Extender
	kubel *fakeKubelet
}

// TestKueueInFrontOfExtender runs Kueue v0.17.0's manager (with the component's
// Configuration, manifests/components/kueue/kueue-config.yaml) in front of the real
// kube-scheduler and the real extender, with kube-controller-manager's Job
// controller, on two nodes publishing 4 batch CPUs each, and the component's
// ClusterQueues with 4 batch CPUs of nominal quota each:
//
//   - a gang whose quota fits but that the nodes cannot hold is admitted, never
//     bound in part, and released by Kueue's waitForPodsReady (evicted, quota freed);
//   - tenant A fills the whole cohort by borrowing, then tenant B submits: Kueue's
//     fair sharing preempts A back to its share; both end within 10 % of 4 CPUs;
//   - a gang that does not fit the quota waits suspended, then, once capacity
//     frees, is admitted and bound whole;
//   - every admitted pod is bound through the extender (its bind count).
//
// There is no kubelet: a fake one marks bound pods Running and Ready and removes
// pods being deleted, and the test completes Jobs by marking their pods Succeeded.
func TestKueueInFrontOfExtender(t *testing.T) {
	skipShort(t)
	bin := kueueharness.Find(t)
	ctx, cp := startControlPlane(t, 6*time.Minute)
	kubectl := controlplane.FindKubectl(t)
	cp.StartControllerManager(t, controlplane.WithControllers("job"))
	// The extender watches PodGroups; without the CRD it logs failed watches.
	if _, err := cp.InstallCRD(ctx, controlplane.PodGroupCRD()); err != nil {
		t.Fatal(err)
	}
	wh := kueueharness.InstallCRDs(ctx, t, cp, bin)
	kueueharness.Start(ctx, t, cp, bin, wh, kueueharness.Options{PodsReadyTimeout: 30 * time.Second, BackoffBaseSeconds: 30})
	ext := extenderharness.Start(ctx, t, cp, extenderharness.Options{TrackPods: true})
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	schedCfg, err := controlplane.ManifestSchedulerConfig(manifest, ext.URL())
	if err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, schedCfg)
	applyKueueComponent(ctx, t, cp, kubectl)
	for i := range kueueNodes {
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:           resource.MustParse("8"),
			corev1.ResourceMemory:        resource.MustParse("32Gi"),
			contract.ResourceBatchCPU:    *resource.NewQuantity(kueueNodeCPU, resource.DecimalSI),
			contract.ResourceBatchMemory: *resource.NewQuantity(kueueNodeMemory, resource.BinarySI),
		}
		if _, err := cp.CreateNode(ctx, fmt.Sprintf("kueue-node-%d", i), capacity, nil); err != nil {
			t.Fatal(err)
		}
	}
	half := int64(kueueNodes * kueueNodeCPU / 2)
	for _, cq := range []string{kueueTenantA, kueueTenantB} {
		if err := setClusterQueueQuota(ctx, cp, cq, half, kueueNodes*kueueNodeMemory/2); err != nil {
			t.Fatal(err)
		}
	}
	kc := &kueueCluster{ctx: ctx, cp: cp, ext: ext, kubel: startFakeKubelet(ctx, t, cp.Client(), kueueTenantA, kueueTenantB)}

	steps := []struct {
		name string
		run  func(t *testing.T, kc *kueueCluster)
	}{
		{"admitted gang the nodes cannot hold is released, never bound in part", testKueueUnplaceableGang},
		{"two tenants get their fair shares", testKueueFairShare},
		{"gang is admitted only when it fits, then bound whole", testKueueGangWaitsForQuota},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, kc) }) {
			return
		}
	}
	if n := kc.kubel.partialGangs(); n != 0 {
		t.Errorf("%d gangs were ever seen partially bound", n)
	}
}

// setClusterQueueQuota sets the nominalQuota of the understory-batch flavor's
// batch-cpu (millicores) and batch-memory (bytes) of ClusterQueue cq (read,
// modify, update: other resources and flavors are kept).
func setClusterQueueQuota(ctx context.Context, cp *controlplane.ControlPlane, cq string, cpu, mem int64) error {
	rc := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues"))
	for attempt := 0; ; attempt++ {
		obj, err := rc.Get(ctx, cq, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rgs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "resourceGroups")
		for _, rg := range rgs {
			flavors, _ := rg.(map[string]any)["flavors"].([]any)
			for _, f := range flavors {
				fm := f.(map[string]any)
				if fm["name"] != kueueFlavor {
					continue
				}
				for _, r := range fm["resources"].([]any) {
					rm := r.(map[string]any)
					switch rm["name"] {
					case contract.ResourceBatchCPU:
						rm["nominalQuota"] = fmt.Sprint(cpu)
					case contract.ResourceBatchMemory:
						rm["nominalQuota"] = fmt.Sprint(mem)
					}
				}
			}
		}
		if err := unstructured.SetNestedSlice(obj.Object, rgs, "spec", "resourceGroups"); err != nil {
			return err
		}
		_, err = rc.Update(ctx, obj, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) || attempt > 5 {
			return err
		}
	}
}

// kueueJob is a batch Job in tenant ns's LocalQueue: parallelism pods of cpu
// batch millicores and 1 GiB batch memory each, created suspended (Kueue's Job
// webhook is not registered: kueueharness). gang > 0 makes the pods a Koordinator
// gang of that minimum.
func kueueJob(ns, name string, parallelism int32, cpu int64, gang int) *batchv1.Job {
	req := corev1.ResourceList{
		contract.ResourceBatchCPU:    *resource.NewQuantity(cpu, resource.DecimalSI),
		contract.ResourceBatchMemory: resource.MustParse("1Gi"),
	}
	ann := map[string]string{contract.AnnotationQOSClass: "batch"}
	if gang > 0 {
		ann[contract.AnnotationKoordinatorName] = name
		ann[contract.AnnotationKoordinatorMinAvailable] = fmt.Sprint(gang)
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{kueueQueueName: kueueQueue}},
		Spec: batchv1.JobSpec{
			Suspend:      ptr.To(true),
			Parallelism:  ptr.To(parallelism),
			Completions:  ptr.To(parallelism),
			BackoffLimit: ptr.To(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kueue-e2e-job": name}, Annotations: ann},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name: "work", Image: "busybox",
						Resources: corev1.ResourceRequirements{Requests: req, Limits: req},
					}},
				},
			},
		},
	}
}

func createJobs(t *testing.T, kc *kueueCluster, jobs ...*batchv1.Job) {
	t.Helper()
	for _, j := range jobs {
		if _, err := kc.cp.Client().BatchV1().Jobs(j.Namespace).Create(kc.ctx, j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// eventually polls cond every 200 ms (each poll reads the API) until it holds, or
// fails t after timeout with what and the last state cond described.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var state string
	if !testenv.PollEvery(timeout, 200*time.Millisecond, func() bool {
		ok, s := cond()
		state = s
		return ok
	}) {
		t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, state)
	}
}

// workloadState is what the test reads of one Workload.
type workloadState struct {
	name, job       string
	reserved, ready bool
	finished        bool
	evictedReason   string
}

func workloads(ctx context.Context, cp *controlplane.ControlPlane, ns string) ([]workloadState, error) {
	l, err := cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []workloadState
	for _, w := range l.Items {
		s := workloadState{name: w.GetName()}
		for _, o := range w.GetOwnerReferences() {
			if o.Kind == "Job" {
				s.job = o.Name
			}
		}
		conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
		for _, c := range conds {
			cm := c.(map[string]any)
			if cm["status"] != "True" {
				continue
			}
			switch cm["type"] {
			case "QuotaReserved":
				s.reserved = true
			case "PodsReady":
				s.ready = true
			case "Finished":
				s.finished = true
			case "Evicted":
				s.evictedReason, _ = cm["reason"].(string)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// usage is the batch-cpu a ClusterQueue has reserved (status.flavorsReservation).
func clusterQueueCPU(ctx context.Context, cp *controlplane.ControlPlane, cq string) (int64, error) {
	obj, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Get(ctx, cq, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	fr, _, _ := unstructured.NestedSlice(obj.Object, "status", "flavorsReservation")
	for _, f := range fr {
		for _, r := range f.(map[string]any)["resources"].([]any) {
			rm := r.(map[string]any)
			if rm["name"] == contract.ResourceBatchCPU {
				q, err := resource.ParseQuantity(fmt.Sprint(rm["total"]))
				if err != nil {
					return 0, err
				}
				return q.Value(), nil
			}
		}
	}
	return 0, nil
}

// boundPods counts the pods of job in ns that are bound (spec.nodeName set) and
// not terminal or deleted.
func boundPods(ctx context.Context, c kubernetes.Interface, ns, job string) (bound, total int, err error) {
	l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "kueue-e2e-job=" + job})
	if err != nil {
		return 0, 0, err
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		total++
		if p.Spec.NodeName != "" {
			bound++
		}
	}
	return bound, total, nil
}

// finishJobs marks every bound pod of the jobs Succeeded (what kubelet would
// report), so the Job controller completes them and Kueue releases their quota.
func finishJobs(t *testing.T, kc *kueueCluster, ns string, jobs ...string) {
	t.Helper()
	for _, j := range jobs {
		kc.kubel.succeed(ns, j)
	}
	eventually(t, time.Minute, fmt.Sprintf("jobs %v in %s finished in Kueue", jobs, ns), func() (bool, string) {
		ws, err := workloads(kc.ctx, kc.cp, ns)
		if err != nil {
			return false, err.Error()
		}
		var open []string
		for _, w := range ws {
			if slices.Contains(jobs, w.job) && !w.finished {
				open = append(open, w.job)
			}
		}
		return len(open) == 0, fmt.Sprintf("not finished: %v", open)
	})
}

func testKueueUnplaceableGang(t *testing.T, kc *kueueCluster) {
	// 3 × 2500 millicores = 7500 fits the cohort's 8000 (tenant A borrows tenant B's
	// idle quota), but each 4000 node holds one member: the extender never places it.
	const job = "gang-unplaceable"
	createJobs(t, kc, kueueJob(kueueTenantA, job, 3, 2500, 3))
	eventually(t, time.Minute, "the gang admitted by Kueue (quota reserved, pods created)", func() (bool, string) {
		_, total, err := boundPods(kc.ctx, kc.cp.Client(), kueueTenantA, job)
		if err != nil {
			return false, err.Error()
		}
		return total == 3, fmt.Sprintf("%d pods", total)
	})
	eventually(t, time.Minute, "Kueue evicting the gang for PodsReadyTimeout", func() (bool, string) {
		ws, err := workloads(kc.ctx, kc.cp, kueueTenantA)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if w.job == job && w.evictedReason == "PodsReadyTimeout" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", ws)
	})
	eventually(t, time.Minute, "the gang's quota released and its pods gone", func() (bool, string) {
		used, err := clusterQueueCPU(kc.ctx, kc.cp, kueueTenantA)
		if err != nil {
			return false, err.Error()
		}
		_, total, err := boundPods(kc.ctx, kc.cp.Client(), kueueTenantA, job)
		if err != nil {
			return false, err.Error()
		}
		return used == 0 && total == 0, fmt.Sprintf("tenant-a reserves %d batch-cpu, %d pods", used, total)
	})
	if n := kc.kubel.boundEver(kueueTenantA, job); n != 0 {
		t.Errorf("%d members of the unplaceable gang were bound", n)
	}
	// Out of the way of the next steps (Kueue would requeue it after its backoff):
	// deactivated through the Workload API, as the quota follower does.
	deactivateJobWorkloads(t, kc, kueueTenantA, job)
	eventually(t, time.Minute, "the deactivated gang holding no quota and no pods", func() (bool, string) {
		used, err := clusterQueueCPU(kc.ctx, kc.cp, kueueTenantA)
		if err != nil {
			return false, err.Error()
		}
		_, total, err := boundPods(kc.ctx, kc.cp.Client(), kueueTenantA, job)
		if err != nil {
			return false, err.Error()
		}
		return used == 0 && total == 0, fmt.Sprintf("reserved %d, %d pods", used, total)
	})
}

// deactivateJobWorkloads sets spec.active=false on the Workloads of job: Kueue
// evicts them (reason Deactivated), suspends the Job and keeps it out of the queue.
func deactivateJobWorkloads(t *testing.T, kc *kueueCluster, ns, job string) {
	t.Helper()
	ws, err := workloads(kc.ctx, kc.cp, ns)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range ws {
		if w.job != job {
			continue
		}
		patch := []byte(`{"spec":{"active":false}}`)
		if _, err := kc.cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(ns).Patch(kc.ctx, w.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no Workload of %s/%s to deactivate", ns, job)
	}
}

func testKueueFairShare(t *testing.T, kc *kueueCluster) {
	const n, cpu = 8, 1000 // per tenant: 8 one-CPU jobs; the cohort holds 8
	var aJobs, bJobs []string
	for i := range n {
		aJobs = append(aJobs, fmt.Sprintf("a-%d", i))
		createJobs(t, kc, kueueJob(kueueTenantA, aJobs[i], 1, cpu, 0))
	}
	// Tenant A alone borrows the whole cohort.
	eventually(t, 90*time.Second, "tenant A running 8 CPUs (its 4 and B's idle 4)", func() (bool, string) {
		used, err := clusterQueueCPU(kc.ctx, kc.cp, kueueTenantA)
		if err != nil {
			return false, err.Error()
		}
		return used == n*cpu && kc.kubel.runningCPU(kueueTenantA) == n*cpu,
			fmt.Sprintf("reserved %d, running %d", used, kc.kubel.runningCPU(kueueTenantA))
	})
	for i := range n {
		bJobs = append(bJobs, fmt.Sprintf("b-%d", i))
		createJobs(t, kc, kueueJob(kueueTenantB, bJobs[i], 1, cpu, 0))
	}
	// B reclaims its share: Kueue preempts A's borrowed Workloads.
	share := int64(kueueNodes * kueueNodeCPU / 2)
	within := func(v int64) bool { return v >= share*9/10 && v <= share*11/10 }
	var ra, rb int64
	eventually(t, 2*time.Minute, "both tenants reserving and running their fair share (4 CPUs each, within 10 %)", func() (bool, string) {
		a, b := kc.kubel.runningCPU(kueueTenantA), kc.kubel.runningCPU(kueueTenantB)
		var err error
		if ra, err = clusterQueueCPU(kc.ctx, kc.cp, kueueTenantA); err != nil {
			return false, err.Error()
		}
		if rb, err = clusterQueueCPU(kc.ctx, kc.cp, kueueTenantB); err != nil {
			return false, err.Error()
		}
		return within(a) && within(b) && within(ra) && within(rb),
			fmt.Sprintf("A runs %d reserves %d, B runs %d reserves %d batch-cpu", a, ra, b, rb)
	})
	t.Logf("fair share: A reserves %d, B reserves %d batch-cpu (share %d each); A runs %d, B runs %d",
		ra, rb, share, kc.kubel.runningCPU(kueueTenantA), kc.kubel.runningCPU(kueueTenantB))
	// And it stays so: no further preemption swings it.
	testenv.Hold(t, 3*time.Second, "both tenants running their fair share", func() bool {
		return within(kc.kubel.runningCPU(kueueTenantA)) && within(kc.kubel.runningCPU(kueueTenantB))
	})
	ws, err := workloads(kc.ctx, kc.cp, kueueTenantA)
	if err != nil {
		t.Fatal(err)
	}
	preempted := 0
	for _, w := range ws {
		if w.evictedReason == "Preempted" {
			preempted++
		}
	}
	if preempted == 0 {
		t.Errorf("no Workload of tenant A was preempted by Kueue: %+v", ws)
	}
	checkBoundThroughExtender(t, kc, kueueTenantA, kueueTenantB)
	// Finish what runs; the preempted A jobs are admitted and run next, finish them too.
	finishAll(t, kc, kueueTenantA, aJobs)
	finishAll(t, kc, kueueTenantB, bJobs)
}

// finishAll completes the jobs as they get to run, until Kueue has finished them all.
func finishAll(t *testing.T, kc *kueueCluster, ns string, jobs []string) {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("all of %s's jobs run and finished", ns), func() (bool, string) {
		for _, j := range jobs {
			kc.kubel.succeed(ns, j)
		}
		ws, err := workloads(kc.ctx, kc.cp, ns)
		if err != nil {
			return false, err.Error()
		}
		done := 0
		for _, w := range ws {
			if slices.Contains(jobs, w.job) && w.finished {
				done++
			}
		}
		return done == len(jobs), fmt.Sprintf("%d/%d finished", done, len(jobs))
	})
}

func testKueueGangWaitsForQuota(t *testing.T, kc *kueueCluster) {
	// Tenant B runs its whole nominal 4 CPUs and tenant A 2 of its 4; a gang of
	// 3 × 1000 in A needs 3: 1 more than A has left, and nobody borrows, so
	// Kueue can reclaim nothing. It keeps the gang suspended (no pods) until A's
	// own jobs finish.
	var aJobs, bJobs []string
	for i := range 4 {
		bJobs = append(bJobs, fmt.Sprintf("b-hold-%d", i))
		createJobs(t, kc, kueueJob(kueueTenantB, bJobs[i], 1, 1000, 0))
	}
	for i := range 2 {
		aJobs = append(aJobs, fmt.Sprintf("a-hold-%d", i))
		createJobs(t, kc, kueueJob(kueueTenantA, aJobs[i], 1, 1000, 0))
	}
	eventually(t, time.Minute, "tenant B running 4 CPUs and A 2", func() (bool, string) {
		a, b := kc.kubel.runningCPU(kueueTenantA), kc.kubel.runningCPU(kueueTenantB)
		return a == 2000 && b == 4000, fmt.Sprintf("A %d, B %d", a, b)
	})
	const gang = "gang-fits-later"
	createJobs(t, kc, kueueJob(kueueTenantA, gang, 3, 1000, 3))
	eventually(t, 30*time.Second, "Kueue seeing the gang (a Workload) and not admitting it", func() (bool, string) {
		ws, err := workloads(kc.ctx, kc.cp, kueueTenantA)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if w.job == gang {
				return !w.reserved, fmt.Sprintf("%+v", w)
			}
		}
		return false, "no Workload yet"
	})
	// A few scheduling rounds: the gang stays suspended, nothing of it bound.
	testenv.Hold(t, 3*time.Second, "the gang staying unbound while it does not fit", func() bool {
		return kc.kubel.boundEver(kueueTenantA, gang) == 0
	})
	ws, err := workloads(kc.ctx, kc.cp, kueueTenantA)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.job == gang && w.reserved {
			t.Fatalf("Kueue admitted the gang while it did not fit: %+v", w)
		}
	}
	finishJobs(t, kc, kueueTenantA, aJobs...)
	eventually(t, time.Minute, "the gang admitted and bound whole", func() (bool, string) {
		bound, total, err := boundPods(kc.ctx, kc.cp.Client(), kueueTenantA, gang)
		if err != nil {
			return false, err.Error()
		}
		return bound == 3 && total == 3, fmt.Sprintf("%d/%d bound", bound, total)
	})
	checkBoundThroughExtender(t, kc, kueueTenantA)
	finishJobs(t, kc, kueueTenantA, gang)
	finishJobs(t, kc, kueueTenantB, bJobs...)
}

// checkBoundThroughExtender: every pod of the namespaces that was ever bound was
// bound by the extender (the spy saw its bind).
func checkBoundThroughExtender(t *testing.T, kc *kueueCluster, namespaces ...string) {
	t.Helper()
	for _, ns := range namespaces {
		for _, p := range kc.kubel.boundPodNames(ns) {
			if pc := kc.ext.PodCalls(ns, p); pc.Bind == 0 {
				t.Errorf("pod %s/%s was bound without the extender's bind", ns, p)
			}
		}
	}
	if c := kc.ext.Calls(); c.Bind == 0 {
		t.Errorf("the extender bound nothing: %+v", c)
	}
}

// fakeKubelet stands in for the kubelets: it marks bound pods of its namespaces
// Running and Ready, deletes pods being deleted at once (GracePeriodSeconds=0),
// marks the pods of jobs it is told to finish Succeeded, and records, per gang
// (Job), the pods it ever saw bound and whether a gang was ever seen with some but
// not all members bound for longer than one bind round (partial).
type fakeKubelet struct {
	c kubernetes.Interface

	mu      sync.Mutex
	bound   map[string]map[string]bool // ns/job -> pod names ever bound
	running map[string]int64           // ns -> batch-cpu of bound, non-terminal pods (last pass)
	finish  map[string]bool            // ns/job -> mark Succeeded
	partial map[string]time.Time       // ns/job -> since when partially bound
	broken  map[string]bool            // ns/job seen partial for over 5 s
}

func startFakeKubelet(ctx context.Context, t *testing.T, c kubernetes.Interface, namespaces ...string) *fakeKubelet {
	k := &fakeKubelet{c: c, bound: map[string]map[string]bool{}, running: map[string]int64{},
		finish: map[string]bool{}, partial: map[string]time.Time{}, broken: map[string]bool{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, ns := range namespaces {
				if err := k.pass(ctx, ns); err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
					t.Logf("fake kubelet: %v", err)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(150 * time.Millisecond):
			}
		}
	}()
	return k
}

func (k *fakeKubelet) pass(ctx context.Context, ns string) error {
	l, err := k.c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var running int64
	type gangCount struct{ bound, total, min int }
	gangs := map[string]*gangCount{}
	for i := range l.Items {
		p := &l.Items[i]
		job := p.Labels["kueue-e2e-job"]
		key := ns + "/" + job
		if p.DeletionTimestamp != nil {
			err := k.c.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if min := p.Annotations[contract.AnnotationKoordinatorMinAvailable]; min != "" {
			g := gangs[key]
			if g == nil {
				g = &gangCount{}
				_, _ = fmt.Sscan(min, &g.min)
				gangs[key] = g
			}
			g.total++
			if p.Spec.NodeName != "" {
				g.bound++
			}
		}
		if p.Spec.NodeName == "" {
			continue
		}
		k.mu.Lock()
		if k.bound[key] == nil {
			k.bound[key] = map[string]bool{}
		}
		k.bound[key][p.Name] = true
		finish := k.finish[key]
		k.mu.Unlock()
		switch {
		case finish:
			p.Status.Phase = corev1.PodSucceeded
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"}}
			now := metav1.Now()
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}}}
			if _, err := k.c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return err
			}
			continue
		case p.Status.Phase != corev1.PodRunning:
			now := metav1.Now()
			p.Status.Phase = corev1.PodRunning
			p.Status.StartTime = &now
			p.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
			if _, err := k.c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return err
			}
		}
		q := p.Spec.Containers[0].Resources.Requests[contract.ResourceBatchCPU]
		running += q.Value()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.running[ns] = running
	now := time.Now()
	for key := range k.partial {
		if strings.HasPrefix(key, ns+"/") {
			if g := gangs[key]; g == nil || g.bound == 0 || g.bound >= g.min {
				delete(k.partial, key)
			}
		}
	}
	for key, g := range gangs {
		if g.bound > 0 && g.bound < g.min {
			since, ok := k.partial[key]
			if !ok {
				k.partial[key] = now
			} else if now.Sub(since) > 5*time.Second {
				k.broken[key] = true
			}
		}
	}
	return nil
}

func (k *fakeKubelet) succeed(ns, job string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.finish[ns+"/"+job] = true
}

func (k *fakeKubelet) runningCPU(ns string) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.running[ns]
}

func (k *fakeKubelet) boundEver(ns, job string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.bound[ns+"/"+job])
}

func (k *fakeKubelet) boundPodNames(ns string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for key, pods := range k.bound {
		if strings.HasPrefix(key, ns+"/") {
			for p := range pods {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// partialGangs is how many gangs were seen with some but not all members bound for
// over 5 s (a bind round takes milliseconds).
func (k *fakeKubelet) partialGangs() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.broken)
}

// TestKueueQuotaFollower runs the quota follower (package kueuequota, as
// cmd/kueue-quota does, passes every 300 ms; two replicas electing a leader, each
// as the component's ServiceAccount, so with exactly its RBAC) against Kueue
// v0.17.0 with the component's ClusterQueues (weights 3 and 1 here) on two nodes
// publishing batch CPU:
//
//   - the quotas rise, damped, to each tenant's weighted part of what is published
//     and never above it;
//   - both tenants fill their quotas with one-CPU Jobs (plus pending extra); tenant
//     B's Jobs ask plain cpu and memory, which the shipped Configuration's
//     transformations count as batch-cpu and batch-memory;
//   - LS takes capacity back (the nodes' allocatable batch CPU halves): the quotas
//     fall at once, the follower deactivates the excess Workloads, Kueue evicts them
//     (Evicted, reason Deactivated: the Jobs are suspended by Kueue, nothing is
//     deleted behind its back), the follower reactivates them and Kueue requeues
//     them (pending); the cohort's reservations end within the published capacity;
//   - the standby replica wrote nothing (no Event) and the first kept the Lease.
//
// No kube-scheduler runs: admitted pods stay Pending, which is all Kueue needs here
// (waitForPodsReady keeps the shipped 5 min).
func TestKueueQuotaFollower(t *testing.T) {
	skipShort(t)
	bin := kueueharness.Find(t)
	ctx, cp := startControlPlane(t, 4*time.Minute)
	kubectl := controlplane.FindKubectl(t)
	cp.StartControllerManager(t, controlplane.WithControllers("job"))
	wh := kueueharness.InstallCRDs(ctx, t, cp, bin)
	kueueharness.Start(ctx, t, cp, bin, wh, kueueharness.Options{})
	applyKueueComponent(ctx, t, cp, kubectl)
	if _, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Patch(ctx, kueueTenantA, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+kueuequota.AnnotationWeight+`":"3"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes := make([]string, kueueNodes)
	for i := range kueueNodes {
		nodes[i] = fmt.Sprintf("follow-node-%d", i)
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:           resource.MustParse("8"),
			corev1.ResourceMemory:        resource.MustParse("32Gi"),
			contract.ResourceBatchCPU:    *resource.NewQuantity(kueueNodeCPU, resource.DecimalSI),
			contract.ResourceBatchMemory: *resource.NewQuantity(kueueNodeMemory, resource.BinarySI),
		}
		if _, err := cp.CreateNode(ctx, nodes[i], capacity, nil); err != nil {
			t.Fatal(err)
		}
		publishKueueNodeMetrics(ctx, t, cp, nodes[i])
	}
	// Two replicas, as the component deploys them: each as the component's
	// ServiceAccount (so its RBAC is what is tested), electing a leader on the
	// component's Lease. The first takes the Lease (it is free); the second
	// stands by and must write nothing.
	rec, standby := &eventCounter{}, &eventCounter{}
	leaderReg := startKueueFollower(ctx, t, cp, "follower-0", rec)
	eventually(t, 30*time.Second, "follower-0 holding the Lease", func() (bool, string) {
		h := kueueLeaseHolder(ctx, cp)
		return h == "follower-0", "holder " + h
	})
	standbyReg := startKueueFollower(ctx, t, cp, "follower-1", standby)

	quota := func(cq string) (cpu int64, mem int64) {
		obj, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Get(ctx, cq, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rgs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "resourceGroups")
		for _, r := range rgs[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)["resources"].([]any) {
			rm := r.(map[string]any)
			q := resource.MustParse(fmt.Sprint(rm["nominalQuota"]))
			switch rm["name"] {
			case contract.ResourceBatchCPU:
				cpu = q.Value()
			case contract.ResourceBatchMemory:
				mem = q.Value()
			}
		}
		return cpu, mem
	}
	published := int64(kueueNodes * kueueNodeCPU)
	var seenA []int64
	eventually(t, time.Minute, "quotas at 3/4 and 1/4 of the published 8 CPUs", func() (bool, string) {
		a, _ := quota(kueueTenantA)
		b, _ := quota(kueueTenantB)
		if len(seenA) == 0 || seenA[len(seenA)-1] != a {
			seenA = append(seenA, a)
		}
		if a+b > published {
			t.Fatalf("quotas %d + %d above the published %d", a, b, published)
		}
		return a == published*3/4 && b == published/4, fmt.Sprintf("A %d, B %d", a, b)
	})
	// Damped: from 0, half the gap per pass, about 5 writes per queue.
	t.Logf("tenant A's quota on the way up, as polled: %v; %d quota writes", seenA, rec.count(kueuequota.ReasonQuotaFollowed))
	if n := rec.count(kueuequota.ReasonQuotaFollowed); n < 6 {
		t.Errorf("%d quota writes on the way up; want a damped rise (about 5 per queue)", n)
	}
	if _, mem := quota(kueueTenantB); mem != kueueNodes*kueueNodeMemory/4 {
		t.Errorf("tenant B batch-memory quota %d, want %d", mem, kueueNodes*kueueNodeMemory/4)
	}

	// Fill: A 6 one-CPU jobs (its 6), B 2 (its 2) and 2 more pending.
	jobs := map[string][]string{}
	for ns, n := range map[string]int{kueueTenantA: 6, kueueTenantB: 4} {
		for i := range n {
			name := fmt.Sprintf("f-%d", i)
			jobs[ns] = append(jobs[ns], name)
			j := kueueJob(ns, name, 1, 1000, 0)
			if ns == kueueTenantB {
				// Tenant B writes plain cpu/memory: the shipped Configuration's
				// resources.transformations count them as batch-cpu/batch-memory.
				plain := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}
				j.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: plain, Limits: plain}
			}
			createJobs(t, &kueueCluster{ctx: ctx, cp: cp}, j)
		}
	}
	eventually(t, time.Minute, "A reserving 6 CPUs and B 2", func() (bool, string) {
		a, _ := clusterQueueCPU(ctx, cp, kueueTenantA)
		b, _ := clusterQueueCPU(ctx, cp, kueueTenantB)
		return a == 6000 && b == 2000, fmt.Sprintf("A %d, B %d", a, b)
	})

	// LS takes half back: every node now publishes 2 CPUs.
	for _, n := range nodes {
		patch := fmt.Sprintf(`{"status":{"allocatable":{%q:"%d"},"capacity":{%q:"%d"}}}`,
			contract.ResourceBatchCPU, kueueNodeCPU/2, contract.ResourceBatchCPU, kueueNodeCPU/2)
		if _, err := cp.Client().CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	published /= 2
	eventually(t, 30*time.Second, "quotas falling to 3 and 1 CPUs", func() (bool, string) {
		a, _ := quota(kueueTenantA)
		b, _ := quota(kueueTenantB)
		return a == published*3/4 && b == published/4, fmt.Sprintf("A %d, B %d", a, b)
	})
	eventually(t, time.Minute, "the cohort's reservations back within the published 4 CPUs (A 3, B 1)", func() (bool, string) {
		a, _ := clusterQueueCPU(ctx, cp, kueueTenantA)
		b, _ := clusterQueueCPU(ctx, cp, kueueTenantB)
		return a == 3000 && b == 1000, fmt.Sprintf("A %d, B %d", a, b)
	})
	// Evicted by Kueue (reason Deactivated), then reactivated and requeued: pending
	// again, active, and their Jobs suspended by Kueue, not deleted.
	for ns, want := range map[string]int{kueueTenantA: 3, kueueTenantB: 1} {
		eventually(t, 30*time.Second, ns+"'s evicted Workloads requeued", func() (bool, string) {
			l, err := cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			requeued := 0
			var states []string
			for _, w := range l.Items {
				active, found, _ := unstructured.NestedBool(w.Object, "spec", "active")
				conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
				var reserved, reactivated bool
				for _, c := range conds {
					cm := c.(map[string]any)
					switch {
					case cm["type"] == "QuotaReserved" && cm["status"] == "True":
						reserved = true
					case cm["type"] == "Requeued" && cm["status"] == "True" && cm["reason"] == "Reactivated":
						reactivated = true
					}
				}
				if (active || !found) && !reserved && reactivated && w.GetLabels()[kueuequota.LabelEvicted] == "" {
					requeued++
				}
				states = append(states, fmt.Sprintf("%s active=%v reserved=%v reactivated=%v", w.GetName(), active || !found, reserved, reactivated))
			}
			return requeued == want, strings.Join(states, "; ")
		})
	}
	for ns, names := range jobs {
		for _, j := range names {
			if _, err := cp.Client().BatchV1().Jobs(ns).Get(ctx, j, metav1.GetOptions{}); err != nil {
				t.Errorf("job %s/%s: %v", ns, j, err)
			}
		}
	}
	if rec.count(kueuequota.ReasonQuotaEvicted) != 4 || rec.count(kueuequota.ReasonQuotaRequeued) != 4 {
		t.Errorf("events: %v", rec.snapshot())
	}
	if h := kueueLeaseHolder(ctx, cp); h != "follower-0" || len(standby.snapshot()) > 0 {
		t.Errorf("Lease held by %q (want follower-0 throughout); the standby's events: %v", h, standby.snapshot())
	}
	const lastPass, leader = "understory_kueue_quota_last_pass_timestamp_seconds", "understory_kueue_quota_leader"
	if got := gaugeValue(t, standbyReg, lastPass); got != 0 || gaugeValue(t, standbyReg, leader) != 0 {
		t.Errorf("the standby ran a pass (last pass %v) or reports leading", got)
	}
	if gaugeValue(t, leaderReg, leader) != 1 || gaugeValue(t, leaderReg, lastPass) == 0 {
		t.Error("the leader does not report leading, or ran no pass")
	}
}

// gaugeValue is the value of the unlabelled gauge name in reg (0 when absent).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// startKueueFollower runs the quota follower (as cmd/kueue-quota does, passes every
// 300 ms) as the component's ServiceAccount, with leader election on its Lease,
// until the test ends; its Events go to rec, its metrics to the registry it returns.
func startKueueFollower(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, identity string,
	rec *eventCounter) *prometheus.Registry {
	t.Helper()
	rc := cp.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:understory-system:" + kueueFollowerSA}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := kueuequota.DefaultConfig()
	cfg.Interval = 300 * time.Millisecond
	cfg.EvictAfter = time.Second // a few passes: the damping, shortened for the test
	reg := prometheus.NewRegistry()
	f, err := kueuequota.New(client, dyn, cfg, reg, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	lc := kueuequota.DefaultLeaderConfig("understory-system", identity)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.RunElected(fctx, lc) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("follower %s: %v", identity, err)
		}
	})
	return reg
}

// publishKueueNodeMetrics writes a fresh node-metrics document on Node name, as its
// agent does: the follower counts only Nodes whose agent is alive (fresh for the
// follower's 5 min bound, longer than the test runs).
func publishKueueNodeMetrics(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name string) {
	t.Helper()
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: time.Now(), WindowMillis: 10_000,
		CPU: contract.CPUMetrics{Capacity: 8000}, Memory: contract.MemoryMetrics{Capacity: 32 << 30},
		Batch: &contract.BatchResources{CPU: kueueNodeCPU, Memory: kueueNodeMemory}}
	ann, err := m.EncodeAnnotations()
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client().CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kueueLeaseHolder is the holder of the follower's Lease ("" none).
func kueueLeaseHolder(ctx context.Context, cp *controlplane.ControlPlane) string {
	l, err := cp.Client().CoordinationV1().Leases("understory-system").Get(ctx, kueuequota.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// eventCounter records the follower's Events by reason.
type eventCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *eventCounter) Eventf(_ runtime.Object, _, reason, _ string, _ ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[reason]++
}

func (e *eventCounter) count(reason string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[reason]
}

func (e *eventCounter) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.n)
}
