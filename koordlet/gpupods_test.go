package koordlet

import (
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/qos"
)

// TestPublishGPUPods: the snapshot carries every field the GPU loop reads, for every pod.
func TestPublishGPUPods(t *testing.T) {
	t.Parallel()
	if n := reflect.TypeFor[gpu.PodInfo]().NumField(); n != 9 {
		t.Fatalf("gpu.PodInfo has %d fields: fill the new ones in gpuPods.publish, then fix this count", n)
	}
	started := time.Unix(1_700_000_000, 0)
	g := &gpuPods{on: true}
	g.publish([]*podState{
		{uid: "u1", namespace: "ml", name: "train", class: qos.ClassBatch, read: podRead{cgroup: "kubepods/pod-u1"},
			terminating: true, spec: podSpec{priority: 5, started: started, containers: map[string]string{"c1": "trainer"}}},
		{uid: "u2", namespace: "web", name: "infer", class: qos.ClassLS},
	})
	want := gpu.PodMap{
		"u1": {UID: "u1", Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: "kubepods/pod-u1",
			Containers: map[string]string{"c1": "trainer"}, Priority: 5, StartTime: started, Terminating: true},
		"u2": {UID: "u2", Namespace: "web", Name: "infer", Class: qos.ClassLS},
	}
	if diff := cmp.Diff(want, g.view()); diff != "" {
		t.Fatalf("snapshot (-want +got):\n%s", diff)
	}
}

// TestAgentRepublishesGPUPods: the control loop hands the GPU loop a new snapshot on the
// next slow period after a pod changed (here: one became terminating), and keeps the old
// one while nothing changed.
func TestAgentRepublishesGPUPods(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	r.agent.gpuPods.on = true // the snapshot is kept only with GPU features on
	for i := 0; i < 2*slowEvery; i++ {
		r.step(0.5, nil)
	}
	first := r.agent.gpuPods.pods.Load()
	if first == nil || len(*first) != 4 {
		t.Fatalf("snapshot %v, want the rig's 4 pods", first)
	}
	for i := 0; i < slowEvery; i++ {
		r.step(0.5, nil)
	}
	if r.agent.gpuPods.pods.Load() != first {
		t.Fatal("snapshot replaced although no pod changed")
	}
	r.changePods(func(i int, p *corev1.Pod) {
		if i == 1 {
			p.DeletionTimestamp = &metav1.Time{Time: r.now}
		}
	})
	for i := 0; i < slowEvery; i++ {
		r.step(0.5, nil)
	}
	if p, ok := r.agent.gpuPods.view().Pod(batchUID1); !ok || !p.Terminating {
		t.Fatalf("pod after the change %+v (found %t), want terminating", p, ok)
	}
}
