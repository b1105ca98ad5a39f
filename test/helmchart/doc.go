// Package helmchart keeps the Helm chart charts/understory and the kustomize install
// under manifests/ one install: the chart is generated from kustomize's output, and
// its renderings are compared with kustomize's, object by object.
//
// The tests:
//   - TestChartIsGenerated: every template of the chart but the hand-written ones
//     (_helpers.tpl, certs.yaml, validate.yaml, second-scheduler-metrics-reader.yaml,
//     NOTES.txt), the CRD under crds/ and the
//     data files under files/ are what the generator in generate_test.go writes from
//     `kubectl kustomize` of the base and of each component (a component's new
//     objects under `if <value>`, the base objects it changes as if/else). Edit
//     manifests/, then run UNDERSTORY_UPDATE_CHART=1 go test ./test/helmchart -run
//     TestChartIsGenerated.
//   - TestChartMatchesKustomize: for each value set of a matrix (defaults, gpu,
//     systemd, cert-manager, alerts, servicemonitors, the second scheduler, Kueue
//     with the quota follower, all at once, the real-node values), `helm
//     template` renders the objects `kubectl kustomize` builds from the matching
//     composition of manifests/; a difference names the object and the field.
//   - TestHelmLint, TestChartRejectsBadValues: helm lint --strict, and clear errors
//     for values the chart cannot install (the values schema, the namespace, a
//     koordlet.config whose cgroupDriver differs from the value, a Prometheus service
//     account without its namespace).
//   - TestChartImages: image.repository and image.tag name every image (kueue-quota
//     with kueue.enabled).
//   - TestChartSecondSchedulerMetricsReader: secondScheduler.prometheusServiceAccount
//     binds the ClusterRole understory-scheduler-metrics-reader (get on /metrics) to
//     that account, only with the second scheduler on.
//   - TestChartSelfSignedCertificates: Helm's CA and certificates verify for the
//     Services' names and client auth, and the webhook's caBundle is the CA.
//   - TestHelmInstallUpgradeUninstall: on a real API server (internal/controlplane),
//     helm install --create-namespace; helm upgrade keeps the CA, the certificates
//     and the caBundle (lookup), and issues a deleted certificate again from the kept
//     CA; helm uninstall leaves the PodGroup CRD (crds/).
//
// The differences the comparison allows are listed in one place, expectedDifferences
// in chart_test.go: the Namespace (Helm's --create-namespace makes it), Secret data
// and the webhook's caBundle (certificates differ on every generation), the chart's
// Secret understory-ca (its kept CA), the alerts ConfigMap (kustomize's base
// always has it; the chart only with alerts=configMap), and the binding of the second
// scheduler's metrics reader to secondScheduler.prometheusServiceAccount (chart only;
// TestChartSecondSchedulerMetricsReader).
//
// Traps:
//   - helm is built by scripts/helm.sh (helm.sh/helm/v3 v3.22.0 from the Go module
//     proxy, cached in ~/.cache/understory/helm-v3.22.0/bin); kubectl is the one of the
//     control-plane binaries cache (scripts/k8s-binaries.sh --with kubectl). Without
//     them the tests skip, or fail under CI=true. UNDERSTORY_HELM names another helm.
//   - The manifests are copied into a temp dir (test/e2e/manifestcopy), whose
//     certs/generate.sh needs openssl.
//   - A template the generator writes starts with its "Generated from manifests/"
//     header; remove the header and the file is yours (and no longer checked).
//   - The generator knows a few objects by name (generate_test.go: the agent's
//     ConfigMap, the extender's and the Kueue quota follower's Deployments (their
//     extraArgs values), the webhook, the alerts ConfigMap) and
//     images by their form (understory/<name>:<VERSION>, registry.k8s.io/
//     kube-scheduler:<version>). It refuses what it cannot express: a component that
//     removes a base object, or two contents for one data file.
//   - An object that several components change is written once per combination of
//     them (the webhook: certificates mode × second scheduler); a new component that
//     changes it too multiplies those copies.
//   - `helm template` renders no crds/: the comparison reads them from the chart.
package helmchart
