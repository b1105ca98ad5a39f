package e2e_test

import (
	"os"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
)

// fromKoordinator is the component a Koordinator user applies, relative to this package.
const fromKoordinator = "../../manifests/components/from-koordinator"

// koordinatorComponent returns the component's PriorityClasses and the webhook
// profiles it sets.
func koordinatorComponent(t *testing.T) ([]schedulingv1.PriorityClass, admission.Profiles) {
	t.Helper()
	data, err := os.ReadFile(fromKoordinator + "/priorityclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pcs []schedulingv1.PriorityClass
	for _, d := range strings.Split(string(data), "\n---\n") {
		var pc schedulingv1.PriorityClass
		if err := yaml.UnmarshalStrict([]byte(d), &pc); err != nil {
			t.Fatal(err)
		}
		pcs = append(pcs, pc)
	}
	data, err = os.ReadFile(fromKoordinator + "/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Patches []struct {
			Patch string `json:"patch"`
		} `json:"patches"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	for _, p := range k.Patches {
		var ops []struct {
			Path  string `json:"path"`
			Value any    `json:"value"`
		}
		if err := yaml.Unmarshal([]byte(p.Patch), &ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if op.Path == "/data/profiles.yaml" {
				ps, err := admission.ParseProfiles([]byte(op.Value.(string)))
				if err != nil {
					t.Fatal(err)
				}
				return pcs, ps
			}
		}
	}
	t.Fatal("components/from-koordinator sets no profiles.yaml")
	return nil, admission.Profiles{}
}

// A workload written for Koordinator, on a real API server after Koordinator is gone:
// without its PriorityClasses the API server refuses the pod of Koordinator's
// colocation example; with components/from-koordinator (its PriorityClasses, the
// shipped webhook configuration, the webhook replacing koord-scheduler and the
// component's profile) the pod is admitted as Understory batch for the default
// scheduler, keeping koord-batch's priority, and an LS pod naming koord-scheduler
// elsewhere only changes scheduler.
func TestKoordinatorMigrationEndToEnd(t *testing.T) {
	ctx, cp := startControlPlane(t, 3*time.Minute)
	c := cp.Client()
	pcs, profiles := koordinatorComponent(t)
	_, batchPC := shippedProfiles(t)

	createNamespaces(t, ctx, cp, map[string]map[string]string{"colo": {"koordinator.sh/enable-colocation": "true"}, "web": nil})
	// Koordinator's example pod, as its profile wrote it.
	koordPod := func(name string) *corev1.Pod {
		p := controlplane.NewPod("colo", name, corev1.ResourceList{
			contract.ResourceKoordinatorBatchCPU: resource.MustParse("1000"), contract.ResourceKoordinatorBatchMemory: resource.MustParse("1Gi")})
		p.Spec.Containers[0].Resources.Limits = p.Spec.Containers[0].Resources.Requests.DeepCopy()
		p.Labels = map[string]string{"koordinator.sh/enable-colocation": "true", "koordinator.sh/qosClass": "BE"}
		p.Spec.PriorityClassName = "koord-batch"
		p.Spec.SchedulerName = admission.KoordinatorScheduler
		return p
	}

	// Koordinator gone, nothing installed: the pod cannot even be created.
	if _, err := c.CoreV1().Pods("colo").Create(ctx, koordPod("before"), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "koord-batch") {
		t.Fatalf("without Koordinator's PriorityClasses: %v; want the API server to refuse koord-batch", err)
	}

	for _, pc := range append(pcs, batchPC) {
		if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, &pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var mwc admissionregv1.MutatingWebhookConfiguration
	manifestObject(t, "mutatingwebhook.yaml", "MutatingWebhookConfiguration", &mwc)
	registerWebhookConfig(t, ctx, cp, profiles, &mwc, admission.WithReplacedSchedulers(admission.KoordinatorScheduler))
	waitAdmissionActive(t, ctx, c, "web", false)

	got, err := c.CoreV1().Pods("colo").Create(ctx, koordPod("after"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Koordinator's example pod with the component: %v", err)
	}
	if got.Spec.SchedulerName != admission.DefaultSchedulerName {
		t.Errorf("schedulerName %q, want %s", got.Spec.SchedulerName, admission.DefaultSchedulerName)
	}
	if got.Annotations[contract.AnnotationQOSClass] != "batch" {
		t.Errorf("class %q, want batch (the colocation profile)", got.Annotations[contract.AnnotationQOSClass])
	}
	if got.Spec.Priority == nil || *got.Spec.Priority != 5000 || got.Spec.PriorityClassName != "koord-batch" {
		t.Errorf("priority %v (%s), want koord-batch's 5000", got.Spec.Priority, got.Spec.PriorityClassName)
	}
	req := got.Spec.Containers[0].Resources.Requests
	if !qEq(req[contract.ResourceBatchCPU], "1000") || !qEq(req[contract.ResourceBatchMemory], "1Gi") {
		t.Errorf("requests %v, want Understory's batch resources with Koordinator's values", req)
	}

	ls := controlplane.NewPod("web", "ls", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})
	ls.Spec.SchedulerName = admission.KoordinatorScheduler
	ls.Spec.PriorityClassName = "koord-prod"
	got, err = c.CoreV1().Pods("web").Create(ctx, ls, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.SchedulerName != admission.DefaultSchedulerName || got.Annotations[contract.AnnotationQOSClass] != "" ||
		!qEq(got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU], "100m") {
		t.Errorf("LS pod naming koord-scheduler: scheduler %q, class %q, requests %v; want only the scheduler changed",
			got.Spec.SchedulerName, got.Annotations[contract.AnnotationQOSClass], got.Spec.Containers[0].Resources.Requests)
	}
}
