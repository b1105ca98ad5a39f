package qos

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
)

// Class is Understory's QoS class of a pod.
type Class string

// The Understory QoS classes.
const (
	// ClassLS is latency-sensitive: the pods Understory protects.
	ClassLS Class = "LS"
	// ClassBE is best-effort: what a Kubernetes BestEffort pod is by default.
	ClassBE Class = "BE"
	// ClassBatch is the tier whose CPU the [Budgeter] caps.
	ClassBatch Class = "batch"
)

// Keys read by [Classify] besides Understory's own annotation,
// contract.AnnotationQOSClass (values LS, BE, batch, ASCII case-insensitive), which wins
// over every other source.
const (
	// AnnotationKoordinatorQOS is Koordinator's QoS key. Values: LSE, LSR, LS,
	// SYSTEM (all map to [ClassLS]) and BE (maps to [ClassBatch]), ASCII
	// case-insensitive. Koordinator sets it as a pod LABEL; Classify reads the
	// label first and the annotation of the same name second.
	AnnotationKoordinatorQOS = "koordinator.sh/qosClass"
	// LabelKoordinatorQOS is the same key as AnnotationKoordinatorQOS, named for
	// its use as a label (which is where Koordinator puts it).
	LabelKoordinatorQOS = AnnotationKoordinatorQOS
)

var (
	// ErrInvalidClass is wrapped by every error about an unknown class value.
	ErrInvalidClass = errors.New("invalid QoS class")
	// ErrNilPod is returned by Classify for a nil pod.
	ErrNilPod = errors.New("nil pod")
)

// maxValueInError bounds how much of a bad value an error message quotes:
// annotation values may be up to 256 KiB and end up in logs and Events.
const maxValueInError = 64

// String returns the class name.
func (c Class) String() string { return string(c) }

// Valid reports whether c is one of ClassLS, ClassBE, ClassBatch.
func (c Class) Valid() bool {
	switch c {
	case ClassLS, ClassBE, ClassBatch:
		return true
	}
	return false
}

// ParseClass parses an Understory class name (LS, BE, batch), ignoring ASCII
// case. Surrounding spaces and non-ASCII look-alikes are rejected. The error
// wraps ErrInvalidClass and quotes (a truncated copy of) the value.
func ParseClass(s string) (Class, error) {
	switch {
	case equalFoldASCII(s, "LS"):
		return ClassLS, nil
	case equalFoldASCII(s, "BE"):
		return ClassBE, nil
	case equalFoldASCII(s, "batch"):
		return ClassBatch, nil
	}
	return "", fmt.Errorf("%s is not one of LS, BE, batch: %w", quoteValue(s), ErrInvalidClass)
}

// ParseKoordinatorClass maps a Koordinator QoS class (LSE, LSR, LS, SYSTEM,
// BE; ASCII case-insensitive) to an Understory class. The error wraps
// ErrInvalidClass and quotes (a truncated copy of) the value.
func ParseKoordinatorClass(s string) (Class, error) {
	switch {
	case equalFoldASCII(s, "LSE"), equalFoldASCII(s, "LSR"),
		equalFoldASCII(s, "LS"), equalFoldASCII(s, "SYSTEM"):
		return ClassLS, nil
	case equalFoldASCII(s, "BE"):
		return ClassBatch, nil
	}
	return "", fmt.Errorf("%s is not one of LSE, LSR, LS, BE, SYSTEM: %w", quoteValue(s), ErrInvalidClass)
}

// classSource is one place a class can come from, in precedence order.
type classSource struct {
	kind  string // "annotation" or "label", for the error message
	key   string
	pick  func(*corev1.Pod) map[string]string
	parse func(string) (Class, error)
}

func podAnnotations(p *corev1.Pod) map[string]string { return p.Annotations }
func podLabels(p *corev1.Pod) map[string]string      { return p.Labels }

// classSources lists the explicit sources in precedence order. It is a
// function, not a package variable, so there is no package-level mutable state.
func classSources() [3]classSource {
	return [...]classSource{
		{"annotation", contract.AnnotationQOSClass, podAnnotations, ParseClass},
		{"label", LabelKoordinatorQOS, podLabels, ParseKoordinatorClass},
		{"annotation", AnnotationKoordinatorQOS, podAnnotations, ParseKoordinatorClass},
	}
}

// Classify returns the Understory class of pod. Precedence, first present
// and valid source wins:
//
//  1. annotation understory.io/qos-class (LS, BE, batch);
//  2. label koordinator.sh/qosClass, then the annotation of the same name
//     (LSE, LSR, LS, SYSTEM -> LS; BE -> batch);
//  3. a pod that asks for understory.io/batch-cpu or understory.io/batch-memory
//     (or Koordinator's kubernetes.io/batch-cpu, kubernetes.io/batch-memory;
//     requests or limits of any container) is batch: it was made a consumer of
//     the node's batch resources (by the admission webhook or by hand);
//  4. the Kubernetes QoS class ([KubeQOSClass]): Guaranteed and Burstable ->
//     LS, BestEffort -> BE.
//
// A present but invalid value never moves the pod into another class: it is
// skipped as if absent, so the result is what the lower-precedence sources
// give, and the returned error (wrapping ErrInvalidClass, one line per bad
// source, each naming the key and the truncated value) tells the caller to
// warn. The class is valid whenever pod is non-nil, even when err != nil.
func Classify(pod *corev1.Pod) (Class, error) {
	if pod == nil {
		return "", ErrNilPod
	}
	var errs []error
	for _, src := range classSources() {
		v, ok := src.pick(pod)[src.key]
		if !ok {
			continue
		}
		c, err := src.parse(v)
		if err == nil {
			return c, errors.Join(errs...)
		}
		errs = append(errs, fmt.Errorf("%s %s: %w", src.kind, src.key, err))
	}
	if RequestsBatchResources(pod) {
		return ClassBatch, errors.Join(errs...)
	}
	return kubeDefaultClass(pod), errors.Join(errs...)
}

// RequestsBatchResources reports whether any container (init containers
// included) requests or limits understory.io/batch-cpu or
// understory.io/batch-memory, or Koordinator's names for them
// (kubernetes.io/batch-cpu, kubernetes.io/batch-memory).
func RequestsBatchResources(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			r := &cs[i].Resources
			for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
				for name := range l {
					if _, ok := contract.BatchResourceName(string(name)); ok {
						return true
					}
				}
			}
		}
	}
	return false
}

// kubeDefaultClass maps the Kubernetes QoS class to an Understory class. An
// unknown value in pod.Status.QOSClass is ignored in favour of the spec.
func kubeDefaultClass(pod *corev1.Pod) Class {
	q := KubeQOSClass(pod)
	switch q {
	case corev1.PodQOSGuaranteed, corev1.PodQOSBurstable:
		return ClassLS
	case corev1.PodQOSBestEffort:
		return ClassBE
	}
	if ComputeKubeQOSClass(pod) == corev1.PodQOSBestEffort {
		return ClassBE
	}
	return ClassLS
}

// equalFoldASCII is strings.EqualFold restricted to ASCII: EqualFold also
// folds Unicode (U+017F "ſ" equals "s", U+212A Kelvin sign equals "k"), which
// would let look-alike values through.
func equalFoldASCII(s, want string) bool {
	if len(s) != len(want) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lowerASCII(s[i]) != lowerASCII(want[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}

// quoteValue quotes v for an error message, cutting it (on a rune boundary
// when v is valid UTF-8) to maxValueInError bytes.
func quoteValue(v string) string {
	if len(v) <= maxValueInError {
		return fmt.Sprintf("%q", v)
	}
	cut := maxValueInError
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	if cut == 0 { // not UTF-8 at all: cut on bytes, %q escapes them
		cut = maxValueInError
	}
	return fmt.Sprintf("%q... (%d bytes)", v[:cut], len(v))
}
