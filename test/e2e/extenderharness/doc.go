// Package extenderharness runs Understory's real scheduler extender (package
// extender) in-process against a control plane of package controlplane, for
// the end-to-end test in test/e2e and the throughput benchmark in
// test/e2e/schedbench. Like controlplane it is a normal package meant to be
// imported from _test.go files only.
//
// Start builds extender.NewServer with the control plane's admin clientset
// and dynamic client, runs its informers (Server.Run) and serves its Handler
// on a loopback httptest server behind a spy that counts the calls per verb
// (and, with Options.TrackPods, per pod). SchedulerConfig reads the example
// KubeSchedulerConfiguration from manifests/scheduler/kube-scheduler-config.yaml
// and substitutes only the extender's urlPrefix (and, for the harness's plain
// http URL, drops its tlsConfig): the tests prove that this
// manifest works. (controlplane.StartScheduler then substitutes
// clientConnection.kubeconfig and turns leader election off.)
//
// Traps:
//   - Stop (also run by t.Cleanup) closes the HTTP server first, which waits
//     for requests in flight: a gang member's bind may wait up to the
//     extender's GangBindTimeout (20 s by default). Stop the scheduler
//     before the extender (cleanups run last-registered first, so start the
//     extender before the scheduler).
//   - Options.TrackPods decodes every request body a second time; leave it
//     off in benchmarks.
//   - The admin client has no client-side rate limit and speaks JSON
//     (Options.Protobuf: protobuf, like kube-scheduler). The binary's default
//     (-kube-api-qps 50, -kube-api-burst 100) would cap the extender's binds
//     at about 25 GPU pods/s (two API calls per bind).
//   - The extender logs to a file in the test's temp dir; its tail is
//     printed when the test fails.
package extenderharness
