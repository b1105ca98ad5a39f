package clusterbench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
)

// admissionManifestDir is where the shipped webhook manifests live, relative to
// the module root.
const admissionManifestDir = "manifests/admission"

// Metric names the benchmark reads for the webhook.
const (
	// admissionDurationMetric is the webhook's own handling time, label endpoint.
	admissionDurationMetric = "understory_admission_duration_seconds"
	// apiWebhookDurationMetric is kube-apiserver's time per webhook call (TLS and
	// network included), label type=admit for mutating webhooks.
	apiWebhookDurationMetric = "apiserver_admission_webhook_admission_duration_seconds"
	// apiWebhookFailOpenMetric counts calls that failed and were ignored
	// (failurePolicy Ignore): pods admitted unmutated.
	apiWebhookFailOpenMetric = "apiserver_admission_webhook_fail_open_count"
)

// errBadManifest means the shipped admission manifests are not what the benchmark
// needs (a kind missing, a webhook without a service path).
var errBadManifest = errors.New("unexpected admission manifest")

// admissionManifests are the shipped objects the benchmark installs: the
// MutatingWebhookConfiguration, the profiles file of the webhook's ConfigMap and
// the PriorityClass the batch profile names.
type admissionManifests struct {
	webhooks      admissionregv1.MutatingWebhookConfiguration
	profiles      []byte
	priorityClass schedulingv1.PriorityClass
}

// readAdmissionManifests reads manifests/admission's mutatingwebhook.yaml and
// configmap.yaml under root; the profiles must parse (admission.ParseProfiles) and
// select the namespace label admission.LabelProfile=batch, which the benchmark puts
// on its batch namespace.
func readAdmissionManifests(root string) (admissionManifests, error) {
	var m admissionManifests
	dir := filepath.Join(root, admissionManifestDir)
	var cm corev1.ConfigMap
	if err := manifestObject(filepath.Join(dir, "configmap.yaml"), "ConfigMap", &cm); err != nil {
		return m, err
	}
	if err := manifestObject(filepath.Join(dir, "configmap.yaml"), "PriorityClass", &m.priorityClass); err != nil {
		return m, err
	}
	if err := manifestObject(filepath.Join(dir, "mutatingwebhook.yaml"), "MutatingWebhookConfiguration", &m.webhooks); err != nil {
		return m, err
	}
	m.profiles = []byte(cm.Data["profiles.yaml"])
	ps, err := admission.ParseProfiles(m.profiles)
	if err != nil {
		return m, fmt.Errorf("%s profiles.yaml: %w", dir, err)
	}
	if ps.Len() == 0 {
		return m, fmt.Errorf("%s: no profile in profiles.yaml: %w", dir, errBadManifest)
	}
	for _, w := range m.webhooks.Webhooks {
		if s := w.ClientConfig.Service; s == nil || s.Path == nil {
			return m, fmt.Errorf("%s: webhook %s has no service path: %w", dir, w.Name, errBadManifest)
		}
	}
	if len(m.webhooks.Webhooks) == 0 {
		return m, fmt.Errorf("%s: no webhook: %w", dir, errBadManifest)
	}
	return m, nil
}

// manifestObject decodes the document of kind kind in the multi-document YAML
// file into out (strictly: an unknown field is an error).
func manifestObject(file, kind string, out any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading manifest: %w", err)
	}
	for _, d := range bytes.Split(data, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if tm.Kind == kind {
			if err := yaml.UnmarshalStrict(d, out); err != nil {
				return fmt.Errorf("%s %s: %w", file, kind, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s holds no %s: %w", file, kind, errBadManifest)
}

// pointedAt is the webhook configuration with every entry calling base + its
// service path over TLS trusted by ca (the shipped one names a Service).
func (m admissionManifests) pointedAt(base string, ca []byte) *admissionregv1.MutatingWebhookConfiguration {
	mwc := m.webhooks.DeepCopy()
	mwc.ResourceVersion = ""
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		url := base + *w.ClientConfig.Service.Path
		w.ClientConfig = admissionregv1.WebhookClientConfig{URL: &url, CABundle: ca}
	}
	return mwc
}

// webhook is the admission webhook (cmd/admission built from this tree) running
// as a child process over TLS on loopback.
type webhook struct {
	proc *child
	url  string
	// hc trusts the webhook's CA (its /healthz and /metrics are HTTPS only).
	hc *http.Client
}

// startWebhook starts bin with the shipped profiles and a throwaway serving
// certificate, registers the shipped MutatingWebhookConfiguration pointed at it
// and waits until kube-apiserver calls it (a dry-run pod in nsBatch comes back
// mutated). Its namespace label and PriorityClass must be in place (setupAdmission).
func startWebhook(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, dir, bin string,
	m admissionManifests, nice int) (*webhook, error) {
	certs, err := controlplane.NewWebhookCerts()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"webhook.crt": certs.CertPEM, "webhook.key": certs.KeyPEM, "profiles.yaml": m.profiles}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certs.CAPEM) {
		return nil, fmt.Errorf("webhook CA: no certificate: %w", errBadManifest)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c, err := startChild(dir, "admission", nice, bin, "-kubeconfig="+cp.Kubeconfig(),
		"-listen=127.0.0.1:"+strconv.Itoa(port),
		"-tls-cert-file="+filepath.Join(dir, "webhook.crt"), "-tls-private-key-file="+filepath.Join(dir, "webhook.key"),
		"-profiles="+filepath.Join(dir, "profiles.yaml"))
	if err != nil {
		return nil, err
	}
	tb.Cleanup(c.stop)
	dumpOnFailure(tb, c)
	w := &webhook{proc: c, url: "https://127.0.0.1:" + strconv.Itoa(port), hc: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}}
	if err := waitHTTPWith(ctx, c, w.hc, w.url+"/healthz", 2*time.Minute); err != nil {
		return nil, fmt.Errorf("admission webhook: %w\n%s", err, controlplane.TailFile(c.log, 20))
	}
	if _, err := cp.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx,
		m.pointedAt(w.url, certs.CAPEM), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("registering the webhook: %w", err)
	}
	if err := waitWebhookActive(ctx, cp.Client(), time.Minute); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, controlplane.TailFile(c.log, 20))
	}
	return w, nil
}

// waitWebhookActive dry-runs a user's batch pod in nsBatch until it comes back
// converted (kube-apiserver picks a new webhook configuration up asynchronously).
func waitWebhookActive(ctx context.Context, c kubernetes.Interface, timeout time.Duration) error {
	probe := userBatchPod(Job{Name: "admission-probe", Duration: time.Second, Members: 1, CPUMilli: 10, MemBytes: 1 << 20}, 0)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := c.CoreV1().Pods(nsBatch).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		return err == nil && converted(got), nil
	})
	if err != nil {
		return fmt.Errorf("admission webhook not converting pods after %v (last create error: %v): %w", timeout, last, err)
	}
	return nil
}

// setupAdmission installs what both forms of batch pod need, the shipped
// PriorityClass and the batch namespace's profile label, and, when on, starts the
// webhook. It returns how the submitter writes batch pods: as a user does (the
// webhook converts them) when on, else already in the webhook's output form.
func setupAdmission(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, dir, bin string,
	m admissionManifests, on bool, nice int) (*webhook, func(Job, int) *corev1.Pod, error) {
	c := cp.Client()
	pc := m.priorityClass.DeepCopy()
	pc.ResourceVersion = ""
	if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, nil, fmt.Errorf("creating PriorityClass %s: %w", pc.Name, err)
	}
	ns, err := c.CoreV1().Namespaces().Get(ctx, nsBatch, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("reading namespace %s: %w", nsBatch, err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[admission.LabelProfile] = "batch"
	if _, err := c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("labelling namespace %s: %w", nsBatch, err)
	}
	if !on {
		return nil, func(j Job, i int) *corev1.Pod { return batchPod(j, i, pc.Name) }, nil
	}
	w, err := startWebhook(ctx, tb, cp, dir, bin, m, nice)
	if err != nil {
		return nil, nil, err
	}
	return w, userBatchPod, nil
}

// converted reports whether p is in the form the webhook gives batch pods: no cpu
// or memory in any container or init container, batch-cpu on the first container.
func converted(p *corev1.Pod) bool {
	if p == nil || len(p.Spec.Containers) == 0 {
		return false
	}
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				if _, ok := l[corev1.ResourceCPU]; ok {
					return false
				}
				if _, ok := l[corev1.ResourceMemory]; ok {
					return false
				}
			}
		}
	}
	_, ok := p.Spec.Containers[0].Resources.Requests[contract.ResourceBatchCPU]
	return ok
}

// admissionMeter measures the webhook over the measured part: its metrics
// scraped at both ends, its CPU from /proc, its RSS sampled.
type admissionMeter struct {
	w       *webhook
	before  map[string]*dto.MetricFamily
	cpu0    time.Duration
	peakRSS uint64
}

// startAdmissionMeter scrapes w (nil: the webhook is off, and the meter is a no-op).
func startAdmissionMeter(ctx context.Context, w *webhook) (*admissionMeter, error) {
	m := &admissionMeter{w: w}
	if w == nil {
		return m, nil
	}
	m.cpu0, _ = proc.ReadCPU("/proc", w.proc.pid())
	var err error
	if m.before, err = scrape(ctx, httpGetterWith(w.hc, w.url+"/metrics")); err != nil {
		return nil, fmt.Errorf("admission webhook: %w", err)
	}
	m.sample()
	return m, nil
}

func (m *admissionMeter) sample() {
	if m.w == nil {
		return
	}
	if rss, _, err := proc.ReadRSS("/proc", m.w.proc.pid()); err == nil {
		m.peakRSS = max(m.peakRSS, rss)
	}
}

// finish fills r's admission figures over secs; apiBefore and apiAfter are
// kube-apiserver's scrapes at the same ends (its side of the webhook calls).
func (m *admissionMeter) finish(ctx context.Context, r *SizeResult, apiBefore, apiAfter map[string]*dto.MetricFamily, secs float64) error {
	r.Admission = m.w != nil
	if m.w == nil {
		return nil
	}
	pid := m.w.proc.pid()
	cpu1, _ := proc.ReadCPU("/proc", pid)
	if _, hwm, err := proc.ReadRSS("/proc", pid); err == nil {
		m.peakRSS = max(m.peakRSS, hwm)
	}
	after, err := scrape(ctx, httpGetterWith(m.w.hc, m.w.url+"/metrics"))
	if err != nil {
		return fmt.Errorf("admission webhook: %w", err)
	}
	p50, n := histogramQuantileBy(m.before, after, admissionDurationMetric, "endpoint", "mutate", 0.5)
	p99, _ := histogramQuantileBy(m.before, after, admissionDurationMetric, "endpoint", "mutate", 0.99)
	r.AdmissionCalls = int64(n)
	r.AdmissionCallsPerSec = float64(n) / secs
	r.AdmissionMutateP50Ms, r.AdmissionMutateP99Ms = msOrZero(p50), msOrZero(p99)
	api99, _ := histogramQuantileBy(apiBefore, apiAfter, apiWebhookDurationMetric, "type", "admit", 0.99)
	r.AdmissionAPIServerP99Ms = msOrZero(api99)
	r.AdmissionFailOpen = int64(math.Round(counterValue(apiAfter, apiWebhookFailOpenMetric) - counterValue(apiBefore, apiWebhookFailOpenMetric)))
	r.AdmissionCPUCores = (cpu1 - m.cpu0).Seconds() / secs
	r.AdmissionRSSMiB = float64(m.peakRSS) / (1 << 20)
	return nil
}

func msOrZero(s float64) float64 {
	if math.IsNaN(s) {
		return 0
	}
	return s * 1000
}

// admissionCheck is the smoke check's verdict on the webhook figures of a run
// with Options.Admission = on: "" when they are what it must show (the webhook
// called, when on; every batch pod converted; no call failed open).
func admissionCheck(r SizeResult, on bool) string {
	var bad []string
	if r.Admission != on {
		bad = append(bad, fmt.Sprintf("admission webhook ran: %v, want %v", r.Admission, on))
	}
	if on && r.AdmissionCalls == 0 {
		bad = append(bad, "the admission webhook was not called in the measured part")
	}
	if r.BatchUnconverted != 0 {
		bad = append(bad, fmt.Sprintf("%d batch pods were not converted to batch resources", r.BatchUnconverted))
	}
	if r.AdmissionFailOpen != 0 {
		bad = append(bad, fmt.Sprintf("%d webhook calls failed open", r.AdmissionFailOpen))
	}
	return strings.Join(bad, "; ")
}
