package e2e_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/controlplane"
)

// startControlPlane is the start of every test on a real control plane: skipped with
// -short, run in parallel, a context that ends after timeout (or with the test), and
// the control plane (skipped when its binaries are missing, unless CI=true).
func startControlPlane(t *testing.T, timeout time.Duration) (context.Context, *controlplane.ControlPlane) {
	t.Helper()
	return startControlPlaneWith(t, timeout, controlplane.Options{})
}

// startControlPlaneWith is startControlPlane with opts.
func startControlPlaneWith(t *testing.T, timeout time.Duration, opts controlplane.Options) (context.Context,
	*controlplane.ControlPlane) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx, controlplane.Start(ctx, t, opts)
}

// createNamespaces creates each namespace with its labels (nil: none but the API
// server's own).
func createNamespaces(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, namespaces map[string]map[string]string) {
	t.Helper()
	c := cp.Client()
	for ns, labels := range namespaces {
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if labels == nil {
			continue
		}
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
