package e2e_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/test/e2e/manifestcopy"
)

// The names the manifests give the pieces other tools (the real-node e2e,
// docs) rely on.
const (
	nsSystem         = "understory-system"
	extenderName     = "understory-scheduler-extender"
	extenderSA       = "system:serviceaccount:understory-system:understory-scheduler-extender"
	koordletName     = "understory-koordlet"
	admissionName    = "understory-admission"
	schedulerConfig  = "understory-scheduler-config"
	schedulerConfKey = "kube-scheduler-config.yaml"
)

// composition writes a kustomization under root/test-<name> made of base and
// the given components (paths relative to root), for variants no shipped
// kustomization builds, and returns its directory.
func composition(t *testing.T, root, name string, components ...string) string {
	t.Helper()
	dir := filepath.Join(root, "test-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../base]\ncomponents:\n")
	for _, c := range components {
		fmt.Fprintf(&b, "  - ../%s\n", c)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// podTemplate returns the pod template of a Deployment or DaemonSet.
func podTemplate(t *testing.T, o *unstructured.Unstructured) corev1.PodTemplateSpec {
	t.Helper()
	switch o.GetKind() {
	case "Deployment":
		var d appsv1.Deployment
		fromUnstructured(t, o, &d)
		return d.Spec.Template
	case "DaemonSet":
		var d appsv1.DaemonSet
		fromUnstructured(t, o, &d)
		return d.Spec.Template
	}
	t.Fatalf("%s %s has no pod template", o.GetKind(), o.GetName())
	return corev1.PodTemplateSpec{}
}

func fromUnstructured(t *testing.T, o *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

// workloadImages returns every container's image and pull policy of the
// objects with pod templates (Deployment, DaemonSet, Job).
func workloadImages(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objs {
		var spec corev1.PodSpec
		switch o.GetKind() {
		case "Deployment", "DaemonSet":
			spec = podTemplate(t, o).Spec
		default:
			continue
		}
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			out[o.GetKind()+"/"+o.GetName()+"/"+c.Name] = c.Image + " " + string(c.ImagePullPolicy)
		}
	}
	return out
}

// schedulerConfigOf returns the KubeSchedulerConfiguration shipped in the build.
func schedulerConfigOf(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	cm := mustFind(t, objs, "ConfigMap", schedulerConfig)
	raw, _, _ := unstructured.NestedString(cm.Object, "data", schedulerConfKey)
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%s: %v", schedulerConfKey, err)
	}
	return cfg
}

// extenderEntry is the one extender of cfg.
func extenderEntry(t *testing.T, cfg map[string]any) map[string]any {
	t.Helper()
	exts, _ := cfg["extenders"].([]any)
	if len(exts) != 1 {
		t.Fatalf("extenders: %v", cfg["extenders"])
	}
	e, _ := exts[0].(map[string]any)
	return e
}

// secretData returns key of the Secret name in objs, decoded.
func secretData(t *testing.T, objs []*unstructured.Unstructured, name, key string) []byte {
	t.Helper()
	s := mustFind(t, objs, "Secret", name)
	v, _, _ := unstructured.NestedString(s.Object, "data", key)
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil || len(b) == 0 {
		t.Fatalf("Secret %s key %s: %v", name, key, err)
	}
	return b
}

func parseCert(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemData)
	if block == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestManifestsBuild builds every shipped kustomization with kubectl's
// kustomize (v1.37.2) and checks what they promise without a cluster: one tag
// for every image and never :latest, the least-privilege settings of each
// workload, certificates that match the Services, the scheduler configuration
// that matches the extender's Service and certificate, and overlays that change
// only what they say.
// partOfLabel marks every object of the install but the shared CRDs.
const partOfLabel = "app.kubernetes.io/part-of"

// agentNodes is the agent's required node affinity: Linux nodes with a kubelet of their
// own (the DaemonSet tolerates every taint, so the affinity alone keeps it off Windows,
// virtual-kubelet and EKS Fargate nodes).
const agentNodes = "kubernetes.io/os In linux; type NotIn virtual-kubelet; eks.amazonaws.com/compute-type NotIn fargate"

// nodeAffinity renders a pod's required node affinity, one term, "key op values; ...".
func nodeAffinity(s corev1.PodSpec) string {
	if s.Affinity == nil || s.Affinity.NodeAffinity == nil ||
		s.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	terms := s.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 {
		return fmt.Sprintf("%d terms", len(terms))
	}
	var out []string
	for _, r := range terms[0].MatchExpressions {
		out = append(out, r.Key+" "+string(r.Operator)+" "+strings.Join(r.Values, ","))
	}
	return strings.Join(out, "; ")
}

func TestManifestsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kubectl; skipped in -short mode")
	}
	t.Parallel()
	ctx := context.Background()
	k := newKubectl(t, "")
	root := copyManifests(t)
	objs := k.build(t, ctx, root)

	t.Run("images", func(t *testing.T) {
		variants := map[string][]*unstructured.Unstructured{
			"root": objs, "gpu": k.build(t, ctx, filepath.Join(root, "overlays", "gpu")),
			"systemd": k.build(t, ctx, filepath.Join(root, "overlays", "systemd")),
		}
		tags := map[string]bool{}
		for variant, vobjs := range variants {
			images := workloadImages(t, vobjs)
			if len(images) == 0 {
				t.Fatalf("%s: no workloads", variant)
			}
			for where, img := range images {
				ref, policy, _ := strings.Cut(img, " ")
				name, tag, ok := strings.Cut(ref, ":")
				if !ok || tag == "" || tag == "latest" || !strings.HasPrefix(name, "understory/") {
					t.Errorf("%s %s: image %q, want understory/<name>:<release tag>", variant, where, ref)
				}
				if policy != string(corev1.PullIfNotPresent) {
					t.Errorf("%s %s: imagePullPolicy %q, want IfNotPresent", variant, where, policy)
				}
				tags[tag] = true
			}
		}
		if len(tags) != 1 {
			t.Errorf("images carry tags %v, want one release tag (base/kustomization.yaml)", tags)
		}
	})

	t.Run("uninstall selects Understory's objects, not the shared CRD", func(t *testing.T) {
		// `kubectl delete -k manifests/ -l app.kubernetes.io/part-of=understory`
		// (docs/operations.md) deletes every object but the PodGroup CRD, which the
		// coscheduling plugin and other controllers share.
		for variant, vobjs := range map[string][]*unstructured.Unstructured{
			"root": objs, "gpu": k.build(t, ctx, filepath.Join(root, "overlays", "gpu")),
			"systemd": k.build(t, ctx, filepath.Join(root, "overlays", "systemd")),
		} {
			crds := 0
			for _, o := range vobjs {
				part := o.GetLabels()[partOfLabel]
				if o.GetKind() == "CustomResourceDefinition" {
					crds++
					if part != "" {
						t.Errorf("%s: CRD %s is labelled %s=%q: an uninstall would delete it", variant, o.GetName(),
							partOfLabel, part)
					}
					continue
				}
				if part != "understory" {
					t.Errorf("%s: %s %s has no %s=understory label: an uninstall would leave it", variant, o.GetKind(),
						o.GetName(), partOfLabel)
				}
			}
			if crds == 0 {
				t.Errorf("%s: no CRD in the build", variant)
			}
		}
	})

	t.Run("one pass order", func(t *testing.T) {
		// kubectl applies in the order of the build: the namespace and the CRD
		// before anything else, the webhook configuration after its Service.
		idx := map[string]int{}
		for i, o := range objs {
			idx[o.GetKind()+"/"+o.GetName()] = i
		}
		if objs[0].GetKind() != "Namespace" || objs[0].GetName() != nsSystem {
			t.Errorf("first object %s %s, want Namespace %s", objs[0].GetKind(), objs[0].GetName(), nsSystem)
		}
		crd, ok := idx["CustomResourceDefinition/podgroups.scheduling.x-k8s.io"]
		if !ok || crd > idx["ServiceAccount/"+koordletName] {
			t.Errorf("PodGroup CRD at %d (present %v), want before the service accounts", crd, ok)
		}
		if idx["MutatingWebhookConfiguration/"+admissionName] < idx["Service/"+admissionName] {
			t.Error("the webhook configuration comes before its Service")
		}
		for _, o := range objs {
			if o.GetAPIVersion() == "scheduling.x-k8s.io/v1alpha1" {
				t.Errorf("%s %s is in the install: a CRD's objects cannot be applied with it", o.GetKind(), o.GetName())
			}
		}
		for _, want := range []string{"ServiceAccount/" + extenderName, "ClusterRole/" + extenderName,
			"DaemonSet/" + koordletName, "Deployment/" + extenderName, "Service/" + extenderName,
			"Deployment/" + admissionName, "ConfigMap/" + schedulerConfig, "ConfigMap/understory-prometheus-scrape",
			"ValidatingAdmissionPolicy/understory-koordlet-node", "ValidatingAdmissionPolicyBinding/understory-koordlet-node",
			"ValidatingAdmissionPolicy/understory-koordlet-pod-status",
			"ValidatingAdmissionPolicyBinding/understory-koordlet-pod-status",
			"ValidatingAdmissionPolicy/understory-batchslowed-writer",
			"ValidatingAdmissionPolicyBinding/understory-batchslowed-writer",
			"ValidatingAdmissionPolicy/understory-scheduler-extender-pods", "FlowSchema/" + extenderName,
			"NetworkPolicy/understory-default-deny-ingress", "Secret/understory-admission-tls",
			"Secret/understory-scheduler-extender-tls"} {
			if _, ok := idx[want]; !ok {
				t.Errorf("the install has no %s", want)
			}
		}
	})

	t.Run("agent pod least privilege", func(t *testing.T) {
		pod := podTemplate(t, mustFind(t, objs, "DaemonSet", koordletName)).Spec
		if got := nodeAffinity(pod); got != agentNodes {
			t.Errorf("agent's node affinity %q, want %q (it tolerates every taint)", got, agentNodes)
		}
		if pod.HostPID || pod.HostNetwork || pod.HostIPC {
			t.Errorf("hostPID %v hostNetwork %v hostIPC %v, want none", pod.HostPID, pod.HostNetwork, pod.HostIPC)
		}
		if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil ||
			pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("seccomp %+v, want RuntimeDefault", pod.SecurityContext)
		}
		c := pod.Containers[0]
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil ||
			*sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"BPF", "PERFMON"}) {
			t.Errorf("container security context %+v, want unprivileged, no escalation, read-only root, all "+
				"capabilities dropped but BPF and PERFMON (the run-queue delay probe)", sc)
		}
		for _, v := range pod.Volumes {
			if v.HostPath != nil && !slices.Contains([]string{"/sys/fs/cgroup", "/var/run/nri"}, v.HostPath.Path) {
				t.Errorf("host path %s mounted; the agent needs only cgroupfs and the NRI socket", v.HostPath.Path)
			}
		}
	})

	t.Run("gpu overlay", func(t *testing.T) {
		gobjs := k.build(t, ctx, filepath.Join(root, "overlays", "gpu"))
		base := podTemplate(t, mustFind(t, gobjs, "DaemonSet", koordletName)).Spec
		gpu := podTemplate(t, mustFind(t, gobjs, "DaemonSet", koordletName+"-gpu")).Spec
		// Every Linux node with a kubelet of its own runs exactly one agent: the GPU
		// agent where any GPU label (NVIDIA's, Node Feature Discovery's, a cloud's)
		// marks it, the pure-Go one elsewhere; none on Windows, virtual or Fargate nodes.
		linux := map[string]string{"kubernetes.io/os": "linux"}
		with := func(kv ...string) map[string]string {
			l := maps.Clone(linux)
			for i := 0; i < len(kv); i += 2 {
				l[kv[i]] = kv[i+1]
			}
			return l
		}
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   string // "gpu", "base" or "" (neither)
		}{
			{"plain node", linux, "base"},
			{"GPU Operator", with("nvidia.com/gpu.present", "true"), "gpu"},
			{"GPU Operator says false", with("nvidia.com/gpu.present", "false"), "base"},
			{"Node Feature Discovery", with("feature.node.kubernetes.io/pci-10de.present", "true"), "gpu"},
			{"GKE GPU pool", with("cloud.google.com/gke-accelerator", "nvidia-l4"), "gpu"},
			{"GKE CPU pool", with("cloud.google.com/gke-nodepool", "default-pool"), "base"},
			{"AKS GPU pool", with("kubernetes.azure.com/accelerator", "nvidia"), "gpu"},
			{"EKS Karpenter GPU", with("karpenter.k8s.aws/instance-gpu-manufacturer", "nvidia"), "gpu"},
			{"EKS Karpenter other accelerator", with("karpenter.k8s.aws/instance-gpu-manufacturer", "amd"), "base"},
			{"EKS Auto Mode GPU", with("eks.amazonaws.com/instance-gpu-manufacturer", "nvidia"), "gpu"},
			{"two GPU labels", with("nvidia.com/gpu.present", "true", "cloud.google.com/gke-accelerator", "nvidia-h100-80gb"), "gpu"},
			{"Windows", map[string]string{"kubernetes.io/os": "windows"}, ""},
			{"virtual-kubelet GPU", with("type", "virtual-kubelet", "nvidia.com/gpu.present", "true"), ""},
			{"Fargate", with("eks.amazonaws.com/compute-type", "fargate"), ""},
		} {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Labels: tc.labels}}
			var got []string
			for name, spec := range map[string]corev1.PodSpec{"base": base, "gpu": gpu} {
				ok, err := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: spec}).Match(node)
				if err != nil {
					t.Fatalf("%s agent's affinity: %v", name, err)
				}
				if ok {
					got = append(got, name)
				}
			}
			if want := []string{tc.want}; !slices.Equal(got, want) && !(tc.want == "" && len(got) == 0) {
				t.Errorf("%s (%v): agents %v, want %q", tc.name, tc.labels, got, tc.want)
			}
		}
		if !gpu.HostPID || base.HostPID {
			t.Errorf("hostPID: GPU agent %v, pure-Go agent %v; want only the GPU agent", gpu.HostPID, base.HostPID)
		}
		if sc := gpu.Containers[0].SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged {
			t.Errorf("GPU agent privileged: %+v", sc)
		}
		baseImg, gpuImg := base.Containers[0].Image, gpu.Containers[0].Image
		baseName, baseTag, _ := strings.Cut(baseImg, ":")
		if baseName != "understory/koordlet-nogpu" || gpuImg != "understory/koordlet:"+baseTag {
			t.Errorf("agent images %q and %q, want the pure-Go one and the cgo one (understory/koordlet) with "+
				"the same release tag", baseImg, gpuImg)
		}
		// A user's overlay retags every workload, the GPU agent's too.
		dir := filepath.Join(root, "test-retag")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var kust strings.Builder
		kust.WriteString("resources: [../overlays/gpu]\nimages:\n")
		for _, n := range []string{"koordlet", "koordlet-nogpu", "scheduler-extender", "admission"} {
			fmt.Fprintf(&kust, "  - {name: understory/%s, newName: registry.example:5000/understory/%s, newTag: v9}\n", n, n)
		}
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		for where, img := range workloadImages(t, k.build(t, ctx, dir)) {
			if ref, _, _ := strings.Cut(img, " "); !strings.HasPrefix(ref, "registry.example:5000/understory/") ||
				!strings.HasSuffix(ref, ":v9") {
				t.Errorf("retagged overlay: %s runs %q", where, ref)
			}
		}
		ds := mustFind(t, gobjs, "DaemonSet", koordletName+"-gpu")
		sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "selector", "matchLabels")
		bsel, _, _ := unstructured.NestedStringMap(mustFind(t, gobjs, "DaemonSet", koordletName).Object,
			"spec", "selector", "matchLabels")
		if fmt.Sprint(sel) == fmt.Sprint(bsel) {
			t.Errorf("both agents select pods with %v", sel)
		}
	})

	t.Run("systemd overlay changes only the cgroup driver", func(t *testing.T) {
		sobjs := k.build(t, ctx, filepath.Join(root, "overlays", "systemd"))
		cfg := func(objs []*unstructured.Unstructured) string {
			s, _, _ := unstructured.NestedString(mustFind(t, objs, "ConfigMap", koordletName).Object, "data", "config.yaml")
			return s
		}
		base, sd := cfg(objs), cfg(sobjs)
		want := strings.Replace(base, "cgroupDriver: cgroupfs       #", "cgroupDriver: systemd        #", 1)
		if want == base || sd != want {
			t.Errorf("systemd config differs from the base config by more than cgroupDriver:\n%s", sd)
		}
		if len(sobjs) != len(objs) {
			t.Errorf("systemd overlay has %d objects, the base %d", len(sobjs), len(objs))
		}
	})

	t.Run("certificates and the scheduler configuration agree", func(t *testing.T) {
		ext := extenderEntry(t, schedulerConfigOf(t, objs))
		svc := mustFind(t, objs, "Service", extenderName)
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		port := fmt.Sprint(ports[0].(map[string]any)["port"]) // a JSON number
		host := extenderName + "." + nsSystem + ".svc"
		if ext["urlPrefix"] != "https://"+host+":"+port || ext["enableHTTPS"] != true {
			t.Errorf("urlPrefix %v enableHTTPS %v, want https://%s:%s", ext["urlPrefix"], ext["enableHTTPS"], host, port)
		}
		tlsCfg, _ := ext["tlsConfig"].(map[string]any)
		if tlsCfg["serverName"] != host || tlsCfg["caFile"] == nil || tlsCfg["certFile"] == nil || tlsCfg["keyFile"] == nil {
			t.Errorf("tlsConfig %v, want serverName %s and the CA and client certificate files", tlsCfg, host)
		}
		for _, c := range []struct{ secret, dns string }{
			{"understory-scheduler-extender-tls", host}, {"understory-admission-tls", admissionName + "." + nsSystem + ".svc"},
		} {
			ca := x509.NewCertPool()
			if !ca.AppendCertsFromPEM(secretData(t, objs, c.secret, "ca.crt")) {
				t.Fatalf("%s: ca.crt holds no certificate", c.secret)
			}
			cert := parseCert(t, secretData(t, objs, c.secret, "tls.crt"))
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: c.dns, Roots: ca}); err != nil {
				t.Errorf("%s: tls.crt does not verify for %s: %v", c.secret, c.dns, err)
			}
		}
		mwc := mustFind(t, objs, "MutatingWebhookConfiguration", admissionName)
		hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
		wantCA := secretData(t, objs, "understory-admission-tls", "ca.crt")
		for _, h := range hooks {
			b64, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
			got, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(b64, "\n", ""))
			if err != nil || !bytes.Equal(got, wantCA) {
				t.Errorf("webhook caBundle is not the CA of understory-admission-tls (%v)", err)
			}
		}
		// The Deployment mounts the Secret the certificates component makes, and
		// serves TLS with client certificates from it.
		d := podTemplate(t, mustFind(t, objs, "Deployment", extenderName)).Spec
		if d.HostNetwork {
			t.Error("the extender runs on the host network")
		}
		args := strings.Join(d.Containers[0].Args, " ")
		for _, flag := range []string{"-tls-cert-file=", "-tls-private-key-file=", "-tls-client-ca-file=", "-listen=:"} {
			if !strings.Contains(args, flag) {
				t.Errorf("extender args %q lack %s", args, flag)
			}
		}
		if d.Volumes[0].Secret == nil || d.Volumes[0].Secret.SecretName != "understory-scheduler-extender-tls" {
			t.Errorf("extender volumes %+v", d.Volumes)
		}
	})

	t.Run("optional components build", func(t *testing.T) {
		cm := k.build(t, ctx, composition(t, root, "cert-manager", "components/cert-manager"))
		if find(cm, "Secret", "understory-admission-tls") != nil {
			t.Error("cert-manager install also carries the self-signed Secrets")
		}
		mwc := mustFind(t, cm, "MutatingWebhookConfiguration", admissionName)
		if mwc.GetAnnotations()["cert-manager.io/inject-ca-from"] != nsSystem+"/understory-admission" {
			t.Errorf("annotations %v, want cert-manager's CA injection", mwc.GetAnnotations())
		}
		for _, name := range []string{"understory-admission", "understory-scheduler-extender", "understory-scheduler-client"} {
			mustFind(t, cm, "Certificate", name)
		}
		sm := k.build(t, ctx, composition(t, root, "servicemonitor", "certs", "components/servicemonitor"))
		for _, name := range []string{koordletName, extenderName, admissionName} {
			checkMonitorPort(t, sm, name)
		}
		// The second scheduler's ServiceMonitor scrapes its Service's port, which is the
		// container's https port, and the NetworkPolicy admits that port.
		ss := k.build(t, ctx, composition(t, root, "servicemonitor-second-scheduler", "certs",
			"components/servicemonitor", "components/second-scheduler"))
		checkMonitorPort(t, ss, secondScheduler)
		c := podTemplate(t, mustFind(t, ss, "Deployment", secondScheduler)).Spec.Containers[0]
		svcPorts, _, _ := unstructured.NestedSlice(mustFind(t, ss, "Service", secondScheduler).Object, "spec", "ports")
		target, _, _ := unstructured.NestedString(svcPorts[0].(map[string]any), "targetPort")
		npPorts, _, _ := unstructured.NestedSlice(mustFind(t, ss, "NetworkPolicy", secondScheduler).Object,
			"spec", "ingress")
		admitted := fmt.Sprint(npPorts)
		if len(c.Ports) != 1 || c.Ports[0].Name != target || !strings.Contains(admitted, fmt.Sprintf("port:%d", c.Ports[0].ContainerPort)) {
			t.Errorf("second scheduler: container ports %+v, Service targetPort %q, NetworkPolicy ingress %s", c.Ports, target,
				admitted)
		}
		mustFind(t, ss, "ClusterRole", "understory-scheduler-metrics-reader")
		checkKueueComponent(t, k.build(t, ctx, composition(t, root, "kueue", "certs", "components/kueue")), objs)
		ex := k.build(t, ctx, filepath.Join(root, "examples"))
		mustFind(t, ex, "PodGroup", "train")
		job := mustFind(t, ex, "Job", "batch-crunch")
		ann, _, _ := unstructured.NestedStringMap(job.Object, "spec", "template", "metadata", "annotations")
		if ann["understory.io/qos-class"] != "batch" {
			t.Errorf("batch example annotations %v", ann)
		}
	})
}

// checkMonitorPort: ServiceMonitor name scrapes the port its Service names.
func checkMonitorPort(t *testing.T, objs []*unstructured.Unstructured, name string) {
	t.Helper()
	mon := mustFind(t, objs, "ServiceMonitor", name)
	eps, _, _ := unstructured.NestedSlice(mon.Object, "spec", "endpoints")
	port, _, _ := unstructured.NestedString(eps[0].(map[string]any), "port")
	svcPorts, _, _ := unstructured.NestedSlice(mustFind(t, objs, "Service", name).Object, "spec", "ports")
	if n, _, _ := unstructured.NestedString(svcPorts[0].(map[string]any), "name"); n != port {
		t.Errorf("ServiceMonitor %s scrapes port %q, the Service names %q", name, port, n)
	}
}

// The repository's VERSION file is the one version source: `make images` tags the
// images with it, and every kustomization that names an Understory image asks for that
// tag, so a fresh clone installs the images it builds, never ones `make images` tagged
// otherwise.
func TestManifestTagsAreVERSION(t *testing.T) {
	t.Parallel()
	v, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(v))
	if version == "" || strings.ContainsAny(version, " \t\n:/@") || version == "latest" {
		t.Fatalf("VERSION %q is not an image tag", version)
	}
	found := 0
	err = filepath.WalkDir(manifestsDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		tags, err := manifestcopy.ImageTags(path)
		if err != nil {
			return err
		}
		for name, tag := range tags {
			if !strings.HasPrefix(name, "understory/") {
				continue
			}
			found++
			if tag != version {
				t.Errorf("%s: %s has newTag %q; the VERSION file says %q (make images tags with it)", path, name, tag, version)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 4 {
		t.Fatalf("found %d Understory image tags under %s; want at least the base's four", found, manifestsDir)
	}

	// The Helm chart (charts/understory): its version, appVersion and default image tag.
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Tag string `json:"tag"`
		} `json:"image"`
	}
	for _, f := range []struct {
		path string
		into any
	}{{"../../charts/understory/Chart.yaml", &chart}, {"../../charts/understory/values.yaml", &values}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, f.into); err != nil {
			t.Fatalf("%s: %v", f.path, err)
		}
	}
	for what, got := range map[string]string{
		"charts/understory/Chart.yaml version":    chart.Version,
		"charts/understory/Chart.yaml appVersion": chart.AppVersion,
		"charts/understory/values.yaml image.tag": values.Image.Tag,
	} {
		if got != version {
			t.Errorf("%s is %q; the VERSION file says %q (make images tags with it)", what, got, version)
		}
	}
}

// TestPolicyComparesEveryStatusField: the agent's ValidatingAdmissionPolicies
// (manifests/koordlet/node-policy.yaml) keep every NodeStatus field but its
// own extended resources, and every PodStatus field but its own condition,
// unchanged, by naming each field: a field the vendored k8s.io/api has that
// the policy does not name could be changed by the agent. (Fields of releases
// newer than the vendored API are listed by hand: docs/security.md, Limits.)
func TestPolicyComparesEveryStatusField(t *testing.T) {
	t.Parallel()
	policy := string(readFile(t, "../../manifests/koordlet/node-policy.yaml"))
	docs := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(policy), 4096)
	bodies := map[string]string{} // policy name → its validations' expressions
	for {
		var u unstructured.Unstructured
		if err := docs.Decode(&u.Object); err != nil {
			break
		}
		if u.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		vs, _, _ := unstructured.NestedSlice(u.Object, "spec", "validations")
		for _, v := range vs {
			if e, ok := v.(map[string]any)["expression"].(string); ok {
				bodies[u.GetName()] += e + "\n"
			}
		}
	}
	tests := []struct {
		policy string
		typ    reflect.Type
		own    []string // fields the policy judges otherwise
	}{
		{"understory-koordlet-node", reflect.TypeFor[corev1.NodeStatus](), []string{"capacity", "allocatable"}},
		{"understory-koordlet-pod-status", reflect.TypeFor[corev1.PodStatus](), []string{"conditions"}},
	}
	for _, tc := range tests {
		body, ok := bodies[tc.policy]
		if !ok {
			t.Fatalf("no ValidatingAdmissionPolicy %s in node-policy.yaml (have %v)", tc.policy, slices.Collect(maps.Keys(bodies)))
		}
		for f := range tc.typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if slices.Contains(tc.own, name) {
				continue
			}
			if want := "object.status.?" + name + " == oldObject.status.?" + name; !strings.Contains(body, want) {
				t.Errorf("%s does not keep %s.%s unchanged (no %q)", tc.policy, tc.typ.Name(), name, want)
			}
		}
	}
}

// checkKueueComponent: components/kueue on the base (kobjs; base the base's build)
// adds the quota follower as the base's workloads are: its image at the base's
// release tag, two replicas, the least-privilege settings of the extender's pod,
// probes on its metrics port, and a leader Role that names the Lease it uses; every
// object labelled part-of=understory.
func checkKueueComponent(t *testing.T, kobjs, base []*unstructured.Unstructured) {
	t.Helper()
	const name = "understory-kueue-quota"
	_, baseTag, _ := strings.Cut(podTemplate(t, mustFind(t, base, "Deployment", extenderName)).Spec.Containers[0].Image, ":")
	for where, img := range workloadImages(t, kobjs) {
		ref, policy, _ := strings.Cut(img, " ")
		if n, tag, _ := strings.Cut(ref, ":"); !strings.HasPrefix(n, "understory/") || tag != baseTag ||
			policy != string(corev1.PullIfNotPresent) {
			t.Errorf("kueue component: %s runs %q (%s), want understory/<name>:%s, IfNotPresent", where, ref, policy, baseTag)
		}
	}
	for _, o := range kobjs {
		if o.GetKind() != "CustomResourceDefinition" && o.GetLabels()[partOfLabel] != "understory" {
			t.Errorf("kueue component: %s %s has no %s=understory label", o.GetKind(), o.GetName(), partOfLabel)
		}
	}
	d := mustFind(t, kobjs, "Deployment", name)
	var dep appsv1.Deployment
	fromUnstructured(t, d, &dep)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("follower replicas %v, want 2 (leader election)", dep.Spec.Replicas)
	}
	pod := podTemplate(t, d).Spec
	if img := pod.Containers[0].Image; img != "understory/kueue-quota:"+baseTag {
		t.Errorf("follower image %q, want understory/kueue-quota:%s", img, baseTag)
	}
	if pod.HostNetwork || pod.HostPID || pod.ServiceAccountName != name {
		t.Errorf("follower pod: hostNetwork %v hostPID %v serviceAccount %q", pod.HostNetwork, pod.HostPID, pod.ServiceAccountName)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("follower pod security context %+v, want non-root and seccomp RuntimeDefault", psc)
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil ||
		!*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) > 0 || (sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("follower container security context %+v, want no escalation, read-only root, every capability dropped", sc)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("follower resources %+v, want memory requests and limits", c.Resources)
	}
	for probe, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("follower probe %s: %+v, want HTTP GET on port metrics", probe, p)
		}
	}
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "-leader-elect=true") || !strings.Contains(args, "-leader-elect-name="+name) {
		t.Errorf("follower args %q, want -leader-elect=true and -leader-elect-name=%s", args, name)
	}
	role := mustFind(t, kobjs, "Role", name+"-leader")
	if role.GetNamespace() != nsSystem {
		t.Errorf("leader Role in %q, want %s", role.GetNamespace(), nsSystem)
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	named := false
	for _, r := range rules {
		names, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resourceNames")
		named = named || slices.Contains(names, name)
	}
	if !named {
		t.Errorf("leader Role rules %v do not name the Lease %s", rules, name)
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "PodDisruptionBudget",
		"NetworkPolicy"} {
		mustFind(t, kobjs, kind, name)
	}
	mustFind(t, kobjs, "RoleBinding", name+"-leader")
}
