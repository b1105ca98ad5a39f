package admission

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
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
	// lbl is a BestEffort pod with labels l (and annotations a).
	lbl := func(l, a map[string]string) *corev1.Pod {
		p := be(a)
		p.Labels = l
		return p
	}
	// podOf copies p with its labels and annotations replaced by l and a.
	podOf := func(p *corev1.Pod, l, a map[string]string) *corev1.Pod {
		q := p.DeepCopy()
		q.Labels, q.Annotations = l, a
		return q
	}
	allow := map[string]string{LabelAllowLSBestEffort: "true"}
	const (
		koord     = qos.LabelKoordinatorQOS // label and annotation
		devs      = contract.AnnotationGPUDevices
		extender  = DefaultGPUDevicesWriter
		tenant    = "system:serviceaccount:team-a:default"
		labelF    = "metadata.labels[" + qos.LabelKoordinatorQOS + "]"
		koordAnnF = "metadata.annotations[" + qos.AnnotationKoordinatorQOS + "]"
		devF      = "metadata.annotations[" + contract.AnnotationGPUDevices + "]"
	)
	boundGPU := burst(ann(devs, "0"))
	boundGPU.Spec.NodeName = "n1"
	tests := []struct {
		name     string
		op       admissionv1.Operation
		old, pod *corev1.Pod
		ns       map[string]string
		user     string
		rule     string // "" accepted
		field    string // the field the rejection names; "" any metadata field
	}{
		{"no annotations", admissionv1.Create, nil, be(nil), nil, tenant, "", ""},
		{"valid class", admissionv1.Create, nil, burst(ann(contract.AnnotationQOSClass, "bAtCh")), nil, tenant, "", ""},
		{"invalid class", admissionv1.Create, nil, burst(ann(contract.AnnotationQOSClass, "gold")), nil, tenant, RuleQOSClassValue, ""},
		{"unicode look-alike", admissionv1.Create, nil, burst(ann(contract.AnnotationQOSClass, "Lſ")), nil, tenant, RuleQOSClassValue, ""},
		{"LS BestEffort", admissionv1.Create, nil, be(ann(contract.AnnotationQOSClass, "LS")), nil, tenant, RuleLSBestEffort, ""},
		{"LS BestEffort allowed", admissionv1.Create, nil, be(ann(contract.AnnotationQOSClass, "LS")), allow, tenant, "", ""},
		{"LS Burstable", admissionv1.Create, nil, burst(ann(contract.AnnotationQOSClass, "LS")), nil, tenant, "", ""},

		// LS through Koordinator's key, which the agent honours (qos.Classify).
		{"koordinator label LSR BestEffort", admissionv1.Create, nil, lbl(ann(koord, "LSR"), nil), nil, tenant,
			RuleLSBestEffort, labelF},
		{"koordinator label lse BestEffort", admissionv1.Create, nil, lbl(ann(koord, "lse"), nil), nil, tenant,
			RuleLSBestEffort, labelF},
		{"koordinator label SYSTEM BestEffort", admissionv1.Create, nil, lbl(ann(koord, "SYSTEM"), nil), nil, tenant,
			RuleLSBestEffort, labelF},
		{"koordinator annotation LS BestEffort", admissionv1.Create, nil, be(ann(koord, "LS")), nil, tenant,
			RuleLSBestEffort, koordAnnF},
		{"koordinator annotation Ls BestEffort", admissionv1.Create, nil, be(ann(koord, "Ls")), nil, tenant,
			RuleLSBestEffort, koordAnnF},
		{"koordinator label invalid, annotation LS", admissionv1.Create, nil, lbl(ann(koord, "gold"), ann(koord, "LSR")),
			nil, tenant, RuleLSBestEffort, koordAnnF},
		{"koordinator label LS BestEffort allowed", admissionv1.Create, nil, lbl(ann(koord, "LS"), nil), allow, tenant, "", ""},
		{"koordinator label LSR Burstable", admissionv1.Create, nil, podOf(burst(nil), ann(koord, "LSR"), nil), nil, tenant, "", ""},
		{"koordinator label BE BestEffort", admissionv1.Create, nil, lbl(ann(koord, "BE"), nil), nil, tenant, "", ""},
		{"koordinator look-alike is no LS", admissionv1.Create, nil, be(ann(koord, "Lſ")), nil, tenant, "", ""},
		{"understory batch wins over koordinator LS", admissionv1.Create, nil,
			lbl(ann(koord, "LSR"), ann(contract.AnnotationQOSClass, "batch")), nil, tenant, "", ""},
		{"koordinator label BE wins over annotation LS", admissionv1.Create, nil, lbl(ann(koord, "BE"), ann(koord, "LS")),
			nil, tenant, "", ""},
		{"invalid understory class, koordinator LS", admissionv1.Create, nil,
			lbl(ann(koord, "LS"), ann(contract.AnnotationQOSClass, "gold")), nil, tenant, RuleLSBestEffort, labelF},

		{"class changed", admissionv1.Update, burst(ann(contract.AnnotationQOSClass, "LS")), burst(ann(contract.AnnotationQOSClass, "batch")),
			nil, tenant, RuleQOSClassImmutable, ""},
		{"class added", admissionv1.Update, burst(nil), burst(ann(contract.AnnotationQOSClass, "batch")), nil, tenant,
			RuleQOSClassImmutable, ""},
		{"class removed", admissionv1.Update, burst(ann(contract.AnnotationQOSClass, "LS")), burst(ann()), nil, tenant,
			RuleQOSClassImmutable, ""},
		{"LS BestEffort unchanged on update", admissionv1.Update, be(ann(contract.AnnotationQOSClass, "LS")),
			be(ann(contract.AnnotationQOSClass, "LS", "x", "y")), nil, tenant, "", ""},
		{"koordinator label added", admissionv1.Update, lbl(nil, nil), lbl(ann(koord, "LSR"), nil), nil, tenant,
			RuleQOSClassImmutable, labelF},
		{"koordinator label changed", admissionv1.Update, lbl(ann(koord, "BE"), nil), lbl(ann(koord, "LS"), nil), nil, tenant,
			RuleQOSClassImmutable, labelF},
		{"koordinator label removed", admissionv1.Update, lbl(ann(koord, "BE"), nil), lbl(ann("app", "x"), nil), nil, tenant,
			RuleQOSClassImmutable, labelF},
		{"koordinator annotation added", admissionv1.Update, be(nil), be(ann(koord, "LS")), nil, tenant,
			RuleQOSClassImmutable, koordAnnF},
		{"koordinator label unchanged on update", admissionv1.Update, lbl(ann(koord, "LSR"), nil),
			lbl(ann(koord, "LSR", "x", "y"), nil), nil, tenant, "", ""},

		// understory.io/gpu-devices: only the scheduler extender writes it.
		{"gpu-devices at create by a tenant", admissionv1.Create, nil, burst(ann(devs, "0")), nil, tenant,
			RuleGPUDevicesWriter, devF},
		{"empty gpu-devices at create by a tenant", admissionv1.Create, nil, burst(ann(devs, "")), nil, tenant,
			RuleGPUDevicesWriter, devF},
		{"gpu-devices at create by the extender", admissionv1.Create, nil, burst(ann(devs, "0")), nil, extender, "", ""},
		{"gpu-devices changed on a bound pod by a tenant", admissionv1.Update, boundGPU, podOf(boundGPU, nil, ann(devs, "1")),
			nil, tenant, RuleGPUDevicesWriter, devF},
		{"gpu-devices added by a tenant", admissionv1.Update, burst(nil), burst(ann(devs, "0")), nil, tenant,
			RuleGPUDevicesWriter, devF},
		{"gpu-devices removed by a tenant", admissionv1.Update, boundGPU, podOf(boundGPU, nil, ann()), nil, tenant,
			RuleGPUDevicesWriter, devF},
		{"gpu-devices changed by the extender", admissionv1.Update, boundGPU, podOf(boundGPU, nil, ann(devs, "1")),
			nil, extender, "", ""},
		{"gpu-devices unchanged on a tenant's update", admissionv1.Update, boundGPU, podOf(boundGPU, nil, ann(devs, "0", "x", "y")),
			nil, tenant, "", ""},
		{"gpu-devices by an anonymous request", admissionv1.Create, nil, burst(ann(devs, "0")), nil, "", RuleGPUDevicesWriter, devF},

		// The extender's other annotations and the webhook's record.
		{"gang-state at create by a tenant", admissionv1.Create, nil, burst(ann(contract.AnnotationGangState, "planned:x")),
			nil, tenant, RuleGangStateWriter, "metadata.annotations[" + contract.AnnotationGangState + "]"},
		{"gang-state added by a tenant", admissionv1.Update, burst(nil), burst(ann(contract.AnnotationGangState, "planned:x")),
			nil, tenant, RuleGangStateWriter, ""},
		{"gang-state changed by the extender", admissionv1.Update, burst(ann(contract.AnnotationGangState, "a")),
			burst(ann(contract.AnnotationGangState, "b")), nil, extender, "", ""},
		{"gang-state unchanged on a tenant's update", admissionv1.Update, burst(ann(contract.AnnotationGangState, "a")),
			burst(ann(contract.AnnotationGangState, "a", "x", "y")), nil, tenant, "", ""},
		{"catch-up at create by a tenant", admissionv1.Create, nil, burst(ann(contract.AnnotationExtenderCatchUp, "x")),
			nil, tenant, RuleCatchUpWriter, ""},
		{"catch-up removed by a tenant", admissionv1.Update, burst(ann(contract.AnnotationExtenderCatchUp, "x")), burst(ann()),
			nil, tenant, RuleCatchUpWriter, ""},
		{"original-resources at create", admissionv1.Create, nil, burst(ann(contract.AnnotationOriginalResources, "{}")),
			nil, tenant, "", ""},
		{"original-resources changed", admissionv1.Update, burst(ann(contract.AnnotationOriginalResources, "{}")),
			burst(ann(contract.AnnotationOriginalResources, `{"containers":{}}`)), nil, extender, RuleOriginalResourcesImmutable, ""},
		{"original-resources unchanged", admissionv1.Update, burst(ann(contract.AnnotationOriginalResources, "{}")),
			burst(ann(contract.AnnotationOriginalResources, "{}", "x", "y")), nil, tenant, "", ""},

		{"gang ok", admissionv1.Create, nil, burst(ann(contract.AnnotationVolcanoMinMember, "10000")), nil, tenant, "", ""},
		{"gang zero", admissionv1.Create, nil, burst(ann(contract.AnnotationVolcanoMinMember, "0")), nil, tenant, RuleGangMinMember, ""},
		{"gang too big", admissionv1.Create, nil, burst(ann(contract.AnnotationKoordinatorMinAvailable, "10001")), nil, tenant,
			RuleGangMinMember, ""},
		{"gang sign", admissionv1.Create, nil, burst(ann(contract.AnnotationKoordinatorMinAvailable, "+3")), nil, tenant, RuleGangMinMember, ""},
		{"gang spaces", admissionv1.Create, nil, burst(ann(contract.AnnotationKoordinatorMinAvailable, " 3")), nil, tenant, RuleGangMinMember, ""},
		{"gang overflow", admissionv1.Create, nil, burst(ann(contract.AnnotationVolcanoMinMember, "99999999999999999999")), nil, tenant,
			RuleGangMinMember, ""},
		{"bad gang unchanged on update", admissionv1.Update, burst(ann(contract.AnnotationVolcanoMinMember, "0")),
			burst(ann(contract.AnnotationVolcanoMinMember, "0", "x", "y")), nil, tenant, "", ""},
		{"bad gang changed on update", admissionv1.Update, burst(ann(contract.AnnotationVolcanoMinMember, "2")),
			burst(ann(contract.AnnotationVolcanoMinMember, "0")), nil, tenant, RuleGangMinMember, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidatePod(PodRequest{Operation: tc.op, Old: tc.old, Pod: tc.pod, NamespaceLabels: tc.ns, Username: tc.user},
				DefaultRules())
			if tc.rule == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			field := "metadata." // some metadata field
			if tc.field != "" {
				field = tc.field + ": "
			}
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), field) ||
				!strings.Contains(err.Error(), "(rule "+tc.rule+")") {
				t.Fatalf("err %v, want ErrRejected naming the field %s and rule %s", err, field, tc.rule)
			}
			if tc.rule == RuleGPUDevicesWriter && (!strings.Contains(err.Error(), DefaultGPUDevicesWriter) ||
				!strings.Contains(err.Error(), fmt.Sprintf("%q", tc.user))) {
				t.Fatalf("err %v, want it to name the allowed writer and the refused user %q", err, tc.user)
			}
		})
	}
}

func TestValidateBinding(t *testing.T) {
	t.Parallel()
	binding := func(a map[string]string) *corev1.Binding {
		return &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: a},
			Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}
	}
	tests := []struct {
		name  string
		b     *corev1.Binding
		user  string
		rules Rules
		want  bool // rejected
	}{
		{"extender with devices", binding(map[string]string{contract.AnnotationGPUDevices: "0,1"}), DefaultGPUDevicesWriter,
			DefaultRules(), false},
		{"kube-scheduler without annotations", binding(nil), "system:kube-scheduler", DefaultRules(), false},
		{"a binder copying other annotations", binding(map[string]string{contract.AnnotationQOSClass: "batch"}),
			"system:serviceaccount:volcano-system:volcano-scheduler", DefaultRules(), false},
		{"another binder with devices", binding(map[string]string{contract.AnnotationGPUDevices: "0"}), "system:kube-scheduler",
			DefaultRules(), true},
		{"renamed extender", binding(map[string]string{contract.AnnotationGPUDevices: "0"}), DefaultGPUDevicesWriter,
			Rules{MaxGangMinMember: 1, GPUDevicesWriters: []string{"system:serviceaccount:sched:ext"}}, true},
		{"configured writer", binding(map[string]string{contract.AnnotationGPUDevices: "0"}), "system:serviceaccount:sched:ext",
			Rules{MaxGangMinMember: 1, GPUDevicesWriters: []string{"system:serviceaccount:sched:ext"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateBinding(tc.b, tc.user, tc.rules)
			if !tc.want {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "(rule "+RuleGPUDevicesWriter+")") ||
				!strings.Contains(err.Error(), "metadata.annotations["+contract.AnnotationGPUDevices+"]: ") {
				t.Fatalf("err %v, want ErrRejected naming the field and rule %s", err, RuleGPUDevicesWriter)
			}
		})
	}
}

// Missing objects are a clear rejection, not a panic.
func TestValidateMissingObjects(t *testing.T) {
	t.Parallel()
	p := pod(nil, nil, ctr("main", nil, nil))
	for name, err := range map[string]error{
		"pod":     ValidatePod(PodRequest{Operation: admissionv1.Create}, DefaultRules()),
		"old pod": ValidatePod(PodRequest{Operation: admissionv1.Update, Pod: p}, DefaultRules()),
		"binding": ValidateBinding(nil, DefaultGPUDevicesWriter, DefaultRules()),
	} {
		if !errors.Is(err, ErrRejected) {
			t.Errorf("no %s: err %v, want ErrRejected", name, err)
		}
	}
}

// lsClaimPod is a BestEffort pod with the class keys whose values are given (nil:
// absent), in qos.Classify's order: understory.io/qos-class, Koordinator's label,
// Koordinator's annotation.
func lsClaimPod(vals [3]*string) *corev1.Pod {
	p := pod(nil, nil, ctr("main", nil, nil))
	for i, k := range classKeys() {
		if vals[i] == nil {
			continue
		}
		m := &p.Annotations
		if k.label {
			m = &p.Labels
		}
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[k.key] = *vals[i]
	}
	return p
}

// checkLSClaim fails unless lsClaim agrees with the node agent: a BestEffort pod
// claims LS exactly when qos.Classify says LS.
func checkLSClaim(t *testing.T, p *corev1.Pod) {
	t.Helper()
	c, _ := qos.Classify(p)
	k, ls := lsClaim(p)
	if ls != (c == qos.ClassLS) {
		t.Fatalf("labels %v annotations %v: lsClaim %v (%s), qos.Classify %s", p.Labels, p.Annotations, ls, k.field, c)
	}
	if ls {
		if v, ok := k.get(p); !ok {
			t.Fatalf("lsClaim names %s, which the pod lacks (%q)", k.field, v)
		}
	}
}

// The admission's view of "LS through a class key" is the node agent's, for every
// combination of the three keys over the values that matter.
func TestLSClaimAgreesWithClassify(t *testing.T) {
	t.Parallel()
	values := []*string{nil}
	for _, v := range []string{"LS", "ls", "LSR", "lsr", "LSE", "Lse", "SYSTEM", "system", "BE", "be", "batch", "BATCH",
		"gold", "", " LS", "Lſ", "LSX"} {
		values = append(values, &v)
	}
	for _, a := range values {
		for _, b := range values {
			for _, c := range values {
				checkLSClaim(t, lsClaimPod([3]*string{a, b, c}))
			}
		}
	}
}

func TestConfigValidateGPUDevicesWriters(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		writers []string
		ok      bool
	}{
		"default":    {DefaultConfig().GPUDevicesWriters, true},
		"two":        {[]string{DefaultGPUDevicesWriter, "system:serviceaccount:x:y"}, true},
		"none":       {nil, false},
		"empty name": {[]string{""}, false},
		"spaces":     {[]string{" system:serviceaccount:x:y"}, false},
		"comma list": {[]string{"a,b"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.GPUDevicesWriters = tc.writers
			if err := cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate(%q) = %v, want ok %v", tc.writers, err, tc.ok)
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
