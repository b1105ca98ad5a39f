package extender

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
)

// richPod is a pod as the API server returns it: managedFields, a big
// last-applied annotation, env, volumes, probes, status, and everything the
// index reads (gang, devices, model, init containers, sidecar, overhead,
// affinity, tolerations).
func richPod(name, node string) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p := podtest.Pod("ns", name, podtest.GPUs(2), podtest.OnNode(node), podtest.Created(3),
		podtest.Annotate(contract.AnnotationGPUDevices, "0,1"), podtest.Annotate(AnnotationGPUModel, "A100"),
		podtest.Annotate(contract.AnnotationKoordinatorName, "k"), podtest.Annotate(contract.AnnotationKoordinatorMinAvailable, "2"),
		podtest.Annotate(contract.AnnotationGangState, "planned:7:n:0,1:1700000000"),
		podtest.Annotate("kubectl.kubernetes.io/last-applied-configuration", strings.Repeat("x", 4000)),
		podtest.Label("app", "train"), podtest.Label(contract.LabelPodGroup, "pg"))
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
	n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0", contract.AnnotationNodeMetrics: "garbage", contract.AnnotationNodeMetricsV2: "{}",
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
// the index reads of pods (as a podRecord), nodes and PodGroups: an index fed
// the slim objects equals one fed the full objects, the rest is dropped, and
// the transform is idempotent.
func TestSlimObjectsKeepWhatTheIndexReads(t *testing.T) {
	t.Parallel()
	slim := func(obj any) any {
		t.Helper()
		out, err := slimObject(obj)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	node := richNode("n")
	sn := slim(node).(*corev1.Node)
	if a, b := slimmedNode(sn), slimmedNode(node); !reflect.DeepEqual(a, b) || !sameMeta(nodeMeta(sn), nodeMeta(node)) {
		t.Errorf("node state differs on the slim node")
	}
	if sn.Status.Images != nil || sn.ManagedFields != nil || sn.Status.Capacity != nil || len(sn.Annotations) != len(nodeAnnotationsRead) {
		t.Errorf("the slim node keeps what the index never reads: %+v", sn)
	}
	if again := slim(sn); !reflect.DeepEqual(again, sn) {
		t.Errorf("slim(slim(node)) differs")
	}

	pending := richPod("p", "")
	pending.Status = corev1.PodStatus{Phase: corev1.PodPending}
	bad := richPod("bad", "n")
	bad.Annotations[AnnotationGPUModel] = ""
	bad.Spec.Containers[0].Resources.Limits[contract.ResourceGPUMilli] = resource.MustParse("-3")
	if _, err := PodRequest(bad); err == nil {
		t.Fatal("the invalid pod is valid")
	}
	done := richPod("done", "n")
	done.Status.Phase = corev1.PodSucceeded
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"gang member", richPod("a", "n")},
		{"no gang", podtest.Pod("ns", "solo", podtest.Milli(250), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "3"))},
		{"no devices annotation", podtest.Pod("ns", "bare", podtest.GPUs(1), podtest.OnNode("n"))},
		{"malformed devices", podtest.Pod("ns", "mal", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "x"))},
		{"pending", pending},
		{"invalid request", bad},
		{"terminated", done},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := tc.pod
			rec, ok := slim(pod).(*podRecord)
			if !ok {
				t.Fatalf("the pod transform returned %T, want *podRecord", slim(pod))
			}
			req, err := PodRequest(pod)
			if !reflect.DeepEqual(rec.req, req) || !reflect.DeepEqual(rec.reqErr, err) {
				t.Errorf("record request %+v (%v), PodRequest %+v (%v)", rec.req, rec.reqErr, req, err)
			}
			// Its gang, constraints and recorded plan, as read from the full pod.
			if want := gang.RecordOf(pod); !reflect.DeepEqual(rec.gang, want) {
				t.Errorf("record gang %+v, of the pod %+v", rec.gang, want)
			}
			// The informer's store keys the record as it keys the pod.
			kr, err1 := cache.DeletionHandlingMetaNamespaceKeyFunc(rec)
			kp, err2 := cache.DeletionHandlingMetaNamespaceKeyFunc(pod)
			if kr != kp || err1 != nil || err2 != nil {
				t.Errorf("store key %q (%v) of the record, %q (%v) of the pod", kr, err1, kp, err2)
			}

			// Indexes fed the full pod and the record agree.
			index := func(feed func(*State)) string {
				srv := testServer(t, newFakeClock(), Deps{})
				srv.state.UpsertNode(node)
				feed(srv.state)
				st := srv.Status()
				st.Time = time.Time{}
				return mustJSON(t, st)
			}
			full := index(func(s *State) { s.UpsertPod(pod) })
			if got := index(func(s *State) { s.upsertRecord(rec) }); got != full {
				t.Errorf("index of the record:\n%s\nof the pod:\n%s", got, full)
			}

			// What is dropped; idempotent; copies are equal and apart.
			if rec.Labels != nil || rec.Annotations != nil || rec.ManagedFields != nil || rec.OwnerReferences != nil {
				t.Errorf("the record keeps metadata the index never reads: %+v", rec.ObjectMeta)
			}
			if again := slim(rec); again != any(rec) {
				t.Errorf("slim(record) is not the record")
			}
			c := rec.DeepCopyObject().(*podRecord)
			if !reflect.DeepEqual(c, rec) || c == rec || c.GetObjectKind() != schema.EmptyObjectKind {
				t.Errorf("DeepCopyObject %+v of %+v", c, rec)
			}
		})
	}
	if other := slim("x"); other != "x" {
		t.Errorf("a string came back as %v", other)
	}
}

// TestPodRecordSmall: a record of a typical bound pod (the memory benchmark's)
// is a fraction of the slimmed pod it replaces; the informer store holds one
// per pod.
func TestPodRecordSmall(t *testing.T) {
	t.Parallel()
	pod := podtest.Pod("team-07", "pod-000123", podtest.Milli(250), podtest.OnNode("node-0042"), podtest.Annotate(contract.AnnotationGPUDevices, "1"),
		podtest.Created(1))
	pod.Status.Phase = corev1.PodPhase(strings.Clone(string(corev1.PodRunning))) // as decoded: its own copy
	rec := podRecordOf(pod)
	if size := unsafe.Sizeof(*rec); size > 416 {
		t.Errorf("podRecord is %d bytes, want at most 416 (a size class)", size)
	}
	if rec.phase != corev1.PodRunning || unsafe.StringData(string(rec.phase)) != unsafe.StringData(string(corev1.PodRunning)) {
		t.Errorf("phase %q is not the package constant", rec.phase)
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

// slimmedNode is what the index builds of a node: its empty ledger and GPU table.
func slimmedNode(n *corev1.Node) any {
	m, _ := contract.DecodeNodeAnnotations(n.Annotations)
	p, t := nodeFromAPI(n, &m)
	return []any{p, t}
}
