package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/koordlet/nodestatus"
	extender "github.com/understory/understory/scheduler-extender"
)

// standInCRDs are permissive CRDs of the third-party kinds the optional
// components use (cert-manager's Issuer and Certificate, the Prometheus
// Operator's ServiceMonitor): same group, version, kind and scope, any fields.
// They let the server-side dry run check that those components apply with the
// install; the real schemas are the projects' own.
const standInCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {kind: Issuer, plural: issuers, singular: issuer, listKind: IssuerList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {kind: Certificate, plural: certificates, singular: certificate, listKind: CertificateList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor, listKind: ServiceMonitorList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
`

// TestManifestsInstall installs manifests/ on a real kube-apiserver (the
// harness's version, controlplane.K8sVersion) the way a user does, with kubectl
// of that version, and checks the least-privilege rules in the API server
// itself:
//
//   - `kubectl apply -k manifests/` succeeds in one pass on an empty cluster,
//     and `kubectl diff -k` then finds nothing to change, also after a second
//     apply; the overlays, the optional components and the
//     examples pass `kubectl apply --dry-run=server` over it (a dry run cannot
//     create the namespace its other objects need, so the base is applied for
//     real first);
//   - the webhook's and the extender's pods meet the "restricted" Pod Security
//     level, the agent's is accepted in its namespace;
//   - the agent's service account, with a token bound to a pod on its node (the
//     node-name claim), may patch its own Node's annotations and batch
//     resources with the agent's own code, and is refused for another Node, for
//     every other field, and without the claim;
//   - the extender's service account may create Bindings and patch only its
//     own annotations; nothing else on pods;
//   - kube-scheduler, with the shipped KubeSchedulerConfiguration (only
//     addresses and file paths replaced), reaches cmd/scheduler-extender over
//     TLS with its client certificate, and the extender, running as its own
//     service account under the policy above, binds a GPU pod and a gang.
//
// TestManifestsInstallOldest does it all again on the oldest Kubernetes the
// README supports.
func TestManifestsInstall(t *testing.T) {
	ctx, cp := startControlPlane(t, 8*time.Minute)
	testManifestsInstall(t, ctx, cp)
}

// TestManifestsInstallOldest proves the README's oldest supported Kubernetes,
// controlplane.OldestSupported: TestManifestsInstall on kube-apiserver and
// kube-scheduler emulating that release (--emulated-version: its APIs and
// their versions, its feature gates' defaults, so a ValidatingAdmissionPolicy
// field or an API that release lacks fails the install).
func TestManifestsInstallOldest(t *testing.T) {
	readme := string(readFile(t, "../../README.md"))
	if want := "Kubernetes ≥ " + controlplane.OldestSupported; !strings.Contains(readme, want) {
		t.Errorf("README.md does not say %q", want)
	}
	ctx, cp := startControlPlaneWith(t, 8*time.Minute, controlplane.Options{EmulatedVersion: controlplane.OldestSupported})
	// /version names the binary; the compatibility metric names the emulation.
	m, err := cp.Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `emulation="` + controlplane.OldestSupported + `"`
	found := false
	for _, l := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(l, "version_info{") && strings.Contains(l, `component="kube"`) {
			found = strings.Contains(l, want)
			t.Logf("kube-apiserver: %s", l)
		}
	}
	if !found {
		t.Fatalf("kube-apiserver's version_info metric does not say %s", want)
	}
	testManifestsInstall(t, ctx, cp)
}

func testManifestsInstall(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) {
	k := newKubectl(t, cp.Kubeconfig())
	root := copyManifests(t)
	objs := k.build(t, ctx, root)

	t.Run("one-pass apply", func(t *testing.T) {
		out := k.must(t, ctx, "apply", "-k", root)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.HasSuffix(line, " created") {
				t.Errorf("first apply: %q, want created", line)
			}
		}
		k.must(t, ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/podgroups.scheduling.x-k8s.io")
		// Applied again, nothing changes: `kubectl diff` exits 0 with no output.
		// (The second apply's own output says "configured" for some kinds even
		// then: client-side apply sends a patch that changes nothing, e.g. for
		// the Secrets, whose base64 kustomize wraps in lines.)
		if d, err := k.run(ctx, "diff", "-k", root); err != nil || strings.TrimSpace(d) != "" {
			t.Errorf("the install differs from manifests/ right after applying it (%v):\n%s", err, d)
		}
		k.must(t, ctx, "apply", "-k", root)
		if d, err := k.run(ctx, "diff", "-k", root); err != nil || strings.TrimSpace(d) != "" {
			t.Errorf("a second apply changed the install (%v):\n%s", err, d)
		}
		mwc, err := cp.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, admissionName,
			metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ca := secretData(t, objs, "understory-admission-tls", "ca.crt")
		for _, w := range mwc.Webhooks {
			if string(w.ClientConfig.CABundle) != string(ca) {
				t.Errorf("webhook %s: caBundle in the API server is not the CA", w.Name)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("server dry run", func(t *testing.T) {
		if _, err := cp.InstallCRD(ctx, []byte(standInCRDs)); err != nil {
			t.Fatal(err)
		}
		if err := cp.CreateNamespace(ctx, "understory-examples"); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{
			root,
			filepath.Join(root, "overlays", "gpu"),
			filepath.Join(root, "overlays", "systemd"),
			composition(t, root, "cert-manager", "components/cert-manager"),
			composition(t, root, "everything", "certs", "components/gpu", "components/systemd",
				"components/servicemonitor", "components/second-scheduler"),
			filepath.Join(root, "examples"),
		} {
			if out, err := k.run(ctx, "apply", "--dry-run=server", "-k", dir); err != nil {
				t.Errorf("%s: %v", dir, err)
			} else if !strings.Contains(out, "(server dry run)") {
				t.Errorf("%s: not a server dry run:\n%s", dir, out)
			}
		}
	})

	t.Run("pod security", func(t *testing.T) {
		const restricted = "psa-restricted"
		if err := cp.CreateNamespace(ctx, restricted); err != nil {
			t.Fatal(err)
		}
		k.must(t, ctx, "label", "namespace", restricted, "pod-security.kubernetes.io/enforce=restricted")
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		for _, name := range []string{extenderName, admissionName} {
			tmpl := podTemplate(t, mustFind(t, objs, "Deployment", name))
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restricted, Labels: tmpl.Labels},
				Spec: tmpl.Spec}
			p.Spec.ServiceAccountName = "" // that namespace has only "default"
			if _, err := cp.Client().CoreV1().Pods(restricted).Create(ctx, p, dry); err != nil {
				t.Errorf("%s's pod in a restricted namespace: %v", name, err)
			}
		}
		tmpl := podTemplate(t, mustFind(t, objs, "DaemonSet", koordletName))
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: nsSystem, Labels: tmpl.Labels},
			Spec: tmpl.Spec}
		p.Spec.NodeName = "no-such-node"
		if _, err := cp.Client().CoreV1().Pods(nsSystem).Create(ctx, p, dry); err != nil {
			t.Errorf("the agent's pod in %s: %v", nsSystem, err)
		}
	})

	t.Run("agent may patch only its own node and fields", func(t *testing.T) { testAgentNodePolicy(t, ctx, cp) })
	t.Run("extender writes only bindings and its annotations", func(t *testing.T) { testExtenderPodPolicy(t, ctx, cp) })
	t.Run("kube-scheduler calls the extender over mutual TLS", func(t *testing.T) {
		testExtenderTLS(t, ctx, cp, root, objs)
	})
	// Last: it removes the install. docs/operations.md's uninstall deletes every object
	// of the install and leaves the PodGroup CRD (and so every PodGroup) to whoever
	// else uses it.
	t.Run("uninstall leaves the shared CRD", func(t *testing.T) {
		k.must(t, ctx, "delete", "-k", root, "-l", "app.kubernetes.io/part-of=understory", "--wait=false")
		if _, err := k.run(ctx, "get", "crd", "podgroups.scheduling.x-k8s.io"); err != nil {
			t.Errorf("the PodGroup CRD is gone after the uninstall: %v", err)
		}
		for _, what := range [][]string{
			{"mutatingwebhookconfiguration", admissionName},
			{"clusterrole", "understory-koordlet"},
			{"validatingadmissionpolicy", "understory-pod-rules"},
		} {
			if out, err := k.run(ctx, "get", what[0], what[1], "--ignore-not-found", "-o", "name"); err != nil ||
				strings.TrimSpace(out) != "" {
				t.Errorf("%s %s still there after the uninstall (%v): %q", what[0], what[1], err, out)
			}
		}
	})
}

// wantForbidden fails unless err is a 403 whose message contains every want.
func wantForbidden(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: err %v, want Forbidden", what, err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// waitPolicy retries probe until it returns Forbidden: a policy takes effect
// once the API server's admission plugin has seen it (about a second).
func waitPolicy(t *testing.T, ctx context.Context, probe func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := probe()
		if apierrors.IsForbidden(err) {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("policy not in force after 30s: last answer %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func mergePatch(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testAgentNodePolicy(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) {
	admin := cp.Client()
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	for _, n := range []string{"agent-a", "agent-b"} {
		if _, err := cp.CreateNode(ctx, n, capacity, map[string]string{"team": "x"}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType,
			mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]string{"example.com/keep": "1"}}}),
			metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's pod on agent-a, and a token bound to it, as kubelet mounts.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "koordlet-a", Namespace: nsSystem},
		Spec: corev1.PodSpec{ServiceAccountName: koordletName, NodeName: "agent-a",
			Containers: []corev1.Container{{Name: "koordlet", Image: "understory/koordlet:e2e"}}}}
	pod, err := admin.CoreV1().Pods(nsSystem).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := saToken(t, ctx, admin, nsSystem, koordletName,
		&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	agent := tokenClient(t, cp, token)
	review, err := agent.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "agent-a" {
		t.Fatalf("the bound token's node-name claim is %v, want [agent-a]", got)
	}
	unbound := tokenClient(t, cp, saToken(t, ctx, admin, nsSystem, koordletName, nil))

	metricsNow := contract.NodeMetrics{Timestamp: time.Now(), WindowMillis: 10000,
		CPU: contract.CPUMetrics{Capacity: 8000, Used: 1000, LS: 500}, Memory: contract.MemoryMetrics{Capacity: 32 << 30, Used: 1 << 30}}
	publish := func(c kubernetes.Interface, node string) error {
		return nodestatus.NewNodeAnnotator(c.CoreV1().Nodes(), node).Publish(ctx, metricsNow)
	}
	batch, err := nodestatus.PatchFor(nodestatus.Resources{CPUMilli: 1500, MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	gpuMilli, err := nodestatus.GPUPatchFor(2000)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(c kubernetes.Interface, node string, body []byte, sub ...string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}, sub...)
		return err
	}
	waitPolicy(t, ctx, func() error { return publish(agent, "agent-b") })
	before, err := admin.CoreV1().Nodes().Get(ctx, "agent-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// What the agent does: its annotations and its resources, on its own Node.
	if err := publish(agent, "agent-a"); err != nil {
		t.Errorf("the agent's own node-metrics patch: %v", err)
	}
	if err := patch(agent, "agent-a", batch, "status"); err != nil {
		t.Errorf("the agent's own batch resources: %v", err)
	}
	if err := patch(agent, "agent-a", gpuMilli, "status"); err != nil {
		t.Errorf("the agent's own gpu-milli: %v", err)
	}
	a, err := admin.CoreV1().Nodes().Get(ctx, "agent-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Annotations[contract.AnnotationNodeMetrics] == "" || a.Annotations["example.com/keep"] != "1" {
		t.Errorf("agent-a annotations %v", a.Annotations)
	}
	if q := a.Status.Allocatable["understory.io/batch-cpu"]; q.Value() != 1500 {
		t.Errorf("agent-a allocatable batch-cpu %v, want 1500", q.String())
	}

	cases := []struct {
		name string
		do   func() error
		want []string
	}{
		{"node-metrics on another node", func() error { return publish(agent, "agent-b") },
			[]string{"of node agent-a may not patch Node agent-b", "koordlet-own-node"}},
		{"batch resources on another node", func() error { return patch(agent, "agent-b", batch, "status") },
			[]string{"may not patch Node agent-b"}},
		{"a token without the node claim", func() error { return publish(unbound, "agent-a") },
			[]string{"names no node"}},
		{"another annotation", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"metadata": map[string]any{
				"annotations": map[string]string{"example.com/other": "x"}}}))
		}, []string{"not example.com/other", "koordlet-own-fields"}},
		{"removing an annotation", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{"example.com/keep": nil}}}))
		}, []string{"not example.com/keep"}},
		{"a label", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"metadata": map[string]any{
				"labels": map[string]string{"team": "y"}}}))
		}, []string{"labels"}},
		{"cordoning", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"spec": map[string]any{"unschedulable": true}}))
		}, []string{"spec"}},
		{"a taint", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"spec": map[string]any{
				"taints": []map[string]string{{"key": "x", "effect": "NoSchedule"}}}}))
		}, []string{"spec"}},
		{"cpu capacity", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"status": map[string]any{
				"capacity": map[string]string{"cpu": "64"}}}), "status")
		}, []string{"not cpu"}},
		{"another extended resource", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"status": map[string]any{
				"allocatable": map[string]string{"example.com/dongle": "1"}}}), "status")
		}, []string{"not example.com/dongle"}},
		{"node conditions", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"status": map[string]any{
				"conditions": []map[string]string{{"type": "Ready", "status": "False"}}}}), "status")
		}, []string{"conditions"}},
		{"a label through the status subresource", func() error {
			return patch(agent, "agent-a", mergePatch(t, map[string]any{"metadata": map[string]any{
				"labels": map[string]string{"team": "z"}}}), "status")
		}, []string{"labels"}},
	}
	for _, tc := range cases {
		wantForbidden(t, tc.name, tc.do(), tc.want...)
	}
	after, err := admin.CoreV1().Nodes().Get(ctx, "agent-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("agent-b changed (resourceVersion %s -> %s)", before.ResourceVersion, after.ResourceVersion)
	}
	a2, err := admin.CoreV1().Nodes().Get(ctx, "agent-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a2.Labels["team"] != "x" || a2.Spec.Unschedulable || len(a2.Spec.Taints) > 0 || a2.Annotations["example.com/keep"] != "1" {
		t.Errorf("agent-a changed beyond the agent's fields: labels %v spec %+v", a2.Labels, a2.Spec)
	}
	// The agent's other rights are RBAC's: no deleting nodes.
	wantForbidden(t, "deleting its node", agent.CoreV1().Nodes().Delete(ctx, "agent-a", metav1.DeleteOptions{}))
}

func testExtenderPodPolicy(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) {
	const ns = "extender-policy"
	admin := cp.Client()
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.CreateNode(ctx, "extender-policy-node", corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}, nil); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"patched", "bound", "foreign", "plain"} {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})
		p.Labels = map[string]string{"app": "x"}
		p.Annotations = map[string]string{"example.com/keep": "1"}
		p.Spec.SchedulerName = "understory-e2e-nobody" // no scheduler races the test's Bindings
		created, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = created
	}
	ext := tokenClient(t, cp, saToken(t, ctx, admin, nsSystem, extenderName, nil))
	patch := func(name string, body any, sub ...string) error {
		_, err := ext.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, mergePatch(t, body), metav1.PatchOptions{}, sub...)
		return err
	}
	annotate := func(key string, value any) error {
		return patch("patched", map[string]any{"metadata": map[string]any{"uid": pods["patched"].UID,
			"annotations": map[string]any{key: value}}})
	}
	bind := func(name string, annotations map[string]string) error {
		return ext.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: pods[name].UID, Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "extender-policy-node"},
		}, metav1.CreateOptions{})
	}
	waitPolicy(t, ctx, func() error { return annotate("example.com/probe", "x") })

	// What the extender does (bind.go: a merge patch with the uid; a Binding
	// carrying the devices).
	if err := annotate(contract.AnnotationGangState, "planned:1:extender-policy-node:0:1"); err != nil {
		t.Errorf("the extender's gang-state patch: %v", err)
	}
	if err := bind("bound", map[string]string{contract.AnnotationGPUDevices: contract.FormatGPUDevices([]int{0})}); err != nil {
		t.Errorf("the extender's Binding with devices: %v", err)
	}
	if err := bind("plain", nil); err != nil {
		t.Errorf("the extender's Binding without annotations: %v", err)
	}
	// A new leader's catch-up barrier, on its own replica's pod (leader.go).
	replica := controlplane.NewPod(nsSystem, extenderName+"-5d9c7-x2b4q", nil)
	replica.Spec.SchedulerName, replica.Spec.ServiceAccountName = "understory-e2e-nobody", extenderName
	if _, err := admin.CoreV1().Pods(nsSystem).Create(ctx, replica, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	barrier := mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		extender.AnnotationCatchUp: "x 2026-11-28T04:00:00Z"}}})
	if _, err := ext.CoreV1().Pods(nsSystem).Patch(ctx, replica.Name, types.MergePatchType, barrier,
		metav1.PatchOptions{}); err != nil {
		t.Errorf("the catch-up barrier on the extender's own pod: %v", err)
	}
	got, err := admin.CoreV1().Pods(ns).Get(ctx, "bound", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "extender-policy-node" || got.Annotations[contract.AnnotationGPUDevices] == "" {
		t.Errorf("bound pod: node %q annotations %v", got.Spec.NodeName, got.Annotations)
	}

	cases := []struct {
		name string
		err  error
		want []string
	}{
		{"another annotation", annotate("example.com/other", "x"), []string{"not example.com/other", "extender-pod-writes"}},
		{"removing an annotation", annotate("example.com/keep", nil), []string{"not example.com/keep"}},
		{"the catch-up barrier on another pod", annotate(extender.AnnotationCatchUp, "x"),
			[]string{"not " + extender.AnnotationCatchUp}},
		{"a label", patch("patched", map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": "y"}}}),
			[]string{"labels"}},
		{"the spec", patch("patched", map[string]any{"spec": map[string]any{"activeDeadlineSeconds": 5}}), []string{"spec"}},
		{"a Binding with another annotation", bind("foreign", map[string]string{"example.com/x": "1"}),
			[]string{"not example.com/x"}},
		{"pod status", patch("patched", map[string]any{"status": map[string]any{"message": "x"}}, "status"), nil},
		{"an eviction", ext.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: ns}}), nil},
		{"deleting a pod", ext.CoreV1().Pods(ns).Delete(ctx, "plain", metav1.DeleteOptions{}), nil},
	}
	for _, tc := range cases {
		wantForbidden(t, tc.name, tc.err, tc.want...)
	}
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "patched", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Labels["app"] != "x" || p.Annotations["example.com/keep"] != "1" || p.Spec.ActiveDeadlineSeconds != nil ||
		p.Annotations[contract.AnnotationGangState] == "" {
		t.Errorf("pod changed beyond the extender's annotation: labels %v annotations %v", p.Labels, p.Annotations)
	}
	if f, err := admin.CoreV1().Pods(ns).Get(ctx, "foreign", metav1.GetOptions{}); err != nil || f.Spec.NodeName != "" {
		t.Errorf("the refused Binding bound the pod anyway (%v)", err)
	}
}

// extenderTLS is cmd/scheduler-extender serving HTTPS with client certificates
// from the files manifests/certs/generate.sh wrote.
type extenderTLS struct {
	addr, certs, log string
	client           *http.Client // trusts the CA, presents kube-scheduler's certificate
	anonymous        *http.Client // trusts the CA, presents none
}

const extenderServerName = extenderName + "." + nsSystem + ".svc"

func startExtenderTLS(t *testing.T, ctx context.Context, kubeconfig, certs string) *extenderTLS {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "scheduler-extender")
	if err := buildExtender(ctx, bin); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "scheduler-extender.log")
	e := &extenderTLS{addr: freeLoopbackAddr(t), certs: certs, log: logPath}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// The shipped Deployment's TLS flags, with the generated files.
	cmd := exec.Command(bin, "-listen", e.addr, "-kubeconfig", kubeconfig,
		"-tls-cert-file", filepath.Join(certs, "scheduler-extender.crt"),
		"-tls-private-key-file", filepath.Join(certs, "scheduler-extender.key"),
		"-tls-client-ca-file", filepath.Join(certs, "ca.crt"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("scheduler-extender log:\n%s", controlplane.TailLines(string(b), 60))
			}
		}
	})
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client, err := tls.LoadX509KeyPair(filepath.Join(certs, "scheduler-client.crt"), filepath.Join(certs, "scheduler-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(certs []tls.Certificate) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, ServerName: extenderServerName, Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	e.client, e.anonymous = mk([]tls.Certificate{client}), mk(nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("scheduler-extender exited during start-up:\n%s", controlplane.TailLines(string(b), 30))
		default:
		}
		if code, _, err := e.call(e.anonymous, http.MethodGet, "/readyz"); err == nil && code == http.StatusOK {
			return e
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatal("scheduler-extender not ready over HTTPS within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *extenderTLS) call(c *http.Client, method, path string) (int, string, error) {
	req, err := http.NewRequest(method, "https://"+e.addr+path, strings.NewReader("{}"))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func testExtenderTLS(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, root string,
	objs []*unstructured.Unstructured) {
	certs := filepath.Join(root, "certs", "generated")
	// The extender runs as its own service account: its Bindings and patches
	// pass the RBAC and the policy of the install.
	kubeconfig := writeTokenKubeconfig(t, cp, saToken(t, ctx, cp.Client(), nsSystem, extenderName, nil))
	e := startExtenderTLS(t, ctx, kubeconfig, certs)

	for _, c := range []struct {
		name, method, path string
		client             *http.Client
		want               int
	}{
		{"probe without a client certificate", http.MethodGet, "/healthz", e.anonymous, http.StatusOK},
		{"metrics without a client certificate", http.MethodGet, "/metrics", e.anonymous, http.StatusOK},
		{"bind without a client certificate", http.MethodPost, "/bind", e.anonymous, http.StatusForbidden},
		{"status without a client certificate", http.MethodGet, "/status", e.anonymous, http.StatusForbidden},
		{"status with kube-scheduler's certificate", http.MethodGet, "/status", e.client, http.StatusOK},
	} {
		if code, body, err := e.call(c.client, c.method, c.path); err != nil || code != c.want {
			t.Errorf("%s: %d %q %v, want %d", c.name, code, body, err, c.want)
		}
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Post("http://"+e.addr+"/bind", "application/json", strings.NewReader("{}")); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served")
		}
	}

	// The shipped KubeSchedulerConfiguration with the test's address and files.
	cfg := schedulerConfigOf(t, objs)
	ext := extenderEntry(t, cfg)
	ext["urlPrefix"] = "https://" + e.addr
	tlsCfg := ext["tlsConfig"].(map[string]any)
	tlsCfg["caFile"] = filepath.Join(certs, "ca.crt")
	tlsCfg["certFile"] = filepath.Join(certs, "scheduler-client.crt")
	tlsCfg["keyFile"] = filepath.Join(certs, "scheduler-client.key")
	if tlsCfg["serverName"] != extenderServerName {
		t.Fatalf("tlsConfig.serverName %v, want %s", tlsCfg["serverName"], extenderServerName)
	}
	cfgYAML, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp.StartScheduler(t, string(cfgYAML))

	const ns = "mtls"
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c := &cluster{ctx: ctx, cp: cp}
	c.nodes(t, ns, twoNodes(2, modelA100)...)
	c.create(t, ns, podSpec{name: "single", gpus: 1})
	c.createPodGroup(t, ns, 2)
	c.create(t, ns, memberSpec(extender.DialectPodGroup, 2, 0, 1, 0), memberSpec(extender.DialectPodGroup, 2, 1, 1, 0))
	bound := c.waitBound(t, ns, "single", "member-0", "member-1")
	for name, p := range bound {
		if p.Annotations[contract.AnnotationGPUDevices] == "" {
			t.Errorf("%s bound to %s without the extender's devices annotation: not bound through the extender",
				name, p.Spec.NodeName)
		}
	}
	// The plan is recorded on the members the planning filter did not come
	// from (a patch sent in the background, "nudging gang member"): at least
	// one of two, and no write of the extender was refused.
	deadline := time.Now().Add(15 * time.Second)
	for {
		nudged := 0
		for _, name := range []string{"member-0", "member-1"} {
			p, err := cp.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Annotations[contract.AnnotationGangState] != "" {
				nudged++
			}
		}
		if nudged > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no gang member carries %s: the extender's pod patch did not pass", contract.AnnotationGangState)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log, err := os.ReadFile(e.log); err != nil || strings.Contains(string(log), "forbidden") {
		t.Errorf("the extender was refused a write (%v):\n%s", err, controlplane.TailLines(string(log), 30))
	}
	code, body, err := e.call(e.client, http.MethodGet, "/metrics")
	if err != nil || code != http.StatusOK || !strings.Contains(body, `understory_extender_requests_total{code="200",verb="bind"}`) {
		t.Errorf("extender metrics (%d, %v) show no successful bind:\n%s", code, err, controlplane.TailLines(body, 20))
	}
}
