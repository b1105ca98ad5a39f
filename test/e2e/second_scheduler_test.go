package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/extenderharness"
)

// What components/second-scheduler names.
const (
	secondScheduler       = "understory-scheduler"
	secondSchedulerConfig = "understory-second-scheduler-config" // + kustomize's hash suffix
	schedulerClientSecret = "understory-scheduler-client-tls"
	schedulerClientMount  = "/etc/understory/scheduler-client"
)

// TestSecondScheduler installs the managed-cluster mode (base + certs +
// components/second-scheduler, built with kubectl kustomize) as far as a control
// plane without kubelet allows, and checks it end to end:
//
//   - the second kube-scheduler runs the component's KubeSchedulerConfiguration
//     with only the extender's URL (a loopback address standing for the Service's
//     ClusterIP; serverName kept), the certificate paths (the Secret's files) and
//     the kubeconfig changed, as the component's service account (a token, with
//     the component's RBAC applied), with leader election on;
//   - the extender (in-process, as the harness runs it) is served over TLS with
//     the build's extender certificate and requires a client certificate from
//     its CA, as -tls-client-ca-file does;
//   - a plain default-scheduler runs beside it;
//   - the webhook (in-process) runs with the -scheduler-name the component adds
//     to its Deployment, behind the component's MutatingWebhookConfiguration.
//
// A batch pod and a GPU pod get schedulerName understory-scheduler and are bound
// through the extender by it (their Scheduled event is understory-scheduler's); an
// LS pod is placed by default-scheduler without the extender; the Lease
// understory-system/understory-scheduler is held. Its /metrics refuses an anonymous
// caller and serves a scraper's token bound to the component's ClusterRole
// understory-scheduler-metrics-reader (kube-scheduler, as the component's service
// account, has the API server review it). Not covered here (no kubelet):
// the Deployment's pods, probes and Secret mount; the real-node e2e covers those.
func TestSecondScheduler(t *testing.T) {
	ctx, cp := startControlPlane(t, 4*time.Minute)
	c := cp.Client()
	k := newKubectl(t, cp.Kubeconfig())
	root := copyManifests(t)
	objs := k.build(t, ctx, composition(t, root, "second-scheduler", "certs", "components/second-scheduler"))

	t.Run("rendered objects", func(t *testing.T) { checkSecondSchedulerObjects(t, objs) })
	if t.Failed() {
		return
	}

	// The component's identity and RBAC, applied as rendered.
	if err := cp.CreateNamespace(ctx, nsSystem); err != nil {
		t.Fatal(err)
	}
	var rbac []*unstructured.Unstructured
	for _, kn := range [][2]string{
		{"ServiceAccount", secondScheduler}, {"ClusterRoleBinding", secondScheduler},
		{"ClusterRoleBinding", secondScheduler + "-volume"}, {"RoleBinding", secondScheduler + "-authentication-reader"},
		{"Role", secondScheduler + "-lease"}, {"RoleBinding", secondScheduler + "-lease"},
	} {
		rbac = append(rbac, mustFind(t, objs, kn[0], kn[1]))
	}
	applyObjects(t, ctx, k, rbac)
	saKubeconfig := writeTokenKubeconfig(t, cp, saToken(t, ctx, c, nsSystem, secondScheduler, nil))

	// The Secrets, as their volumes would hold them.
	clientDir := secretFiles(t, mustFind(t, objs, "Secret", schedulerClientSecret))
	extenderDir := secretFiles(t, mustFind(t, objs, "Secret", "understory-scheduler-extender-tls"))

	// The extender watches PodGroups (gangs).
	if _, err := cp.InstallCRD(ctx, controlplane.PodGroupCRD()); err != nil {
		t.Fatal(err)
	}
	// The extender behind TLS with client certificates (its -tls-client-ca-file is
	// its Secret's ca.crt).
	ext := extenderharness.Start(ctx, t, cp, extenderharness.Options{TrackPods: true})
	serving, err := tls.LoadX509KeyPair(filepath.Join(extenderDir, "tls.crt"), filepath.Join(extenderDir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM(readFile(t, filepath.Join(extenderDir, "ca.crt"))) {
		t.Fatal("extender ca.crt holds no certificate")
	}
	tlsExt := httptest.NewUnstartedServer(ext)
	tlsExt.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serving},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	tlsExt.StartTLS()
	t.Cleanup(tlsExt.Close)

	// The component's scheduler configuration: only the URL, the certificate paths
	// and (in the harness) the kubeconfig change.
	cfg := renderedSchedulerConfig(t, objs)
	e := cfg["extenders"].([]any)[0].(map[string]any)
	e["urlPrefix"] = tlsExt.URL // https://127.0.0.1:PORT, as a ClusterIP would be written
	tc := e["tlsConfig"].(map[string]any)
	for _, f := range []string{"caFile", "certFile", "keyFile"} {
		tc[f] = filepath.Join(clientDir, filepath.Base(tc[f].(string)))
	}
	cfgYAML, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sched := cp.StartScheduler(t, string(cfgYAML), controlplane.WithKubeconfig(saKubeconfig), controlplane.WithLeaderElection())
	cp.StartScheduler(t, "") // default-scheduler, leader election off

	// The webhook in second-scheduler mode, as the component configures it.
	startSecondSchedulerWebhook(t, ctx, cp, objs)
	const ns = "ss-apps"
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	waitAdmissionActive(t, ctx, c, ns, false)

	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
		contract.ResourceGPU:      resource.MustParse("2"),
		contract.ResourceBatchCPU: resource.MustParse("4000"), contract.ResourceBatchMemory: resource.MustParse("8Gi"),
	}
	if _, err := cp.CreateNodes(ctx, "ss-node", 2, capacity, map[string]string{extender.LabelGPUProduct: modelA100}); err != nil {
		t.Fatal(err)
	}

	batch := controlplane.NewPod(ns, "batch", corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")})
	batch.Annotations = map[string]string{contract.AnnotationQOSClass: "batch"}
	gpu := controlplane.NewPod(ns, "gpu", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})
	gpu.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("100m"), contract.ResourceGPU: resource.MustParse("1")}
	gpu.Spec.Containers[0].Resources.Requests[contract.ResourceGPU] = resource.MustParse("1")
	ls := controlplane.NewPod(ns, "ls", corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")})
	ls.Annotations = map[string]string{contract.AnnotationQOSClass: "LS"}
	ls.Spec.Containers[0].Resources.Limits = ls.Spec.Containers[0].Resources.Requests.DeepCopy()
	other := controlplane.NewPod(ns, "other", nil)
	other.Annotations = map[string]string{contract.AnnotationQOSClass: "batch"}
	other.Spec.SchedulerName = "some-other-scheduler"

	want := map[string]string{batch.Name: secondScheduler, gpu.Name: secondScheduler,
		ls.Name: admission.DefaultSchedulerName, other.Name: "some-other-scheduler"}
	for _, p := range []*corev1.Pod{batch, gpu, ls, other} {
		got, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.SchedulerName != want[p.Name] {
			t.Errorf("pod %s: schedulerName %q after admission, want %q", p.Name, got.Spec.SchedulerName, want[p.Name])
		}
	}
	if t.Failed() {
		return
	}

	cl := &cluster{ctx: ctx, cp: cp, ext: ext}
	bound := cl.waitBound(t, ns, batch.Name, gpu.Name, ls.Name)
	for _, name := range []string{batch.Name, gpu.Name} {
		cl.checkThroughExtender(t, bound[name])
		waitScheduledBy(t, ctx, cp, ns, name, secondScheduler)
	}
	if a := bound[gpu.Name].Annotations[contract.AnnotationGPUDevices]; a == "" {
		t.Errorf("GPU pod bound without %s", contract.AnnotationGPUDevices)
	}
	if pc := ext.PodCalls(ns, ls.Name); pc.Filter+pc.Bind != 0 {
		t.Errorf("LS pod reached the extender: %+v", pc)
	}
	waitScheduledBy(t, ctx, cp, ns, ls.Name, admission.DefaultSchedulerName)

	lease, err := c.CoordinationV1().Leases(nsSystem).Get(ctx, secondScheduler, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the second scheduler's lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("lease %s/%s has no holder: %+v", nsSystem, secondScheduler, lease.Spec)
	} else {
		t.Logf("lease %s/%s held by %s", nsSystem, secondScheduler, *lease.Spec.HolderIdentity)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, other.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("a pod naming a scheduler nobody runs was bound (%v): %s", err, p.Spec.NodeName)
	}
	t.Run("metrics for an authorised scraper", func(t *testing.T) {
		checkSecondSchedulerMetrics(t, ctx, cp, k, objs, sched.URL())
	})
}

// checkSecondSchedulerMetrics scrapes the second scheduler's /metrics as Prometheus
// does: the component's ClusterRole understory-scheduler-metrics-reader bound to a
// scraper's service account, whose token kube-scheduler (running as the component's
// service account, with the component's RBAC) has the API server review. An anonymous
// caller is refused; the scraper reads the metrics the alerts use: the leader's
// leader_election_master_status 1 and its scheduled attempts.
func checkSecondSchedulerMetrics(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, k kubectl,
	objs []*unstructured.Unstructured, url string) {
	const role, scraperNS, scraper = "understory-scheduler-metrics-reader", "monitoring", "prometheus"
	applyObjects(t, ctx, k, []*unstructured.Unstructured{mustFind(t, objs, "ClusterRole", role)})
	c := cp.Client()
	if err := cp.CreateNamespace(ctx, scraperNS); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(scraperNS).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: scraper, Namespace: scraperNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: scraperNS, Name: scraper}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := saToken(t, ctx, c, scraperNS, scraper, nil)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(readFile(t, cp.CAFile())) {
		t.Fatal("the control plane's CA file holds no certificate")
	}
	hc := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	get := func(token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		return resp.StatusCode, string(b)
	}
	if code, body := get(""); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("anonymous /metrics: %d %.200s, want 401 or 403", code, body)
	}
	want := []string{`leader_election_master_status{name="kube-scheduler"} 1`,
		`scheduler_schedule_attempts_total{profile="` + secondScheduler + `",result="scheduled"}`}
	var code int
	var body string
	// kube-scheduler caches each review's answer for 10 s.
	served := testenv.PollEvery(30*time.Second, 500*time.Millisecond, func() bool {
		code, body = get(token)
		return code == http.StatusOK
	})
	if !served {
		t.Fatalf("/metrics with %s/%s's token (bound to %s): %d %.200s", scraperNS, scraper, role, code, body)
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("/metrics has no %s", w)
		}
	}
}

// checkSecondSchedulerObjects checks what the component renders against the brief
// of docs/second-scheduler.md.
func checkSecondSchedulerObjects(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/part-of"] != "understory" && o.GetKind() != "CustomResourceDefinition" {
			t.Errorf("%s %s is not labelled app.kubernetes.io/part-of: understory", o.GetKind(), o.GetName())
		}
	}
	pod := podTemplate(t, mustFind(t, objs, "Deployment", secondScheduler)).Spec
	if pod.ServiceAccountName != secondScheduler || pod.HostNetwork || len(pod.Containers) != 1 {
		t.Errorf("pod: serviceAccount %q, hostNetwork %v, %d containers", pod.ServiceAccountName, pod.HostNetwork, len(pod.Containers))
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a host path", v.Name)
		}
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil ||
		sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v, want non-root with seccomp RuntimeDefault", sc)
	}
	ctr := pod.Containers[0]
	if ctr.Image != "registry.k8s.io/kube-scheduler:"+k8sVersion(t) || ctr.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s (%s), want registry.k8s.io/kube-scheduler:%s, IfNotPresent", ctr.Image, ctr.ImagePullPolicy, k8sVersion(t))
	}
	if sc := ctr.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v, want no escalation, read-only root, all capabilities dropped", sc)
	}
	for probe, path := range map[*corev1.Probe]string{ctr.LivenessProbe: "/livez", ctr.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || probe.HTTPGet.Scheme != corev1.URISchemeHTTPS ||
			probe.HTTPGet.Port.String() != "https" {
			t.Errorf("probe %+v, want GET %s over HTTPS on the https port", probe, path)
		}
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != 10259 {
		t.Errorf("ports %+v, want https 10259", ctr.Ports)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == schedulerClientSecret && mounts[v.Name] != schedulerClientMount {
			t.Errorf("the client Secret is mounted at %q, want %s", mounts[v.Name], schedulerClientMount)
		}
	}

	cfg := renderedSchedulerConfig(t, objs)
	if profiles, _ := cfg["profiles"].([]any); len(profiles) != 1 ||
		profiles[0].(map[string]any)["schedulerName"] != secondScheduler {
		t.Errorf("profiles %v, want one: %s", cfg["profiles"], secondScheduler)
	}
	le, _ := cfg["leaderElection"].(map[string]any)
	if le["leaderElect"] != true || le["resourceNamespace"] != nsSystem || le["resourceName"] != secondScheduler {
		t.Errorf("leaderElection %v, want the lease %s/%s", le, nsSystem, secondScheduler)
	}
	if cc, ok := cfg["clientConnection"].(map[string]any); ok && cc["kubeconfig"] != nil {
		t.Errorf("clientConnection.kubeconfig %v, want none (in-cluster)", cc["kubeconfig"])
	}
	if cfg["percentageOfNodesToScore"] != float64(100) {
		t.Errorf("percentageOfNodesToScore %v, want 100", cfg["percentageOfNodesToScore"])
	}
	// The extender block is the host scheduler's but for the certificate paths.
	manifest, err := controlplane.ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	host := map[string]any{}
	if err := yaml.Unmarshal(manifest, &host); err != nil {
		t.Fatal(err)
	}
	ours, theirs := cfg["extenders"].([]any)[0].(map[string]any), host["extenders"].([]any)[0].(map[string]any)
	tc := ours["tlsConfig"].(map[string]any)
	for f, want := range map[string]string{"caFile": "ca.crt", "certFile": "tls.crt", "keyFile": "tls.key"} {
		if tc[f] != schedulerClientMount+"/"+want {
			t.Errorf("tlsConfig.%s %v, want %s/%s", f, tc[f], schedulerClientMount, want)
		}
		tc[f] = theirs["tlsConfig"].(map[string]any)[f]
	}
	if !reflect.DeepEqual(ours, theirs) {
		t.Errorf("extender block differs from manifests/scheduler's beyond the certificate paths:\n ours %v\n host %v", ours, theirs)
	}

	// The webhook runs in second-scheduler mode.
	adm := podTemplate(t, mustFind(t, objs, "Deployment", admissionName)).Spec.Containers[0]
	if !slices.Contains(adm.Args, "-scheduler-name="+secondScheduler) {
		t.Errorf("webhook args %q lack -scheduler-name=%s", adm.Args, secondScheduler)
	}

	// The client certificate verifies, for client auth, against the CA the extender
	// trusts (its Secret's ca.crt, its -tls-client-ca-file).
	client := secretMap(t, mustFind(t, objs, "Secret", schedulerClientSecret))
	extCA := secretMap(t, mustFind(t, objs, "Secret", "understory-scheduler-extender-tls"))["ca.crt"]
	if client["ca.crt"] != extCA {
		t.Error("the scheduler client Secret's ca.crt is not the extender's CA")
	}
	block, _ := pem.Decode([]byte(client["tls.crt"]))
	if block == nil {
		t.Fatal("client tls.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(extCA))
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify against the extender's client CA: %v", err)
	}
}

// renderedSchedulerConfig is the component's KubeSchedulerConfiguration, from its
// generated ConfigMap.
func renderedSchedulerConfig(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), secondSchedulerConfig+"-") {
			raw, _, _ := unstructured.NestedString(o.Object, "data", schedulerConfKey)
			cfg := map[string]any{}
			if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
				t.Fatalf("%s: %v", o.GetName(), err)
			}
			return cfg
		}
	}
	t.Fatalf("no ConfigMap %s-<hash>", secondSchedulerConfig)
	return nil
}

// k8sVersion is the Kubernetes version the project tests (scripts/k8s-binaries.sh).
func k8sVersion(t *testing.T) string {
	t.Helper()
	for _, l := range strings.Split(string(readFile(t, "../../scripts/k8s-binaries.sh")), "\n") {
		if v, ok := strings.CutPrefix(l, "K8S_VERSION="); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no K8S_VERSION= in scripts/k8s-binaries.sh")
	return ""
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// secretMap decodes a rendered Secret's data.
func secretMap(t *testing.T, o *unstructured.Unstructured) map[string]string {
	t.Helper()
	data, _, _ := unstructured.NestedStringMap(o.Object, "data")
	out := map[string]string{}
	for k, v := range data {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Fatalf("Secret %s %s: %v", o.GetName(), k, err)
		}
		out[k] = string(b)
	}
	return out
}

// secretFiles writes a rendered Secret's keys as files, as its volume holds them,
// and returns the directory.
func secretFiles(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range secretMap(t, o) {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// applyObjects applies objs with kubectl, as the install would.
func applyObjects(t *testing.T, ctx context.Context, k kubectl, objs []*unstructured.Unstructured) {
	t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	f := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(f, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	k.must(t, ctx, "apply", "-f", f)
}

// startSecondSchedulerWebhook runs the webhook in-process with the profiles and
// the -scheduler-name of the rendered objects, and registers the rendered
// MutatingWebhookConfiguration pointed at it.
func startSecondSchedulerWebhook(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane,
	objs []*unstructured.Unstructured) {
	t.Helper()
	var cm corev1.ConfigMap
	fromUnstructured(t, mustFind(t, objs, "ConfigMap", admissionName), &cm)
	profiles, err := admission.ParseProfiles([]byte(cm.Data["profiles.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	var schedulerName string
	for _, a := range podTemplate(t, mustFind(t, objs, "Deployment", admissionName)).Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "-scheduler-name="); ok {
			schedulerName = v
		}
	}
	var mwc admissionregv1.MutatingWebhookConfiguration
	fromUnstructured(t, mustFind(t, objs, "MutatingWebhookConfiguration", admissionName), &mwc)
	registerWebhookConfig(t, ctx, cp, profiles, &mwc, admission.WithSchedulerName(schedulerName))
}

// waitScheduledBy waits for the Scheduled event of pod ns/name and checks which
// scheduler profile reported it (events.k8s.io reportingController).
func waitScheduledBy(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, ns, name, want string) {
	t.Helper()
	var got []string
	testenv.WaitFor(t, 30*time.Second, "the Scheduled event of pod "+name, func() bool {
		by, err := controlplane.ScheduledBy(ctx, cp.Client(), ns, name)
		got = by
		return err == nil && len(by) > 0
	})
	if !slices.Equal(got, []string{want}) {
		t.Errorf("pod %s: Scheduled reported by %v, want %s", name, got, want)
	}
	t.Logf("pod %s: Scheduled by %v", name, got)
}

// TestSecondSchedulerGPUSharePolicy checks the fence of the second-scheduler mode
// against a webhook outage on a real API server: the component's policy
// understory-gpu-share-scheduler, as kustomize renders it with the install's other
// policies, is applied with the component's MutatingWebhookConfiguration pointed at a
// port nobody listens on
// (failurePolicy Ignore: pods are admitted unmutated, as when the webhook is down).
// A pod asking for understory.io/gpu-milli that names default-scheduler (or none) is
// refused with the rule's name, in a container or an init container; named for the
// second scheduler it is admitted; pods without GPU shares (a plain pod, a whole-GPU
// pod) stay with the default scheduler. The Go form (admission.ValidatePod with
// Rules.GPUShareScheduler) agrees on every case.
func TestSecondSchedulerGPUSharePolicy(t *testing.T) {
	ctx, cp := startControlPlane(t, 3*time.Minute)
	c := cp.Client()
	k := newKubectl(t, cp.Kubeconfig())
	root := copyManifests(t)
	objs := k.build(t, ctx, composition(t, root, "second-scheduler", "certs", "components/second-scheduler"))

	// The webhook is down: its configuration points at a closed port.
	var mwc admissionregv1.MutatingWebhookConfiguration
	fromUnstructured(t, mustFind(t, objs, "MutatingWebhookConfiguration", admissionName), &mwc)
	dead := "https://127.0.0.1:1/mutate"
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig = admissionregv1.WebhookClientConfig{URL: &dead}
	}
	mwc.ResourceVersion = ""
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Every policy the install renders (the base's pod rules included), as applied.
	var policies []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" || o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			policies = append(policies, o)
		}
	}
	applyObjects(t, ctx, k, policies)

	const ns = "ss-fence"
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	share := corev1.ResourceList{contract.ResourceGPUMilli: resource.MustParse("500")}
	gpuShare := func(name, scheduler string, init bool) *corev1.Pod {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})
		p.Spec.SchedulerName = scheduler
		ctr := &p.Spec.Containers[0]
		if init {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: ctr.Image}}
			ctr = &p.Spec.InitContainers[0]
		}
		ctr.Resources.Requests = share.DeepCopy()
		ctr.Resources.Limits = share.DeepCopy()
		return p
	}
	wholeGPU := controlplane.NewPod(ns, "whole-gpu", nil)
	wholeGPU.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{contract.ResourceGPU: resource.MustParse("1")},
		Limits:   corev1.ResourceList{contract.ResourceGPU: resource.MustParse("1")}}

	// Policies take effect asynchronously: wait for the base's pod rules (present with
	// or without this component's policy), then give the others a moment by the same
	// probe on the component's rule, which must not be needed for the verdicts below.
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var lastErr error
	if !testenv.PollEvery(60*time.Second, 200*time.Millisecond, func() bool {
		probe := controlplane.NewPod(ns, "probe", nil)
		probe.Annotations = map[string]string{contract.AnnotationQOSClass: "nope"}
		_, lastErr = c.CoreV1().Pods(ns).Create(ctx, probe, dry)
		return lastErr != nil && strings.Contains(lastErr.Error(), "(rule "+admission.RuleQOSClassValue+")")
	}) {
		t.Fatalf("the install's policies not in force after 60s: last answer %v", lastErr)
	}
	testenv.PollEvery(10*time.Second, 200*time.Millisecond, func() bool {
		_, err := c.CoreV1().Pods(ns).Create(ctx, gpuShare("probe", "", false), dry)
		return err != nil
	})

	rules := admission.DefaultRules()
	rules.GPUShareScheduler = secondScheduler
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		refused bool
	}{
		{"gpu share, default scheduler", gpuShare("share-default", admission.DefaultSchedulerName, false), true},
		{"gpu share, no scheduler named", gpuShare("share-unnamed", "", false), true},
		{"gpu share in an init container", gpuShare("share-init", "", true), true},
		{"gpu share, another scheduler", gpuShare("share-other", "some-other-scheduler", false), true},
		{"gpu share, the second scheduler", gpuShare("share-second", secondScheduler, false), false},
		{"no gpu, default scheduler", controlplane.NewPod(ns, "plain",
			corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}), false},
		{"whole gpu, default scheduler", wholeGPU, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goErr := admission.ValidatePod(admission.PodRequest{Operation: "CREATE", Pod: tc.pod, Username: e2eAdmin}, rules)
			if (goErr != nil) != tc.refused {
				t.Errorf("ValidatePod = %v, want refused %v", goErr, tc.refused)
			}
			got, err := c.CoreV1().Pods(ns).Create(ctx, tc.pod, metav1.CreateOptions{})
			if tc.refused {
				wantRejected(t, err, admission.RuleGPUShareScheduler, "spec.schedulerName")
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			want := tc.pod.Spec.SchedulerName
			if want == "" {
				want = admission.DefaultSchedulerName
			}
			if got.Spec.SchedulerName != want {
				t.Errorf("schedulerName %q, want %q (the webhook is down: nothing changes it)", got.Spec.SchedulerName, want)
			}
		})
	}
}
