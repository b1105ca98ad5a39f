package gang

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/understory/understory/contract"
)

// PodGroupGVR is the scheduler-plugins PodGroup resource the extender watches.
var PodGroupGVR = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}

// VolcanoPodGroupGVR is Volcano's PodGroup resource: the minMember of the
// Volcano dialect's gangs (the extender watches it unless its VolcanoPodGroups is off).
var VolcanoPodGroupGVR = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}

// maxScheduleTimeout bounds spec.scheduleTimeoutSeconds (one day).
const maxScheduleTimeout = 24 * time.Hour

// podGroupSpec is what the extender uses of a PodGroup.
type podGroupSpec struct {
	minMember int
	timeout   time.Duration // 0: Config.PlanTTL
	err       error         // the PodGroup is malformed
}

// parsePodGroup reads spec.minMember (required, 1..MaxGangSize) and
// spec.scheduleTimeoutSeconds (optional, > 0) of a PodGroup.
func parsePodGroup(u *unstructured.Unstructured) podGroupSpec {
	var spec podGroupSpec
	if spec.minMember, spec.err = parseMinMember(u); spec.err != nil {
		return spec
	}
	if t, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "scheduleTimeoutSeconds"); found && t != nil {
		sec, ok := asInt(t)
		if !ok || sec < 1 || sec > int64(maxScheduleTimeout/time.Second) {
			spec.err = fmt.Errorf("spec.scheduleTimeoutSeconds %v must be an integer in 1..%d: %w", t, int(maxScheduleTimeout.Seconds()), ErrInvalidGang)
			return spec
		}
		spec.timeout = time.Duration(sec) * time.Second
	}
	return spec
}

// asInt accepts the integer forms JSON decoding produces.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int:
		return int64(x), true
	case float64:
		if x == float64(int64(x)) && x > -1e15 && x < 1e15 {
			return int64(x), true
		}
	}
	return 0, false
}

// parseVolcanoPodGroup reads spec.minMember (required, 1..MaxGangSize) of a
// Volcano PodGroup; Volcano has no schedule timeout there.
func parseVolcanoPodGroup(u *unstructured.Unstructured) podGroupSpec {
	var spec podGroupSpec
	spec.minMember, spec.err = parseMinMember(u)
	return spec
}

// parseMinMember reads spec.minMember (required, 1..MaxGangSize), the same
// field in both PodGroup dialects.
func parseMinMember(u *unstructured.Unstructured) (int, error) {
	m, found, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "minMember")
	if err != nil || !found {
		return 0, fmt.Errorf("spec.minMember missing: %w", ErrInvalidGang)
	}
	v, ok := asInt(m)
	if !ok || v < 1 || v > contract.MaxGangSize {
		return 0, fmt.Errorf("spec.minMember %v must be an integer in 1..%d: %w", m, contract.MaxGangSize, ErrInvalidGang)
	}
	return int(v), nil
}

// SlimPodGroup keeps apiVersion, kind, identity and spec.minMember and
// spec.scheduleTimeoutSeconds: what parsePodGroup and parseVolcanoPodGroup read
// (the PodGroup informers' transform keeps only this).
func SlimPodGroup(u *unstructured.Unstructured) *unstructured.Unstructured {
	meta := map[string]any{"name": u.GetName(), "namespace": u.GetNamespace()}
	if v := u.GetUID(); v != "" {
		meta["uid"] = string(v)
	}
	if v := u.GetResourceVersion(); v != "" {
		meta["resourceVersion"] = v
	}
	out := &unstructured.Unstructured{Object: map[string]any{"metadata": meta}}
	for _, k := range []string{"apiVersion", "kind"} {
		if v, ok := u.Object[k]; ok {
			out.Object[k] = v
		}
	}
	if spec, ok := u.Object["spec"].(map[string]any); ok {
		s := map[string]any{}
		for _, k := range []string{"minMember", "scheduleTimeoutSeconds"} {
			if v, ok := spec[k]; ok {
				s[k] = v
			}
		}
		out.Object["spec"] = s
	} else if spec, ok := u.Object["spec"]; ok {
		out.Object["spec"] = spec // malformed: the decoder says so
	}
	return out
}
