package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/understory/understory/contract"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/qos"
)

// fakeCluster serves namespaces and PriorityClasses from maps; err fails every call.
type fakeCluster struct {
	ns  map[string]map[string]string
	pcs map[string]*schedulingv1.PriorityClass
	err error
}

var _ Cluster = fakeCluster{}

func (f fakeCluster) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	if f.err != nil {
		return nil, f.err
	}
	l, ok := f.ns[name]
	if !ok {
		return nil, fmt.Errorf("namespace %q: %w", name, ErrNotFound)
	}
	return l, nil
}

func (f fakeCluster) PriorityClass(_ context.Context, name string) (*schedulingv1.PriorityClass, error) {
	if f.err != nil {
		return nil, f.err
	}
	pc, ok := f.pcs[name]
	if !ok {
		return nil, fmt.Errorf("PriorityClass %q: %w", name, ErrNotFound)
	}
	return pc, nil
}

func rl(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func ctr(name string, req, lim corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Image: "img", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}
}

func pod(ann map[string]string, init []corev1.Container, ctrs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: ann, Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{InitContainers: init, Containers: ctrs},
	}
}

var batchAnn = map[string]string{contract.AnnotationQOSClass: "Batch"}

const (
	bcpu = contract.ResourceBatchCPU
	bmem = contract.ResourceBatchMemory
)

// applyPatch applies res's patch to p with a JSON Patch library and decodes the result.
func applyPatch(t *testing.T, p *corev1.Pod, ops []PatchOp) *corev1.Pod {
	t.Helper()
	if len(ops) == 0 {
		return p.DeepCopy()
	}
	doc, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatalf("patch is not valid JSON Patch: %v\n%s", err, raw)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("applying patch: %v\n%s", err, raw)
	}
	var got corev1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func originals(t *testing.T, p *corev1.Pod) OriginalResources {
	t.Helper()
	v, ok := p.Annotations[contract.AnnotationOriginalResources]
	if !ok {
		t.Fatalf("no %s annotation", contract.AnnotationOriginalResources)
	}
	o, err := DecodeOriginalResources(v)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func quantityEq(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }

func TestMutateResources(t *testing.T) {
	t.Parallel()
	sidecar := ctr("sidecar", rl("cpu", "100m", "memory", "64Mi"), nil)
	always := corev1.ContainerRestartPolicyAlways
	sidecar.RestartPolicy = &always
	tests := []struct {
		name     string
		pod      *corev1.Pod
		wantCtrs []corev1.ResourceRequirements // containers after mutation
		wantInit []corev1.ResourceRequirements
		wantOrig bool
	}{
		{
			name: "requests only: request becomes request and limit",
			pod:  pod(batchAnn, nil, ctr("main", rl("cpu", "500m", "memory", "1Gi"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{
				Requests: rl(bcpu, "500", bmem, "1Gi"), Limits: rl(bcpu, "500", bmem, "1Gi")}},
			wantOrig: true,
		},
		{
			name: "limits only",
			pod:  pod(batchAnn, nil, ctr("main", nil, rl("cpu", "2", "memory", "512Mi"))),
			wantCtrs: []corev1.ResourceRequirements{{
				Requests: rl(bcpu, "2000", bmem, "512Mi"), Limits: rl(bcpu, "2000", bmem, "512Mi")}},
			wantOrig: true,
		},
		{
			name: "request and limit: the limit wins",
			pod:  pod(batchAnn, nil, ctr("main", rl("cpu", "250m", "memory", "100M"), rl("cpu", "1500m", "memory", "200M"))),
			wantCtrs: []corev1.ResourceRequirements{{
				Requests: rl(bcpu, "1500", bmem, "200M"), Limits: rl(bcpu, "1500", bmem, "200M")}},
			wantOrig: true,
		},
		{
			name: "sub-millicore rounds up, other resources kept",
			pod:  pod(batchAnn, nil, ctr("main", rl("cpu", "0.0005", "ephemeral-storage", "1Gi"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{
				Requests: rl(bcpu, "1", "ephemeral-storage", "1Gi"), Limits: rl(bcpu, "1")}},
			wantOrig: true,
		},
		{
			name: "init containers and sidecars too",
			pod: pod(batchAnn, []corev1.Container{ctr("init", rl("cpu", "1"), nil), sidecar},
				ctr("a", rl("memory", "1Gi"), nil), ctr("b", nil, nil)),
			wantInit: []corev1.ResourceRequirements{
				{Requests: rl(bcpu, "1000"), Limits: rl(bcpu, "1000")},
				{Requests: rl(bcpu, "100", bmem, "64Mi"), Limits: rl(bcpu, "100", bmem, "64Mi")},
			},
			wantCtrs: []corev1.ResourceRequirements{{Requests: rl(bmem, "1Gi"), Limits: rl(bmem, "1Gi")}, {}},
			wantOrig: true,
		},
		{
			name:     "no cpu or memory: unchanged",
			pod:      pod(batchAnn, nil, ctr("main", rl("ephemeral-storage", "1Gi"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{Requests: rl("ephemeral-storage", "1Gi")}},
		},
		{
			name:     "zero cpu: moved, no batch resource",
			pod:      pod(batchAnn, nil, ctr("main", rl("cpu", "0"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{}},
			wantOrig: true,
		},
		{
			name:     "LS pod: unchanged",
			pod:      pod(map[string]string{contract.AnnotationQOSClass: "LS"}, nil, ctr("main", rl("cpu", "1"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{Requests: rl("cpu", "1")}},
		},
		{
			name:     "no annotation, no profile: unchanged",
			pod:      pod(nil, nil, ctr("main", rl("cpu", "1"), nil)),
			wantCtrs: []corev1.ResourceRequirements{{Requests: rl("cpu", "1")}},
		},
	}
	m, err := NewMutator(Profiles{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := tc.pod.DeepCopy()
			res, err := m.Mutate(context.Background(), "ns", tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Fatalf("Mutate modified its input: %s", diff)
			}
			got := applyPatch(t, tc.pod, res.Patch)
			check := func(kind string, cs []corev1.Container, want []corev1.ResourceRequirements) {
				if len(cs) != len(want) {
					t.Fatalf("%s: %d, want %d", kind, len(cs), len(want))
				}
				for i, c := range cs {
					if !cmp.Equal(c.Resources.Requests, want[i].Requests, cmp.Comparer(quantityEq)) ||
						!cmp.Equal(c.Resources.Limits, want[i].Limits, cmp.Comparer(quantityEq)) {
						t.Errorf("%s[%d] resources = %v, want %v", kind, i, c.Resources, want[i])
					}
				}
			}
			check("containers", got.Spec.Containers, tc.wantCtrs)
			check("initContainers", got.Spec.InitContainers, tc.wantInit)
			if _, ok := got.Annotations[contract.AnnotationOriginalResources]; ok != tc.wantOrig {
				t.Fatalf("original-resources annotation present = %v, want %v", ok, tc.wantOrig)
			}
			if tc.wantOrig {
				// The annotation holds exactly the moved cpu/memory, per container.
				o := originals(t, got)
				for i, c := range before.Spec.Containers {
					if !hasCPUOrMemory(c.Resources.Requests) && !hasCPUOrMemory(c.Resources.Limits) {
						continue
					}
					rec := o.Containers[c.Name]
					for _, k := range []corev1.ResourceName{"cpu", "memory"} {
						if q, ok := c.Resources.Requests[k]; ok && !quantityEq(q, rec.Requests[k]) {
							t.Errorf("containers[%d] original request %s = %v, want %v", i, k, rec.Requests[k], q)
						}
					}
				}
				// Kubelet sees a BestEffort pod.
				if q := qos.ComputeKubeQOSClass(got); q != corev1.PodQOSBestEffort {
					t.Errorf("mutated pod QoS %s, want BestEffort", q)
				}
			}
			// Idempotent: mutating the result changes nothing.
			again, err := m.Mutate(context.Background(), "ns", got)
			if err != nil || len(again.Patch) != 0 {
				t.Fatalf("second Mutate = %+v, %v; want no patch", again.Patch, err)
			}
		})
	}
}

func TestMutateRejects(t *testing.T) {
	t.Parallel()
	podLevel := pod(batchAnn, nil, ctr("main", nil, nil))
	podLevel.Spec.Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "1")}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"pod-level resources", podLevel, "spec.resources"},
		{"both cpu and batch-cpu", pod(batchAnn, nil, ctr("main", rl("cpu", "1", bcpu, "5"), rl(bcpu, "5"))),
			`spec.containers[0] ("main").resources: sets both cpu and understory.io/batch-cpu`},
		{"malformed original annotation",
			pod(map[string]string{contract.AnnotationQOSClass: "batch", contract.AnnotationOriginalResources: "{"}, nil,
				ctr("main", rl("cpu", "1"), nil)),
			"metadata.annotations[understory.io/original-resources]"},
	}
	m, _ := NewMutator(Profiles{}, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := m.Mutate(context.Background(), "ns", tc.pod)
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrRejected naming %q", err, tc.want)
			}
		})
	}
}

func TestMutateFailsOpenOnUnsupported(t *testing.T) {
	t.Parallel()
	m, _ := NewMutator(Profiles{}, nil)
	for name, p := range map[string]*corev1.Pod{
		"request above limit": pod(batchAnn, nil, ctr("main", rl("cpu", "2"), rl("cpu", "1"))),
		"negative":            pod(batchAnn, nil, ctr("main", rl("memory", "-1"), nil)),
		"huge":                pod(batchAnn, nil, ctr("main", rl("cpu", "1e15"), nil)),
		"one bad container":   pod(batchAnn, nil, ctr("ok", rl("cpu", "1"), nil), ctr("bad", rl("cpu", "2"), rl("cpu", "1"))),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, err := m.Mutate(context.Background(), "ns", p)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Patch) != 0 || len(res.Problems) != 1 || res.Problems[0] != ProblemUnsupported || len(res.Warnings) != 1 {
				t.Fatalf("got %+v; want no patch, one unsupported problem and a warning", res)
			}
		})
	}
	// An invalid class is left to the ValidatingAdmissionPolicy.
	res, err := m.Mutate(context.Background(), "ns", pod(map[string]string{contract.AnnotationQOSClass: "batch "}, nil,
		ctr("main", rl("cpu", "1"), nil)))
	if err != nil || len(res.Patch) != 0 || len(res.Problems) != 1 || res.Problems[0] != ProblemInvalidClass {
		t.Fatalf("invalid class: %+v, %v", res, err)
	}
}

// A later webhook (a sidecar injector) adds a container after the first pass; the
// reinvocation moves it and keeps the first pass's record.
func TestMutateReinvocationAfterSidecarInjection(t *testing.T) {
	t.Parallel()
	m, _ := NewMutator(Profiles{}, nil)
	p := pod(batchAnn, nil, ctr("main", rl("cpu", "1"), nil))
	res, _ := m.Mutate(context.Background(), "ns", p)
	first := applyPatch(t, p, res.Patch)
	first.Spec.Containers = append(first.Spec.Containers, ctr("proxy", rl("cpu", "100m", "memory", "128Mi"), nil))
	res, err := m.Mutate(context.Background(), "ns", first)
	if err != nil {
		t.Fatal(err)
	}
	got := applyPatch(t, first, res.Patch)
	if q := qos.ComputeKubeQOSClass(got); q != corev1.PodQOSBestEffort {
		t.Fatalf("QoS %s after reinvocation, want BestEffort", q)
	}
	o := originals(t, got)
	if len(o.Containers) != 2 || !quantityEq(o.Containers["main"].Requests["cpu"], resource.MustParse("1")) ||
		!quantityEq(o.Containers["proxy"].Requests["memory"], resource.MustParse("128Mi")) {
		t.Fatalf("originals %+v, want main and proxy", o)
	}
}

func TestMutateProfiles(t *testing.T) {
	t.Parallel()
	never := corev1.PreemptNever
	cluster := fakeCluster{
		ns: map[string]map[string]string{
			"batch-ns": {LabelProfile: "batch"},
			"plain":    {},
		},
		pcs: map[string]*schedulingv1.PriorityClass{
			"understory-batch": {ObjectMeta: metav1.ObjectMeta{Name: "understory-batch"}, Value: -100, PreemptionPolicy: &never},
			"default":          {ObjectMeta: metav1.ObjectMeta{Name: "default"}, Value: 1000, GlobalDefault: true},
			"high":             {ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 5000},
		},
	}
	profiles, err := ParseProfiles([]byte(`
profiles:
  - name: gpu-ls
    objectSelector: {matchLabels: {tier: web}}
    namespaceSelector: {matchLabels: {understory.io/colocation-profile: batch}}
    qosClass: LS
  - name: batch
    namespaceSelector: {matchLabels: {understory.io/colocation-profile: batch}}
    priorityClassName: understory-batch
    labels: {team: batch, app: overridden}
    annotations: {example.com/note: "added"}
  - name: missing-class
    namespaceSelector: {matchLabels: {understory.io/colocation-profile: broken}}
    priorityClassName: nope
`))
	if err != nil {
		t.Fatal(err)
	}
	cluster.ns["broken-ns"] = map[string]string{LabelProfile: "broken"}
	m, err := NewMutator(profiles, cluster)
	if err != nil {
		t.Fatal(err)
	}
	withPrio := func(p *corev1.Pod, class string, prio int32) *corev1.Pod {
		p.Spec.PriorityClassName, p.Spec.Priority = class, &prio
		return p
	}
	tests := []struct {
		name         string
		ns           string
		pod          *corev1.Pod
		wantClass    string // annotation after; "" none
		wantPC       string
		wantPrio     int32
		wantMoved    bool
		wantProblems []string
	}{
		{"batch profile sets class, priority, labels", "batch-ns",
			withPrio(pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), "", 0), "batch", "understory-batch", -100, true, nil},
		{"global default class counts as none", "batch-ns",
			withPrio(pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), "default", 1000), "batch", "understory-batch", -100, true, nil},
		{"the pod's own class is kept", "batch-ns",
			withPrio(pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), "high", 5000), "batch", "high", 5000, true, nil},
		{"no cpu/memory: annotated only", "batch-ns",
			withPrio(pod(nil, nil, ctr("main", nil, nil)), "", 0), "batch", "understory-batch", -100, false, nil},
		{"first matching profile wins (LS, nothing moved)", "batch-ns",
			func() *corev1.Pod {
				p := pod(nil, nil, ctr("main", rl("cpu", "1"), nil))
				p.Labels["tier"] = "web"
				return p
			}(),
			"LS", "", 0, false, nil},
		{"explicit annotation wins over profiles", "batch-ns",
			pod(map[string]string{contract.AnnotationQOSClass: "BE"}, nil, ctr("main", rl("cpu", "1"), nil)), "BE", "", 0, false, nil},
		{"namespace without profile label", "plain", pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), "", "", 0, false, nil},
		{"missing PriorityClass: still batch, counted", "broken-ns",
			withPrio(pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), "", 0), "batch", "", 0, true,
			[]string{ProblemPriorityMissing}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := m.Mutate(context.Background(), tc.ns, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if !cmp.Equal(res.Problems, tc.wantProblems, cmp.Comparer(func(a, b []string) bool {
				return strings.Join(a, ",") == strings.Join(b, ",")
			})) {
				t.Errorf("problems %v, want %v", res.Problems, tc.wantProblems)
			}
			got := applyPatch(t, tc.pod, res.Patch)
			if c := got.Annotations[contract.AnnotationQOSClass]; c != tc.wantClass {
				t.Errorf("class annotation %q, want %q", c, tc.wantClass)
			}
			if got.Spec.PriorityClassName != tc.wantPC && tc.wantPC != "" {
				t.Errorf("priorityClassName %q, want %q", got.Spec.PriorityClassName, tc.wantPC)
			}
			if tc.wantPC != "" && (got.Spec.Priority == nil || *got.Spec.Priority != tc.wantPrio) {
				t.Errorf("priority %v, want %d", got.Spec.Priority, tc.wantPrio)
			}
			if tc.wantPC == "understory-batch" && (got.Spec.PreemptionPolicy == nil || *got.Spec.PreemptionPolicy != never) {
				t.Errorf("preemptionPolicy %v, want Never", got.Spec.PreemptionPolicy)
			}
			_, moved := got.Annotations[contract.AnnotationOriginalResources]
			if moved != tc.wantMoved {
				t.Errorf("moved %v, want %v", moved, tc.wantMoved)
			}
			if res.Profile == "batch" {
				if got.Labels["team"] != "batch" || got.Labels["app"] != "x" || got.Annotations["example.com/note"] != "added" {
					t.Errorf("labels %v annotations %v: want team=batch added, app kept", got.Labels, got.Annotations)
				}
			}
			again, err := m.Mutate(context.Background(), tc.ns, got)
			if err != nil || len(again.Patch) != 0 {
				t.Fatalf("not idempotent: %+v, %v", again.Patch, err)
			}
		})
	}
}

func TestMutateLookupFailureFailsOpen(t *testing.T) {
	t.Parallel()
	ps, err := ParseProfiles([]byte(`{"profiles":[{"name":"b","namespaceSelector":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMutator(ps, fakeCluster{err: errors.New("apiserver down")})
	res, err := m.Mutate(context.Background(), "ns", pod(nil, nil, ctr("main", rl("cpu", "1"), nil)))
	if err != nil || len(res.Patch) != 0 || len(res.Problems) != 1 || res.Problems[0] != ProblemLookup {
		t.Fatalf("got %+v, %v; want unmutated with a lookup problem", res, err)
	}
	if _, err := NewMutator(ps, nil); err == nil {
		t.Fatal("NewMutator without a cluster accepted a namespaceSelector profile")
	}
}

func TestPatchEscapesKeys(t *testing.T) {
	t.Parallel()
	ops := mapPatch("/metadata/annotations", map[string]string{"a": "1"}, map[string]string{"a": "1", "x.io/k~y": "v"})
	if len(ops) != 1 || ops[0].Path != "/metadata/annotations/x.io~1k~0y" {
		t.Fatalf("ops %+v", ops)
	}
}
