package admission

import (
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/qos"
)

func TestValidatePod(t *testing.T) {
	t.Parallel()
	ann := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	be := func(a map[string]string) *corev1.Pod { return pod(a, nil, ctr("main", nil, nil)) }
	burst := func(a map[string]string) *corev1.Pod { return pod(a, nil, ctr("main", rl("cpu", "1"), nil)) }
	allow := map[string]string{LabelAllowLSBestEffort: "true"}
	tests := []struct {
		name     string
		op       admissionv1.Operation
		old, pod *corev1.Pod
		ns       map[string]string
		rule     string
	}{
		{"no annotations", admissionv1.Create, nil, be(nil), nil, ""},
		{"valid class", admissionv1.Create, nil, burst(ann(qos.AnnotationQOSClass, "bAtCh")), nil, ""},
		{"invalid class", admissionv1.Create, nil, burst(ann(qos.AnnotationQOSClass, "gold")), nil, RuleQOSClassValue},
		{"unicode look-alike", admissionv1.Create, nil, burst(ann(qos.AnnotationQOSClass, "Lſ")), nil, RuleQOSClassValue},
		{"LS BestEffort", admissionv1.Create, nil, be(ann(qos.AnnotationQOSClass, "LS")), nil, RuleLSBestEffort},
		{"LS BestEffort allowed", admissionv1.Create, nil, be(ann(qos.AnnotationQOSClass, "LS")), allow, ""},
		{"LS Burstable", admissionv1.Create, nil, burst(ann(qos.AnnotationQOSClass, "LS")), nil, ""},
		{"class changed", admissionv1.Update, burst(ann(qos.AnnotationQOSClass, "LS")), burst(ann(qos.AnnotationQOSClass, "batch")), nil,
			RuleQOSClassImmutable},
		{"class added", admissionv1.Update, burst(nil), burst(ann(qos.AnnotationQOSClass, "batch")), nil, RuleQOSClassImmutable},
		{"class removed", admissionv1.Update, burst(ann(qos.AnnotationQOSClass, "LS")), burst(ann()), nil, RuleQOSClassImmutable},
		{"LS BestEffort unchanged on update", admissionv1.Update, be(ann(qos.AnnotationQOSClass, "LS")),
			be(ann(qos.AnnotationQOSClass, "LS", "x", "y")), nil, ""},
		{"gang ok", admissionv1.Create, nil, burst(ann(AnnotationVolcanoMinMember, "10000")), nil, ""},
		{"gang zero", admissionv1.Create, nil, burst(ann(AnnotationVolcanoMinMember, "0")), nil, RuleGangMinMember},
		{"gang too big", admissionv1.Create, nil, burst(ann(AnnotationKoordinatorMinAvailable, "10001")), nil, RuleGangMinMember},
		{"gang sign", admissionv1.Create, nil, burst(ann(AnnotationKoordinatorMinAvailable, "+3")), nil, RuleGangMinMember},
		{"gang spaces", admissionv1.Create, nil, burst(ann(AnnotationKoordinatorMinAvailable, " 3")), nil, RuleGangMinMember},
		{"gang overflow", admissionv1.Create, nil, burst(ann(AnnotationVolcanoMinMember, "99999999999999999999")), nil, RuleGangMinMember},
		{"bad gang unchanged on update", admissionv1.Update, burst(ann(AnnotationVolcanoMinMember, "0")),
			burst(ann(AnnotationVolcanoMinMember, "0", "x", "y")), nil, ""},
		{"bad gang changed on update", admissionv1.Update, burst(ann(AnnotationVolcanoMinMember, "2")),
			burst(ann(AnnotationVolcanoMinMember, "0")), nil, RuleGangMinMember},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidatePod(tc.op, tc.old, tc.pod, tc.ns, DefaultMaxGangMinMember)
			if tc.rule == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "(rule "+tc.rule+")") ||
				!strings.Contains(err.Error(), "metadata.annotations[") {
				t.Fatalf("err %v, want ErrRejected naming the field and rule %s", err, tc.rule)
			}
		})
	}
}

func TestParseProfilesErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ yaml, want string }{
		"unknown field":  {`profiles: [{name: a, namespaceSelector: {}, bogus: 1}]`, "bogus"},
		"no selector":    {`profiles: [{name: a}]`, "namespaceSelector or objectSelector"},
		"bad class":      {`profiles: [{name: a, objectSelector: {}, qosClass: gold}]`, "qosClass"},
		"bad selector":   {`profiles: [{name: a, objectSelector: {matchExpressions: [{key: k, operator: Nope}]}}]`, "objectSelector"},
		"duplicate":      {`profiles: [{name: a, objectSelector: {}}, {name: a, objectSelector: {}}]`, "duplicate"},
		"bad label":      {`profiles: [{name: a, objectSelector: {}, labels: {"a b": c}}]`, `labels["a b"]`},
		"protected key":  {`profiles: [{name: a, objectSelector: {}, annotations: {understory.io/qos-class: LS}}]`, "qosClass"},
		"bad name":       {`profiles: [{name: "A_B", objectSelector: {}}]`, "name"},
		"bad prio class": {`profiles: [{name: a, objectSelector: {}, priorityClassName: "X Y"}]`, "priorityClassName"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseProfiles([]byte(tc.yaml))
			if !errors.Is(err, ErrInvalidProfiles) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrInvalidProfiles naming %q", err, tc.want)
			}
		})
	}
}

func TestDecodeOriginalResources(t *testing.T) {
	t.Parallel()
	o := OriginalResources{Containers: map[string]ContainerResources{"a": {Requests: rl("cpu", "1")}}}
	s, err := o.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeOriginalResources(s)
	if err != nil || !quantityEq(back.Containers["a"].Requests["cpu"], o.Containers["a"].Requests["cpu"]) {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	for _, bad := range []string{"", "{", `{"x":1}`, `{}}`, `{} {}`, `{"containers":{"a":{"requests":{"cpu":"x"}}}}`} {
		if _, err := DecodeOriginalResources(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
