package helmchart_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const productionValues = "charts/understory/ci/production-values.yaml"

// podSpec returns workload o's pod spec.
func podSpec(o obj) map[string]any {
	spec, _ := o["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	ps, _ := tmpl["spec"].(map[string]any)
	return ps
}

// A production values file that sets every placement, priority, size, pull-secret,
// rollout and monitoring value lints, and each value lands where it was meant: on
// every workload its own, nothing of the manifests' own field left beside it.
func TestChartProductionValues(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	f := filepath.Join(repoRoot, productionValues)
	if out, err := run(context.Background(), "", helm, "lint", chartDir, "--strict", "--namespace", namespace, "--values", f); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := helmTemplate(context.Background(), helm, f)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	byKey := map[string]obj{}
	for _, o := range objs {
		byKey[key(o)] = o
	}
	for k, w := range workloads() {
		o, ok := byKey[k]
		if !ok {
			t.Errorf("%s not rendered with the production values", k)
			continue
		}
		want := dig(values, strings.Split(w.values, ".")...).(map[string]any)
		ps := podSpec(o)
		for _, field := range podFields {
			if !reflect.DeepEqual(ps[field], want[field]) {
				t.Errorf("%s: %s is %s, want %s.%s: %s", k, field, short(ps[field]), w.values, field, short(want[field]))
			}
		}
		if got := ps["imagePullSecrets"]; !reflect.DeepEqual(got, values["imagePullSecrets"]) {
			t.Errorf("%s: imagePullSecrets %s", k, short(got))
		}
		found := false
		for _, c := range ps["containers"].([]any) {
			cm := c.(map[string]any)
			if cm["name"] == w.container {
				found = true
				if !reflect.DeepEqual(cm["resources"], want["resources"]) {
					t.Errorf("%s: container %s resources %s, want %s", k, w.container, short(cm["resources"]), short(want["resources"]))
				}
			}
		}
		if !found {
			t.Errorf("%s: no container %s", k, w.container)
		}
		if o["kind"] == "DaemonSet" {
			if got := dig(o, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"); got != "25%" {
				t.Errorf("%s: maxUnavailable %v, want koordlet.maxUnavailable 25%%", k, got)
			}
		}
	}
	// admission.port: the pod listens there and its NetworkPolicy admits it.
	var listens []any
	for _, c := range podSpec(byKey[admissionDeploy])["containers"].([]any) {
		cm := c.(map[string]any)
		for _, a := range cm["args"].([]any) {
			if s := a.(string); strings.HasPrefix(s, "-listen=") {
				listens = append(listens, s)
			}
		}
		for _, p := range cm["ports"].([]any) {
			listens = append(listens, p.(map[string]any)["containerPort"])
		}
	}
	if want := []any{"-listen=:8443", float64(8443)}; !reflect.DeepEqual(listens, want) {
		t.Errorf("webhook listens on %v, want %v", listens, want)
	}
	if got := dig(byKey[admissionPolicy], "spec", "ingress").([]any)[0].(map[string]any)["ports"]; !reflect.DeepEqual(got, []any{map[string]any{"protocol": "TCP", "port": float64(8443)}}) {
		t.Errorf("the webhook's NetworkPolicy admits %s, want 8443", short(got))
	}
	monitors := 0
	for _, o := range objs {
		var vk string
		switch o["kind"] {
		case "ServiceMonitor":
			vk = "serviceMonitors"
		case "PrometheusRule":
			vk = "prometheusRule"
		default:
			continue
		}
		monitors++
		md := o["metadata"].(map[string]any)
		labels, _ := md["labels"].(map[string]any)
		if labels["release"] != "kube-prometheus-stack" || labels["app.kubernetes.io/part-of"] != "understory" {
			t.Errorf("%s: labels %s, want the manifests' and %s.labels", key(o), short(labels), vk)
		}
		if ann, _ := md["annotations"].(map[string]any); ann["owner"] != "platform" {
			t.Errorf("%s: annotations %s, want %s.annotations", key(o), short(ann), vk)
		}
	}
	if monitors < 2 {
		t.Errorf("%d ServiceMonitors and PrometheusRules rendered, want them all", monitors)
	}
}

// koordlet.maxUnavailable takes a count as well as a percentage, and refuses what a
// DaemonSet would not take.
func TestChartMaxUnavailable(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range []struct {
		value string
		want  any // nil: refused
	}{
		{"3", float64(3)},
		{`"10%"`, "10%"},
		{`"0%"`, nil},
		{"0", nil},
		{`"ten"`, nil},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte("gpu: {enabled: true}\nkoordlet: {maxUnavailable: "+tc.value+"}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := helmTemplate(context.Background(), helm, f)
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), "maxUnavailable") {
					t.Fatalf("rendered (error %v); want a refusal naming maxUnavailable", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(out)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, o := range objs {
				if o["kind"] != "DaemonSet" {
					continue
				}
				n++
				if got := dig(o, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("%s: maxUnavailable %#v, want %#v", key(o), got, tc.want)
				}
			}
			if n != 2 {
				t.Errorf("%d DaemonSets, want the two agents", n)
			}
		})
	}
}

// The chart installs on the oldest Kubernetes the project tests (1.34: README.md,
// "Install") and refuses older API servers, as Chart.yaml's kubeVersion says.
func TestChartKubeVersionFloor(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range []struct {
		version string
		ok      bool
	}{{"1.33.9", false}, {"1.34.0", true}, {"v1.34.2-gke.1000", true}, {"1.37.2", true}} {
		t.Run(tc.version, func(t *testing.T) {
			t.Parallel()
			out, err := run(context.Background(), "", helm, "template", "understory", chartDir, "--namespace", namespace, "--kube-version", tc.version)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "kubeVersion")) {
				t.Fatalf("rendered %d bytes (error %v); want a refusal naming kubeVersion", len(out), err)
			}
		})
	}
}

// The second scheduler runs the cluster's own kube-scheduler version (the skew policy
// allows the same version everywhere; the manifests' pinned one may be newer than a
// managed API server), without a distribution's suffix; secondScheduler.image pins one.
func TestChartSecondSchedulerFollowsCluster(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	for _, tc := range []struct {
		kube, image, want string
	}{
		{"v1.34.2-gke.1000", "", "registry.k8s.io/kube-scheduler:v1.34.2"},
		{"v1.35.1-eks-3025e55", "", "registry.k8s.io/kube-scheduler:v1.35.1"},
		{"1.36.0", "", "registry.k8s.io/kube-scheduler:v1.36.0"},
		{"v1.34.2-gke.1000", "mirror.example/kube-scheduler:v1.34.1", "mirror.example/kube-scheduler:v1.34.1"},
	} {
		t.Run(tc.kube+" "+tc.image, func(t *testing.T) {
			t.Parallel()
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte("secondScheduler: {enabled: true, image: \""+tc.image+"\"}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := run(context.Background(), "", helm, "template", "understory", chartDir, "--namespace", namespace,
				"--kube-version", tc.kube, "--values", f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(out)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if key(o) != secondScheduler {
					continue
				}
				c := podSpec(o)["containers"].([]any)[0].(map[string]any)
				if c["image"] != tc.want {
					t.Fatalf("image %v, want %s", c["image"], tc.want)
				}
				return
			}
			t.Fatal("no second scheduler rendered")
		})
	}
}

// Under GitOps the chart is rendered by `helm template`, which has no cluster to read
// the self-signed Secrets back from: certificates.pinned gives the PEM files
// (manifests/certs/generate.sh's), and two renders then carry the same certificates,
// the webhook's caBundle the given CA. A partial set fails, naming what is missing.
func TestChartPinnedCertificates(t *testing.T) {
	t.Parallel()
	helm := findHelm(t)
	dir := t.TempDir()
	if out, err := run(context.Background(), "", filepath.Join(repoRoot, "manifests/certs/generate.sh"), "-d", dir); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, out)
	}
	files := map[string]string{"caCrt": "ca.crt", "caKey": "ca.key", "admissionCrt": "admission.crt",
		"admissionKey": "admission.key", "schedulerExtenderCrt": "scheduler-extender.crt",
		"schedulerExtenderKey": "scheduler-extender.key", "schedulerClientCrt": "scheduler-client.crt",
		"schedulerClientKey": "scheduler-client.key"}
	pinned := map[string]any{}
	for k, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		pinned[k] = string(b)
	}
	writeValues := func(p map[string]any) string {
		b, err := yaml.Marshal(map[string]any{"certificates": map[string]any{"pinned": p}})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := writeValues(pinned)
	first, err := helmTemplate(context.Background(), helm, f)
	if err != nil {
		t.Fatal(err)
	}
	second, err := helmTemplate(context.Background(), helm, f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Error("two renders with the same pinned certificates differ")
	}
	objs, err := decode(first)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{"understory-admission-tls": {"admissionCrt", "admissionKey"},
		"understory-scheduler-extender-tls": {"schedulerExtenderCrt", "schedulerExtenderKey"},
		"understory-scheduler-client-tls":   {"schedulerClientCrt", "schedulerClientKey"}, "understory-ca": {"caCrt", "caKey"}}
	caB64 := base64.StdEncoding.EncodeToString([]byte(pinned["caCrt"].(string)))
	seen := 0
	for _, o := range objs {
		k := key(o)
		if o["kind"] == "MutatingWebhookConfiguration" {
			for _, h := range o["webhooks"].([]any) {
				if got := dig(h.(map[string]any), "clientConfig", "caBundle"); got != caB64 {
					t.Errorf("%s: caBundle is not the pinned CA", k)
				}
			}
		}
		if o["kind"] != "Secret" {
			continue
		}
		name := dig(o, "metadata", "name").(string)
		w, ok := want[name]
		if !ok {
			continue
		}
		seen++
		data := o["data"].(map[string]any)
		for field, v := range map[string]string{"tls.crt": w[0], "tls.key": w[1]} {
			if data[field] != base64.StdEncoding.EncodeToString([]byte(pinned[v].(string))) {
				t.Errorf("%s %s is not certificates.pinned.%s", name, field, v)
			}
		}
		if name != "understory-ca" && data["ca.crt"] != caB64 {
			t.Errorf("%s ca.crt is not the pinned CA", name)
		}
	}
	if seen != len(want) {
		t.Errorf("%d of the %d certificate Secrets rendered", seen, len(want))
	}
	delete(pinned, "schedulerClientKey")
	if _, err := helmTemplate(context.Background(), helm, writeValues(pinned)); err == nil ||
		!strings.Contains(err.Error(), "certificates.pinned.schedulerClientKey") {
		t.Errorf("a partial pinned set: %v; want an error naming certificates.pinned.schedulerClientKey", err)
	}
}
