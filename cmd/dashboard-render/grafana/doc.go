// Package grafana reads, checks and renders Understory's Grafana dashboards
// (manifests/grafana) against a Prometheus HTTP API. It is tooling: cmd/dashboard-render
// is its command line and the end-to-end tests (test/e2e/dashboards, test/e2e/realnode)
// check every panel with it; no production binary imports it.
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
//   - exempt.go: Exemptions name the panels, targets and variables that may lack
//     data where a check runs (no GPU on a node), with a reason; Check reports them
//     apart and refuses exemptions that name nothing.
//   - render.go: Render draws a dashboard's panels, laid out as on Grafana's grid,
//     from Prometheus' range API to a PNG (gonum.org/v1/plot).
//   - thresholds.go: the threshold steps; a stat's value is drawn in its step's
//     colour (or fills the panel, colorMode background), a time series draws its
//     thresholds as lines: a stale value is never drawn green.
//
// Traps:
//   - A panel counts as empty when its query returns only NaN: histogram_quantile
//     over a window without observations is NaN, not absent. Each target is checked
//     on its own: one empty target fails its panel.
//   - Repeated panels (repeat: node) are checked once, with the variable standing
//     for all its values.
//   - $__rate_interval must span at least two scrapes, or rate() returns nothing:
//     Window.RateInterval defaults to 1m; a caller scraping every second should pass
//     4 s, as Grafana would for a 1 s scrape interval.
//   - dcgm-exporter's series are absent without a GPU: the GPU panels' `or on(UUID)`
//     joins are parsed and run, but only their Understory side returns data.
//   - An exemption excuses only a lack of data: a query Prometheus refuses fails
//     all the same. An exempt panel that has data is simply OK.
//   - Threshold lines do not stretch a time series' axis (Grafana's do not): a line
//     far above the data is not drawn. Percentage thresholds are not drawn.
//   - The tests read the shipped dashboards from ../../../manifests/grafana: they run in
//     this package's folder.
package grafana
