// Package kueueharness runs Kueue's manager (sigs.k8s.io/kueue v0.17.0, cmd/kueue,
// built by scripts/kueue.sh into $UNDERSTORY_CACHE/kueue-v0.17.0/bin) as a process
// against a control plane of package controlplane, for test/e2e/kueue_test.go and the
// cluster benchmark. Like controlplane, production never links it.
//
// Usage:
//
//	bin := kueueharness.Find(t)                // skips (fails under CI=true) when missing
//	kueueharness.InstallCRDs(ctx, t, cp, bin)  // Kueue's CRDs, from the same build
//	k := kueueharness.Start(ctx, t, cp, bin, kueueharness.Options{Config: cfg})
//
// Start writes Kueue's Configuration: Options.Config (the user's keys, e.g.
// manifests/components/kueue/kueue-config.yaml) with the harness's keys laid over
// it: namespace kueue-system, leader election off, webhook, metrics and health
// servers on free loopback ports, internal certificate management on, only the
// batch/job integration, the VisibilityOnDemand feature off (its aggregated API
// server needs a Service), and Options' overrides of waitForPodsReady. It creates
// the namespace and the empty webhook Secret Kueue's certificate rotator fills, runs
// the manager with the admin kubeconfig and waits for its /readyz.
//
// Traps:
//   - Kueue's admission webhooks are NOT registered with the API server. Kueue's
//     internal certificate manager issues its serving certificate for the in-cluster
//     Service name (kueue-webhook-service.kueue-system.svc), which a loopback API
//     server cannot verify at 127.0.0.1; and with it off, the manager reads a metrics
//     certificate from the fixed path /etc/kueue/metrics/certs, outside the test's
//     reach. Without the Job webhook nothing suspends a Job on creation: tests must
//     create Kueue Jobs with spec.suspend: true (what the webhook would set), or the
//     Job controller creates pods before Kueue sees the Job. Defaulting and
//     validation of Kueue's own objects then come from the CRD schemas only.
//   - The rotator writes its certificate into the Secret
//     kueue-system/kueue-webhook-server-cert and then waits for the files in
//     webhook.certDir, which a kubelet would project from that Secret: Start copies
//     the Secret's keys into certDir itself (every 250 ms) until the test ends.
//   - The rotator injects its CA into the conversion webhook of the CRDs Kueue
//     serves in two versions and waits until it has: InstallCRDs gives those CRDs a
//     conversion webhook (a URL on the harness's webhook port) for that reason only.
//     Conversions themselves would fail TLS verification (the Service name again), so
//     tests must use kueue.x-k8s.io/v1beta2, the storage version, throughout.
//   - There is no kubelet: pods are never Ready, so waitForPodsReady evicts every
//     admitted Workload after its timeout unless the test marks the pods Ready (and
//     the Job controller's status.ready follows). Jobs suspended by Kueue delete their
//     pods with a grace period: without a kubelet they stay Terminating until the
//     test deletes them with GracePeriodSeconds=0.
//   - The manager logs to a file in the test's temp dir; its tail is printed when
//     the test fails. Stop (t.Cleanup) sends SIGTERM, then SIGKILL after 5 s.
package kueueharness
