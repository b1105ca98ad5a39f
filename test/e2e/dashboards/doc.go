// Package dashboards is the end-to-end check of Understory's Grafana dashboards
// (manifests/grafana) against a real Prometheus. Reading, checking and rendering the
// dashboards is cmd/dashboard-render/grafana (shared with cmd/dashboard-render); this package holds
// the test Prometheus and the tests.
//
//   - prometheus.go: StartPrometheus runs a throwaway Prometheus server (Debian's
//     package, installed by scripts/prometheus.sh) on a free port with its data in
//     a temp dir, scraping the given targets (http, or https with a tls_config: CA,
//     server name, client certificate; a bearer token from a file), for tests; Launch does the same for a server
//     that outlives its subtest (the real-node install test), SetJobs moves targets
//     (POST /-/reload).
//   - shipped_test.go: every shipped query parses and runs on a real Prometheus.
//
// The end-to-end test (e2e_test.go) runs the real agent in static mode on this
// machine's cgroups with LS, BE and batch pods that burn real CPU, the real
// scheduler extender on a real control plane called by kube-scheduler as the second
// scheduler (sched_test.go), and, as no GPU is available, the agent's real GPU loop
// (koordlet/gpu: collector, throttle, freezer, metrics) over go-nvml's dgxa100 mock
// with scripted utilisation; kube-scheduler's own /metrics with a service account's
// token (scraper_test.go); and the real Kueue quota follower over Kueue's CRDs
// (quota_test.go). Prometheus scrapes all of them and every panel of every dashboard
// must show data.
//
// Traps:
//   - What counts as empty, exempt or repeated is cmd/dashboard-render/grafana's (see its doc).
//   - $__rate_interval must span at least two scrapes, or rate() returns nothing:
//     Window.RateInterval defaults to 1m; the e2e test scrapes every second and
//     uses 4 s, as Grafana would for a 1 s scrape interval.
//   - dcgm-exporter's series are absent here (no GPU): the GPU panels' `or on(UUID)`
//     joins are parsed and run, but only their Understory side returns data.
//   - TLS file paths must be absolute: Prometheus reads relative ones from its
//     configuration file's directory, a temp dir.
//   - Prometheus scrapes with honor_labels: the GPU pod series carry the pod's
//     namespace, pod and container labels, which a target label of the same name
//     would otherwise rename to exported_*.
//   - kube-scheduler caches each TokenReview and SubjectAccessReview answer for 10 s:
//     a request made before the binding of the metrics reader is seen is refused for
//     that long, so the test polls until its token is served.
//   - No Kueue manager runs: the test writes the Workload's admission, its
//     QuotaReserved condition and the ClusterQueue's flavorsReservation itself, and
//     evicts the Workload once the follower deactivates it. Only the storage version
//     kueue.x-k8s.io/v1beta2 is used (the CRDs have no conversion webhook here). The
//     Kueue build must be there (scripts/kueue.sh, make kueue-bin): without it the test
//     skips, or fails under CI=true.
//   - The quota nodes carry a NoSchedule taint so that the scheduling traffic never
//     lands on them; the follower counts them all the same (it ignores other taints
//     than unreachable and not-ready).
package dashboards
