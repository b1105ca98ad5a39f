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
// the patch applies, a batch pod it patched is BestEffort, spec.schedulerName changes
// only in the second-scheduler mode and only from the default, and a second pass
// changes nothing.
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
	// A GPU pod (the second-scheduler mode hands it over) and one naming its own scheduler.
	f.Add([]byte(`{"spec":{"schedulerName":"default-scheduler","containers":[{"name":"a","resources":` +
		`{"limits":{"nvidia.com/gpu":"1"}}}]}}`))
	f.Add([]byte(`{"metadata":{"annotations":{"understory.io/qos-class":"batch"}},"spec":{"schedulerName":"volcano",` +
		`"initContainers":[{"name":"i","resources":{"requests":{"understory.io/gpu-milli":"5"}}}],"containers":[]}}`))
	plain, err := NewMutator(Profiles{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	// The second-scheduler mode on: the same invariants, and it never touches a pod
	// that names another scheduler.
	withScheduler, err := NewMutator(Profiles{}, nil, WithSchedulerName("understory-scheduler"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p corev1.Pod
		if json.Unmarshal(raw, &p) != nil {
			return
		}
		for _, m := range []*Mutator{plain, withScheduler} {
			res, err := m.Mutate(context.Background(), "ns", &p)
			if err != nil {
				if !errors.Is(err, ErrRejected) {
					t.Fatalf("error %v does not wrap ErrRejected", err)
				}
				continue
			}
			if len(res.Patch) == 0 {
				continue
			}
			got := applyPatch(t, &p, res.Patch)
			// Only the mode may patch a pod that stays Burstable: a GPU pod, or a batch
			// pod left on cpu/memory, gets its scheduler.
			batchOnly := m == plain || res.Class == qos.ClassBatch && len(res.Problems) == 0
			if batchOnly && qos.ComputeKubeQOSClass(got) != corev1.PodQOSBestEffort && p.Spec.Resources == nil {
				t.Fatalf("patched batch pod is %s", qos.ComputeKubeQOSClass(got))
			}
			if s := p.Spec.SchedulerName; got.Spec.SchedulerName != s &&
				(m.SchedulerName() == "" || s != "" && s != DefaultSchedulerName) {
				t.Fatalf("schedulerName %q changed to %q", s, got.Spec.SchedulerName)
			}
			again, err := m.Mutate(context.Background(), "ns", got)
			if err != nil || len(again.Patch) != 0 {
				t.Fatalf("second pass: %+v, %v", again.Patch, err)
			}
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
