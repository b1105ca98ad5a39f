package admission

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
	extender "github.com/understory/understory/scheduler-extender"
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
	ls := pod(map[string]string{qos.AnnotationQOSClass: "LS"}, nil, ctr("main", nil, nil))
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
				if got := applyPatch(t, batch, ops); got.Spec.Containers[0].Resources.Limits[qos.ResourceBatchCPU] == (batch.Spec.Containers[0].Resources.Limits[qos.ResourceBatchCPU]) {
					t.Fatal("patch did not set batch-cpu")
				}
			}
		})
	}
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
	send("application/json", review(t, admissionv1.Create, pod(batchAnn, nil, ctr("main", rl("cpu", "1", qos.ResourceBatchCPU, "1"), nil)), nil))
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

// The gang keys and maximum must stay the extender's.
func TestGangKeysMatchExtender(t *testing.T) {
	t.Parallel()
	if AnnotationVolcanoMinMember != extender.AnnotationVolcanoMinMember ||
		AnnotationKoordinatorMinAvailable != extender.AnnotationKoordinatorMinAvailable ||
		DefaultMaxGangMinMember != extender.MaxGangSize {
		t.Fatal("gang keys or maximum differ from scheduler-extender's")
	}
	data, err := os.ReadFile("../manifests/admission/validatingadmissionpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `expression: "10000"`) {
		t.Fatal("the policy's maxGangMinMember is not the extender's MaxGangSize")
	}
}
