package helmchart_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/kueueharness"
)

// kueueTenants are the namespaces of the Kueue example's LocalQueues
// (manifests/components/kueue/localqueues.yaml).
var kueueTenants = []string{"tenant-a", "tenant-b"}

// keepPolicy is Helm's annotation that leaves an object behind on uninstall.
const keepPolicy = "helm.sh/resource-policy"

// The chart owns no tenant data: with kueue.enabled, no Namespace is a release
// object that Helm would delete (every Namespace it renders, if any, carries
// helm.sh/resource-policy: keep), and on a real API server `helm uninstall` leaves
// the tenants' namespaces and what is in them (a PVC, a Secret).
func TestKueueNamespacesNotReleaseObjects(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for name, values := range map[string]string{
		"kueue":      "kueue: {enabled: true}\n",
		"everything": "gpu: {enabled: true}\nsecondScheduler: {enabled: true}\nkueue: {enabled: true}\n",
	} {
		f := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := helmTemplate(ctx, helm, f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs, err := decode(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o["kind"] != "Namespace" {
				continue
			}
			ann, _ := dig(o, "metadata", "annotations").(map[string]any)
			if ann[keepPolicy] != "keep" {
				t.Errorf("%s: the chart renders %s without %s: keep; helm uninstall would delete it and all in it",
					name, key(o), keepPolicy)
			}
		}
	}

	t.Run("uninstall leaves the tenants' data", func(t *testing.T) {
		bin := kueueharness.Find(t) // Kueue's CRDs: the chart's ClusterQueues need them
		cp := controlplane.Start(ctx, t, controlplane.Options{})
		kueueharness.InstallCRDs(ctx, t, cp, bin)
		helmRun := helmRunner(t, ctx, helm, cp.Kubeconfig())
		// The tenants' namespaces come first, from outside the chart (docs/kueue.md).
		for _, ns := range kueueTenants {
			if err := cp.CreateNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
		helmRun("install", "understory", chartDir, "--namespace", namespace, "--create-namespace", "--set", "kueue.enabled=true")
		c := cp.Client()
		for _, ns := range kueueTenants {
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
			if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "credentials", Namespace: ns},
				StringData: map[string]string{"token": "x"}}
			if _, err := c.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// Turning Kueue off, then uninstalling: neither touches the tenants.
		helmRun("upgrade", "understory", chartDir, "--namespace", namespace, "--set", "kueue.enabled=false")
		helmRun("uninstall", "understory", "--namespace", namespace, "--wait")
		for _, ns := range kueueTenants {
			n, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil || n.DeletionTimestamp != nil {
				t.Errorf("after helm uninstall, namespace %s: %v (deleting: %v); want it kept", ns, err, n != nil && n.DeletionTimestamp != nil)
				continue
			}
			if _, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err != nil {
				t.Errorf("after helm uninstall, PVC %s/data: %v; want it kept", ns, err)
			}
			if _, err := c.CoreV1().Secrets(ns).Get(ctx, "credentials", metav1.GetOptions{}); err != nil {
				t.Errorf("after helm uninstall, Secret %s/credentials: %v; want it kept", ns, err)
			}
		}
	})
}
