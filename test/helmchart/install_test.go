package helmchart_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/understory/understory/internal/controlplane"
)

// The chart on a real API server, as a user runs it: `helm install` with
// --create-namespace, `helm upgrade` keeping the self-signed CA, certificates and
// the webhook's caBundle (and issuing a deleted certificate again from the kept CA),
// and `helm uninstall` leaving the shared PodGroup CRD.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp := controlplane.Start(ctx, t, controlplane.Options{})
	helmRun := helmRunner(t, ctx, helm, cp.Kubeconfig())
	secrets := cp.Client().CoreV1().Secrets(namespace)
	secretData := func(name string) map[string][]byte {
		t.Helper()
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
		return s.Data
	}
	caBundle := func() []byte {
		t.Helper()
		w, err := cp.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "understory-admission", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w.Webhooks[0].ClientConfig.CABundle
	}

	helmRun("install", "understory", chartDir, "--namespace", namespace, "--create-namespace")
	ca := secretData("understory-ca")
	admission := secretData("understory-admission-tls")
	client := secretData("understory-scheduler-client-tls")
	if !bytes.Equal(caBundle(), ca["tls.crt"]) {
		t.Fatal("after install, the webhook's caBundle is not the CA of Secret understory-ca")
	}

	// An upgrade (with a changed value) keeps every certificate.
	helmRun("upgrade", "understory", chartDir, "--namespace", namespace, "--set", "gpu.enabled=true")
	if got := secretData("understory-ca"); !bytes.Equal(got["tls.crt"], ca["tls.crt"]) || !bytes.Equal(got["tls.key"], ca["tls.key"]) {
		t.Error("helm upgrade replaced the CA")
	}
	if got := secretData("understory-admission-tls"); !bytes.Equal(got["tls.crt"], admission["tls.crt"]) || !bytes.Equal(got["tls.key"], admission["tls.key"]) {
		t.Error("helm upgrade replaced the webhook's certificate")
	}
	if !bytes.Equal(caBundle(), ca["tls.crt"]) {
		t.Error("helm upgrade changed the webhook's caBundle")
	}
	if _, err := cp.Client().AppsV1().DaemonSets(namespace).Get(ctx, "understory-koordlet-gpu", metav1.GetOptions{}); err != nil {
		t.Errorf("gpu.enabled=true: %v", err)
	}

	// A deleted certificate is issued again by the kept CA.
	if err := secrets.Delete(ctx, "understory-scheduler-client-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	helmRun("upgrade", "understory", chartDir, "--namespace", namespace, "--set", "gpu.enabled=true")
	renewed := secretData("understory-scheduler-client-tls")
	if bytes.Equal(renewed["tls.crt"], client["tls.crt"]) {
		t.Error("the deleted client certificate came back unchanged; want a new one")
	}
	if !bytes.Equal(renewed["ca.crt"], ca["tls.crt"]) {
		t.Error("the re-issued client certificate names another CA")
	}

	// A certificate that expires within 30 days is issued again from the kept CA on
	// upgrade; the others stay.
	prev, err := secrets.Get(ctx, "understory-admission-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	notAfter, err := time.Parse(time.RFC3339, prev.Annotations["understory.io/not-after"])
	if err != nil || notAfter.Before(time.Now().Add(360*24*time.Hour)) {
		t.Fatalf("the webhook's certificate Secret says it expires at %q (%v); want about a year from now", prev.Annotations["understory.io/not-after"], err)
	}
	prev.Annotations["understory.io/not-after"] = time.Now().Add(10 * 24 * time.Hour).UTC().Format(time.RFC3339)
	if _, err := secrets.Update(ctx, prev, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	extenderTLS := secretData("understory-scheduler-extender-tls")
	helmRun("upgrade", "understory", chartDir, "--namespace", namespace, "--set", "gpu.enabled=true")
	if got := secretData("understory-admission-tls"); bytes.Equal(got["tls.crt"], admission["tls.crt"]) || !bytes.Equal(got["ca.crt"], ca["tls.crt"]) {
		t.Error("the webhook's certificate, 10 days from its expiry, was not issued again from the kept CA")
	}
	if got := secretData("understory-scheduler-extender-tls"); !bytes.Equal(got["tls.crt"], extenderTLS["tls.crt"]) {
		t.Error("the extender's certificate, a year from its expiry, was replaced")
	}

	// Uninstall: the release's objects go, the shared CRD stays.
	helmRun("uninstall", "understory", "--namespace", namespace, "--wait")
	if _, err := cp.Client().AppsV1().Deployments(namespace).Get(ctx, "understory-scheduler-extender", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall, the extender's Deployment: %v; want not found", err)
	}
	crds := cp.Dynamic().Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Get(ctx, "podgroups.scheduling.x-k8s.io", metav1.GetOptions{}); err != nil {
		t.Errorf("after helm uninstall, the PodGroup CRD: %v; want it kept", err)
	}
}

// helmRunner runs helm against kubeconfig with a home of its own (cache, config and
// data under a temporary directory) and returns its output; a failure ends the test.
func helmRunner(t *testing.T, ctx context.Context, helm, kubeconfig string) func(args ...string) string {
	home := t.TempDir()
	return func(args ...string) string {
		t.Helper()
		args = append(args, "--kubeconfig", kubeconfig)
		cmd := exec.CommandContext(ctx, helm, args...)
		cmd.Env = append(cmd.Environ(),
			"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
			"HELM_DATA_HOME="+filepath.Join(home, "data"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
}
