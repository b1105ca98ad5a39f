package clusterbench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
)

// repoRoot is the module root, two levels above this package.
const repoRoot = "../.."

func TestReadAdmissionManifests(t *testing.T) {
	t.Parallel()
	m, err := readAdmissionManifests(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	mwc := m.pointedAt("https://127.0.0.1:1234", []byte("CA"))
	if len(mwc.Webhooks) == 0 {
		t.Fatal("no webhook")
	}
	for _, w := range mwc.Webhooks {
		if w.ClientConfig.Service != nil || w.ClientConfig.URL == nil ||
			!strings.HasPrefix(*w.ClientConfig.URL, "https://127.0.0.1:1234/") || string(w.ClientConfig.CABundle) != "CA" {
			t.Errorf("webhook %s client config %+v, want the loopback URL and the CA", w.Name, w.ClientConfig)
		}
	}
	if m.webhooks.Webhooks[0].ClientConfig.Service == nil {
		t.Error("pointedAt changed the manifest it was read from")
	}
	if m.priorityClass.Name == "" {
		t.Error("no PriorityClass name")
	}

	// Fakes: a missing kind, a missing file, bad profiles.
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, admissionManifestDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, admissionManifestDir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := readAdmissionManifests(dir); err == nil {
		t.Error("no files: want an error")
	}
	write("configmap.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {profiles.yaml: 'profiles: []'}\n")
	if _, err := readAdmissionManifests(dir); !errors.Is(err, errBadManifest) {
		t.Errorf("no PriorityClass: %v, want errBadManifest", err)
	}
	for _, tc := range []struct{ name, profiles string }{
		{"empty", "profiles: []"},
		{"bad", "profiles: [{name: BAD NAME}]"},
	} {
		write("configmap.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  profiles.yaml: '"+tc.profiles+
			"'\n---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: p}\nvalue: 1\n")
		write("mutatingwebhook.yaml", "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {name: x}\n")
		if _, err := readAdmissionManifests(dir); err == nil {
			t.Errorf("%s profiles: want an error", tc.name)
		}
	}
}

// fakeCluster is the webhook's view of the benchmark's cluster: the batch
// namespace with its profile label and the shipped PriorityClass.
type fakeCluster struct{ pc schedulingv1.PriorityClass }

var _ admission.Cluster = (*fakeCluster)(nil)

func (f *fakeCluster) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	if name == nsBatch {
		return map[string]string{admission.LabelProfile: "batch"}, nil
	}
	return map[string]string{}, nil
}

func (f *fakeCluster) PriorityClass(_ context.Context, name string) (*schedulingv1.PriorityClass, error) {
	if name == f.pc.Name {
		return f.pc.DeepCopy(), nil
	}
	return nil, nil
}

// TestPodForms checks that the webhook's own code (admission.Mutator with the
// shipped profiles) turns the pod a user writes (userBatchPod) into the pod the
// benchmark writes when the webhook is off (batchPod), resources, class,
// label and PriorityClass included, for every kind of job.
func TestPodForms(t *testing.T) {
	t.Parallel()
	m, err := readAdmissionManifests(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	profiles, err := admission.ParseProfiles(m.profiles)
	if err != nil {
		t.Fatal(err)
	}
	mut, err := admission.NewMutator(profiles, &fakeCluster{pc: m.priorityClass})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		job  Job
		res  corev1.ResourceName
	}{
		{"cpu", Job{Name: "cpu-1", Duration: time.Minute, Members: 1, CPUMilli: 12500, MemBytes: 3 << 30}, ""},
		{"gang", Job{Name: "gang-2", Duration: time.Minute, Members: 4, CPUMilli: 500, MemBytes: 1 << 20}, ""},
		{"whole GPUs", Job{Name: "gpu-3", Duration: time.Minute, Members: 1, CPUMilli: 8000, MemBytes: 1 << 30, NumGPU: 2, GPUMilli: 1000}, contract.ResourceGPU},
		{"GPU share", Job{Name: "gpu-4", Duration: time.Minute, Members: 1, CPUMilli: 4000, MemBytes: 1 << 30, NumGPU: 1, GPUMilli: 300}, contract.ResourceGPUMilli},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			user := userBatchPod(tc.job, 1)
			if converted(user) {
				t.Fatalf("the user's pod %v counts as converted", user.Spec.Containers[0].Resources)
			}
			res, err := mut.Mutate(context.Background(), nsBatch, user.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Problems) != 0 || res.Profile == "" {
				t.Fatalf("profile %q, problems %v: want the shipped profile, none", res.Profile, res.Problems)
			}
			got := applyPatch(t, user, res.Patch)
			want := batchPod(tc.job, 1, m.priorityClass.Name)
			if !converted(got) || !converted(want) {
				t.Errorf("converted: webhook's %v, benchmark's %v; want both", converted(got), converted(want))
			}
			if g, w := got.Spec.Containers[0].Resources, want.Spec.Containers[0].Resources; !apiequality.Semantic.DeepEqual(g, w) {
				t.Errorf("resources: webhook %v, benchmark %v", g, w)
			}
			if tc.res != "" {
				if _, ok := got.Spec.Containers[0].Resources.Limits[tc.res]; !ok {
					t.Errorf("%s missing from %v", tc.res, got.Spec.Containers[0].Resources.Limits)
				}
			}
			if got.Spec.PriorityClassName != want.Spec.PriorityClassName || got.Annotations[contract.AnnotationQOSClass] != "batch" ||
				got.Labels[admission.LabelProfile] != want.Labels[admission.LabelProfile] || got.Name != want.Name {
				t.Errorf("webhook's pod %s class %q, annotations %v, labels %v; benchmark's %s class %q, labels %v", got.Name,
					got.Spec.PriorityClassName, got.Annotations, got.Labels, want.Name, want.Spec.PriorityClassName, want.Labels)
			}
			for k, v := range want.Annotations {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, got.Annotations[k], v)
				}
			}
		})
	}
}

func applyPatch(t *testing.T, p *corev1.Pod, ops []admission.PatchOp) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func TestAdmissionCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    SizeResult
		on   bool
		want string
	}{
		{"through the webhook", SizeResult{Admission: true, AdmissionCalls: 10}, true, ""},
		{"off", SizeResult{}, false, ""},
		{"not called", SizeResult{Admission: true}, true, "not called"},
		{"did not run", SizeResult{}, true, "ran: false"},
		{"unconverted", SizeResult{Admission: true, AdmissionCalls: 3, BatchUnconverted: 2}, true, "2 batch pods were not converted"},
		{"unconverted off", SizeResult{BatchUnconverted: 1}, false, "1 batch pods"},
		{"fail open", SizeResult{Admission: true, AdmissionCalls: 3, AdmissionFailOpen: 1}, true, "failed open"},
	} {
		got := admissionCheck(tc.r, tc.on)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestHistogramQuantileBy(t *testing.T) {
	t.Parallel()
	h := func(mutate, validate int) string {
		return "# TYPE y histogram\n" +
			`y_bucket{endpoint="mutate",le="0.001"} ` + itoa(mutate) + "\n" +
			`y_bucket{endpoint="mutate",le="+Inf"} ` + itoa(mutate) + "\n" +
			`y_sum{endpoint="mutate"} 0` + "\n" + `y_count{endpoint="mutate"} ` + itoa(mutate) + "\n" +
			`y_bucket{endpoint="validate",le="0.001"} 0` + "\n" +
			`y_bucket{endpoint="validate",le="+Inf"} ` + itoa(validate) + "\n" +
			`y_sum{endpoint="validate"} 0` + "\n" + `y_count{endpoint="validate"} ` + itoa(validate) + "\n"
	}
	before, after := parseMetrics(t, h(0, 0)), parseMetrics(t, h(40, 7))
	if q, n := histogramQuantileBy(before, after, "y", "endpoint", "mutate", 0.99); n != 40 || q > 0.001 {
		t.Errorf("mutate p99 %v over %d, want <= 1 ms over 40", q, n)
	}
	if _, n := histogramQuantileBy(before, after, "y", "endpoint", "validate", 0.5); n != 7 {
		t.Errorf("validate count %d, want 7", n)
	}
}

// TestTrackerCountsUnconverted checks that the tracker counts a pod created
// without batch resources once, whatever events follow, and a converted one never.
func TestTrackerCountsUnconverted(t *testing.T) {
	t.Parallel()
	nodes := []benchNode{{name: nodeName(0)}}
	tk := newTracker(nil, nodes, make([]usage, len(nodes)))
	job := Job{Name: "cpu-1", Duration: time.Minute, Members: 1, CPUMilli: 1000, MemBytes: 1 << 30}
	user := userBatchPod(job, 0)
	good := batchPod(Job{Name: "cpu-2", Duration: time.Minute, Members: 1, CPUMilli: 1000, MemBytes: 1 << 30}, 0, "p")
	tk.submitted(user.Namespace, user.Name, time.Now())
	tk.observe(user)
	bound := user.DeepCopy()
	bound.Spec.NodeName = nodes[0].name
	tk.observe(bound)
	tk.observe(good)
	if got := tk.stats(time.Now().Add(-time.Minute), time.Now()).Unconverted; got != 1 {
		t.Errorf("unconverted %d, want 1", got)
	}
}
