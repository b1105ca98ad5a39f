package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/understory/understory/test/e2e/controlplane"
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
