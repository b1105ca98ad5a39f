package extender

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/understory/understory/metrics"
)

// richPod is a pod as the API server returns it: managedFields, a big
// last-applied annotation, env, volumes, probes, status, and everything the
// index reads (gang, devices, model, init containers, sidecar, overhead,
// affinity, tolerations).
func richPod(name, node string) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p := testPod("ns", name, gpus(2), onNode(node), created(3),
		annotate(AnnotationGPUDevices, "0,1"), annotate(AnnotationGPUModel, "A100"),
		annotate(AnnotationKoordinatorName, "k"), annotate(AnnotationKoordinatorMinAvailable, "2"),
		annotate(AnnotationGangState, "planned:7:n:0,1:1700000000"),
		annotate("kubectl.kubernetes.io/last-applied-configuration", strings.Repeat("x", 4000)),
		label("app", "train"), label(LabelPodGroup, "pg"))
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}
	p.Spec.NodeSelector = map[string]string{"pool": "gpu"}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1}}},
		PodAntiAffinity: &corev1.PodAntiAffinity{}}
	p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")}
	c := &p.Spec.Containers[0]
	c.Image, c.Command = "registry/train:1", []string{"python", "train.py"}
	c.Env = []corev1.EnvVar{{Name: "A", Value: strings.Repeat("y", 500)}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	c.LivenessProbe = &corev1.Probe{InitialDelaySeconds: 5}
	p.Spec.InitContainers = []corev1.Container{
		{Name: "init", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2")}}},
		{Name: "sidecar", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("1Gi")}}},
	}
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
		Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "registry/train:1", Ready: true}}}
	return p
}

func richNode(name string) *corev1.Node {
	n := testNode(name, "A100", 4, 64, 256)
	n.Labels["pool"], n.Labels["zone"] = "gpu", "a"
	n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0", metrics.AnnotationNodeMetrics: "garbage",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	n.Spec.PodCIDR = "10.0.0.0/24"
	n.Status.Capacity = n.Status.Allocatable.DeepCopy()
	n.Status.Images = []corev1.ContainerImage{{Names: []string{strings.Repeat("img", 300)}, SizeBytes: 1 << 30}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.34.4"}
	return n
}

// TestSlimObjectsKeepWhatTheIndexReads: the informers' transform keeps what
// the index reads of pods, nodes and PodGroups (an index fed the slim objects
// equals one fed the full objects), drops the rest, and is idempotent.
func TestSlimObjectsKeepWhatTheIndexReads(t *testing.T) {
	t.Parallel()
	pod, node := richPod("a", "n"), richNode("n")
	slim := func(obj any) any {
		t.Helper()
		out, err := slimObject(obj)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	sp, sn := slim(pod).(*corev1.Pod), slim(node).(*corev1.Node)

	full, err := PodRequest(pod)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := PodRequest(sp); err != nil || !reflect.DeepEqual(got, full) {
		t.Errorf("PodRequest of the slim pod %+v (%v), of the full pod %+v", got, err, full)
	}
	if a, _ := podGang(pod); !reflect.DeepEqual(func() gangRef { r, _ := podGang(sp); return r }(), a) {
		t.Errorf("podGang differs on the slim pod")
	}
	if a, b := constraintsOf(pod).cacheKey(), constraintsOf(sp).cacheKey(); a != b || a == "" {
		t.Errorf("constraints key %q on the slim pod, %q on the full one", b, a)
	}
	if a, b := persistedOf(pod), persistedOf(sp); !reflect.DeepEqual(a, b) || a == nil {
		t.Errorf("persisted plan %+v on the slim pod, %+v on the full one", b, a)
	}
	if !reflect.DeepEqual(nodeFromAPI(sn), nodeFromAPI(node)) || !sameMeta(nodeMeta(sn), nodeMeta(node)) {
		t.Errorf("node state differs on the slim node")
	}

	// Indexes fed full and slim objects agree.
	index := func(n *corev1.Node, p *corev1.Pod) Status {
		srv := testServer(t, newFakeClock(), Deps{})
		srv.State().UpsertNode(n)
		srv.State().UpsertPod(p)
		st := srv.Status()
		st.Time = time.Time{}
		return st
	}
	a, b := index(node, pod), index(sn, sp)
	if ja, jb := mustJSON(t, a), mustJSON(t, b); ja != jb {
		t.Errorf("index of the slim objects:\n%s\nof the full ones:\n%s", jb, ja)
	}

	// What is dropped, and how much.
	if len(sp.ManagedFields) != 0 || sp.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" ||
		sp.Labels["app"] != "" || sp.Spec.Containers[0].Env != nil || sp.Spec.Volumes != nil ||
		sp.Status.ContainerStatuses != nil || sp.Spec.Affinity.PodAntiAffinity != nil {
		t.Errorf("the slim pod keeps what the index never reads: %+v", sp)
	}
	if sn.Status.Images != nil || sn.ManagedFields != nil || sn.Status.Capacity != nil || len(sn.Annotations) != 1 {
		t.Errorf("the slim node keeps what the index never reads: %+v", sn)
	}
	if f, s := len(mustJSON(t, pod)), len(mustJSON(t, sp)); s*4 > f {
		t.Errorf("slim pod %d bytes of JSON, full %d: want under a quarter", s, f)
	}

	// Idempotent, and other objects pass through.
	if again := slim(sp); !reflect.DeepEqual(again, sp) {
		t.Errorf("slim(slim(pod)) differs")
	}
	if again := slim(sn); !reflect.DeepEqual(again, sn) {
		t.Errorf("slim(slim(node)) differs")
	}
	if other := slim("x"); other != "x" {
		t.Errorf("a string came back as %v", other)
	}
}

func TestSlimPodGroup(t *testing.T) {
	t.Parallel()
	for _, spec := range []any{
		map[string]any{"minMember": int64(3), "scheduleTimeoutSeconds": int64(30), "queue": "q", "minResources": map[string]any{"cpu": "1"}},
		map[string]any{"minMember": "three"},
		nil, []any{int64(1)},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
			"metadata": map[string]any{"name": "g", "namespace": "ns", "uid": "u", "resourceVersion": "9",
				"managedFields": []any{map[string]any{"manager": "x"}}},
			"spec":   spec,
			"status": map[string]any{"phase": "Running", "running": int64(3)},
		}}
		s, err := slimObject(u)
		if err != nil {
			t.Fatal(err)
		}
		su := s.(*unstructured.Unstructured)
		if !reflect.DeepEqual(parsePodGroup(su), parsePodGroup(u)) ||
			!reflect.DeepEqual(parseVolcanoPodGroup(su), parseVolcanoPodGroup(u)) {
			t.Errorf("spec %v: the slim PodGroup decodes differently", spec)
		}
		if su.GetName() != "g" || su.GetNamespace() != "ns" || su.GetResourceVersion() != "9" || su.Object["status"] != nil ||
			su.GetManagedFields() != nil {
			t.Errorf("spec %v: slim PodGroup %v", spec, su.Object)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
