package admission

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/qos"
)

// Keys the validation rules read. The gang keys are the scheduler extender's
// (scheduler-extender/gang.go); a test checks they stay equal.
const (
	// LabelAllowLSBestEffort on a namespace (value "true") allows pods annotated
	// understory.io/qos-class: LS that are Kubernetes BestEffort. Elsewhere such a pod
	// is rejected: LS means "protected", and a BestEffort pod reserves nothing.
	LabelAllowLSBestEffort = "understory.io/allow-ls-besteffort"
	// AnnotationVolcanoMinMember is Volcano's gang minimum member count.
	AnnotationVolcanoMinMember = "scheduling.volcano.sh/group-min-member"
	// AnnotationKoordinatorMinAvailable is Koordinator's gang minimum member count.
	AnnotationKoordinatorMinAvailable = "gang.scheduling.koordinator.sh/min-available"
	// DefaultMaxGangMinMember is the largest gang minimum accepted, the extender's MaxGangSize.
	DefaultMaxGangMinMember = 10000
)

// Rule names, quoted in every rejection (the ValidatingAdmissionPolicy in
// manifests/admission uses the same names).
const (
	RuleQOSClassValue     = "qos-class-value"
	RuleQOSClassImmutable = "qos-class-immutable"
	RuleLSBestEffort      = "ls-besteffort-namespace"
	RuleGangMinMember     = "gang-min-member"
)

// maxGangDigits bounds the digits of a gang minimum (the CEL rule checks the same
// before int(), which would fail on overflow).
const maxGangDigits = 9

// ValidatePod is the Go form of the ValidatingAdmissionPolicy
// understory-pod-rules (manifests/admission/validatingadmissionpolicy.yaml). The
// cluster enforces the policy; the webhook serves this only at /validate for API
// servers without ValidatingAdmissionPolicy (before 1.30), and the e2e test checks
// both agree. op is CREATE or UPDATE (old is nil on CREATE); nsLabels are the labels
// of the pod's namespace. Every error wraps ErrRejected and names the field and the
// rule.
func ValidatePod(op admissionv1.Operation, old, pod *corev1.Pod, nsLabels map[string]string, maxGang int) error {
	var errs []error
	v, has := pod.Annotations[qos.AnnotationQOSClass]
	field := fmt.Sprintf("metadata.annotations[%s]", qos.AnnotationQOSClass)
	switch op {
	case admissionv1.Create:
		if has {
			c, err := qos.ParseClass(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: must be LS, BE or batch (rule %s)", field, RuleQOSClassValue))
			} else if c == qos.ClassLS && qos.KubeQOSClass(pod) == corev1.PodQOSBestEffort &&
				nsLabels[LabelAllowLSBestEffort] != "true" {
				errs = append(errs, fmt.Errorf("%s: LS on a BestEffort pod is allowed only in namespaces labelled "+
					"%s=true (rule %s)", field, LabelAllowLSBestEffort, RuleLSBestEffort))
			}
		}
	case admissionv1.Update:
		ov, oldHas := old.Annotations[qos.AnnotationQOSClass]
		if has != oldHas || v != ov {
			errs = append(errs, fmt.Errorf("%s: cannot be added, changed or removed after creation (rule %s)",
				field, RuleQOSClassImmutable))
		}
	}
	for _, key := range []string{AnnotationVolcanoMinMember, AnnotationKoordinatorMinAvailable} {
		v, ok := pod.Annotations[key]
		if !ok {
			continue
		}
		if op == admissionv1.Update {
			if ov, oldOK := old.Annotations[key]; oldOK && ov == v {
				continue // unchanged: never block unrelated updates of existing pods
			}
		}
		if _, err := ParseGangMinMember(v, maxGang); err != nil {
			errs = append(errs, fmt.Errorf("metadata.annotations[%s]: %w (rule %s)", key, err, RuleGangMinMember))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRejected, errors.Join(errs...))
	}
	return nil
}

// ParseGangMinMember parses a gang minimum: decimal digits only (no sign, no
// spaces), at most maxGangDigits of them, value in 1..maxGang.
func ParseGangMinMember(s string, maxGang int) (int, error) {
	if len(s) == 0 || len(s) > maxGangDigits {
		return 0, fmt.Errorf("must be an integer in 1..%d", maxGang)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("must be an integer in 1..%d", maxGang)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxGang {
		return 0, fmt.Errorf("must be an integer in 1..%d", maxGang)
	}
	return n, nil
}

// DecodeOriginalResources decodes the understory.io/original-resources annotation.
// Unknown fields and trailing data are errors.
func DecodeOriginalResources(s string) (OriginalResources, error) {
	var o OriginalResources
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return OriginalResources{}, fmt.Errorf("decoding original resources: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return OriginalResources{}, errors.New("decoding original resources: trailing data")
	}
	return o, nil
}

// Encode returns the annotation value.
func (o OriginalResources) Encode() (string, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return "", fmt.Errorf("encoding original resources: %w", err)
	}
	return string(b), nil
}
