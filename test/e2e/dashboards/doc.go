// Package dashboards checks and renders Understory's Grafana dashboards
// (manifests/grafana) against a real Prometheus.
//
//   - dashboard.go: Load and Parse the dashboard JSON models (only what is read
//     here), Expand template variables ($node, ${gpu}, [[x]], Grafana's
//     $__rate_interval, $__range, ...), VariableValues (a check stands every
//     variable for its "All" regex or ".+").
//   - check.go: Check runs every target of every panel through Prometheus' HTTP API
//     (client_golang's api/prometheus/v1): format_query parses it with Prometheus'
//     own parser, then a range query over the window (an instant query at its end
//     for instant targets) must return a series with a finite value; label_values
//     variables must list a value. The report names each panel without data.
//   - prometheus.go: StartPrometheus runs a throwaway Prometheus server (Debian's
//     package, installed by scripts/prometheus.sh) on a free port with its data in
//     a temp dir, scraping the given targets (http, or https with a tls_config: CA,
//     server name, client certificate), for tests; Launch does the same for a server
//     that outlives its subtest (the real-node install test), SetJobs moves targets
//     (POST /-/reload).
//   - exempt.go: Exemptions name the panels, targets and variables that may lack
//     data where a check runs (no GPU on a node), with a reason; Check reports them
//     apart and refuses exemptions that name nothing.
//   - render.go: Render draws a dashboard's panels, laid out as on Grafana's grid,
//     from Prometheus' range API to a PNG (gonum.org/v1/plot); cmd/dashboard-render
//     is its command line.
//
// The end-to-end test (e2e_test.go) runs the real agent in static mode on this
// machine's cgroups with LS, BE and batch pods that burn real CPU, the real
// scheduler extender on a real control plane, and, as no GPU is available, the
// agent's real GPU loop (koordlet/gpu: collector, throttle, freezer, metrics)
// over go-nvml's dgxa100 mock with scripted utilisation; Prometheus scrapes all
// of them and every panel of every dashboard must show data.
//
// Traps:
//   - A panel counts as empty when its query returns only NaN: histogram_quantile
//     over a window without observations is NaN, not absent. Each target is checked
//     on its own: one empty target fails its panel.
//   - Repeated panels (repeat: node) are checked once, with the variable standing
//     for all its values.
//   - $__rate_interval must span at least two scrapes, or rate() returns nothing:
//     Window.RateInterval defaults to 1m; the e2e test scrapes every second and
//     uses 4 s, as Grafana would for a 1 s scrape interval.
//   - dcgm-exporter's series are absent here (no GPU): the GPU panels' `or on(UUID)`
//     joins are parsed and run, but only their Understory side returns data.
//   - An exemption excuses only a lack of data: a query Prometheus refuses fails
//     all the same. An exempt panel that has data is simply OK.
//   - TLS file paths must be absolute: Prometheus reads relative ones from its
//     configuration file's directory, a temp dir.
//   - Prometheus scrapes with honor_labels: the GPU pod series carry the pod's
//     namespace, pod and container labels, which a target label of the same name
//     would otherwise rename to exported_*.
package dashboards
