package admission

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
)

const second = "understory-scheduler"

func TestMutateSchedulerName(t *testing.T) {
	t.Parallel()
	profiles, err := ParseProfiles([]byte(`
profiles:
  - name: batch
    objectSelector: {matchLabels: {tier: batch}}
  - name: web
    objectSelector: {matchLabels: {tier: web}}
    qosClass: LS
`))
	if err != nil {
		t.Fatal(err)
	}
	named := func(p *corev1.Pod, s string) *corev1.Pod { p.Spec.SchedulerName = s; return p }
	labelled := func(p *corev1.Pod, tier string) *corev1.Pod { p.Labels = map[string]string{"tier": tier}; return p }
	ls := map[string]string{contract.AnnotationQOSClass: "LS"}
	be := map[string]string{contract.AnnotationQOSClass: "BE"}
	tests := []struct {
		name      string
		scheduler string // the mutator's; "" = mode off
		pod       *corev1.Pod
		want      string // spec.schedulerName after the patch
	}{
		{"off: batch pod keeps the default", "", named(pod(batchAnn, nil, ctr("m", rl("cpu", "1"), nil)), DefaultSchedulerName),
			DefaultSchedulerName},
		{"off: GPU pod keeps the default", "", named(pod(nil, nil, ctr("m", nil, rl(contract.ResourceGPU, "1"))), DefaultSchedulerName),
			DefaultSchedulerName},
		{"annotated batch pod", second, named(pod(batchAnn, nil, ctr("m", rl("cpu", "1"), nil)), DefaultSchedulerName), second},
		{"batch pod without schedulerName (not defaulted)", second, pod(batchAnn, nil, ctr("m", rl("cpu", "1"), nil)), second},
		{"batch pod without resources", second, named(pod(batchAnn, nil, ctr("m", nil, nil)), DefaultSchedulerName), second},
		{"batch pod left on cpu (unsupported) still batch", second,
			named(pod(batchAnn, nil, ctr("m", rl("cpu", "2"), rl("cpu", "1"))), DefaultSchedulerName), second},
		{"profile makes it batch", second, named(labelled(pod(nil, nil, ctr("m", rl("cpu", "1"), nil)), "batch"),
			DefaultSchedulerName), second},
		{"profile makes it LS", second, named(labelled(pod(nil, nil, ctr("m", rl("cpu", "1"), nil)), "web"),
			DefaultSchedulerName), DefaultSchedulerName},
		{"no profile, no GPU", second, named(pod(nil, nil, ctr("m", rl("cpu", "1"), nil)), DefaultSchedulerName),
			DefaultSchedulerName},
		{"LS pod", second, named(pod(ls, nil, ctr("m", rl("cpu", "1"), rl("cpu", "1"))), DefaultSchedulerName),
			DefaultSchedulerName},
		{"BE pod", second, named(pod(be, nil, ctr("m", nil, nil)), DefaultSchedulerName), DefaultSchedulerName},
		{"whole GPU, no class", second, named(pod(nil, nil, ctr("m", nil, rl(contract.ResourceGPU, "1"))),
			DefaultSchedulerName), second},
		{"GPU share in requests", second, named(pod(nil, nil, ctr("m", rl(contract.ResourceGPUMilli, "500"), nil)),
			DefaultSchedulerName), second},
		{"GPU share in an init container", second, named(pod(nil,
			[]corev1.Container{ctr("i", nil, rl(contract.ResourceGPUMilli, "250"))}, ctr("m", nil, nil)),
			DefaultSchedulerName), second},
		{"LS pod asking for a GPU", second, named(pod(ls, nil, ctr("m", rl("cpu", "1"), rl("cpu", "1", contract.ResourceGPU, "1"))),
			DefaultSchedulerName), second},
		{"batch resources without the annotation", second, named(pod(nil, nil,
			ctr("m", rl(contract.ResourceBatchCPU, "500"), rl(contract.ResourceBatchCPU, "500"))), DefaultSchedulerName), second},
		{"Koordinator's batch names", second, named(pod(nil, nil,
			ctr("m", rl(contract.ResourceKoordinatorBatchCPU, "500"), rl(contract.ResourceKoordinatorBatchCPU, "500"))),
			DefaultSchedulerName), second},
		{"batch pod naming another scheduler", second, named(pod(batchAnn, nil, ctr("m", rl("cpu", "1"), nil)), "volcano"),
			"volcano"},
		{"GPU pod naming another scheduler", second, named(pod(nil, nil, ctr("m", nil, rl(contract.ResourceGPU, "1"))), "kai"),
			"kai"},
		{"already ours", second, named(pod(batchAnn, nil, ctr("m", nil, nil)), second), second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := NewMutator(profiles, nil, WithSchedulerName(tc.scheduler))
			if err != nil {
				t.Fatal(err)
			}
			if m.SchedulerName() != tc.scheduler {
				t.Fatalf("SchedulerName() = %q, want %q", m.SchedulerName(), tc.scheduler)
			}
			res, err := m.Mutate(context.Background(), "ns", tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			got := applyPatch(t, tc.pod, res.Patch)
			if got.Spec.SchedulerName != tc.want {
				t.Fatalf("schedulerName %q, want %q (patch %+v)", got.Spec.SchedulerName, tc.want, res.Patch)
			}
			changed := tc.want != tc.pod.Spec.SchedulerName
			if (res.SchedulerName != "") != changed || changed && res.SchedulerName != tc.want {
				t.Fatalf("Result.SchedulerName %q, pod went from %q to %q", res.SchedulerName, tc.pod.Spec.SchedulerName, tc.want)
			}
			for _, op := range res.Patch {
				if op.Path == "/spec/schedulerName" && !changed {
					t.Fatalf("schedulerName patched though unchanged: %+v", res.Patch)
				}
			}
			again, err := m.Mutate(context.Background(), "ns", got)
			if err != nil || len(again.Patch) != 0 {
				t.Fatalf("second pass: %+v, %v", again.Patch, err)
			}
		})
	}
}

func TestSchedulerNameValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"off", "", nil},
		{"ours", second, nil},
		{"dotted", "sched.example.com", nil},
		{"upper case", "Understory", ErrInvalidSchedulerName},
		{"underscore", "under_story", ErrInvalidSchedulerName},
		{"the default", DefaultSchedulerName, ErrInvalidSchedulerName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := ValidateSchedulerName(tc.in); !errors.Is(err, tc.want) {
				t.Fatalf("ValidateSchedulerName(%q) = %v, want %v", tc.in, err, tc.want)
			}
			_, err := NewMutator(Profiles{}, nil, WithSchedulerName(tc.in))
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewMutator(%q) = %v, want %v", tc.in, err, tc.want)
			}
		})
	}
}

// The resources that send a pod to the second scheduler are exactly the extender's
// managedResources in the component's configuration: kube-scheduler calls the
// extender only for those.
func TestExtenderResourcesMatchSchedulerConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../manifests/components/second-scheduler/kube-scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Extenders []struct {
			ManagedResources []struct {
				Name string `json:"name"`
			} `json:"managedResources"`
		} `json:"extenders"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Extenders) != 1 {
		t.Fatalf("%d extenders, want 1", len(cfg.Extenders))
	}
	var managed []string
	for _, r := range cfg.Extenders[0].ManagedResources {
		managed = append(managed, r.Name)
	}
	var ours []string
	for _, r := range extenderResources {
		ours = append(ours, string(r))
	}
	slices.Sort(managed)
	slices.Sort(ours)
	if !slices.Equal(managed, ours) {
		t.Fatalf("managedResources %v, the webhook hands over pods asking for %v", managed, ours)
	}
}

// TestValidatePodGPUShareScheduler is the Go form of the second-scheduler mode's
// policy understory-gpu-share-scheduler: a CREATE asking for gpu-milli must name the
// second scheduler; other pods, UPDATEs and the mode off are left alone.
func TestValidatePodGPUShareScheduler(t *testing.T) {
	t.Parallel()
	share := rl(contract.ResourceGPUMilli, "500")
	named := func(p *corev1.Pod, s string) *corev1.Pod { p.Spec.SchedulerName = s; return p }
	initShare := pod(nil, []corev1.Container{ctr("init", nil, share)}, ctr("main", nil, nil))
	tests := []struct {
		name      string
		scheduler string // Rules.GPUShareScheduler
		op        string
		pod       *corev1.Pod
		refused   bool
	}{
		{"share, default scheduler", second, "CREATE", named(pod(nil, nil, ctr("main", share, share)), DefaultSchedulerName), true},
		{"share, none named", second, "CREATE", pod(nil, nil, ctr("main", share, share)), true},
		{"share in a limit only", second, "CREATE", pod(nil, nil, ctr("main", nil, share)), true},
		{"share in an init container", second, "CREATE", initShare, true},
		{"share, another scheduler", second, "CREATE", named(pod(nil, nil, ctr("main", share, share)), "volcano"), true},
		{"share, the second scheduler", second, "CREATE", named(pod(nil, nil, ctr("main", share, share)), second), false},
		{"no share", second, "CREATE", pod(nil, nil, ctr("main", rl("cpu", "1"), nil)), false},
		{"whole gpu", second, "CREATE", pod(nil, nil, ctr("main", rl(contract.ResourceGPU, "1"), rl(contract.ResourceGPU, "1"))), false},
		{"mode off", "", "CREATE", pod(nil, nil, ctr("main", share, share)), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rules := DefaultRules()
			rules.GPUShareScheduler = tc.scheduler
			err := ValidatePod(PodRequest{Operation: admissionv1.Operation(tc.op), Pod: tc.pod, Username: "u"}, rules)
			if (err != nil) != tc.refused {
				t.Fatalf("err %v, want refused %v", err, tc.refused)
			}
			if err != nil && (!errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "spec.schedulerName: ") ||
				!strings.Contains(err.Error(), "(rule "+RuleGPUShareScheduler+")")) {
				t.Fatalf("err %v, want ErrRejected naming spec.schedulerName and rule %s", err, RuleGPUShareScheduler)
			}
		})
	}
}
