package admission

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/understory/understory/qos"
)

// Sentinel errors callers branch on.
var (
	// ErrRejected wraps every reason the webhook denies a pod (bad input it must not
	// guess about). The message names the field.
	ErrRejected = errors.New("rejected")
	// ErrNotFound is returned by a Cluster for a namespace or PriorityClass that does not exist.
	ErrNotFound = errors.New("not found")
	// errUnsupported marks resources the mutator cannot convert; the pod is then left
	// on cpu/memory (fail open) and the problem counted.
	errUnsupported = errors.New("unsupported resources")
)

// Cluster is what the mutator reads from the API server. Implementations return an
// error wrapping ErrNotFound for objects that do not exist.
type Cluster interface {
	NamespaceLabels(ctx context.Context, name string) (map[string]string, error)
	PriorityClass(ctx context.Context, name string) (*schedulingv1.PriorityClass, error)
}

// Problem kinds counted in understory_admission_errors_total{kind}.
const (
	ProblemLookup          = "lookup"                 // namespace or PriorityClass read failed
	ProblemUnsupported     = "unsupported"            // resources left unconverted (fail open)
	ProblemPriorityMissing = "priority_class_missing" // profile's PriorityClass does not exist
	ProblemInvalidClass    = "invalid_class"          // qos-class annotation not LS/BE/batch
	ProblemDecode          = "decode"                 // malformed AdmissionReview or pod
	ProblemEncode          = "encode"                 // response could not be encoded
)

// maxBatchValue bounds one container's batch-cpu (millicores) and batch-memory
// (bytes): 2^53 is 9e12 cores or 8 PiB, far above any node, and sums over thousands
// of containers still fit in int64 in the scheduler and the extender.
const maxBatchValue = 1 << 53

// PatchOp is one RFC 6902 JSON Patch operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Result is what Mutate decided about one pod.
type Result struct {
	// Patch turns the pod into the mutated pod; empty when nothing changes.
	Patch []PatchOp
	// Class is the pod's Understory class as the webhook saw it ("" when none).
	Class qos.Class
	// Profile names the profile that selected the pod, if any.
	Profile string
	// Warnings are returned to the client (kubectl prints them).
	Warnings []string
	// Problems are counted by kind (Problem* constants); the pod is still admitted.
	Problems []string
	// SchedulerName is the scheduler the webhook gave the pod ("" when it left
	// spec.schedulerName alone).
	SchedulerName string
}

// DefaultSchedulerName is the API server's default spec.schedulerName. A pod naming
// it (or none) may be handed to the second scheduler; a pod naming another is left alone.
const DefaultSchedulerName = "default-scheduler"

// ErrInvalidSchedulerName is wrapped by NewMutator's error for a scheduler name the
// API server would refuse in spec.schedulerName, or the default scheduler's.
var ErrInvalidSchedulerName = errors.New("invalid scheduler name")

// Mutator decides the mutation of pods. It holds no mutable state and is safe for
// concurrent use.
type Mutator struct {
	profiles  Profiles
	cluster   Cluster
	scheduler string
	// replaced are scheduler names pods are moved off (WithReplacedSchedulers).
	replaced []string
}

// MutatorOption tunes NewMutator.
type MutatorOption func(*Mutator)

// WithSchedulerName turns the second-scheduler mode on: batch pods and pods asking
// for a resource the scheduler extender manages (GPUs, GPU shares, batch resources)
// get spec.schedulerName = name, unless they already name a scheduler other than
// default-scheduler. "" leaves it off (the default).
func WithSchedulerName(name string) MutatorOption {
	return func(m *Mutator) { m.scheduler = name }
}

// NewMutator returns a mutator for profiles. cluster may be nil only when no profile
// needs namespace labels or a PriorityClass. A scheduler name that is not a DNS-1123
// subdomain, or is default-scheduler, is an error wrapping ErrInvalidSchedulerName.
func NewMutator(profiles Profiles, cluster Cluster, opts ...MutatorOption) (*Mutator, error) {
	if cluster == nil {
		for _, p := range profiles.list {
			if p.nsSelector != nil || p.PriorityClassName != "" {
				return nil, fmt.Errorf("profile %q needs the API server (namespace labels or PriorityClass) "+
					"but no cluster client was given", p.Name)
			}
		}
	}
	m := &Mutator{profiles: profiles, cluster: cluster}
	for _, o := range opts {
		o(m)
	}
	if err := ValidateSchedulerName(m.scheduler); err != nil {
		return nil, err
	}
	if err := m.validateReplaced(); err != nil {
		return nil, err
	}
	return m, nil
}

// ValidateSchedulerName checks a second scheduler's name: "" (off) or a DNS-1123
// subdomain other than default-scheduler. Errors wrap ErrInvalidSchedulerName.
func ValidateSchedulerName(name string) error {
	if name == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%w %q: %s", ErrInvalidSchedulerName, name, strings.Join(errs, "; "))
	}
	if name == DefaultSchedulerName {
		return fmt.Errorf("%w %q: that is the default scheduler; leave it empty to turn the second "+
			"scheduler off", ErrInvalidSchedulerName, name)
	}
	return nil
}

// SchedulerName is the second scheduler's name; "" when the mode is off.
func (m *Mutator) SchedulerName() string { return m.scheduler }

// Mutate returns the patch for pod, created in namespace. An error wrapping
// ErrRejected means the pod must be denied with that message; no other error is
// returned (lookups that fail leave the pod unmutated and are reported as Problems).
func (m *Mutator) Mutate(ctx context.Context, namespace string, pod *corev1.Pod) (Result, error) {
	var res Result
	out := pod.DeepCopy()
	m.replaceScheduler(out, &res)
	renamed, err := renameKoordinatorResources(out)
	if err != nil {
		return res, err
	}
	if renamed {
		res.Warnings = append(res.Warnings, fmt.Sprintf("understory: %s and %s renamed to %s and %s (Koordinator's "+
			"names; nodes publish Understory's)", contract.ResourceKoordinatorBatchCPU, contract.ResourceKoordinatorBatchMemory,
			contract.ResourceBatchCPU, contract.ResourceBatchMemory))
	}
	// The containers as renamed: what a batch pod keeps when its cpu/memory cannot move.
	afterRename := out.DeepCopy()
	if v, ok := pod.Annotations[contract.AnnotationQOSClass]; ok {
		c, err := qos.ParseClass(v)
		if err != nil {
			// The ValidatingAdmissionPolicy rejects the pod; do not guess here.
			res.Problems = append(res.Problems, ProblemInvalidClass)
			res.Patch = diffPatch(pod, out)
			return res, nil
		}
		res.Class = c
	} else if m.profiles.Len() > 0 {
		if !m.applyProfile(ctx, namespace, out, &res) {
			m.applyScheduler(out, &res) // applyProfile changed nothing
			res.Patch = diffPatch(pod, out)
			return res, nil
		}
	}
	if res.Class == qos.ClassBatch {
		if err := moveToBatch(out); err != nil {
			if !errors.Is(err, errUnsupported) {
				return res, err
			}
			res.Problems = append(res.Problems, ProblemUnsupported)
			res.Warnings = append(res.Warnings, "understory: batch pod left on cpu/memory (the node agent still "+
				"treats it as batch): "+err.Error())
			// The profile's annotations, labels and priority still apply; moveToBatch
			// writes the original-resources annotation only after every container moved.
			out.Spec.Containers, out.Spec.InitContainers = afterRename.Spec.Containers, afterRename.Spec.InitContainers
		}
	}
	m.applyScheduler(out, &res)
	res.Patch = diffPatch(pod, out)
	return res, nil
}

// extenderResources are the resources the scheduler extender manages (its
// managedResources in the KubeSchedulerConfiguration): a pod asking for one must be
// placed by a kube-scheduler that calls the extender.
var extenderResources = [...]corev1.ResourceName{
	contract.ResourceGPU, contract.ResourceGPUMilli, contract.ResourceBatchCPU, contract.ResourceBatchMemory,
}

// applyScheduler hands out to the second scheduler (when the mode is on) if it is a
// batch pod or asks for a resource the extender manages, and names no scheduler of
// its own. An LS or BE pod asking for none of them is left to the default scheduler.
func (m *Mutator) applyScheduler(out *corev1.Pod, res *Result) {
	if m.scheduler == "" {
		return
	}
	if cur := out.Spec.SchedulerName; cur != "" && cur != DefaultSchedulerName {
		return // the pod's own choice (possibly already ours)
	}
	if res.Class != qos.ClassBatch && !asksExtenderResource(out) {
		return
	}
	out.Spec.SchedulerName = m.scheduler
	res.SchedulerName = m.scheduler
}

// asksExtenderResource reports whether any container or init container requests or
// limits one of extenderResources.
func asksExtenderResource(p *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			for _, r := range extenderResources {
				if _, ok := cs[i].Resources.Requests[r]; ok {
					return true
				}
				if _, ok := cs[i].Resources.Limits[r]; ok {
					return true
				}
			}
		}
	}
	return false
}

// applyProfile applies the first matching profile to out. It returns false when no
// profile applies (or the namespace could not be read: fail open).
func (m *Mutator) applyProfile(ctx context.Context, namespace string, out *corev1.Pod, res *Result) bool {
	var nsLabels map[string]string
	if m.profiles.NeedNamespaceLabels() {
		var err error
		if nsLabels, err = m.cluster.NamespaceLabels(ctx, namespace); err != nil {
			res.Problems = append(res.Problems, ProblemLookup)
			res.Warnings = append(res.Warnings, fmt.Sprintf("understory: profiles not applied: reading namespace %q: %v",
				namespace, err))
			return false
		}
	}
	p, class, ok := m.profiles.Select(nsLabels, out.Labels)
	if !ok {
		return false
	}
	res.Profile, res.Class = p.Name, class
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[contract.AnnotationQOSClass] = string(class)
	for k, v := range p.Annotations {
		if _, ok := out.Annotations[k]; !ok {
			out.Annotations[k] = v
		}
	}
	if len(p.Labels) > 0 && out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for k, v := range p.Labels {
		if _, ok := out.Labels[k]; !ok {
			out.Labels[k] = v
		}
	}
	if p.PriorityClassName != "" {
		m.applyPriority(ctx, p, out, res)
	}
	return true
}

// applyPriority sets the profile's PriorityClass on a pod that has none.
//
// Trap: the Priority admission plugin runs BEFORE mutating webhooks. It has already
// resolved spec.priority (and preemptionPolicy) from the pod's class, or from the
// globalDefault class, which it also writes into priorityClassName. When a webhook
// changes a pod, the API server runs the in-tree mutating plugins again; Priority
// then resolves the new class name and rejects the pod if spec.priority differs
// ("the integer value of priority (0) must not be provided"). So the webhook sets
// priority and preemptionPolicy from the PriorityClass itself, and treats a class
// name that is the global default as "none given".
func (m *Mutator) applyPriority(ctx context.Context, p Profile, out *corev1.Pod, res *Result) {
	if cur := out.Spec.PriorityClassName; cur != "" {
		if cur == p.PriorityClassName {
			return
		}
		pc, err := m.cluster.PriorityClass(ctx, cur)
		switch {
		case errors.Is(err, ErrNotFound):
			return // Priority rejects the pod anyway
		case err != nil:
			res.Problems = append(res.Problems, ProblemLookup)
			res.Warnings = append(res.Warnings, fmt.Sprintf("understory: profile %q: priorityClassName not set: "+
				"reading PriorityClass %q: %v", p.Name, cur, err))
			return
		case !pc.GlobalDefault:
			return // the pod's own choice
		}
	}
	pc, err := m.cluster.PriorityClass(ctx, p.PriorityClassName)
	if err != nil {
		kind := ProblemLookup
		if errors.Is(err, ErrNotFound) {
			kind = ProblemPriorityMissing
		}
		res.Problems = append(res.Problems, kind)
		res.Warnings = append(res.Warnings, fmt.Sprintf("understory: profile %q: priorityClassName %q not set: %v",
			p.Name, p.PriorityClassName, err))
		return
	}
	out.Spec.PriorityClassName = pc.Name
	v := pc.Value
	out.Spec.Priority = &v
	policy := corev1.PreemptLowerPriority
	if pc.PreemptionPolicy != nil {
		policy = *pc.PreemptionPolicy
	}
	out.Spec.PreemptionPolicy = &policy
}

// ContainerResources is one container's cpu and memory before the webhook moved them.
type ContainerResources struct {
	Requests corev1.ResourceList `json:"requests,omitempty"`
	Limits   corev1.ResourceList `json:"limits,omitempty"`
}

// OriginalResources is the JSON in the understory.io/original-resources annotation:
// per container name, the cpu and memory requests and limits it had before.
type OriginalResources struct {
	Containers     map[string]ContainerResources `json:"containers,omitempty"`
	InitContainers map[string]ContainerResources `json:"initContainers,omitempty"`
}

// batchKinds maps each native resource to its batch resource and converter.
var batchKinds = [...]struct {
	native corev1.ResourceName
	batch  corev1.ResourceName
	format resource.Format
	value  func(resource.Quantity) int64
}{
	{corev1.ResourceCPU, contract.ResourceBatchCPU, resource.DecimalSI, func(q resource.Quantity) int64 { return q.MilliValue() }},
	{corev1.ResourceMemory, contract.ResourceBatchMemory, resource.BinarySI, func(q resource.Quantity) int64 { return q.Value() }},
}

// moveToBatch moves every container's cpu and memory to the batch resources and
// records the originals in the annotation. It returns an error wrapping ErrRejected
// for input it must not guess about, or errUnsupported for values it cannot convert;
// pod is then partly modified and must be discarded.
func moveToBatch(pod *corev1.Pod) error {
	if r := pod.Spec.Resources; r != nil && (hasCPUOrMemory(r.Requests) || hasCPUOrMemory(r.Limits)) {
		return fmt.Errorf("%w: spec.resources: pod-level cpu/memory cannot be moved to %s/%s (extended "+
			"resources are not allowed at pod level); set them per container", ErrRejected,
			contract.ResourceBatchCPU, contract.ResourceBatchMemory)
	}
	var orig OriginalResources
	if v, ok := pod.Annotations[contract.AnnotationOriginalResources]; ok {
		var err error
		if orig, err = DecodeOriginalResources(v); err != nil {
			return fmt.Errorf("%w: metadata.annotations[%s]: %w (it is written by the webhook; remove it)",
				ErrRejected, contract.AnnotationOriginalResources, err)
		}
	}
	moved := false
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		ok, err := moveContainer(c, fmt.Sprintf("spec.initContainers[%d]", i), &orig.InitContainers)
		if err != nil {
			return err
		}
		moved = moved || ok
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		ok, err := moveContainer(c, fmt.Sprintf("spec.containers[%d]", i), &orig.Containers)
		if err != nil {
			return err
		}
		moved = moved || ok
	}
	if !moved {
		return nil
	}
	v, err := orig.Encode()
	if err != nil {
		return fmt.Errorf("%w: encoding %s: %w", errUnsupported, contract.AnnotationOriginalResources, err)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[contract.AnnotationOriginalResources] = v
	return nil
}

func hasCPUOrMemory(l corev1.ResourceList) bool {
	_, cpu := l[corev1.ResourceCPU]
	_, mem := l[corev1.ResourceMemory]
	return cpu || mem
}

// moveContainer moves one container's cpu and memory. Mapping, per resource: the
// batch value is the limit if set, else the request (cpu in millicores rounded up,
// memory in bytes rounded up); the batch request and limit are both that value,
// because the API server requires request == limit for extended resources. A value
// of 0 sets no batch resource.
func moveContainer(c *corev1.Container, path string, orig *map[string]ContainerResources) (bool, error) {
	r := &c.Resources
	if !hasCPUOrMemory(r.Requests) && !hasCPUOrMemory(r.Limits) {
		return false, nil
	}
	var rec ContainerResources
	batch := map[corev1.ResourceName]int64{}
	for _, k := range batchKinds {
		req, hasReq := r.Requests[k.native]
		lim, hasLim := r.Limits[k.native]
		if !hasReq && !hasLim {
			continue
		}
		_, bReq := r.Requests[k.batch]
		_, bLim := r.Limits[k.batch]
		if bReq || bLim {
			return false, fmt.Errorf("%w: %s (%q).resources: sets both %s and %s; a batch pod sets one of them",
				ErrRejected, path, c.Name, k.native, k.batch)
		}
		src := req
		if hasLim {
			src = lim
		}
		switch {
		case hasReq && hasLim && req.Cmp(lim) > 0:
			return false, fmt.Errorf("%w: %s (%q): %s request %s exceeds its limit %s", errUnsupported, path,
				c.Name, k.native, req.String(), lim.String())
		case src.Sign() < 0:
			return false, fmt.Errorf("%w: %s (%q): negative %s %s", errUnsupported, path, c.Name, k.native, src.String())
		}
		v := k.value(src)
		if src.Cmp(*resource.NewQuantity(maxBatchValue, resource.DecimalSI)) > 0 || v > maxBatchValue || v < 0 {
			return false, fmt.Errorf("%w: %s (%q): %s %s is out of range for %s", errUnsupported, path, c.Name,
				k.native, src.String(), k.batch)
		}
		batch[k.batch] = v
		if hasReq {
			rec.Requests = setQuantity(rec.Requests, k.native, req)
		}
		if hasLim {
			rec.Limits = setQuantity(rec.Limits, k.native, lim)
		}
	}
	if *orig == nil {
		*orig = map[string]ContainerResources{}
	}
	if prev, ok := (*orig)[c.Name]; ok {
		// A reinvocation after another webhook gave this container cpu/memory again:
		// keep what was recorded for the kinds not moved now.
		for k, v := range prev.Requests {
			if _, now := rec.Requests[k]; !now {
				rec.Requests = setQuantity(rec.Requests, k, v)
			}
		}
		for k, v := range prev.Limits {
			if _, now := rec.Limits[k]; !now {
				rec.Limits = setQuantity(rec.Limits, k, v)
			}
		}
	}
	(*orig)[c.Name] = rec
	r.Requests, r.Limits = r.Requests.DeepCopy(), r.Limits.DeepCopy()
	for _, k := range batchKinds {
		delete(r.Requests, k.native)
		delete(r.Limits, k.native)
		v, ok := batch[k.batch]
		if !ok || v == 0 {
			continue
		}
		q := *resource.NewQuantity(v, k.format)
		r.Requests = setQuantity(r.Requests, k.batch, q)
		r.Limits = setQuantity(r.Limits, k.batch, q.DeepCopy())
	}
	if len(r.Requests) == 0 {
		r.Requests = nil
	}
	if len(r.Limits) == 0 {
		r.Limits = nil
	}
	return true, nil
}

func setQuantity(l corev1.ResourceList, k corev1.ResourceName, q resource.Quantity) corev1.ResourceList {
	if l == nil {
		l = corev1.ResourceList{}
	}
	l[k] = q
	return l
}

// diffPatch returns JSON Patch operations that turn pod into out, for the fields the
// mutator changes: container and init container requests and limits, labels,
// annotations, priorityClassName, priority, preemptionPolicy and schedulerName. Maps are patched
// whole only when absent, otherwise key by key, so keys the webhook does not own
// (and fields this k8s.io/api version does not know) are never rewritten.
func diffPatch(pod, out *corev1.Pod) []PatchOp {
	var ops []PatchOp
	ops = append(ops, mapPatch("/metadata/labels", pod.Labels, out.Labels)...)
	ops = append(ops, mapPatch("/metadata/annotations", pod.Annotations, out.Annotations)...)
	for i := range out.Spec.InitContainers {
		ops = append(ops, resourcesPatch("/spec/initContainers/"+strconv.Itoa(i), &pod.Spec.InitContainers[i],
			&out.Spec.InitContainers[i])...)
	}
	for i := range out.Spec.Containers {
		ops = append(ops, resourcesPatch("/spec/containers/"+strconv.Itoa(i), &pod.Spec.Containers[i],
			&out.Spec.Containers[i])...)
	}
	if out.Spec.PriorityClassName != pod.Spec.PriorityClassName {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/priorityClassName", Value: out.Spec.PriorityClassName})
	}
	if !reflect.DeepEqual(out.Spec.Priority, pod.Spec.Priority) && out.Spec.Priority != nil {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/priority", Value: *out.Spec.Priority})
	}
	if !reflect.DeepEqual(out.Spec.PreemptionPolicy, pod.Spec.PreemptionPolicy) && out.Spec.PreemptionPolicy != nil {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/preemptionPolicy", Value: *out.Spec.PreemptionPolicy})
	}
	if out.Spec.SchedulerName != pod.Spec.SchedulerName && out.Spec.SchedulerName != "" {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/schedulerName", Value: out.Spec.SchedulerName})
	}
	return ops
}

// mapPatch patches a string map at path. The mutator only adds or changes keys.
func mapPatch(path string, old, cur map[string]string) []PatchOp {
	if maps.Equal(old, cur) {
		return nil
	}
	if old == nil {
		return []PatchOp{{Op: "add", Path: path, Value: cur}}
	}
	var ops []PatchOp
	for _, k := range slices.Sorted(maps.Keys(cur)) {
		if v, ok := old[k]; !ok || v != cur[k] {
			ops = append(ops, PatchOp{Op: "add", Path: path + "/" + escapePointer(k), Value: cur[k]})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(old)) {
		if _, ok := cur[k]; !ok {
			ops = append(ops, PatchOp{Op: "remove", Path: path + "/" + escapePointer(k)})
		}
	}
	return ops
}

func resourcesPatch(path string, old, cur *corev1.Container) []PatchOp {
	var ops []PatchOp
	for _, f := range []struct {
		name     string
		old, cur corev1.ResourceList
	}{{"requests", old.Resources.Requests, cur.Resources.Requests}, {"limits", old.Resources.Limits, cur.Resources.Limits}} {
		if apiequality.Semantic.DeepEqual(f.old, f.cur) { // quantities by value; nil = empty
			continue
		}
		p := path + "/resources/" + f.name
		if len(f.cur) == 0 {
			if f.old != nil {
				ops = append(ops, PatchOp{Op: "remove", Path: p})
			}
			continue
		}
		ops = append(ops, PatchOp{Op: "add", Path: p, Value: f.cur})
	}
	return ops
}

// escapePointer escapes a JSON Pointer reference token (RFC 6901).
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
