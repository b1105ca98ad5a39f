package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/understory/understory/cmd/kubectl-understory/kubectlunderstory"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
)

// TestKubectlUnderstory runs `kubectl understory why` against a real API server and
// kube-scheduler (real FailedScheduling events, a real PodGroup), and the node agent's
// pod condition against the shipped RBAC and ValidatingAdmissionPolicy: the agent writes
// understory.io/BatchSlowed on its own node's pods, nothing else. `node` needs a kubelet
// behind the pod proxy: the real-node test covers it.
func TestKubectlUnderstory(t *testing.T) {
	ctx, cp := startControlPlane(t, 5*time.Minute)
	admin := cp.Client()
	for _, ns := range []string{nsSystem, "jobs"} {
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	crd, err := os.ReadFile(filepath.Join(manifestsDir, "crds", "podgroups.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.InstallCRD(ctx, crd); err != nil {
		t.Fatal(err)
	}
	k := newKubectl(t, cp.Kubeconfig())
	k.must(t, ctx, "apply", "-f", filepath.Join(manifestsDir, "koordlet", "rbac.yaml"),
		"-f", filepath.Join(manifestsDir, "koordlet", "node-policy.yaml"))
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:       resource.MustParse("110"),
		contract.ResourceBatchCPU: resource.MustParse("1000"), contract.ResourceBatchMemory: resource.MustParse("4Gi")}
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := cp.CreateNode(ctx, n, capacity, nil); err != nil {
			t.Fatal(err)
		}
	}
	plugin, err := kubectlunderstory.New(cp.RESTConfig(), kubectlunderstory.Options{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("why a pending gang member", func(t *testing.T) {
		testWhyPending(t, ctx, cp, plugin)
	})
	t.Run("agent writes only its own pods' condition", func(t *testing.T) {
		testAgentPodCondition(t, ctx, cp, admin, plugin)
	})
}

func testWhyPending(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, plugin *kubectlunderstory.Client) {
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"namespace": "jobs", "name": "train"},
		"spec":     map[string]any{"minMember": int64(2)},
	}}
	if _, err := cp.Dynamic().Resource(extender.PodGroupGVR).Namespace("jobs").Create(ctx, pg,
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "train-0",
			Labels:      map[string]string{contract.LabelPodGroup: "train"},
			Annotations: map[string]string{contract.AnnotationQOSClass: "batch"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{contract.ResourceBatchCPU: resource.MustParse("2000")},
				Limits:   corev1.ResourceList{contract.ResourceBatchCPU: resource.MustParse("2000")}}}}},
	}
	if _, err := cp.Client().CoreV1().Pods("jobs").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, "")
	testenv.WaitFor(t, time.Minute, "a FailedScheduling event on jobs/train-0", func() bool {
		evs, err := cp.Client().CoreV1().Events("jobs").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "train-0" && e.Reason == "FailedScheduling" {
				return true
			}
		}
		return false
	})
	var out bytes.Buffer
	if err := plugin.Why(ctx, "jobs", "train-0", &out, kubectlunderstory.FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Pod jobs/train-0: Pending, class batch",
		"understory.io/batch-cpu=2.00",
		"Gang train (podgroup (scheduling.x-k8s.io)): minMember 2, 1 members, 0 scheduled",
		"waiting for 1 more member(s)",
		"Nodes: 0 of 2 have room",
		"no: understory.io/batch-cpu: needs 2.00, 1.00 free",
		"FailedScheduling",
		"Insufficient understory.io/batch-cpu",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("why lacks %q:\n%s", want, out.String())
		}
	}
}

func testAgentPodCondition(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, admin kubernetes.Interface,
	plugin *kubectlunderstory.Client) {
	// The agent's pod on node-a, and a token bound to it, as kubelet mounts.
	agentPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "koordlet-a", Namespace: nsSystem,
		Labels: map[string]string{"app.kubernetes.io/name": koordletName}},
		Spec: corev1.PodSpec{ServiceAccountName: koordletName, NodeName: "node-a",
			Containers: []corev1.Container{{Name: "koordlet", Image: "understory/koordlet:e2e"}}}}
	agentPod, err := admin.CoreV1().Pods(nsSystem).Create(ctx, agentPod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent := tokenClient(t, cp, saToken(t, ctx, admin, nsSystem, koordletName,
		&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID}))
	unbound := tokenClient(t, cp, saToken(t, ctx, admin, nsSystem, koordletName, nil))
	batch := func(name, node string) *corev1.Pod {
		p, err := admin.CoreV1().Pods("jobs").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: name,
				Annotations: map[string]string{contract.AnnotationQOSClass: "batch"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	own, other := batch("etl-a", "node-a"), batch("etl-b", "node-b")
	statusPatch := func(c kubernetes.Interface, p *corev1.Pod, body map[string]any) error {
		_, err := c.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, mergePatch(t, body),
			metav1.PatchOptions{}, "status")
		return err
	}
	slowed := func(uid types.UID) map[string]any {
		return map[string]any{"metadata": map[string]any{"uid": uid}, "status": map[string]any{"conditions": []map[string]any{{
			"type": string(qos.ConditionBatchSlowed), "status": "True", "reason": "Throttled", "message": "m"}}}}
	}
	waitPolicy(t, ctx, func() error { return statusPatch(agent, other, slowed(other.UID)) })

	// What the agent does: its writer, on a pod of its own node.
	w := nodestatus.NewPodConditionWriter(typedPodStatus{agent}, nil)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	cond := qos.WrittenBatchCondition{BatchCondition: qos.BatchCondition{Reason: qos.BatchThrottled,
		Message: "throttled by the node agent in 80% of its CFS periods"}, At: time.Now(), Since: time.Now()}
	w.Set(own, cond.PodCondition())
	testenv.WaitFor(t, 30*time.Second, "the agent's condition written", func() bool { return w.Writes() == 1 })
	if w.Failures() != 0 {
		t.Errorf("the writer failed %d times", w.Failures())
	}
	var out bytes.Buffer
	if err := plugin.Why(ctx, "jobs", own.Name, &out, kubectlunderstory.FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Condition understory.io/BatchSlowed=True, reason Throttled", "80% of its CFS periods",
		"the agent's view: no node agent on the node node-a"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("why lacks %q:\n%s", want, out.String())
		}
	}
	// No kubelet runs the agent's pod: node finds no running agent.
	if err := plugin.Node(ctx, "node-a", &out, kubectlunderstory.FormatTable); !errors.Is(err, kubectlunderstory.ErrNoAgent) {
		t.Errorf("node on a node without a running agent: %v, want ErrNoAgent", err)
	}

	cases := []struct {
		name string
		do   func() error
		want []string
	}{
		{"a pod on another node", func() error { return statusPatch(agent, other, slowed(other.UID)) },
			[]string{"of node node-a may not patch the status of pod jobs/etl-b, which runs on node-b", "koordlet-own-pods"}},
		{"a token without the node claim", func() error { return statusPatch(unbound, own, slowed(own.UID)) },
			[]string{"names no node"}},
		{"another condition", func() error {
			return statusPatch(agent, own, map[string]any{"status": map[string]any{"conditions": []map[string]any{{
				"type": "Ready", "status": "True"}}}})
		}, []string{"koordlet-own-condition"}},
		{"the phase", func() error {
			return statusPatch(agent, own, map[string]any{"status": map[string]any{"phase": "Failed"}})
		}, []string{"koordlet-own-condition"}},
		{"a label through the status subresource", func() error {
			return statusPatch(agent, own, map[string]any{"metadata": map[string]any{"labels": map[string]string{"x": "y"}}})
		}, []string{"labels"}},
	}
	for _, tc := range cases {
		wantForbidden(t, tc.name, tc.do(), tc.want...)
	}
	// A pod recreated under the same name: the API server refuses the old UID (metadata.uid
	// is immutable), and the writer drops the write instead of retrying it.
	if err := statusPatch(agent, own, slowed("not-the-pod")); !apierrors.IsInvalid(err) {
		t.Errorf("a patch with another pod's UID: %v, want Invalid", err)
	}
	stale := own.DeepCopy()
	stale.UID = "not-the-pod"
	w.Set(stale, cond.PodCondition())
	w.Set(own, qos.WrittenBatchCondition{BatchCondition: qos.BatchCondition{Reason: qos.BatchRunning, Message: "free"},
		At: time.Now(), Since: time.Now()}.PodCondition())
	testenv.WaitFor(t, 30*time.Second, "the agent's second condition written", func() bool { return w.Writes() == 2 })
	if w.Failures() != 0 {
		t.Errorf("the writer counted %d failures; a stale UID is dropped, not failed", w.Failures())
	}
	got, err := admin.CoreV1().Pods("jobs").Get(ctx, own.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == qos.ConditionBatchSlowed && (c.Status != corev1.ConditionFalse || c.Reason != "Running") {
			t.Errorf("condition %+v, want False/Running", c)
		}
	}
	testConditionOneWriter(t, ctx, cp, admin, own, other)
}

// testConditionOneWriter: nobody but the agent sets, changes or removes the condition
// (understory-batchslowed-writer): not a tenant with pods/status rights, not the
// administrator, not through a pod's create; their other writes to the same pods pass.
// own carries the agent's condition, other none.
func testConditionOneWriter(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, admin kubernetes.Interface,
	own, other *corev1.Pod) {
	const tenant = "etl-operator"
	if _, err := admin.CoreV1().ServiceAccounts("jobs").Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles("jobs").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: tenant},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"},
			Verbs: []string{"get", "create", "update", "patch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("jobs").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: tenant},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: tenant},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "jobs", Name: tenant}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tc := tokenClient(t, cp, saToken(t, ctx, admin, "jobs", tenant, nil))
	patch := func(c kubernetes.Interface, p *corev1.Pod, body map[string]any, sub ...string) error {
		_, err := c.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, mergePatch(t, body),
			metav1.PatchOptions{}, sub...)
		return err
	}
	condition := func(typ, status, reason string) map[string]any {
		return map[string]any{"status": map[string]any{"conditions": []map[string]any{{
			"type": typ, "status": status, "reason": reason, "message": "m"}}}}
	}
	slowed := string(qos.ConditionBatchSlowed)
	forge := func() error { return patch(tc, other, condition(slowed, "True", "Frozen"), "status") }
	waitPolicy(t, ctx, forge)
	for _, c := range []struct {
		name string
		err  error
	}{
		{"a tenant sets it", forge()},
		{"a tenant changes the agent's", patch(tc, own, condition(slowed, "True", "Frozen"), "status")},
		{"the administrator changes it", patch(admin, own, condition(slowed, "False", "Finished"), "status")},
		{"the administrator removes it", patch(admin, own, map[string]any{"status": map[string]any{
			"conditions": []map[string]any{{"type": slowed, "$patch": "delete"}}}},
			"status")},
	} {
		wantForbidden(t, c.name, c.err, "may not set, change or remove the pod condition "+slowed, "batchslowed-one-writer")
	}
	// Their other writes to the same pods pass: another condition beside the agent's,
	// a label on the pod.
	if err := patch(tc, own, condition("example.com/Checked", "True", "Done"), "status"); err != nil {
		t.Errorf("a tenant's own condition beside the agent's: %v", err)
	}
	if err := patch(tc, own, map[string]any{"metadata": map[string]any{"labels": map[string]string{"stage": "2"}}}); err != nil {
		t.Errorf("a tenant's label on a pod carrying the condition: %v", err)
	}
	// A pod created with the condition: refused or stripped, never carried.
	forged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "forged"},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: qos.ConditionBatchSlowed,
			Status: corev1.ConditionTrue, Reason: "Frozen"}}}}
	if p, err := tc.CoreV1().Pods("jobs").Create(ctx, forged, metav1.CreateOptions{}); err == nil {
		for _, c := range p.Status.Conditions {
			if c.Type == qos.ConditionBatchSlowed {
				t.Errorf("a pod created with the condition carries it: %+v", c)
			}
		}
	} else if !apierrors.IsForbidden(err) {
		t.Errorf("a pod created with the condition: %v, want it created without it or Forbidden", err)
	}
	got, err := admin.CoreV1().Pods("jobs").Get(ctx, own.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, c := range got.Status.Conditions {
		kept = append(kept, string(c.Type)+"="+c.Reason)
	}
	if !slices.Contains(kept, slowed+"=Running") || !slices.Contains(kept, "example.com/Checked=Done") {
		t.Errorf("conditions %v, want the agent's Running and the tenant's Checked", kept)
	}
}

// typedPodStatus patches pods/status through client-go's typed client (the agent itself
// uses podsource.CoreClient).
type typedPodStatus struct{ c kubernetes.Interface }

func (p typedPodStatus) PatchPodStatus(ctx context.Context, ns, name string, pt types.PatchType, data []byte) error {
	_, err := p.c.CoreV1().Pods(ns).Patch(ctx, name, pt, data, metav1.PatchOptions{}, "status")
	return err
}

var _ nodestatus.PodStatusPatcher = typedPodStatus{}
