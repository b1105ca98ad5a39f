package admission

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

// koordinatorProfiles are the profiles of components/from-koordinator: the base's
// batch profile and Koordinator's example ClusterColocationProfile translated
// (TestKoordinatorMigrationEndToEnd runs the component's own file).
func koordinatorProfiles(t *testing.T) Profiles {
	t.Helper()
	ps, err := ParseProfiles([]byte(`
profiles:
  - name: batch
    namespaceSelector: {matchLabels: {understory.io/colocation-profile: batch}}
    qosClass: batch
    priorityClassName: understory-batch
  - name: koordinator-colocation
    namespaceSelector: {matchLabels: {koordinator.sh/enable-colocation: "true"}}
    objectSelector: {matchLabels: {koordinator.sh/enable-colocation: "true"}}
    qosClass: batch
    priorityClassName: understory-batch
`))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// koordinatorPod is the pod of Koordinator's colocation example, as its profile left
// it: labelled for colocation, qosClass BE, priorityClassName koord-batch, scheduled
// by koord-scheduler, asking for Koordinator's batch resources.
func koordinatorPod() *corev1.Pod {
	p := pod(nil, nil, ctr("app", rl(contract.ResourceKoordinatorBatchCPU, "1000", contract.ResourceKoordinatorBatchMemory, "1Gi"),
		rl(contract.ResourceKoordinatorBatchCPU, "1000", contract.ResourceKoordinatorBatchMemory, "1Gi")))
	p.Namespace = "colo"
	p.Labels = map[string]string{"koordinator.sh/enable-colocation": "true", "koordinator.sh/qosClass": "BE"}
	p.Spec.SchedulerName = KoordinatorScheduler
	p.Spec.PriorityClassName = "koord-batch"
	return p
}

// A workload written for Koordinator, after Koordinator is gone and
// components/from-koordinator is applied: koord-scheduler is replaced (by the second
// scheduler in its mode), the batch resources renamed, and the colocation profile
// makes pods labelled for it batch in namespaces labelled for it, and nowhere else.
func TestMutateKoordinatorMigration(t *testing.T) {
	t.Parallel()
	profiles := koordinatorProfiles(t)
	cluster := fakeCluster{
		ns: map[string]map[string]string{
			"colo":  {"koordinator.sh/enable-colocation": "true"},
			"plain": {},
		},
		pcs: map[string]*schedulingv1.PriorityClass{
			"understory-batch": {ObjectMeta: metav1.ObjectMeta{Name: "understory-batch"}, Value: -100},
		},
	}
	lsPod := func() *corev1.Pod {
		p := pod(nil, nil, ctr("web", rl("cpu", "1"), rl("cpu", "1")))
		p.Namespace = "plain"
		p.Spec.SchedulerName = KoordinatorScheduler
		return p
	}
	inPlain := func(p *corev1.Pod) *corev1.Pod { p.Namespace = "plain"; return p }
	for _, tc := range []struct {
		name      string
		second    string // the second scheduler; "" = mode off
		replaced  []string
		pod       *corev1.Pod
		scheduler string
		class     qos.Class // "" = no class written
	}{
		{"Koordinator's example pod", "", []string{KoordinatorScheduler}, koordinatorPod(), DefaultSchedulerName, qos.ClassBatch},
		{"Koordinator's example pod, second scheduler", second, []string{KoordinatorScheduler}, koordinatorPod(), second, qos.ClassBatch},
		{"the same pod outside a colocation namespace", "", []string{KoordinatorScheduler}, inPlain(koordinatorPod()),
			DefaultSchedulerName, ""},
		{"an LS pod naming koord-scheduler, second scheduler", second, []string{KoordinatorScheduler}, lsPod(),
			DefaultSchedulerName, ""},
		{"without the migration, koord-scheduler stays", "", nil, lsPod(), KoordinatorScheduler, ""},
		{"another scheduler is not replaced", "", []string{KoordinatorScheduler}, func() *corev1.Pod {
			p := lsPod()
			p.Spec.SchedulerName = "volcano"
			return p
		}(), "volcano", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := NewMutator(profiles, cluster, WithSchedulerName(tc.second), WithReplacedSchedulers(tc.replaced...))
			if err != nil {
				t.Fatal(err)
			}
			res, err := m.Mutate(context.Background(), tc.pod.Namespace, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			got := applyPatch(t, tc.pod, res.Patch)
			if got.Spec.SchedulerName != tc.scheduler {
				t.Errorf("schedulerName %q, want %q", got.Spec.SchedulerName, tc.scheduler)
			}
			if c := got.Annotations[contract.AnnotationQOSClass]; c != string(tc.class) {
				t.Errorf("class %q, want %q", c, tc.class)
			}
			replacedOne := tc.pod.Spec.SchedulerName == KoordinatorScheduler && len(tc.replaced) > 0
			warned := false
			for _, w := range res.Warnings {
				warned = warned || strings.Contains(w, "koord-scheduler replaced")
			}
			if warned != replacedOne {
				t.Errorf("warnings %q; want one about koord-scheduler: %v", res.Warnings, replacedOne)
			}
			for _, c := range got.Spec.Containers {
				for r := range c.Resources.Requests {
					if r == contract.ResourceKoordinatorBatchCPU || r == contract.ResourceKoordinatorBatchMemory {
						t.Errorf("container %s still asks for %s", c.Name, r)
					}
				}
			}
			if tc.class == qos.ClassBatch && got.Spec.PriorityClassName != "koord-batch" {
				t.Errorf("priorityClassName %q; the pod's own koord-batch must stay", got.Spec.PriorityClassName)
			}
			again, err := m.Mutate(context.Background(), got.Namespace, got)
			if err != nil || len(again.Patch) != 0 {
				t.Fatalf("second pass: %+v, %v", again.Patch, err)
			}
		})
	}
}

func TestReplacedSchedulerValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		second   string
		replaced []string
		want     error
	}{
		{"koord-scheduler", "", []string{KoordinatorScheduler}, nil},
		{"several", second, []string{KoordinatorScheduler, "old"}, nil},
		{"the default scheduler", "", []string{DefaultSchedulerName}, ErrInvalidSchedulerName},
		{"the second scheduler itself", second, []string{second}, ErrInvalidSchedulerName},
		{"not a name", "", []string{"Koord_Scheduler"}, ErrInvalidSchedulerName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewMutator(Profiles{}, nil, WithSchedulerName(tc.second), WithReplacedSchedulers(tc.replaced...))
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewMutator: %v, want %v", err, tc.want)
			}
		})
	}
}
