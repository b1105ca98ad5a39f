package helmchart_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// chartCase is one value set and the kustomize composition it must equal.
type chartCase struct {
	name   string
	values string // YAML values file content ("" for the defaults)
	// valuesFile is a values file of the repository, relative to its root.
	valuesFile string
	// components: base plus these (relative to manifests/); or overlay, a shipped
	// kustomization (relative to manifests/).
	components []string
	overlay    string
}

func chartCases() []chartCase {
	return []chartCase{
		{name: "defaults", components: []string{"certs"}},
		{name: "gpu", values: "gpu: {enabled: true}", components: []string{"certs", "components/gpu"}},
		{name: "systemd", values: "cgroupDriver: systemd", components: []string{"certs", "components/systemd"}},
		{name: "cert-manager", values: "certificates: {mode: cert-manager}", components: []string{"components/cert-manager"}},
		{name: "alerts-prometheusrule", values: "alerts: prometheusRule", components: []string{"certs", "components/prometheusrule"}},
		{name: "alerts-none", values: "alerts: none", components: []string{"certs"}},
		{name: "servicemonitors", values: "serviceMonitors: {enabled: true}", components: []string{"certs", "components/servicemonitor"}},
		{name: "second-scheduler", values: "secondScheduler: {enabled: true}", components: []string{"certs", "components/second-scheduler"}},
		{name: "second-scheduler-cert-manager", values: "secondScheduler: {enabled: true}\ncertificates: {mode: cert-manager}",
			components: []string{"components/cert-manager", "components/second-scheduler"}},
		{name: "second-scheduler-prometheus-account", values: "secondScheduler: {enabled: true, prometheusServiceAccount: {namespace: monitoring, name: prometheus}}",
			components: []string{"certs", "components/second-scheduler"}},
		{name: "servicemonitors-second-scheduler", values: "serviceMonitors: {enabled: true}\nsecondScheduler: {enabled: true}",
			components: []string{"certs", "components/servicemonitor", "components/second-scheduler"}},
		{name: "kueue", values: "kueue: {enabled: true}", components: []string{"certs", "components/kueue"}},
		{name: "from-koordinator", values: "koordinator: {enabled: true}", components: []string{"certs", "components/from-koordinator"}},
		{name: "from-koordinator-second-scheduler", values: "koordinator: {enabled: true}\nsecondScheduler: {enabled: true}",
			components: []string{"certs", "components/second-scheduler", "components/from-koordinator"}},
		{name: "everything", values: "gpu: {enabled: true}\ncgroupDriver: systemd\ncertificates: {mode: cert-manager}\nalerts: prometheusRule\nserviceMonitors: {enabled: true}\nsecondScheduler: {enabled: true}\nkueue: {enabled: true}\nkoordinator: {enabled: true}\n",
			components: []string{"components/cert-manager", "components/gpu", "components/systemd", "components/prometheusrule", "components/servicemonitor", "components/second-scheduler", "components/kueue", "components/from-koordinator"}},
		{name: "everything-self-signed", values: "gpu: {enabled: true}\ncgroupDriver: systemd\nalerts: none\nserviceMonitors: {enabled: true}\nsecondScheduler: {enabled: true}\n",
			components: []string{"certs", "components/gpu", "components/systemd", "components/servicemonitor", "components/second-scheduler"}},
		{name: "realnode", valuesFile: "charts/understory/ci/realnode-values.yaml", overlay: "overlays/realnode"},
	}
}

// expectedDifferences is the one place that says where the chart renders otherwise
// than kustomize, and why. It removes those objects and fields from both sides.
//   - Namespace understory-system: kustomize's base creates it (labelled
//     pod-security.kubernetes.io/enforce=privileged and part-of=understory); Helm makes
//     it with --create-namespace, bare (README.md, "Install with Helm").
//   - Secret data and the webhook's caBundle: certificates are new on every generation;
//     the chart's leaf Secrets also carry understory.io/not-after (their expiry, for
//     the reissue within 30 days of it on upgrade).
//   - Secret understory-ca, chart only, with certificates.mode self-signed: the chart
//     keeps its CA (key included) in the cluster, to keep the certificates across
//     upgrades; kustomize's certs component leaves it as files of generate.sh.
//   - ConfigMap understory-prometheus-rules: kustomize's base always has it; the chart
//     only with alerts=configMap.
//   - ClusterRoleBinding understory-scheduler-metrics-reader, chart only, with
//     secondScheduler.prometheusServiceAccount: the chart binds the second scheduler's
//     metrics reader to the Prometheus service account it names; kustomize leaves that
//     binding to the user (TestChartSecondSchedulerMetricsReader checks it).
func expectedDifferences(objs []obj, chart bool, values map[string]any) []obj {
	certMode, _ := dig(values, "certificates", "mode").(string)
	alerts, _ := values["alerts"].(string)
	var out []obj
	for _, o := range objs {
		k := key(o)
		switch {
		case k == namespaceObject:
			continue
		case k == rulesConfigMap && !chart && alerts != "configMap":
			continue
		case chart && certMode == "self-signed" && k == "Secret/"+namespace+"/understory-ca":
			continue
		case chart && k == metricsReaderBinding:
			continue
		case o["kind"] == "Secret":
			delete(o, "data")
			delete(o, "stringData")
			// The chart's self-signed certificates say when they expire, for the
			// reissue within 30 days of it on upgrade.
			if md, _ := o["metadata"].(map[string]any); md != nil {
				if ann, _ := md["annotations"].(map[string]any); ann != nil {
					delete(ann, "understory.io/not-after")
					if len(ann) == 0 {
						delete(md, "annotations")
					}
				}
			}
		case k == webhookConfig:
			hooks, _ := o["webhooks"].([]any)
			for _, h := range hooks {
				if cc, ok := h.(map[string]any)["clientConfig"].(map[string]any); ok {
					delete(cc, "caBundle")
				}
			}
		}
		out = append(out, o)
	}
	return out
}

// dig returns the value at the path of nested maps, or nil.
func dig(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

// testedKubeVersion is the Kubernetes version the manifests pin kube-scheduler at (and
// every test runs): rendered at it, the chart's second scheduler (which follows the
// cluster's version) is the manifests'.
const testedKubeVersion = "v1.37.2"

// renderValues renders the chart with values (a values file's text) for an API
// server at testedKubeVersion and returns its objects.
func renderValues(t *testing.T, helm, values string) []obj {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helmTemplate(context.Background(), helm, f)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// helmTemplate renders the chart with the values files, for an API server at
// testedKubeVersion.
func helmTemplate(ctx context.Context, helm string, valuesFiles ...string) ([]byte, error) {
	args := []string{"template", "understory", chartDir, "--namespace", namespace, "--kube-version", testedKubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	return run(ctx, "", helm, args...)
}

// The chart renders the objects of the kustomize install, for every value set of
// chartCases: same objects (kind/namespace/name), each equal field by field, but for
// expectedDifferences.
func TestChartMatchesKustomize(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	m := newManifests(t)
	defaults := chartDefaults(t)
	for _, tc := range chartCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			valuesFile := filepath.Join(t.TempDir(), "values.yaml")
			content := []byte(tc.values)
			if tc.valuesFile != "" {
				var err error
				if content, err = os.ReadFile(filepath.Join(repoRoot, tc.valuesFile)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(valuesFile, content, 0o644); err != nil {
				t.Fatal(err)
			}
			values := map[string]any{}
			if err := yaml.Unmarshal(content, &values); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			values = merge(defaults, values)

			out, err := helmTemplate(ctx, helm, valuesFile)
			if err != nil {
				t.Fatal(err)
			}
			chart, err := decode(out)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			// crds/ is not rendered by `helm template` without --include-crds.
			crds, err := readCRDs(filepath.Join(chartDir, "crds"))
			if err != nil {
				t.Fatal(err)
			}
			chart = append(chart, crds...)

			var kust []obj
			if tc.overlay != "" {
				kust, err = m.kustomize(ctx, filepath.Join(m.root, tc.overlay))
			} else {
				kust, err = m.build(ctx, tc.name, []string{"base"}, tc.components, false)
			}
			if err != nil {
				t.Fatal(err)
			}
			compareObjects(t, expectedDifferences(chart, true, values), expectedDifferences(kust, false, values))
		})
	}
}

// chartDefaults returns the chart's values.yaml.
func chartDefaults(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]any{}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	return v
}

// merge returns b over a, maps merged recursively (as Helm merges values).
func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		am, aok := out[k].(map[string]any)
		bm, bok := v.(map[string]any)
		if aok && bok {
			out[k] = merge(am, bm)
			continue
		}
		out[k] = v
	}
	return out
}

func readCRDs(dir string) ([]obj, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []obj
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		objs, err := decode(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// compareObjects fails t for every object only one side has and every field where
// two objects of the same kind/namespace/name differ.
func compareObjects(t *testing.T, chart, kust []obj) {
	t.Helper()
	index := func(side string, objs []obj) map[string]obj {
		m := map[string]obj{}
		for _, o := range objs {
			k := key(o)
			if _, dup := m[k]; dup {
				t.Errorf("%s renders %s twice", side, k)
			}
			m[k] = o
		}
		return m
	}
	c, k := index("the chart", chart), index("kustomize", kust)
	for _, n := range unionKeys(c, k) {
		co, inChart := c[n]
		ko, inKust := k[n]
		switch {
		case !inChart:
			t.Errorf("%s: kustomize has it, the chart does not", n)
		case !inKust:
			t.Errorf("%s: the chart has it, kustomize does not", n)
		default:
			for _, d := range diff("", co, ko) {
				t.Errorf("%s: %s", n, d)
			}
		}
	}
}

// diff lists the fields where chart value a and kustomize value b differ.
func diff(path string, a, b any) []string {
	if reflect.DeepEqual(a, b) {
		return nil
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var keys []string
		for k := range am {
			keys = append(keys, k)
		}
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		var out []string
		for _, k := range keys {
			out = append(out, diff(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok && len(al) == len(bl) {
		var out []string
		for i := range al {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), al[i], bl[i])...)
		}
		return out
	}
	return []string{fmt.Sprintf("%s: chart %s, kustomize %s", strings.TrimPrefix(path, "."), short(a), short(b))}
}

// short prints a value for a diff line, long strings cut.
func short(v any) string {
	if v == nil {
		return "(absent)"
	}
	s := fmt.Sprintf("%#v", v)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// helm lint passes with the defaults and every value set the chart ships or tests.
func TestHelmLint(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range chartCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"lint", chartDir, "--strict", "--namespace", namespace}
			f := tc.valuesFile
			if f == "" {
				f = filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(f, []byte(tc.values), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				f = filepath.Join(repoRoot, f)
			}
			args = append(args, "--values", f)
			if out, err := run(context.Background(), "", helm, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// Values the install cannot work with fail the render, with a message that names
// what to change.
func TestChartRejectsBadValues(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range []struct {
		name, values, namespace, mentions string
	}{
		{"other namespace", "", "default", "understory-system"},
		{"unknown cgroup driver", "cgroupDriver: cgroupv2", namespace, "cgroupDriver"},
		{"unknown certificates mode", "certificates: {mode: vault}", namespace, "mode"},
		{"unknown alerts", "alerts: yes", namespace, "alerts"},
		{"empty tag", `image: {tag: ""}`, namespace, "tag"},
		{"koordlet config with another driver", "cgroupDriver: systemd\nkoordlet: {config: \"cgroupDriver: cgroupfs\\n\"}", namespace, "cgroupDriver"},
		{"koordlet config not YAML", "koordlet: {config: \"[\"}", namespace, "koordlet.config"},
		{"unknown kueue value", "kueue: {enabled: true, replicas: 3}", namespace, "replicas"},
		{"kueue follower args not strings", "kueue: {quotaFollower: {extraArgs: [1]}}", namespace, "extraArgs"},
		{"prometheus account without namespace", "secondScheduler: {enabled: true, prometheusServiceAccount: {name: prometheus}}",
			namespace, "prometheusServiceAccount"},
		{"prometheus account without name", "secondScheduler: {prometheusServiceAccount: {namespace: monitoring}}",
			namespace, "prometheusServiceAccount"},
		{"prometheus account not a name", "secondScheduler: {prometheusServiceAccount: {namespace: monitoring, name: Prom_1}}",
			namespace, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(tc.values), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := run(context.Background(), "", helm, "template", "understory", chartDir, "--namespace", tc.namespace, "--values", f)
			if err == nil {
				t.Fatalf("helm template rendered %d bytes; want an error", len(out))
			}
			if !strings.Contains(err.Error(), tc.mentions) {
				t.Errorf("the error does not name %q:\n%v", tc.mentions, err)
			}
		})
	}
}

// image.repository and image.tag name every image of the install, the GPU agent's,
// the Kueue quota follower's and the release ConfigMap's included.
func TestChartImages(t *testing.T) {
	t.Parallel()
	objs := renderValues(t, findHelm(t), "image: {repository: registry.example/u, tag: \"1.2.3\"}\ngpu: {enabled: true}\nkueue: {enabled: true}\n")
	seen := map[string]bool{}
	version := readVersion(t)
	for _, o := range objs {
		walkStrings(o, func(s string) (string, bool) {
			if strings.Contains(s, "understory/") && strings.Contains(s, ":"+version) {
				t.Errorf("%s still names %q", key(o), s)
			}
			if strings.HasPrefix(s, "registry.example/u/") {
				seen[s] = true
			}
			return s, false
		})
	}
	for _, name := range []string{"koordlet-nogpu", "koordlet", "scheduler-extender", "admission", "kueue-quota"} {
		if want := "registry.example/u/" + name + ":1.2.3"; !seen[want] {
			t.Errorf("no %s in the rendered chart", want)
		}
	}
}

// With certificates.mode self-signed the chart's certificates work together: the
// webhook's and the extender's serving certificates verify against the CA for their
// Service names, kube-scheduler's client certificate for client auth, every Secret
// carries that CA, and the webhook's caBundle is it.
func TestChartSelfSignedCertificates(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	out, err := helmTemplate(context.Background(), helm)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]obj{}
	for _, o := range objs {
		byKey[key(o)] = o
	}
	secretPEM := func(name, field string) []byte {
		t.Helper()
		s, ok := byKey["Secret/"+namespace+"/"+name]
		if !ok {
			t.Fatalf("no Secret %s", name)
		}
		b64, _ := dig(s, "data", field).(string)
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(data) == 0 {
			t.Fatalf("Secret %s %s: %q: %v", name, field, b64, err)
		}
		return data
	}
	caPEM := secretPEM("understory-ca", "tls.crt")
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("understory-ca tls.crt is no PEM certificate")
	}
	for _, tc := range []struct {
		secret, dnsName string
		usage           x509.ExtKeyUsage
	}{
		{"understory-admission-tls", "understory-admission.understory-system.svc", x509.ExtKeyUsageServerAuth},
		{"understory-scheduler-extender-tls", "understory-scheduler-extender.understory-system.svc", x509.ExtKeyUsageServerAuth},
		{"understory-scheduler-client-tls", "", x509.ExtKeyUsageClientAuth},
	} {
		if got := secretPEM(tc.secret, "ca.crt"); !bytes.Equal(got, caPEM) {
			t.Errorf("%s ca.crt is not the CA of understory-ca", tc.secret)
		}
		if _, err := tls.X509KeyPair(secretPEM(tc.secret, "tls.crt"), secretPEM(tc.secret, "tls.key")); err != nil {
			t.Errorf("%s: tls.crt and tls.key are no pair: %v", tc.secret, err)
		}
		block, _ := pem.Decode(secretPEM(tc.secret, "tls.crt"))
		if block == nil {
			t.Fatalf("%s tls.crt is not PEM", tc.secret)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", tc.secret, err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: tc.dnsName, Roots: pool, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s does not verify against the CA for %q: %v", tc.secret, tc.dnsName, err)
		}
	}
	hooks, _ := byKey[webhookConfig]["webhooks"].([]any)
	if len(hooks) == 0 {
		t.Fatal("the MutatingWebhookConfiguration has no webhooks")
	}
	for i, h := range hooks {
		b64, _ := dig(h.(map[string]any), "clientConfig", "caBundle").(string)
		if got, err := base64.StdEncoding.DecodeString(b64); err != nil || !bytes.Equal(got, caPEM) {
			t.Errorf("webhooks[%d].clientConfig.caBundle is not the CA (%v)", i, err)
		}
	}
}

// metricsReaderBinding binds the second scheduler's ClusterRole
// understory-scheduler-metrics-reader (get on /metrics) to Prometheus' service account:
// hand-written in the chart (templates/second-scheduler-metrics-reader.yaml), from
// secondScheduler.prometheusServiceAccount.
const metricsReaderBinding = "ClusterRoleBinding//understory-scheduler-metrics-reader"

// secondScheduler.prometheusServiceAccount binds the second scheduler's metrics reader
// to that account, only with the second scheduler on; empty, nothing is bound.
func TestChartSecondSchedulerMetricsReader(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range []struct {
		name, values string
		// subject is the binding's one subject (namespace/name), "" for no binding.
		subject string
	}{
		{"bound", "secondScheduler: {enabled: true, prometheusServiceAccount: {namespace: monitoring, name: prometheus-k8s}}",
			"monitoring/prometheus-k8s"},
		{"no account", "secondScheduler: {enabled: true}", ""},
		{"second scheduler off", "secondScheduler: {prometheusServiceAccount: {namespace: monitoring, name: prometheus-k8s}}", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := renderValues(t, helm, tc.values)
			byKey := map[string]obj{}
			for _, o := range objs {
				byKey[key(o)] = o
			}
			b, bound := byKey[metricsReaderBinding]
			if tc.subject == "" {
				if bound {
					t.Errorf("rendered %s; want none", metricsReaderBinding)
				}
				return
			}
			if !bound {
				t.Fatalf("no %s", metricsReaderBinding)
			}
			if _, ok := byKey["ClusterRole//understory-scheduler-metrics-reader"]; !ok {
				t.Error("the binding's ClusterRole understory-scheduler-metrics-reader is not rendered")
			}
			if ref := dig(b, "roleRef", "name"); ref != "understory-scheduler-metrics-reader" {
				t.Errorf("roleRef.name %v", ref)
			}
			subjects, _ := b["subjects"].([]any)
			if len(subjects) != 1 {
				t.Fatalf("subjects %v, want one", subjects)
			}
			sub, _ := subjects[0].(map[string]any)
			if got := fmt.Sprintf("%v/%v", sub["namespace"], sub["name"]); sub["kind"] != "ServiceAccount" || got != tc.subject {
				t.Errorf("subject %v, want ServiceAccount %s", sub, tc.subject)
			}
		})
	}
}
