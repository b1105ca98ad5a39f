package e2e_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/certreload"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/kueuequota"
	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
)

// admissionManifests is where the shipped manifests live, relative to this package.
const admissionManifests = "../../manifests/admission"

// readManifestDocs returns the YAML documents of a manifest file.
func readManifestDocs(t *testing.T, name string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(admissionManifests, name))
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// manifestObject decodes the document of file whose kind is kind into out.
func manifestObject(t *testing.T, file, kind string, out any) {
	t.Helper()
	for _, d := range readManifestDocs(t, file) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			t.Fatal(err)
		}
		if tm.Kind == kind {
			if err := yaml.UnmarshalStrict(d, out); err != nil {
				t.Fatalf("%s %s: %v", file, kind, err)
			}
			return
		}
	}
	t.Fatalf("%s has no %s", file, kind)
}

// webhookServer is the admission server in-process, over real TLS on loopback.
type webhookServer struct {
	url  string
	hs   *http.Server
	done chan struct{}
}

func startWebhook(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, profiles admission.Profiles,
	certs *controlplane.WebhookCerts, opts ...admission.MutatorOption) *webhookServer {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certs.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, certs.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := admission.NewClusterCache(cp.Client(), 0)
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); cluster.Shutdown() })
	cluster.Start(cctx)
	mut, err := admission.NewMutator(profiles, cluster, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admission.NewServer(admission.DefaultConfig(), admission.Deps{
		Mutator: mut, Cluster: cluster, Registry: prometheus.NewRegistry(), Ready: cluster.HasSynced,
	})
	if err != nil {
		t.Fatal(err)
	}
	reloader, err := certreload.New(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &webhookServer{
		url:  "https://" + ln.Addr().String(),
		hs:   &http.Server{Handler: srv.Handler(), TLSConfig: &tls.Config{GetCertificate: reloader.GetCertificate}},
		done: make(chan struct{}),
	}
	go func() {
		defer close(w.done)
		if err := w.hs.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("webhook server: %v", err)
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *webhookServer) stop() {
	w.hs.Close()
	<-w.done
}

// TestAdmissionEndToEnd runs the admission webhook in-process behind a real
// kube-apiserver v1.37.2, with the shipped MutatingWebhookConfiguration (pointed at
// the test's URL), ValidatingAdmissionPolicy, binding, profiles and PriorityClass
// from manifests/admission. It is skipped when the binaries are missing, unless
// CI=true (see package controlplane).
func TestAdmissionEndToEnd(t *testing.T) {
	ctx, cp := startControlPlane(t, 3*time.Minute)
	c := cp.Client()

	// The shipped profiles and their PriorityClass, plus a globalDefault class: the
	// Priority plugin writes its name into every pod before the webhook runs.
	profiles, pc := shippedProfiles(t)
	defaultPC := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-default"}, Value: 10, GlobalDefault: true}
	for _, p := range []*schedulingv1.PriorityClass{&pc, defaultPC} {
		if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	wh := registerWebhook(t, ctx, cp, profiles)
	installPolicies(t, ctx, c)

	namespaces := map[string]map[string]string{
		"adm-batch":      nil,
		"adm-profile":    {admission.LabelProfile: "batch"},
		"adm-ls-allowed": {admission.LabelAllowLSBestEffort: "true"},
	}
	createNamespaces(t, ctx, cp, namespaces)
	waitAdmissionActive(t, ctx, c, "adm-batch", true)

	create := func(p *corev1.Pod) (*corev1.Pod, error) {
		return c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	}
	batchPod := func(ns, name string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")})
		p.Annotations = map[string]string{contract.AnnotationQOSClass: "batch"}
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: p.Spec.Containers[0].Image,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}
		return p
	}

	t.Run("annotated batch pod is moved to batch resources", func(t *testing.T) {
		got, err := create(batchPod("adm-batch", "batch"))
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, got, "1000", "256Mi")
		if r := got.Spec.InitContainers[0].Resources; !qEq(r.Requests[contract.ResourceBatchCPU], "100") {
			t.Errorf("init container resources %v, want batch-cpu 100", r)
		}
	})

	t.Run("Koordinator's batch resources are renamed, in any namespace", func(t *testing.T) {
		p := controlplane.NewPod("adm-ls-allowed", "koord-batch", corev1.ResourceList{
			contract.ResourceKoordinatorBatchCPU: resource.MustParse("1500"), contract.ResourceKoordinatorBatchMemory: resource.MustParse("1Gi")})
		p.Labels = map[string]string{qos.LabelKoordinatorQOS: "BE"}
		p.Spec.Containers[0].Resources.Limits = p.Spec.Containers[0].Resources.Requests.DeepCopy()
		got, err := create(p)
		if err != nil {
			t.Fatal(err)
		}
		r := got.Spec.Containers[0].Resources
		for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
			if !qEq(l[contract.ResourceBatchCPU], "1500") || !qEq(l[contract.ResourceBatchMemory], "1Gi") {
				t.Errorf("resources %v: want batch-cpu 1500 and batch-memory 1Gi under Understory's names", r)
			}
			if _, ok := l[contract.ResourceKoordinatorBatchCPU]; ok {
				t.Errorf("resources %v: Koordinator's name left", r)
			}
		}
		// Both names of one resource: refused, with the container named.
		both := controlplane.NewPod("adm-ls-allowed", "koord-both", corev1.ResourceList{
			contract.ResourceKoordinatorBatchCPU: resource.MustParse("100"), contract.ResourceBatchCPU: resource.MustParse("100")})
		both.Spec.Containers[0].Resources.Limits = both.Spec.Containers[0].Resources.Requests.DeepCopy()
		if _, err := create(both); err == nil || !strings.Contains(err.Error(), "Koordinator alias") {
			t.Errorf("a pod with both names: err %v, want a refusal naming the alias", err)
		}
	})

	t.Run("profile namespace: class, PriorityClass and priority", func(t *testing.T) {
		p := controlplane.NewPod("adm-profile", "profiled", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")})
		got, err := create(p)
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, got, "200", "")
		if got.Annotations[contract.AnnotationQOSClass] != "batch" || got.Labels[admission.LabelProfile] != "batch" {
			t.Errorf("annotations %v labels %v: want the profile's", got.Annotations, got.Labels)
		}
		if got.Spec.PriorityClassName != pc.Name || got.Spec.Priority == nil || *got.Spec.Priority != pc.Value ||
			got.Spec.PreemptionPolicy == nil || *got.Spec.PreemptionPolicy != *pc.PreemptionPolicy {
			t.Errorf("priority %q/%v/%v, want %q/%d/%s", got.Spec.PriorityClassName, got.Spec.Priority,
				got.Spec.PreemptionPolicy, pc.Name, pc.Value, *pc.PreemptionPolicy)
		}
	})

	t.Run("qos-class cannot change on update", func(t *testing.T) {
		p, err := c.CoreV1().Pods("adm-batch").Get(ctx, "batch", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Labels = map[string]string{"unrelated": "update"}
		if p, err = c.CoreV1().Pods("adm-batch").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("unrelated update rejected: %v", err)
		}
		for _, mutate := range []func(*corev1.Pod){
			func(p *corev1.Pod) { p.Annotations[contract.AnnotationQOSClass] = "LS" },
			func(p *corev1.Pod) { delete(p.Annotations, contract.AnnotationQOSClass) },
		} {
			q := p.DeepCopy()
			mutate(q)
			_, err := c.CoreV1().Pods("adm-batch").Update(ctx, q, metav1.UpdateOptions{})
			wantRejected(t, err, admission.RuleQOSClassImmutable, "")
		}
	})

	t.Run("Koordinator's class key cannot change on update", func(t *testing.T) {
		p := controlplane.NewPod("adm-batch", "koord", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
		p.Labels = map[string]string{qos.LabelKoordinatorQOS: "BE"}
		p, err := create(p)
		if err != nil {
			t.Fatal(err)
		}
		p.Labels["unrelated"] = "update"
		if p, err = c.CoreV1().Pods("adm-batch").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("unrelated update rejected: %v", err)
		}
		for _, tc := range []struct {
			field  string
			mutate func(*corev1.Pod)
		}{
			{labelKoord, func(p *corev1.Pod) { p.Labels[qos.LabelKoordinatorQOS] = "LSR" }},
			{labelKoord, func(p *corev1.Pod) { delete(p.Labels, qos.LabelKoordinatorQOS) }},
			{annotationKoord, func(p *corev1.Pod) {
				p.Annotations = map[string]string{qos.AnnotationKoordinatorQOS: "LS"}
			}},
		} {
			q := p.DeepCopy()
			tc.mutate(q)
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Update, Old: p, Pod: q, Username: e2eAdmin},
				admission.RuleQOSClassImmutable)
			_, err := c.CoreV1().Pods("adm-batch").Update(ctx, q, metav1.UpdateOptions{})
			wantRejected(t, err, admission.RuleQOSClassImmutable, tc.field)
		}
	})

	lsPod := func(ns, name string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, nil)
		p.Annotations = map[string]string{contract.AnnotationQOSClass: "ls"}
		return p
	}
	// koordPod is a BestEffort pod with Koordinator's class key as label and
	// annotation ("" absent).
	koordPod := func(ns, name, label, annotation string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, nil)
		if label != "" {
			p.Labels = map[string]string{qos.LabelKoordinatorQOS: label}
		}
		if annotation != "" {
			p.Annotations = map[string]string{qos.AnnotationKoordinatorQOS: annotation}
		}
		return p
	}
	gangPod := func(name, key, v string) *corev1.Pod {
		p := controlplane.NewPod("adm-batch", name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
		p.Annotations = map[string]string{key: v}
		return p
	}
	rejections := []struct {
		name  string
		pod   *corev1.Pod
		rule  string // "" accepted
		field string // the field the rejection names; "" a metadata.annotations one
	}{
		{"LS on BestEffort outside the labelled namespace", lsPod("adm-batch", "ls-be"), admission.RuleLSBestEffort, ""},
		{"LS on BestEffort in the labelled namespace", lsPod("adm-ls-allowed", "ls-be"), "", ""},
		{"invalid class value", func() *corev1.Pod {
			p := lsPod("adm-batch", "bad-class")
			p.Annotations[contract.AnnotationQOSClass] = "Lſ" // folds to "ls" in Unicode, not in ASCII
			return p
		}(), admission.RuleQOSClassValue, ""},
		{"Koordinator label LSR on BestEffort", koordPod("adm-batch", "koord-lsr", "LSR", ""), admission.RuleLSBestEffort, labelKoord},
		{"Koordinator label lse on BestEffort", koordPod("adm-batch", "koord-lse", "lse", ""), admission.RuleLSBestEffort, labelKoord},
		{"Koordinator label SYSTEM on BestEffort", koordPod("adm-batch", "koord-system", "SYSTEM", ""), admission.RuleLSBestEffort,
			labelKoord},
		{"Koordinator annotation LS on BestEffort", koordPod("adm-batch", "koord-ann-ls", "", "LS"), admission.RuleLSBestEffort,
			annotationKoord},
		{"Koordinator label invalid, annotation Lsr", koordPod("adm-batch", "koord-skip", "gold", "Lsr"), admission.RuleLSBestEffort,
			annotationKoord},
		{"Koordinator label BE wins over annotation LS", koordPod("adm-batch", "koord-be", "BE", "LS"), "", ""},
		{"Koordinator label LSR in the labelled namespace", koordPod("adm-ls-allowed", "koord-lsr", "LSR", ""), "", ""},
		{"Koordinator label LSR on Burstable", func() *corev1.Pod {
			p := koordPod("adm-batch", "koord-burstable", "LSR", "")
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
			return p
		}(), "", ""},
		{"understory.io/qos-class BE wins over Koordinator LS", func() *corev1.Pod {
			p := koordPod("adm-batch", "koord-under-be", "LS", "")
			p.Annotations = map[string]string{contract.AnnotationQOSClass: "BE"}
			return p
		}(), "", ""},
		{"gpu-devices set at create by a user", func() *corev1.Pod {
			p := controlplane.NewPod("adm-batch", "gpu-at-create", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
			p.Annotations = map[string]string{contract.AnnotationGPUDevices: "0"}
			return p
		}(), admission.RuleGPUDevicesWriter, ""},
		{"volcano min-member 0", gangPod("gang-0", contract.AnnotationVolcanoMinMember, "0"), admission.RuleGangMinMember, ""},
		{"volcano min-member not an integer", gangPod("gang-x", contract.AnnotationVolcanoMinMember, "3x"), admission.RuleGangMinMember, ""},
		{"koordinator min-available above max", gangPod("gang-big", contract.AnnotationKoordinatorMinAvailable, "10001"),
			admission.RuleGangMinMember, ""},
		{"koordinator min-available negative", gangPod("gang-neg", contract.AnnotationKoordinatorMinAvailable, "-1"),
			admission.RuleGangMinMember, ""},
		{"valid gang", gangPod("gang-ok", contract.AnnotationVolcanoMinMember, "3"), "", ""},
	}
	for _, tc := range rejections {
		t.Run(tc.name, func(t *testing.T) {
			// The Go form of the policy must agree with the CEL one.
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Create, Pod: tc.pod,
				NamespaceLabels: namespaces[tc.pod.Namespace], Username: e2eAdmin}, tc.rule)
			_, err := create(tc.pod)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			wantRejected(t, err, tc.rule, tc.field)
		})
	}

	t.Run("only the scheduler extender writes gpu-devices", func(t *testing.T) { testGPUDevicesWriter(t, ctx, cp) })

	t.Run("webhook down: batch pod is created unmutated", func(t *testing.T) {
		wh.stop()
		got, err := create(batchPod("adm-batch", "fail-open"))
		if err != nil {
			t.Fatalf("create with the webhook down: %v (mutation must fail open)", err)
		}
		if got.Status.QOSClass != corev1.PodQOSBurstable || got.Annotations[contract.AnnotationQOSClass] != "batch" {
			t.Errorf("QoS %s annotations %v: want Burstable with the batch annotation kept", got.Status.QOSClass, got.Annotations)
		}
		if _, ok := got.Spec.Containers[0].Resources.Requests[contract.ResourceBatchCPU]; ok {
			t.Error("mutated although the webhook is down")
		}
	})
}

// waitAdmissionActive waits until the API server calls the webhook for pods in ns and,
// when policy is set, enforces the ValidatingAdmissionPolicy (both are picked up
// asynchronously after creation), probing with dry-run pods.
func waitAdmissionActive(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, policy bool) {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var mutated, enforced bool
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true,
		func(ctx context.Context) (bool, error) {
			probe := controlplane.NewPod(ns, "probe", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
			probe.Annotations = map[string]string{contract.AnnotationQOSClass: "batch"}
			got, err := c.CoreV1().Pods(ns).Create(ctx, probe, dry)
			mutated = err == nil && got.Annotations[contract.AnnotationOriginalResources] != ""
			if !policy {
				return mutated, nil
			}
			probe.Annotations[contract.AnnotationQOSClass] = "nope"
			_, lastErr = c.CoreV1().Pods(ns).Create(ctx, probe, dry)
			enforced = lastErr != nil && strings.Contains(lastErr.Error(), admission.RuleQOSClassValue)
			return mutated && enforced, nil
		})
	if err != nil {
		t.Fatalf("admission not active after 60s: webhook mutating %v, policy enforced %v (want %v; %v): %v",
			mutated, enforced, policy, lastErr, err)
	}
}

func qEq(q resource.Quantity, want string) bool { return q.Cmp(resource.MustParse(want)) == 0 }

// checkBatch checks the first container carries batch-cpu (and batch-memory unless
// "") as request = limit, no cpu/memory, and that the pod is BestEffort with its
// originals recorded.
func checkBatch(t *testing.T, p *corev1.Pod, cpu, mem string) {
	t.Helper()
	if p.Status.QOSClass != corev1.PodQOSBestEffort {
		t.Errorf("QoS class %s, want BestEffort", p.Status.QOSClass)
	}
	r := p.Spec.Containers[0].Resources
	for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
		if !qEq(l[contract.ResourceBatchCPU], cpu) {
			t.Errorf("batch-cpu %v in %v, want %s", l[contract.ResourceBatchCPU], l, cpu)
		}
		if mem != "" && !qEq(l[contract.ResourceBatchMemory], mem) {
			t.Errorf("batch-memory %v in %v, want %s", l[contract.ResourceBatchMemory], l, mem)
		}
	}
	o, err := admission.DecodeOriginalResources(p.Annotations[contract.AnnotationOriginalResources])
	if err != nil || len(o.Containers) != 1 {
		t.Errorf("original resources %+v, %v", o, err)
	}
}

// wantRejected fails unless err names rule and field (a metadata.annotations field
// when field is "").
func wantRejected(t *testing.T, err error, rule, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want rejected by rule %s", rule)
	}
	if field == "" {
		field = "metadata.annotations["
	}
	if !strings.Contains(err.Error(), "(rule "+rule+")") || !strings.Contains(err.Error(), field) {
		t.Fatalf("rejected with %q, want the field %s and rule %s", err, field, rule)
	}
}

// Fields the class-key rejections name.
const (
	labelKoord      = "metadata.labels[" + qos.LabelKoordinatorQOS + "]"
	annotationKoord = "metadata.annotations[" + qos.AnnotationKoordinatorQOS + "]"
)

// e2eAdmin stands for the test's admin user in the Go form of the rules: any user
// but the scheduler extender.
const e2eAdmin = "understory-e2e-admin"

// checkGoRule fails unless the Go form of the policy (admission.ValidatePod) rejects
// r by rule ("" accepts it), as the CEL one must.
func checkGoRule(t *testing.T, r admission.PodRequest, rule string) {
	t.Helper()
	err := admission.ValidatePod(r, admission.DefaultRules())
	if (err == nil) != (rule == "") || (err != nil && !strings.Contains(err.Error(), "(rule "+rule+")")) {
		t.Errorf("ValidatePod = %v, want rule %q", err, rule)
	}
}

// installPolicies creates every ValidatingAdmissionPolicy and binding that
// manifests/admission ships.
func installPolicies(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	n := 0
	for _, d := range readManifestDocs(t, "validatingadmissionpolicy.yaml") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			t.Fatal(err)
		}
		var err error
		switch tm.Kind {
		case "ValidatingAdmissionPolicy":
			var vap admissionregv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict(d, &vap); err != nil {
				t.Fatal(err)
			}
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &vap, metav1.CreateOptions{})
		case "ValidatingAdmissionPolicyBinding":
			var vapb admissionregv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict(d, &vapb); err != nil {
				t.Fatal(err)
			}
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &vapb, metav1.CreateOptions{})
		default:
			t.Fatalf("validatingadmissionpolicy.yaml holds a %s", tm.Kind)
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("validatingadmissionpolicy.yaml holds %d objects, want two policies and their bindings", n)
	}
}

// testGPUDevicesWriter checks that only the scheduler extender's service account
// (admission.DefaultGPUDevicesWriter, given the extender's RBAC here) sets
// understory.io/gpu-devices, the way it does (a Binding carrying it), or changes it
// on a bound pod; the test's admin is refused both, and a Binding without the key
// (kube-scheduler's) passes.
func testGPUDevicesWriter(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) {
	const ns, node = "adm-batch", "adm-gpu-node"
	admin := cp.Client()
	saNS, saName, _ := strings.Cut(strings.TrimPrefix(admission.DefaultGPUDevicesWriter, "system:serviceaccount:"), ":")
	if err := cp.CreateNamespace(ctx, saNS); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(saNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: saName, Namespace: saNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "adm-e2e-extender"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
	}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "adm-e2e-extender"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: saName, Namespace: saNS}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ext := tokenClient(t, cp, saToken(t, ctx, admin, saNS, saName, nil))
	if _, err := cp.CreateNode(ctx, node, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi")}, nil); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"gpu-bound", "gpu-probe", "plain-bound"} {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
		p.Spec.SchedulerName = "understory-e2e-nobody" // no scheduler races the test's Bindings
		created, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = created
	}
	binding := func(name string, annotations map[string]string) *corev1.Binding {
		return &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: pods[name].UID, Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}
	}
	withDevices := map[string]string{contract.AnnotationGPUDevices: "0"}
	// The Binding policy takes effect asynchronously, like the pod policy.
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true,
		func(ctx context.Context) (bool, error) {
			lastErr = admin.CoreV1().Pods(ns).Bind(ctx, binding("gpu-probe", withDevices),
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return lastErr != nil && strings.Contains(lastErr.Error(), admission.RuleGPUDevicesWriter), nil
		}); err != nil {
		t.Fatalf("Binding policy not in force after 60s: last answer %v", lastErr)
	}
	b := binding("gpu-probe", withDevices)
	if err := admission.ValidateBinding(b, e2eAdmin, admission.DefaultRules()); err == nil {
		t.Error("ValidateBinding accepted a Binding with devices from the admin; the CEL policy refused it")
	}
	wantRejected(t, admin.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}), admission.RuleGPUDevicesWriter, "")
	// The legacy namespaced "bindings" resource applies a Binding the same way.
	wantRejected(t, admin.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").Body(b).Do(ctx).Error(),
		admission.RuleGPUDevicesWriter, "")

	// What the extender does (scheduler-extender/bind.go): one Binding carrying the devices.
	if err := admission.ValidateBinding(binding("gpu-bound", withDevices), admission.DefaultGPUDevicesWriter,
		admission.DefaultRules()); err != nil {
		t.Errorf("ValidateBinding refused the extender: %v", err)
	}
	if err := ext.CoreV1().Pods(ns).Bind(ctx, binding("gpu-bound", withDevices), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the extender's Binding with devices: %v", err)
	}
	// kube-scheduler's Binding carries no annotations.
	if err := admin.CoreV1().Pods(ns).Bind(ctx, binding("plain-bound", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a Binding without devices: %v", err)
	}
	bound, err := admin.CoreV1().Pods(ns).Get(ctx, "gpu-bound", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bound.Spec.NodeName != node || bound.Annotations[contract.AnnotationGPUDevices] != "0" {
		t.Fatalf("bound pod: node %q annotations %v", bound.Spec.NodeName, bound.Annotations)
	}

	// On the bound pod, the admin may update other fields but not the devices.
	for _, tc := range []struct {
		name   string
		mutate func(*corev1.Pod)
		rule   string
	}{
		{"unrelated label", func(p *corev1.Pod) { p.Labels = map[string]string{"unrelated": "update"} }, ""},
		{"devices changed", func(p *corev1.Pod) { p.Annotations[contract.AnnotationGPUDevices] = "1" }, admission.RuleGPUDevicesWriter},
		{"devices removed", func(p *corev1.Pod) { delete(p.Annotations, contract.AnnotationGPUDevices) }, admission.RuleGPUDevicesWriter},
	} {
		cur, err := admin.CoreV1().Pods(ns).Get(ctx, "gpu-bound", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := cur.DeepCopy()
		tc.mutate(q)
		checkGoRule(t, admission.PodRequest{Operation: admissionv1.Update, Old: cur, Pod: q, Username: e2eAdmin}, tc.rule)
		_, err = admin.CoreV1().Pods(ns).Update(ctx, q, metav1.UpdateOptions{})
		if tc.rule == "" {
			if err != nil {
				t.Errorf("%s: rejected: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), admission.DefaultGPUDevicesWriter) {
			t.Errorf("%s: %v, want a refusal naming the extender", tc.name, err)
		}
		wantRejected(t, err, tc.rule, "")
	}
	// The extender may change them (as the policy lets it; its own pod-policy.yaml
	// lets it patch only its two annotations).
	if _, err := ext.CoreV1().Pods(ns).Patch(ctx, "gpu-bound", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+contract.AnnotationGPUDevices+`":"1"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the extender's devices patch: %v", err)
	}
}

// shippedProfiles returns the admission profiles and the PriorityClass that
// manifests/admission ships in configmap.yaml.
func shippedProfiles(t *testing.T) (admission.Profiles, schedulingv1.PriorityClass) {
	t.Helper()
	var cm corev1.ConfigMap
	manifestObject(t, "configmap.yaml", "ConfigMap", &cm)
	profiles, err := admission.ParseProfiles([]byte(cm.Data["profiles.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	var pc schedulingv1.PriorityClass
	manifestObject(t, "configmap.yaml", "PriorityClass", &pc)
	return profiles, pc
}

// registerWebhook starts the admission webhook in-process over real TLS and registers
// the shipped MutatingWebhookConfiguration with the API server, pointed at it.
func registerWebhook(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane,
	profiles admission.Profiles) *webhookServer {
	t.Helper()
	var mwc admissionregv1.MutatingWebhookConfiguration
	manifestObject(t, "mutatingwebhook.yaml", "MutatingWebhookConfiguration", &mwc)
	return registerWebhookConfig(t, ctx, cp, profiles, &mwc)
}

// registerWebhookConfig starts the webhook (with opts) and registers mwc pointed at it.
func registerWebhookConfig(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane,
	profiles admission.Profiles, mwc *admissionregv1.MutatingWebhookConfiguration,
	opts ...admission.MutatorOption) *webhookServer {
	t.Helper()
	certs, err := controlplane.NewWebhookCerts()
	if err != nil {
		t.Fatal(err)
	}
	wh := startWebhook(t, ctx, cp, profiles, certs, opts...)
	mwc.ResourceVersion = ""
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		url := wh.url + *w.ClientConfig.Service.Path
		w.ClientConfig = admissionregv1.WebhookClientConfig{URL: &url, CABundle: certs.CAPEM}
	}
	if _, err := cp.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc,
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return wh
}

// impersonating returns the admin's client acting as user (a service account's
// user name, with its groups), so that RBAC and the policies see that user.
func impersonating(t *testing.T, cp *controlplane.ControlPlane, user string) kubernetes.Interface {
	t.Helper()
	groups := []string{"system:authenticated"}
	if rest, ok := strings.CutPrefix(user, "system:serviceaccount:"); ok {
		ns, _, _ := strings.Cut(rest, ":")
		groups = append(groups, "system:serviceaccounts", "system:serviceaccounts:"+ns)
	}
	rc := cp.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSystemAnnotationsFenced proves, on a real API server with the shipped
// policies, the fence of every pod annotation in contract.TrustedKeys: a tenant
// (a service account with the pod rights of the "edit" role in its namespace) is refused,
// with the key's rule, when it creates a pod carrying a writer-fenced key
// (understory.io/gpu-devices, understory.io/gang-state, ...) or adds, changes or
// removes one on its own pod; the key's writer (the scheduler extender's service
// account, impersonated) may still write it by patch, and the tenant's unrelated
// updates of such a pod pass. understory.io/original-resources, which the webhook
// writes inside the tenant's own CREATE, can be changed by nobody afterwards. The Go
// form of the rules (admission.ValidatePod) agrees on every case.
func TestSystemAnnotationsFenced(t *testing.T) {
	ctx, cp := startControlPlane(t, 3*time.Minute)
	admin := cp.Client()
	installPolicies(t, ctx, admin)

	const ns = "fence-tenant"
	if err := cp.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// The tenant's pod rights in its namespace (the built-in "edit" role's, which is
	// aggregated by kube-controller-manager, absent here).
	tenantUser := "system:serviceaccount:" + ns + ":tenant"
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-pods", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"},
			Verbs: []string{"create", "get", "list", "update", "patch", "delete"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-pods", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant-pods"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The writers' pod rights (the extender's RBAC: get and patch pods).
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fence-writers"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var subjects []rbacv1.Subject
	for _, k := range contract.TrustedKeys() {
		for _, w := range k.Writers {
			if rest, ok := strings.CutPrefix(w, "system:serviceaccount:"); ok {
				sns, name, _ := strings.Cut(rest, ":")
				subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: sns})
			}
		}
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fence-writers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenant := impersonating(t, cp, tenantUser)

	newPod := func(name string, annotations map[string]string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
		p.Spec.SchedulerName = "understory-e2e-nobody"
		p.Annotations = annotations
		return p
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	// The policy takes effect asynchronously: wait for a rule that holds before any fix.
	var lastErr error
	if !testenv.PollEvery(60*time.Second, 200*time.Millisecond, func() bool {
		_, lastErr = tenant.CoreV1().Pods(ns).Create(ctx, newPod("probe",
			map[string]string{contract.AnnotationQOSClass: "nope"}), dry)
		return lastErr != nil && strings.Contains(lastErr.Error(), "(rule "+admission.RuleQOSClassValue+")")
	}) {
		t.Fatalf("understory-pod-rules not in force after 60s: last answer %v", lastErr)
	}

	annotate := func(c kubernetes.Interface, name, key string, value *string) (*corev1.Pod, error) {
		return c.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType,
			mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}),
			metav1.PatchOptions{})
	}
	ptr := func(s string) *string { return &s }
	n := 0
	for i, k := range contract.TrustedKeys() {
		if k.Kind != contract.KindPodAnnotation {
			continue
		}
		n++
		t.Run(k.Key, func(t *testing.T) {
			field := "metadata.annotations[" + k.Key + "]"
			carrying := newPod(fmt.Sprintf("carrying-%d", i), map[string]string{k.Key: "forged"})
			createRule := k.Rule
			if k.Fence == contract.FenceImmutable {
				createRule = "" // written by the webhook inside this very CREATE: not refusable here
			}
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Create, Pod: carrying, Username: tenantUser}, createRule)
			_, err := tenant.CoreV1().Pods(ns).Create(ctx, carrying, metav1.CreateOptions{})
			if createRule != "" {
				wantRejected(t, err, k.Rule, field)
			} else if err != nil {
				t.Fatalf("create carrying %s: %v", k.Key, err)
			}

			plain, err := tenant.CoreV1().Pods(ns).Create(ctx, newPod(fmt.Sprintf("plain-%d", i), nil), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			added := plain.DeepCopy()
			added.Annotations = map[string]string{k.Key: "forged"}
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Update, Old: plain, Pod: added, Username: tenantUser}, k.Rule)
			_, err = annotate(tenant, plain.Name, k.Key, ptr("forged"))
			wantRejected(t, err, k.Rule, field)

			// A pod that carries the key as its writer left it.
			holder := plain.Name
			if k.Fence == contract.FenceImmutable {
				holder = carrying.Name
			} else {
				for _, w := range k.Writers {
					if _, err := annotate(impersonating(t, cp, w), holder, k.Key, ptr("by-writer")); err != nil {
						t.Fatalf("the writer %s: %v", w, err)
					}
				}
			}
			cur, err := admin.CoreV1().Pods(ns).Get(ctx, holder, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			changed, removed := cur.DeepCopy(), cur.DeepCopy()
			changed.Annotations[k.Key] = "changed"
			delete(removed.Annotations, k.Key)
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Update, Old: cur, Pod: changed, Username: tenantUser}, k.Rule)
			checkGoRule(t, admission.PodRequest{Operation: admissionv1.Update, Old: cur, Pod: removed, Username: tenantUser}, k.Rule)
			_, err = annotate(tenant, holder, k.Key, ptr("changed"))
			wantRejected(t, err, k.Rule, field)
			_, err = annotate(tenant, holder, k.Key, nil)
			wantRejected(t, err, k.Rule, field)
			if _, err := tenant.CoreV1().Pods(ns).Patch(ctx, holder, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"unrelated":"update"}}}`), metav1.PatchOptions{}); err != nil {
				t.Errorf("the tenant's unrelated update: %v", err)
			}
			if k.Fence == contract.FenceImmutable {
				// Nobody changes it after creation, the writers of other keys included.
				_, err = annotate(impersonating(t, cp, contract.UserSchedulerExtender), holder, k.Key, ptr("changed"))
				wantRejected(t, err, k.Rule, field)
			}
		})
	}
	if n < 4 {
		t.Fatalf("contract.TrustedKeys lists %d pod annotations, want at least gpu-devices, gang-state, "+
			"extender-catch-up and original-resources", n)
	}
}

// saUserRE matches a service account's user name in policy text.
var saUserRE = regexp.MustCompile(`system:serviceaccount:[a-z0-9.-]+:[a-z0-9.-]+`)

// TestTrustedKeysFencedByPolicy holds contract.TrustedKeys to the shipped policies
// (every ValidatingAdmissionPolicy under manifests/, which the chart is generated from;
// test/helmchart TestChartIsGenerated keeps the chart equal): each key's policy fails
// closed and is bound with Deny; it matches CREATE and UPDATE of the key's object (UPDATE
// only for an immutable key); one of its rules names the key's rule, and that rule's
// expression, with the variables it uses expanded, reads the key and names exactly the
// key's writers, no one else. It also checks the components declare the same key names
// as the contract.
func TestTrustedKeysFencedByPolicy(t *testing.T) {
	t.Parallel()
	for have, want := range map[string]string{
		extender.AnnotationCatchUp:        contract.AnnotationExtenderCatchUp,
		kueuequota.LabelEvicted:           contract.LabelQuotaEvicted,
		admission.DefaultGPUDevicesWriter: contract.UserSchedulerExtender,
	} {
		if have != want {
			t.Errorf("a component declares %q, the contract %q", have, want)
		}
	}

	policies := map[string]admissionregv1.ValidatingAdmissionPolicy{}
	bindings := map[string]admissionregv1.ValidatingAdmissionPolicyBinding{}
	err := filepath.WalkDir(manifestsDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var tm metav1.TypeMeta
			if yaml.Unmarshal([]byte(doc), &tm) != nil || tm.APIVersion != admissionregv1.SchemeGroupVersion.String() {
				continue
			}
			switch tm.Kind {
			case "ValidatingAdmissionPolicy":
				var v admissionregv1.ValidatingAdmissionPolicy
				if err := yaml.UnmarshalStrict([]byte(doc), &v); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				policies[v.Name] = v
			case "ValidatingAdmissionPolicyBinding":
				var b admissionregv1.ValidatingAdmissionPolicyBinding
				if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				bindings[b.Spec.PolicyName] = b
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	resources := map[contract.TrustedKind]string{
		contract.KindPodAnnotation: "pods", contract.KindNodeAnnotation: "nodes", contract.KindWorkloadLabel: "workloads"}
	varRE := regexp.MustCompile(`variables\.([A-Za-z0-9_]+)`)
	for _, k := range contract.TrustedKeys() {
		t.Run(string(k.Kind)+" "+k.Key, func(t *testing.T) {
			p, ok := policies[k.Policy]
			if !ok {
				t.Fatalf("no ValidatingAdmissionPolicy %s under %s", k.Policy, manifestsDir)
			}
			if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregv1.Fail {
				t.Errorf("%s does not fail closed", k.Policy)
			}
			if b, ok := bindings[k.Policy]; !ok || !slices.Contains(b.Spec.ValidationActions, admissionregv1.Deny) {
				t.Errorf("%s has no binding that denies", k.Policy)
			}
			wantOps := []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update}
			if k.Fence != contract.FenceWriters {
				wantOps = wantOps[1:]
			}
			for _, op := range wantOps {
				matched := false
				for _, r := range p.Spec.MatchConstraints.ResourceRules {
					if (slices.Contains(r.Operations, op) || slices.Contains(r.Operations, admissionregv1.OperationAll)) &&
						slices.Contains(r.Resources, resources[k.Kind]) {
						matched = true
					}
				}
				if !matched {
					t.Errorf("%s does not match %s of %s", k.Policy, op, resources[k.Kind])
				}
			}
			vars := map[string]string{}
			for _, v := range p.Spec.Variables {
				vars[v.Name] = v.Expression
			}
			// The expressions of the rule (one or more validations naming it) with every
			// variable they use, transitively, and the policy's match conditions (which
			// decide whom it applies to).
			var text string
			for _, v := range p.Spec.Validations {
				if strings.Contains(v.Message+v.MessageExpression, "(rule "+k.Rule+")") {
					text += "\n" + v.Expression
				}
			}
			if text == "" {
				t.Fatalf("%s has no rule %s", k.Policy, k.Rule)
			}
			seen := map[string]bool{}
			for todo := varRE.FindAllStringSubmatch(text, -1); len(todo) > 0; {
				name := todo[0][1]
				todo = todo[1:]
				if seen[name] {
					continue
				}
				seen[name] = true
				text += "\n" + vars[name]
				todo = append(todo, varRE.FindAllStringSubmatch(vars[name], -1)...)
			}
			for _, mc := range p.Spec.MatchConditions {
				text += "\n" + mc.Expression
			}
			if !strings.Contains(text, "'"+k.Key+"'") {
				t.Errorf("%s rule %s does not read %s", k.Policy, k.Rule, k.Key)
			}
			users := slices.Sorted(slices.Values(saUserRE.FindAllString(text, -1)))
			users = slices.Compact(users)
			want := slices.Sorted(slices.Values(k.Writers))
			if !slices.Equal(users, want) {
				t.Errorf("%s rule %s lets %v write %s, the contract says %v", k.Policy, k.Rule, users, k.Key, want)
			}
		})
	}
}
