// Package alerts tests Understory's Prometheus alerting rules: the rule file
// manifests/monitoring/understory-alerts.yaml (ConfigMap understory-prometheus-rules,
// for a Prometheus without the Operator) and the PrometheusRule of
// manifests/components/prometheusrule (for the Prometheus Operator). docs/alerts.md
// says what each alert means and what to do.
//
// The tests check that:
//   - the PrometheusRule's spec.groups equal the rule file's groups (one source of
//     truth, kept by hand in two places: kustomize cannot put a file's content into
//     a resource's spec, and the Operator's CRD must stay out of manifests/base);
//   - `promtool check rules` accepts both, and `promtool test rules` passes the unit
//     tests of testdata/understory-alerts_test.yaml against both;
//   - every alert has a unit test in which it fires and one in which it does not;
//   - every metric an expression names is one the metrics package defines (or up), or
//     one kube-scheduler v1.37.2 serves (testdata/kube-scheduler-v1.37.2-metrics.txt,
//     read from the binary's /metrics: the second scheduler's alerts), selected only by
//     labels its series carry; and every job it names is a scrape job of
//     manifests/monitoring/prometheus-scrape.yaml.
//   - the rule file is the ConfigMap understory-prometheus-rules (no name hash: a
//     Prometheus mounts it by name) and the PrometheusRule only a Component, never in
//     manifests/base (`kubectl apply -k manifests/` must work without the Operator).
//
// Traps:
//   - promtool is Debian's prometheus package (scripts/prometheus.sh installs it, as
//     for test/e2e/dashboards); without it the promtool tests skip, or fail under CI=true
//     (internal/testenv.SkipOrFailInCI). UNDERSTORY_PROMTOOL names another binary.
//   - promtool resolves rule_files relative to the test file: each run copies the test
//     file and the rules under test, named understory-alerts.yaml, into a temp dir.
//   - promtool compares annotations exactly: a changed summary or description must be
//     changed in the unit tests too. Input series with `_` samples stay visible for the
//     5-minute lookback, so a series that vanishes at 10m is absent only after 15m.
//   - Rule expressions must keep the scrape targets' labels (node, pod, and, under the
//     Operator, namespace/service/endpoint): aggregate with `without`, not `by`, except
//     where the alert is per node by design (UnderstoryGPULost).
package alerts
