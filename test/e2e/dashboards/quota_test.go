package dashboards

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/kueueharness"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/kueuequota"
)

// The Kueue quota follower's part of the end-to-end test: the real follower
// (cmd/kueue-quota, built by the test) runs passes every second against the control
// plane, which has Kueue's ClusterQueue and Workload CRDs (from the Kueue build
// scripts/kueue.sh caches) and the shipped ClusterQueues tenant-a and tenant-b
// (manifests/components/kueue/clusterqueues.yaml). Kueue's manager does not run: the
// test plays the little of Kueue the follower reads, one Workload admitted in
// tenant-a (its status.admission and QuotaReserved condition, the queue's
// status.flavorsReservation), and evicts it as Kueue would once the follower
// deactivates it, and admits it again once the quota holds it. Two nodes publish batch
// capacity (allocatable and a fresh node-metrics document); a taint keeps
// kube-scheduler's traffic off them.
const (
	// clusterQueuesFile is the shipped ClusterQueues, relative to the module root.
	clusterQueuesFile = "manifests/components/kueue/clusterqueues.yaml"
	quotaTenant       = "tenant-a"
	quotaWorkload     = "e2e-admitted"
	// quotaNodeCPU is each quota node's batch CPU in millicores: 2 × 4000 published,
	// 4000 for each of the two queues (weights 1 and 1). The admitted Workload holds
	// quotaWorkloadCPU of tenant-a's. The capacity falls in two steps: to
	// quotaNodeCPUMid (2000 a queue: below the Workload, but the cohort's 4000 still
	// hold it, so nothing is evicted), then to quotaNodeCPULow (1000 a queue: the cohort
	// is over its quotas and the Workload is evicted).
	quotaNodeCPU     = 4000
	quotaNodeCPUMid  = 2000
	quotaNodeCPULow  = 1000
	quotaWorkloadCPU = 3000
	quotaNodeMemory  = 8 << 30
	// quotaTaint keeps the traffic's pods off the quota nodes (the follower ignores
	// taints but unreachable and not-ready ones).
	quotaTaint = "understory.io/e2e-quota-only"
)

// quotaNodes are the nodes whose batch capacity the follower follows.
var quotaNodes = []string{"e2e-quota-0", "e2e-quota-1"}

// kueueCRDs are the Kueue CRDs the follower reads and writes.
var kueueCRDs = map[string]bool{"clusterqueues.kueue.x-k8s.io": true, "workloads.kueue.x-k8s.io": true}

// quotaFollower is the running follower and the Kueue it follows.
type quotaFollower struct {
	cp   *controlplane.ControlPlane
	addr string // host:port of its /metrics
}

// setUpKueue installs Kueue's ClusterQueue and Workload CRDs from the Kueue build,
// the shipped ClusterQueues, the quota nodes and an admitted Workload in tenant-a.
func setUpKueue(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, kueue kueueharness.Bin) {
	t.Helper()
	raw, err := os.ReadFile(kueue.CRDs)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := selectDocs(raw, func(o map[string]any) bool {
		md, _ := o["metadata"].(map[string]any)
		name, _ := md["name"].(string)
		return kueueCRDs[name]
	})
	if err != nil {
		t.Fatalf("%s: %v", kueue.CRDs, err)
	}
	if len(crds) != len(kueueCRDs) {
		t.Fatalf("%s: found %d of the CRDs %v", kueue.CRDs, len(crds), kueueCRDs)
	}
	if _, err := cp.InstallCRD(ctx, bytes.Join(crds, []byte("\n---\n"))); err != nil {
		t.Fatal(err)
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root, clusterQueuesFile))
	if err != nil {
		t.Fatal(err)
	}
	queues, err := selectDocs(shipped, func(o map[string]any) bool { return o["kind"] == "ClusterQueue" })
	if err != nil || len(queues) != 2 {
		t.Fatalf("%s: %d ClusterQueues (%v), want tenant-a and tenant-b", clusterQueuesFile, len(queues), err)
	}
	for _, q := range queues {
		o := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(q, &o.Object); err != nil {
			t.Fatal(err)
		}
		if _, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating ClusterQueue %s: %v", o.GetName(), err)
		}
	}
	for _, name := range quotaNodes {
		n := controlplane.NewNode(name, corev1.ResourceList{
			corev1.ResourceCPU:           resource.MustParse("8"),
			corev1.ResourceMemory:        resource.MustParse("32Gi"),
			contract.ResourceBatchCPU:    *resource.NewQuantity(quotaNodeCPU, resource.DecimalSI),
			contract.ResourceBatchMemory: *resource.NewQuantity(quotaNodeMemory, resource.BinarySI),
		}, nil)
		n.Spec.Taints = []corev1.Taint{{Key: quotaTaint, Effect: corev1.TaintEffectNoSchedule}}
		if _, err := cp.Client().CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := publishNodeMetrics(ctx, cp, name, quotaNodeCPU); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.CreateNamespace(ctx, quotaTenant); err != nil {
		t.Fatal(err)
	}
	if err := admitWorkload(ctx, cp); err != nil {
		t.Fatal(err)
	}
}

// selectDocs returns the documents of a YAML stream for which keep is true, as JSON.
func selectDocs(stream []byte, keep func(map[string]any) bool) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var out [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		if o == nil || !keep(o) {
			continue
		}
		js, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		out = append(out, js)
	}
}

// publishNodeMetrics writes a fresh node-metrics document on node name, as its agent
// does, and sets its allocatable (and capacity) batch CPU to cpuMilli: the follower
// counts only nodes whose agent is alive.
func publishNodeMetrics(ctx context.Context, cp *controlplane.ControlPlane, name string, cpuMilli int64) error {
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: time.Now(), WindowMillis: 10_000,
		CPU: contract.CPUMetrics{Capacity: 8000}, Memory: contract.MemoryMetrics{Capacity: 32 << 30},
		Batch: &contract.BatchResources{CPU: cpuMilli, Memory: quotaNodeMemory}}
	ann, err := m.EncodeAnnotations()
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	nodes := cp.Client().CoreV1().Nodes()
	if _, err := nodes.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	q := *resource.NewQuantity(cpuMilli, resource.DecimalSI)
	status, err := json.Marshal(map[string]any{"status": map[string]any{
		"allocatable": map[string]any{contract.ResourceBatchCPU: q.String()},
		"capacity":    map[string]any{contract.ResourceBatchCPU: q.String()},
	}})
	if err != nil {
		return err
	}
	if _, err := nodes.PatchStatus(ctx, name, status); err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	return nil
}

// setQuotaCapacity makes every quota node publish cpuMilli batch CPU.
func setQuotaCapacity(ctx context.Context, cp *controlplane.ControlPlane, cpuMilli int64) error {
	for _, name := range quotaNodes {
		if err := publishNodeMetrics(ctx, cp, name, cpuMilli); err != nil {
			return err
		}
	}
	return nil
}

// admitWorkload creates the Workload quotaWorkload in tenant-a's namespace and admits
// it as Kueue would: status.admission in ClusterQueue tenant-a with its batch CPU in
// flavor understory-batch, condition QuotaReserved, and the queue's
// status.flavorsReservation.
func admitWorkload(ctx context.Context, cp *controlplane.ControlPlane) error {
	cpu := *resource.NewQuantity(quotaWorkloadCPU, resource.DecimalSI)
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kueueharness.Group + "/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"name": quotaWorkload, "namespace": quotaTenant},
		"spec": map[string]any{
			"queueName": "batch",
			"podSets": []any{map[string]any{
				"name": "main", "count": int64(1),
				"template": map[string]any{"spec": map[string]any{
					"restartPolicy": "Never",
					"containers": []any{map[string]any{
						"name": "main", "image": "understory.invalid/batch:never-pulled",
						"resources": map[string]any{"requests": map[string]any{contract.ResourceBatchCPU: cpu.String()}},
					}},
				}},
			}},
		},
	}}
	workloads := cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(quotaTenant)
	created, err := workloads.Create(ctx, w, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Workload %s: %w", quotaWorkload, err)
	}
	return admit(ctx, cp, created)
}

// admit writes w's admission in ClusterQueue tenant-a (its batch CPU in flavor
// understory-batch), its condition QuotaReserved, and the queue's reservation.
func admit(ctx context.Context, cp *controlplane.ControlPlane, w *unstructured.Unstructured) error {
	cpu := *resource.NewQuantity(quotaWorkloadCPU, resource.DecimalSI)
	w.Object["status"] = map[string]any{
		"admission": map[string]any{
			"clusterQueue": quotaTenant,
			"podSetAssignments": []any{map[string]any{
				"name": "main", "count": int64(1),
				"flavors":       map[string]any{contract.ResourceBatchCPU: kueuequota.DefaultFlavor},
				"resourceUsage": map[string]any{contract.ResourceBatchCPU: cpu.String()},
			}},
		},
		"conditions": []any{condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue "+quotaTenant)},
	}
	workloads := cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(quotaTenant)
	if _, err := workloads.UpdateStatus(ctx, w, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("admitting Workload %s: %w", quotaWorkload, err)
	}
	return setReservation(ctx, cp, quotaWorkloadCPU)
}

// setReservation writes ClusterQueue tenant-a's status.flavorsReservation: cpuMilli of
// batch CPU in flavor understory-batch.
func setReservation(ctx context.Context, cp *controlplane.ControlPlane, cpuMilli int64) error {
	q := *resource.NewQuantity(cpuMilli, resource.DecimalSI)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"flavorsReservation": []any{map[string]any{
		"name":      kueuequota.DefaultFlavor,
		"resources": []any{map[string]any{"name": contract.ResourceBatchCPU, "total": q.String(), "borrowed": "0"}},
	}}}})
	if err != nil {
		return err
	}
	_, err = cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Patch(ctx, quotaTenant, types.MergePatchType, patch,
		metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("ClusterQueue %s reservation: %w", quotaTenant, err)
	}
	return nil
}

func condition(typ, status, reason, message string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": message,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
}

// playKueue plays Kueue's part for the Workload until ctx ends, polling it: once the
// follower has deactivated it (spec.active false) while it holds its reservation, it
// evicts it (conditions Evicted, reason Deactivated, and QuotaReserved False;
// admission cleared) and releases the queue's reservation, as Kueue does; the follower
// then reactivates it (a requeue). A requeued Workload is admitted again once tenant-a's
// nominalQuota holds it. The first error ends it.
func playKueue(ctx context.Context, cp *controlplane.ControlPlane) error {
	workloads := cp.Dynamic().Resource(kueueharness.GVR("workloads")).Namespace(quotaTenant)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
		w, err := workloads.Get(ctx, quotaWorkload, metav1.GetOptions{})
		if err != nil {
			return ctxErr(ctx, err)
		}
		active, found, _ := unstructured.NestedBool(w.Object, "spec", "active")
		conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
		reserved := false
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			reserved = reserved || (cm["type"] == "QuotaReserved" && cm["status"] == "True")
		}
		if !reserved && (!found || active) && w.GetLabels()[kueuequota.LabelEvicted] == "" {
			fits, err := quotaHolds(ctx, cp)
			if err != nil {
				return ctxErr(ctx, err)
			}
			if fits {
				if err := admit(ctx, cp, w); err != nil {
					return ctxErr(ctx, err)
				}
			}
			continue
		}
		if !found || active || !reserved {
			continue
		}
		unstructured.RemoveNestedField(w.Object, "status", "admission")
		w.Object["status"].(map[string]any)["conditions"] = []any{
			condition("QuotaReserved", "False", "Pending", "Evicted: the Workload is deactivated"),
			condition("Evicted", "True", "Deactivated", "The workload is deactivated"),
		}
		if _, err := workloads.UpdateStatus(ctx, w, metav1.UpdateOptions{}); err != nil {
			return ctxErr(ctx, fmt.Errorf("evicting Workload %s: %w", quotaWorkload, err))
		}
		if err := setReservation(ctx, cp, 0); err != nil {
			return ctxErr(ctx, err)
		}
	}
}

// quotaHolds reports whether tenant-a's nominalQuota of batch CPU holds the Workload.
func quotaHolds(ctx context.Context, cp *controlplane.ControlPlane) (bool, error) {
	q, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Get(ctx, quotaTenant, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	quotas, err := kueuequota.NominalQuotas(q, kueuequota.DefaultFlavor, []string{contract.ResourceBatchCPU})
	if err != nil {
		return false, err
	}
	return quotas[contract.ResourceBatchCPU] >= quotaWorkloadCPU, nil
}

// buildBinary builds the main package pkg (relative to the module root) into dir.
func buildBinary(ctx context.Context, dir, pkg string) (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// startQuotaFollower runs the follower binary as its Deployment does (leader
// election on the Lease understory-system/understory-kueue-quota) with the admin
// kubeconfig, passes every second, an eviction after 2 s over quota, and waits for
// its /readyz.
func startQuotaFollower(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, bin string) *quotaFollower {
	t.Helper()
	if err := cp.CreateNamespace(ctx, "understory-system"); err != nil {
		t.Fatal(err)
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	logPath := filepath.Join(dir, "kueue-quota.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "-kubeconfig="+cp.Kubeconfig(), "-listen="+addr, "-interval=1s", "-evict-after=2s",
		"-metrics-max-age=10m", "-leader-elect-namespace=understory-system", "-leader-elect-identity=e2e-follower")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("quota follower log %s, last lines:\n%s", logPath, controlplane.TailFile(logPath, 30))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("the quota follower exited; log:\n%s", controlplane.TailFile(logPath, 30))
		case <-time.After(200 * time.Millisecond):
		}
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return &quotaFollower{cp: cp, addr: addr}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quota follower was not ready within 30s; log:\n%s", controlplane.TailFile(logPath, 30))
		}
	}
}
