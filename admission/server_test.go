package admission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

func newTestServer(t *testing.T, cfg Config) (*Server, *prometheus.Registry) {
	t.Helper()
	m, err := NewMutator(Profiles{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := NewServer(cfg, Deps{Mutator: m, Cluster: fakeCluster{ns: map[string]map[string]string{"ns": nil}}, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func review(t *testing.T, op admissionv1.Operation, obj, old any) []byte {
	t.Helper()
	raw := func(v any) runtime.RawExtension {
		if v == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("u1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "ns", Operation: op, Object: raw(obj), OldObject: raw(old),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeHTTP(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.ServeValidate = true
	s, _ := newTestServer(t, cfg)
	h := s.Handler()
	batch := pod(batchAnn, nil, ctr("main", rl("cpu", "1"), nil))
	ls := pod(map[string]string{contract.AnnotationQOSClass: "LS"}, nil, ctr("main", nil, nil))
	tests := []struct {
		name, path, ctype string
		body              []byte
		code              int
		allowed           bool
		patched           bool
		inBody            string
	}{
		{"mutate batch", "/mutate", "application/json", review(t, admissionv1.Create, batch, nil), 200, true, true, ""},
		{"mutate non-batch", "/mutate", "application/json; charset=utf-8", review(t, admissionv1.Create, ls, nil), 200, true, false, ""},
		{"mutate update ignored", "/mutate", "application/json", review(t, admissionv1.Update, batch, batch), 200, true, false, ""},
		{"validate LS BestEffort denied", "/validate", "application/json", review(t, admissionv1.Create, ls, nil), 200, false, false,
			RuleLSBestEffort},
		{"wrong content type", "/mutate", "text/plain", review(t, admissionv1.Create, batch, nil), 415, false, false, "application/json"},
		{"malformed JSON", "/mutate", "application/json", []byte(`{"apiVersion":`), 400, false, false, "malformed AdmissionReview"},
		{"wrong version", "/mutate", "application/json",
			[]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), 400, false, false, "apiVersion"},
		{"no request", "/mutate", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`),
			400, false, false, "no request"},
		{"bad object", "/mutate", "application/json",
			[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"version":"v1","kind":"Pod"},` +
				`"operation":"CREATE","object":{"spec":{"containers":7}}}}`), 400, false, false, "request.object"},
		{"too large", "/mutate", "application/json", bytes.Repeat([]byte(" "), int(cfg.MaxBodyBytes)+1), 413, false, false, "larger"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodPost, tc.path, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.ctype)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("code %d, want %d: %s", rec.Code, tc.code, rec.Body)
			}
			if tc.code != 200 {
				if !strings.Contains(rec.Body.String(), tc.inBody) {
					t.Fatalf("body %q, want it to say %q", rec.Body, tc.inBody)
				}
				return
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			r := out.Response
			if r == nil || r.UID != "u1" || r.Allowed != tc.allowed || (len(r.Patch) > 0) != tc.patched {
				t.Fatalf("response %+v", r)
			}
			if !tc.allowed && (r.Result == nil || !strings.Contains(r.Result.Message, tc.inBody)) {
				t.Fatalf("denial %+v, want %q", r.Result, tc.inBody)
			}
			if tc.patched {
				var ops []PatchOp
				if err := json.Unmarshal(r.Patch, &ops); err != nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Fatalf("patch %s: %v", r.Patch, err)
				}
				if got := applyPatch(t, batch, ops); got.Spec.Containers[0].Resources.Limits[contract.ResourceBatchCPU] == (batch.Spec.Containers[0].Resources.Limits[contract.ResourceBatchCPU]) {
					t.Fatal("patch did not set batch-cpu")
				}
			}
		})
	}
}

// /validate reads the requester from userInfo and serves Bindings (pods/binding) for
// the understory.io/gpu-devices rule.
func TestServeValidateWriters(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.ServeValidate = true
	s, _ := newTestServer(t, cfg)
	h := s.Handler()
	gpuPod := pod(map[string]string{contract.AnnotationGPUDevices: "0"}, nil, ctr("main", rl("cpu", "1"), nil))
	koordLS := pod(nil, nil, ctr("main", nil, nil))
	koordLS.Labels[qos.LabelKoordinatorQOS] = "LSR"
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns",
		Annotations: map[string]string{contract.AnnotationGPUDevices: "0"}}, Target: corev1.ObjectReference{Kind: "Node", Name: "n"}}
	const tenant = "system:serviceaccount:ns:default"
	tests := []struct {
		name    string
		body    []byte
		allowed bool
		rule    string
	}{
		{"pod with devices from a tenant", reviewAs(t, "Pod", "", tenant, admissionv1.Create, gpuPod), false, RuleGPUDevicesWriter},
		{"pod with devices from the extender", reviewAs(t, "Pod", "", DefaultGPUDevicesWriter, admissionv1.Create, gpuPod), true, ""},
		{"BestEffort pod labelled Koordinator LSR", reviewAs(t, "Pod", "", tenant, admissionv1.Create, koordLS), false, RuleLSBestEffort},
		{"Binding with devices from kube-scheduler", reviewAs(t, "Binding", "binding", "system:kube-scheduler", admissionv1.Create, binding),
			false, RuleGPUDevicesWriter},
		{"Binding with devices from the extender", reviewAs(t, "Binding", "binding", DefaultGPUDevicesWriter, admissionv1.Create, binding),
			true, ""},
		{"legacy bindings resource with devices from a tenant", reviewAs(t, "Binding", "", tenant, admissionv1.Create, binding),
			false, RuleGPUDevicesWriter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var out admissionv1.AdmissionReview
			if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &out) != nil || out.Response == nil {
				t.Fatalf("code %d body %s", rec.Code, rec.Body)
			}
			r := out.Response
			if r.Allowed != tc.allowed || len(r.Warnings) > 0 {
				t.Fatalf("response %+v, want allowed %v and no warnings", r, tc.allowed)
			}
			if !tc.allowed && (r.Result == nil || !strings.Contains(r.Result.Message, "(rule "+tc.rule+")")) {
				t.Fatalf("denial %+v, want rule %s", r.Result, tc.rule)
			}
		})
	}
}

// resourceOf is the resource the API server names for kind and subresource: a Pod
// and pods/binding are "pods", a Binding without subresource the legacy "bindings".
func resourceOf(kind, sub string) string {
	if kind == "Binding" && sub == "" {
		return "bindings"
	}
	return "pods"
}

// reviewAs is an AdmissionReview of obj (kind, subresource) sent by user.
func reviewAs(t *testing.T, kind, sub, user string, op admissionv1.Operation, obj any) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("u1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind}, SubResource: sub,
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: resourceOf(kind, sub)},
			Namespace: "ns", Operation: op, Object: runtime.RawExtension{Raw: raw},
			UserInfo: authenticationv1.UserInfo{Username: user},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMetricsGolden(t *testing.T) {
	t.Parallel()
	s, reg := newTestServer(t, DefaultConfig())
	h := s.Handler()
	send := func(ctype string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	send("application/json", review(t, admissionv1.Create, pod(batchAnn, nil, ctr("main", rl("cpu", "1"), nil)), nil))
	send("application/json", review(t, admissionv1.Create, pod(batchAnn, nil, ctr("main", rl("cpu", "2"), rl("cpu", "1"))), nil))
	send("application/json", review(t, admissionv1.Create, pod(batchAnn, nil, ctr("main", rl("cpu", "1", contract.ResourceBatchCPU, "1"), nil)), nil))
	send("text/plain", nil)
	want := `
# HELP understory_admission_errors_total Problems by kind; except decode, the pod was admitted (fail open).
# TYPE understory_admission_errors_total counter
understory_admission_errors_total{kind="decode"} 1
understory_admission_errors_total{kind="unsupported"} 1
# HELP understory_admission_requests_total AdmissionReviews handled, by operation and result (mutated, unchanged, allowed, denied, bad_request).
# TYPE understory_admission_requests_total counter
understory_admission_requests_total{operation="CREATE",result="denied"} 1
understory_admission_requests_total{operation="CREATE",result="mutated"} 1
understory_admission_requests_total{operation="CREATE",result="unchanged"} 1
understory_admission_requests_total{operation="unknown",result="bad_request"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"understory_admission_errors_total", "understory_admission_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(s.Metrics().Duration); n != 1 {
		t.Fatalf("duration series %d, want 1 (mutate)", n)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != 200 {
		t.Fatalf("healthz %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil))
	if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("/validate served without ServeValidate: %d", rec.Code)
	}
}

// The policy's maxGangMinMember is the contract's MaxGangSize, the bound the webhook and
// the extender share.
func TestPolicyMaxGangMinMember(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../manifests/admission/validatingadmissionpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("expression: \"%d\"", contract.MaxGangSize); !strings.Contains(string(data), want) {
		t.Fatalf("the policy's maxGangMinMember is not contract.MaxGangSize (no %s)", want)
	}
}

// The devices key's writer is the extender's service account as manifests/scheduler
// names it; both policies in manifests/admission allow exactly DefaultGPUDevicesWriter.
func TestGPUDevicesWriterMatchesExtender(t *testing.T) {
	t.Parallel()
	ns, name, ok := strings.Cut(strings.TrimPrefix(DefaultGPUDevicesWriter, "system:serviceaccount:"), ":")
	if !ok {
		t.Fatalf("DefaultGPUDevicesWriter %q is not a service account", DefaultGPUDevicesWriter)
	}
	rbac, err := os.ReadFile("../manifests/scheduler/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, doc := range strings.Split(string(rbac), "\n---\n") {
		var sa corev1.ServiceAccount
		if yaml.Unmarshal([]byte(doc), &sa) == nil && sa.Kind == "ServiceAccount" && sa.Name == name && sa.Namespace == ns {
			found = true
		}
	}
	if !found {
		t.Fatalf("manifests/scheduler/rbac.yaml has no ServiceAccount %s/%s (DefaultGPUDevicesWriter)", ns, name)
	}
	data, err := os.ReadFile("../manifests/admission/validatingadmissionpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := `expression: "['` + DefaultGPUDevicesWriter + `']"`
	// gpuDevicesWriters in both policies, extenderAnnotationWriters in the pod rules.
	if n := strings.Count(string(data), want); n != 3 {
		t.Fatalf("the policies' gpuDevicesWriters and extenderAnnotationWriters: %d of 3 are %s", n, want)
	}
	if !strings.Contains(string(data), "'"+contract.AnnotationGPUDevices+"'") {
		t.Fatalf("the policies do not name %s", contract.AnnotationGPUDevices)
	}
}
