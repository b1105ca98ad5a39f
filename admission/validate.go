package admission

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

// Keys the validation rules read. The gang keys and their bound are the shared
// contract's (contract.AnnotationVolcanoMinMember, contract.AnnotationKoordinatorMinAvailable,
// contract.MaxGangSize), as is the devices key (contract.AnnotationGPUDevices); the class
// keys are the node agent's (package qos). All are imported, never re-declared.
const (
	// LabelAllowLSBestEffort on a namespace (value "true") allows BestEffort pods that
	// the node agent classifies LS through a class key (understory.io/qos-class: LS, or
	// Koordinator's koordinator.sh/qosClass label or annotation: LSE, LSR, LS, SYSTEM).
	// Elsewhere such a pod is rejected: LS means "protected", and a BestEffort pod
	// reserves nothing.
	LabelAllowLSBestEffort = "understory.io/allow-ls-besteffort"
	// DefaultMaxGangMinMember is the largest gang minimum accepted, the extender's bound
	// too (contract.MaxGangSize).
	DefaultMaxGangMinMember = contract.MaxGangSize
	// DefaultGPUDevicesWriter is the user name of the scheduler extender's service
	// account (manifests/scheduler: ServiceAccount understory-scheduler-extender in
	// understory-system), the only writer of understory.io/gpu-devices: it puts the
	// annotation in the Binding it creates (pods/binding), which kube-apiserver copies
	// onto the pod. The policy's variable gpuDevicesWriters names it too; a test checks.
	DefaultGPUDevicesWriter = contract.UserSchedulerExtender
)

// Rule names, quoted in every rejection (the ValidatingAdmissionPolicies in
// manifests/admission use the same names).
const (
	RuleQOSClassValue     = "qos-class-value"
	RuleQOSClassImmutable = "qos-class-immutable"
	RuleLSBestEffort      = "ls-besteffort-namespace"
	RuleGangMinMember     = "gang-min-member"
	RuleGPUDevicesWriter  = "gpu-devices-writer"
	// RuleGangStateWriter and RuleCatchUpWriter keep the extender's other annotations
	// (contract.AnnotationGangState, contract.AnnotationExtenderCatchUp) to its identity.
	RuleGangStateWriter = "gang-state-writer"
	RuleCatchUpWriter   = "extender-catch-up-writer"
	// RuleOriginalResourcesImmutable: understory.io/original-resources is the webhook's,
	// written inside the pod's CREATE; no UPDATE may add, change or remove it.
	RuleOriginalResourcesImmutable = "original-resources-immutable"
	// RuleGPUShareScheduler (second-scheduler mode): a GPU-share pod must name the
	// scheduler that calls the extender (policy understory-gpu-share-scheduler).
	RuleGPUShareScheduler = "gpu-share-scheduler"
)

// maxGangDigits bounds the digits of a gang minimum (the CEL rule checks the same
// before int(), which would fail on overflow).
const maxGangDigits = 9

// Rules are the parameters of the validation rules: the variables of the
// ValidatingAdmissionPolicies in manifests/admission (maxGangMinMember,
// gpuDevicesWriters). DefaultRules matches the shipped policies.
type Rules struct {
	// MaxGangMinMember is the largest gang minimum accepted.
	MaxGangMinMember int
	// GPUDevicesWriters are the user names (request.userInfo.username) that may set
	// understory.io/gpu-devices on a pod or a Binding, or change it on a pod.
	GPUDevicesWriters []string
	// ExtenderAnnotationWriters may set or change understory.io/gang-state and
	// understory.io/extender-catch-up (the policy's extenderAnnotationWriters).
	ExtenderAnnotationWriters []string
	// GPUShareScheduler, when not "", is the second scheduler's name: a pod CREATE
	// asking for understory.io/gpu-milli must name it in spec.schedulerName (the
	// second-scheduler mode's policy understory-gpu-share-scheduler). "" is off.
	GPUShareScheduler string
}

// DefaultRules returns the rules of the shipped policies.
func DefaultRules() Rules {
	return Rules{MaxGangMinMember: DefaultMaxGangMinMember, GPUDevicesWriters: []string{DefaultGPUDevicesWriter},
		ExtenderAnnotationWriters: []string{DefaultGPUDevicesWriter}}
}

// PodRequest is one pod CREATE or UPDATE as the validation rules see it.
type PodRequest struct {
	// Operation is CREATE or UPDATE; other operations are not validated.
	Operation admissionv1.Operation
	// Old is the pod before an UPDATE (required there); nil on CREATE.
	Old *corev1.Pod
	// Pod is the pod being created, or the pod after the UPDATE (required).
	Pod *corev1.Pod
	// NamespaceLabels are the labels of the pod's namespace.
	NamespaceLabels map[string]string
	// Username is the requesting user (request.userInfo.username).
	Username string
}

// classKey is one key the node agent reads a pod's class from (qos.Classify).
type classKey struct {
	field string // as rejections name it
	key   string
	label bool // a label, else an annotation
	parse func(string) (qos.Class, error)
}

// classKeys are the keys qos.Classify reads, in its precedence order (the first
// present key with a valid value decides). TestLSClaimAgreesWithClassify and
// FuzzLSClaim hold this to qos.Classify. A function, not a package variable, so
// there is no package-level mutable state.
func classKeys() [3]classKey {
	return [...]classKey{
		{fmt.Sprintf("metadata.annotations[%s]", contract.AnnotationQOSClass), contract.AnnotationQOSClass, false, qos.ParseClass},
		{fmt.Sprintf("metadata.labels[%s]", qos.LabelKoordinatorQOS), qos.LabelKoordinatorQOS, true, qos.ParseKoordinatorClass},
		{fmt.Sprintf("metadata.annotations[%s]", qos.AnnotationKoordinatorQOS), qos.AnnotationKoordinatorQOS, false,
			qos.ParseKoordinatorClass},
	}
}

func (k classKey) get(p *corev1.Pod) (string, bool) {
	m := p.Annotations
	if k.label {
		m = p.Labels
	}
	v, ok := m[k.key]
	return v, ok
}

// lsClaim returns the class key through which the node agent classifies pod LS, if
// any: the first key (in qos.Classify's order) with a valid value decides, and an
// invalid value is skipped as the agent skips it. A pod whose deciding key says BE
// or batch claims nothing, whatever a lower key says.
func lsClaim(pod *corev1.Pod) (classKey, bool) {
	for _, k := range classKeys() {
		v, ok := k.get(pod)
		if !ok {
			continue
		}
		c, err := k.parse(v)
		if err != nil {
			continue
		}
		return k, c == qos.ClassLS
	}
	return classKey{}, false
}

// ValidatePod is the Go form of the ValidatingAdmissionPolicy understory-pod-rules
// (manifests/admission/validatingadmissionpolicy.yaml). The cluster enforces the
// policy; the webhook serves this only at /validate for API servers without
// ValidatingAdmissionPolicy (before 1.30), and the e2e test checks both agree. Every
// error wraps ErrRejected and names the field and the rule.
func ValidatePod(r PodRequest, rules Rules) error {
	if r.Pod == nil || (r.Operation == admissionv1.Update && r.Old == nil) {
		return fmt.Errorf("%w: %s without the pod (and, on UPDATE, the old pod)", ErrRejected, r.Operation)
	}
	var errs []error
	pod := r.Pod
	switch r.Operation {
	case admissionv1.Create:
		if v, has := pod.Annotations[contract.AnnotationQOSClass]; has {
			if _, err := qos.ParseClass(v); err != nil {
				errs = append(errs, fmt.Errorf("metadata.annotations[%s]: must be LS, BE or batch (rule %s)",
					contract.AnnotationQOSClass, RuleQOSClassValue))
			}
		}
		if k, ls := lsClaim(pod); ls && qos.KubeQOSClass(pod) == corev1.PodQOSBestEffort &&
			r.NamespaceLabels[LabelAllowLSBestEffort] != "true" {
			errs = append(errs, fmt.Errorf("%s: LS on a BestEffort pod is allowed only in namespaces labelled "+
				"%s=true (rule %s)", k.field, LabelAllowLSBestEffort, RuleLSBestEffort))
		}
	case admissionv1.Update:
		for _, k := range classKeys() {
			v, has := k.get(pod)
			ov, oldHas := k.get(r.Old)
			if has != oldHas || v != ov {
				errs = append(errs, fmt.Errorf("%s: cannot be added, changed or removed after creation (rule %s)",
					k.field, RuleQOSClassImmutable))
			}
		}
	}
	// The pod annotations only their writers may carry at CREATE or add, change or
	// remove at UPDATE.
	for _, f := range []struct {
		key, rule, what string
		writers         []string
	}{
		{contract.AnnotationGPUDevices, RuleGPUDevicesWriter, "set or change it, when it binds the pod",
			rules.GPUDevicesWriters},
		{contract.AnnotationGangState, RuleGangStateWriter, "set or change it", rules.ExtenderAnnotationWriters},
		{contract.AnnotationExtenderCatchUp, RuleCatchUpWriter, "set or change it", rules.ExtenderAnnotationWriters},
	} {
		if changesAnnotation(r, f.key) {
			if err := writerError(f.key, f.rule, f.writers, r.Username, f.what); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if r.Operation == admissionv1.Update && changesAnnotation(r, contract.AnnotationOriginalResources) {
		errs = append(errs, fmt.Errorf("metadata.annotations[%s]: cannot be added, changed or removed after "+
			"creation (rule %s)", contract.AnnotationOriginalResources, RuleOriginalResourcesImmutable))
	}
	if s := rules.GPUShareScheduler; s != "" && r.Operation == admissionv1.Create && asksGPUShare(pod) &&
		pod.Spec.SchedulerName != s {
		cur := pod.Spec.SchedulerName
		if cur == "" {
			cur = DefaultSchedulerName
		}
		errs = append(errs, fmt.Errorf("spec.schedulerName: a pod asking for %s must be placed by %s, the "+
			"scheduler that calls the extender, not %q (rule %s)", contract.ResourceGPUMilli, s, cur,
			RuleGPUShareScheduler))
	}
	for _, key := range []string{contract.AnnotationVolcanoMinMember, contract.AnnotationKoordinatorMinAvailable} {
		v, ok := pod.Annotations[key]
		if !ok {
			continue
		}
		if r.Operation == admissionv1.Update {
			if ov, oldOK := r.Old.Annotations[key]; oldOK && ov == v {
				continue // unchanged: never block unrelated updates of existing pods
			}
		}
		if _, err := ParseGangMinMember(v, rules.MaxGangMinMember); err != nil {
			errs = append(errs, fmt.Errorf("metadata.annotations[%s]: %w (rule %s)", key, err, RuleGangMinMember))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRejected, errors.Join(errs...))
	}
	return nil
}

// changesAnnotation reports whether r carries key at CREATE, or adds, changes or
// removes it at UPDATE.
func changesAnnotation(r PodRequest, key string) bool {
	v, has := r.Pod.Annotations[key]
	switch r.Operation {
	case admissionv1.Create:
		return has
	case admissionv1.Update:
		ov, oldHas := r.Old.Annotations[key]
		return has != oldHas || v != ov
	}
	return false
}

// asksGPUShare reports whether any container or init container requests or limits
// understory.io/gpu-milli.
func asksGPUShare(p *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Requests[contract.ResourceGPUMilli]; ok {
				return true
			}
			if _, ok := cs[i].Resources.Limits[contract.ResourceGPUMilli]; ok {
				return true
			}
		}
	}
	return false
}

// ValidateBinding is the Go form of the ValidatingAdmissionPolicy
// understory-gpu-devices-binding: a Binding (pods/binding or bindings CREATE) may carry
// understory.io/gpu-devices, which kube-apiserver copies onto the pod, only from one
// of rules.GPUDevicesWriters. The error wraps ErrRejected and names the field and the
// rule.
func ValidateBinding(b *corev1.Binding, username string, rules Rules) error {
	if b == nil {
		return fmt.Errorf("%w: no Binding", ErrRejected)
	}
	if _, has := b.Annotations[contract.AnnotationGPUDevices]; !has {
		return nil
	}
	if err := writerError(contract.AnnotationGPUDevices, RuleGPUDevicesWriter, rules.GPUDevicesWriters, username,
		"set it in a Binding, when it binds the pod"); err != nil {
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	return nil
}

// writerError is nil when username is one of writers, the scheduler extender's
// identities; otherwise it refuses, by rule, what username did to annotation key.
func writerError(key, rule string, writers []string, username, what string) error {
	if slices.Contains(writers, username) {
		return nil
	}
	return fmt.Errorf("metadata.annotations[%s]: only the scheduler extender (%s) may %s; not %q (rule %s)",
		key, strings.Join(writers, ", "), what, username, rule)
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
