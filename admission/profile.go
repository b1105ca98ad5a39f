package admission

import (
	"errors"
	"fmt"
	"strings"

	"github.com/understory/understory/contract"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

// ErrInvalidProfiles is wrapped by every error about the profiles file; the message
// names the profile and the field.
var ErrInvalidProfiles = errors.New("invalid admission profiles")

// LabelProfile is the namespace label the shipped MutatingWebhookConfiguration selects
// for the profile path: only pods in namespaces carrying it (any value) are sent to
// the webhook without the qos-class annotation. Profiles usually select on it too
// (namespaceSelector.matchLabels: {understory.io/colocation-profile: NAME}).
const LabelProfile = "understory.io/colocation-profile"

// Profile assigns a QoS class (and optionally a PriorityClass, labels and
// annotations) to the pods it selects, like Koordinator's ClusterColocationProfile.
type Profile struct {
	// Name identifies the profile in logs, metrics-free warnings and the docs.
	Name string `json:"name"`
	// NamespaceSelector selects on the labels of the pod's namespace; nil: any namespace.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// ObjectSelector selects on the pod's labels; nil: any pod.
	ObjectSelector *metav1.LabelSelector `json:"objectSelector,omitempty"`
	// QOSClass is the class written to understory.io/qos-class: LS, BE or batch
	// (default batch). Only batch pods have their resources moved.
	QOSClass string `json:"qosClass,omitempty"`
	// PriorityClassName is set on pods that have none (see docs/admission.md for how
	// spec.priority is kept consistent with it).
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// Labels and Annotations are added to the pod; keys the pod already has keep the
	// pod's value.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ProfilesFile is the -profiles file.
type ProfilesFile struct {
	// Profiles are tried in order; the first that selects a pod applies.
	Profiles []Profile `json:"profiles"`
}

// Profiles is a validated, compiled ProfilesFile. The zero value selects no pod.
type Profiles struct {
	list []compiledProfile
}

type compiledProfile struct {
	Profile
	class       qos.Class
	nsSelector  labels.Selector // nil: any namespace
	objSelector labels.Selector // nil: any pod
}

// ParseProfiles decodes and validates a profiles file (YAML or JSON). Unknown fields,
// duplicate names, invalid selectors, classes, label keys or values and protected
// annotation keys are errors that wrap ErrInvalidProfiles and name the field.
func ParseProfiles(data []byte) (Profiles, error) {
	var f ProfilesFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return Profiles{}, fmt.Errorf("%w: %w", ErrInvalidProfiles, err)
	}
	return CompileProfiles(f.Profiles)
}

// CompileProfiles validates ps and compiles their selectors.
func CompileProfiles(ps []Profile) (Profiles, error) {
	out := Profiles{list: make([]compiledProfile, 0, len(ps))}
	seen := map[string]bool{}
	var errs []error
	for i, p := range ps {
		cp, err := compileProfile(p)
		if err == nil && seen[p.Name] {
			err = fmt.Errorf("duplicate name")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("profiles[%d] (%q): %w", i, p.Name, err))
			continue
		}
		seen[p.Name] = true
		out.list = append(out.list, cp)
	}
	if len(errs) > 0 {
		return Profiles{}, fmt.Errorf("%w: %w", ErrInvalidProfiles, errors.Join(errs...))
	}
	return out, nil
}

func compileProfile(p Profile) (compiledProfile, error) {
	cp := compiledProfile{Profile: p, class: qos.ClassBatch}
	if errs := validation.IsDNS1123Subdomain(p.Name); len(errs) > 0 {
		return cp, fmt.Errorf("name: %s", strings.Join(errs, "; "))
	}
	if p.QOSClass != "" {
		c, err := qos.ParseClass(p.QOSClass)
		if err != nil {
			return cp, fmt.Errorf("qosClass: %w", err)
		}
		cp.class = c
	}
	if p.NamespaceSelector == nil && p.ObjectSelector == nil {
		// A profile without selectors would take over every pod the webhook sees;
		// an explicit empty selector ({}) still says "all" on purpose.
		return cp, errors.New("namespaceSelector or objectSelector is required")
	}
	var err error
	if p.NamespaceSelector != nil {
		if cp.nsSelector, err = metav1.LabelSelectorAsSelector(p.NamespaceSelector); err != nil {
			return cp, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	if p.ObjectSelector != nil {
		if cp.objSelector, err = metav1.LabelSelectorAsSelector(p.ObjectSelector); err != nil {
			return cp, fmt.Errorf("objectSelector: %w", err)
		}
	}
	if p.PriorityClassName != "" {
		if errs := validation.IsDNS1123Subdomain(p.PriorityClassName); len(errs) > 0 {
			return cp, fmt.Errorf("priorityClassName: %s", strings.Join(errs, "; "))
		}
	}
	for k, v := range p.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return cp, fmt.Errorf("labels[%q]: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return cp, fmt.Errorf("labels[%q]: %s", k, strings.Join(errs, "; "))
		}
	}
	for k := range p.Annotations {
		if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 {
			return cp, fmt.Errorf("annotations[%q]: %s", k, strings.Join(errs, "; "))
		}
		if k == contract.AnnotationQOSClass || k == contract.AnnotationOriginalResources {
			return cp, fmt.Errorf("annotations[%q]: written by the webhook itself (use qosClass)", k)
		}
	}
	return cp, nil
}

// Len is the number of profiles.
func (ps Profiles) Len() int { return len(ps.list) }

// NeedNamespaceLabels reports whether any profile selects on namespace labels, i.e.
// whether Select needs the namespace's labels at all.
func (ps Profiles) NeedNamespaceLabels() bool {
	for _, p := range ps.list {
		if p.nsSelector != nil {
			return true
		}
	}
	return false
}

// Select returns the first profile whose selectors match the namespace's and the
// pod's labels. nsLabels may be nil when NeedNamespaceLabels is false.
func (ps Profiles) Select(nsLabels, podLabels map[string]string) (Profile, qos.Class, bool) {
	for _, p := range ps.list {
		if p.nsSelector != nil && !p.nsSelector.Matches(labels.Set(nsLabels)) {
			continue
		}
		if p.objSelector != nil && !p.objSelector.Matches(labels.Set(podLabels)) {
			continue
		}
		return p.Profile, p.class, true
	}
	return Profile{}, "", false
}
