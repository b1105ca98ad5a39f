package e2e_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/internal/certreload"
	"github.com/understory/understory/qos"
	"github.com/understory/understory/test/e2e/controlplane"
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
	certs *controlplane.WebhookCerts) *webhookServer {
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
	mut, err := admission.NewMutator(profiles, cluster)
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
// kube-apiserver v1.34.4, with the shipped MutatingWebhookConfiguration (pointed at
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
	var vap admissionregv1.ValidatingAdmissionPolicy
	manifestObject(t, "validatingadmissionpolicy.yaml", "ValidatingAdmissionPolicy", &vap)
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var vapb admissionregv1.ValidatingAdmissionPolicyBinding
	manifestObject(t, "validatingadmissionpolicy.yaml", "ValidatingAdmissionPolicyBinding", &vapb)
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &vapb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	namespaces := map[string]map[string]string{
		"adm-batch":      nil,
		"adm-profile":    {admission.LabelProfile: "batch"},
		"adm-ls-allowed": {admission.LabelAllowLSBestEffort: "true"},
	}
	for ns, labels := range namespaces {
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if labels != nil {
			n, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range labels {
				n.Labels[k] = v
			}
			if _, err := c.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitAdmissionActive(t, ctx, c, "adm-batch", true)

	create := func(p *corev1.Pod) (*corev1.Pod, error) {
		return c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	}
	batchPod := func(ns, name string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")})
		p.Annotations = map[string]string{qos.AnnotationQOSClass: "batch"}
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
		if r := got.Spec.InitContainers[0].Resources; !qEq(r.Requests[qos.ResourceBatchCPU], "100") {
			t.Errorf("init container resources %v, want batch-cpu 100", r)
		}
	})

	t.Run("profile namespace: class, PriorityClass and priority", func(t *testing.T) {
		p := controlplane.NewPod("adm-profile", "profiled", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")})
		got, err := create(p)
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, got, "200", "")
		if got.Annotations[qos.AnnotationQOSClass] != "batch" || got.Labels[admission.LabelProfile] != "batch" {
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
			func(p *corev1.Pod) { p.Annotations[qos.AnnotationQOSClass] = "LS" },
			func(p *corev1.Pod) { delete(p.Annotations, qos.AnnotationQOSClass) },
		} {
			q := p.DeepCopy()
			mutate(q)
			_, err := c.CoreV1().Pods("adm-batch").Update(ctx, q, metav1.UpdateOptions{})
			wantRejected(t, err, admission.RuleQOSClassImmutable)
		}
	})

	lsPod := func(ns, name string) *corev1.Pod {
		p := controlplane.NewPod(ns, name, nil)
		p.Annotations = map[string]string{qos.AnnotationQOSClass: "ls"}
		return p
	}
	gangPod := func(name, key, v string) *corev1.Pod {
		p := controlplane.NewPod("adm-batch", name, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")})
		p.Annotations = map[string]string{key: v}
		return p
	}
	rejections := []struct {
		name string
		pod  *corev1.Pod
		rule string // "" accepted
	}{
		{"LS on BestEffort outside the labelled namespace", lsPod("adm-batch", "ls-be"), admission.RuleLSBestEffort},
		{"LS on BestEffort in the labelled namespace", lsPod("adm-ls-allowed", "ls-be"), ""},
		{"invalid class value", func() *corev1.Pod {
			p := lsPod("adm-batch", "bad-class")
			p.Annotations[qos.AnnotationQOSClass] = "Lſ" // folds to "ls" in Unicode, not in ASCII
			return p
		}(), admission.RuleQOSClassValue},
		{"volcano min-member 0", gangPod("gang-0", admission.AnnotationVolcanoMinMember, "0"), admission.RuleGangMinMember},
		{"volcano min-member not an integer", gangPod("gang-x", admission.AnnotationVolcanoMinMember, "3x"), admission.RuleGangMinMember},
		{"koordinator min-available above max", gangPod("gang-big", admission.AnnotationKoordinatorMinAvailable, "10001"), admission.RuleGangMinMember},
		{"koordinator min-available negative", gangPod("gang-neg", admission.AnnotationKoordinatorMinAvailable, "-1"), admission.RuleGangMinMember},
		{"valid gang", gangPod("gang-ok", admission.AnnotationVolcanoMinMember, "3"), ""},
	}
	for _, tc := range rejections {
		t.Run(tc.name, func(t *testing.T) {
			// The Go form of the policy must agree with the CEL one.
			goErr := admission.ValidatePod(admissionv1.Create, nil, tc.pod, namespaces[tc.pod.Namespace],
				admission.DefaultMaxGangMinMember)
			if (goErr == nil) != (tc.rule == "") || (goErr != nil && !strings.Contains(goErr.Error(), tc.rule)) {
				t.Errorf("ValidatePod = %v, want rule %q", goErr, tc.rule)
			}
			_, err := create(tc.pod)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			wantRejected(t, err, tc.rule)
		})
	}

	t.Run("webhook down: batch pod is created unmutated", func(t *testing.T) {
		wh.stop()
		got, err := create(batchPod("adm-batch", "fail-open"))
		if err != nil {
			t.Fatalf("create with the webhook down: %v (mutation must fail open)", err)
		}
		if got.Status.QOSClass != corev1.PodQOSBurstable || got.Annotations[qos.AnnotationQOSClass] != "batch" {
			t.Errorf("QoS %s annotations %v: want Burstable with the batch annotation kept", got.Status.QOSClass, got.Annotations)
		}
		if _, ok := got.Spec.Containers[0].Resources.Requests[qos.ResourceBatchCPU]; ok {
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
			probe.Annotations = map[string]string{qos.AnnotationQOSClass: "batch"}
			got, err := c.CoreV1().Pods(ns).Create(ctx, probe, dry)
			mutated = err == nil && got.Annotations[qos.AnnotationOriginalResources] != ""
			if !policy {
				return mutated, nil
			}
			probe.Annotations[qos.AnnotationQOSClass] = "nope"
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
		if !qEq(l[qos.ResourceBatchCPU], cpu) {
			t.Errorf("batch-cpu %v in %v, want %s", l[qos.ResourceBatchCPU], l, cpu)
		}
		if mem != "" && !qEq(l[qos.ResourceBatchMemory], mem) {
			t.Errorf("batch-memory %v in %v, want %s", l[qos.ResourceBatchMemory], l, mem)
		}
	}
	o, err := admission.DecodeOriginalResources(p.Annotations[qos.AnnotationOriginalResources])
	if err != nil || len(o.Containers) != 1 {
		t.Errorf("original resources %+v, %v", o, err)
	}
}

func wantRejected(t *testing.T, err error, rule string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want rejected by rule %s", rule)
	}
	if !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), "metadata.annotations[") {
		t.Fatalf("rejected with %q, want the field and rule %s", err, rule)
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
	certs, err := controlplane.NewWebhookCerts()
	if err != nil {
		t.Fatal(err)
	}
	wh := startWebhook(t, ctx, cp, profiles, certs)
	var mwc admissionregv1.MutatingWebhookConfiguration
	manifestObject(t, "mutatingwebhook.yaml", "MutatingWebhookConfiguration", &mwc)
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		url := wh.url + *w.ClientConfig.Service.Path
		w.ClientConfig = admissionregv1.WebhookClientConfig{URL: &url, CABundle: certs.CAPEM}
	}
	if _, err := cp.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mwc,
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return wh
}
