package admission

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/understory/understory/contract"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/qos"
)

// FuzzDecodeReview: any body either decodes to a review with a request and a UID,
// or fails with ErrBadReview; never a panic.
func FuzzDecodeReview(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"spec":1}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1beta1"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"request":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rev, err := DecodeReview(body)
		if err != nil {
			if !errors.Is(err, ErrBadReview) {
				t.Fatalf("error %v does not wrap ErrBadReview", err)
			}
			return
		}
		if rev.Request == nil || rev.Request.UID == "" {
			t.Fatalf("accepted review without request or uid: %s", body)
		}
		if _, err := decodePod(rev.Request.Object.Raw, "object"); err != nil && !errors.Is(err, ErrBadReview) {
			t.Fatalf("decodePod error %v does not wrap ErrBadReview", err)
		}
	})
}

// FuzzMutate: for any pod JSON, Mutate never panics, a rejection wraps ErrRejected,
// the patch applies, a batch pod it patched is BestEffort, and a second pass changes
// nothing.
func FuzzMutate(f *testing.F) {
	seeds := []*corev1.Pod{
		pod(batchAnn, nil, ctr("main", rl("cpu", "500m", "memory", "1Gi"), rl("cpu", "1"))),
		pod(batchAnn, []corev1.Container{ctr("init", rl("cpu", "1"), nil)}, ctr("main", nil, rl("memory", "1e3"))),
		pod(map[string]string{contract.AnnotationQOSClass: "batch", contract.AnnotationOriginalResources: `{"containers":{}}`}, nil,
			ctr("main", rl("cpu", "1"), nil)),
		pod(batchAnn, nil, ctr("main", rl("cpu", "1", contract.ResourceBatchCPU, "3"), nil)),
	}
	for _, p := range seeds {
		b, _ := json.Marshal(p)
		f.Add(b)
	}
	f.Add([]byte(`{"metadata":{"annotations":{"understory.io/qos-class":"batch"}},"spec":{"containers":[{"name":"a",` +
		`"resources":{"requests":{"cpu":"-1"}}},{"name":"a","resources":{"limits":{"memory":"9e18"}}}]}}`))
	// The other class keys the agent honours, and the extender's devices key.
	f.Add([]byte(`{"metadata":{"labels":{"koordinator.sh/qosClass":"LSR"},"annotations":{"koordinator.sh/qosClass":"LS",` +
		`"understory.io/gpu-devices":"0,1"}},"spec":{"containers":[{"name":"a","resources":{"requests":{"cpu":"1"}}}]}}`))
	f.Add([]byte(`{"metadata":{"labels":{"koordinator.sh/qosClass":"BE"},"annotations":{"understory.io/qos-class":"batch",` +
		`"understory.io/gpu-devices":"+1"}},"spec":{"containers":[{"name":"a","resources":{"limits":{"cpu":"1"}}}]}}`))
	m, err := NewMutator(Profiles{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p corev1.Pod
		if json.Unmarshal(raw, &p) != nil {
			return
		}
		res, err := m.Mutate(context.Background(), "ns", &p)
		if err != nil {
			if !errors.Is(err, ErrRejected) {
				t.Fatalf("error %v does not wrap ErrRejected", err)
			}
			return
		}
		if len(res.Patch) == 0 {
			return
		}
		got := applyPatch(t, &p, res.Patch)
		if qos.ComputeKubeQOSClass(got) != corev1.PodQOSBestEffort && p.Spec.Resources == nil {
			t.Fatalf("patched batch pod is %s", qos.ComputeKubeQOSClass(got))
		}
		again, err := m.Mutate(context.Background(), "ns", got)
		if err != nil || len(again.Patch) != 0 {
			t.Fatalf("second pass: %+v, %v", again.Patch, err)
		}
	})
}

// FuzzLSClaim: for any values of the three class keys (each present or absent), the
// admission's "claims LS" is the node agent's qos.Classify on a BestEffort pod, and
// ValidatePod refuses the pod outside an allowed namespace exactly then, naming the
// deciding key.
func FuzzLSClaim(f *testing.F) {
	for _, s := range [][3]string{
		{"", "LSR", ""}, {"", "", "LS"}, {"batch", "LSR", "LS"}, {"gold", "lse", ""}, {"", "gold", "SYSTEM"},
		{"", "BE", "LS"}, {"Lſ", "Lſ", "Lſ"}, {"LS", "BE", ""}, {"", " LS", "lsr"},
	} {
		f.Add(s[0], s[1], s[2], uint8(0b111))
		f.Add(s[0], s[1], s[2], uint8(0b110))
	}
	f.Fuzz(func(t *testing.T, understory, label, annotation string, present uint8) {
		var vals [3]*string
		for i, v := range []string{understory, label, annotation} {
			if present&(1<<i) != 0 {
				vals[i] = &v
			}
		}
		p := lsClaimPod(vals)
		checkLSClaim(t, p)
		k, ls := lsClaim(p)
		err := ValidatePod(PodRequest{Operation: admissionv1.Create, Pod: p}, DefaultRules())
		if ls != (err != nil && strings.Contains(err.Error(), k.field+": LS on a BestEffort pod")) {
			t.Fatalf("lsClaim %v (%s), ValidatePod %v", ls, k.field, err)
		}
		if err != nil && !errors.Is(err, ErrRejected) {
			t.Fatalf("error %v does not wrap ErrRejected", err)
		}
	})
}
