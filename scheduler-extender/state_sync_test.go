package extender

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRunSyncedMeansIndexed: once the server reports synced, its index holds
// every node and pod of the initial lists (the informers' handlers have run,
// not only their stores been filled), so a filter right after start never
// sees "node unknown to the extender".
func TestRunSyncedMeansIndexed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		nodes, pods  int
		wantGPUNodes int
	}{
		{name: "empty cluster"},
		{name: "large cluster", nodes: 3000, pods: 1000, wantGPUNodes: 3000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var objs []runtime.Object
			for i := range tc.nodes {
				objs = append(objs, &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%d", i), Labels: map[string]string{LabelGPUProduct: "A100"}},
					Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
						corev1.ResourcePods: resource.MustParse("110"), ResourceGPU: resource.MustParse("4"),
					}},
				})
			}
			for i := range tc.pods {
				objs = append(objs, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", i))},
					Spec:       corev1.PodSpec{NodeName: fmt.Sprintf("n-%d", i%max(tc.nodes, 1)), Containers: []corev1.Container{{Name: "c"}}},
				})
			}
			srv, err := NewServer(DefaultConfig(), Deps{Client: fake.NewClientset(objs...)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			var st Status
			for st = srv.Status(); !st.Synced; st = srv.Status() {
				select {
				case <-ctx.Done():
					t.Fatal("never synced")
				case <-time.After(time.Millisecond):
				}
			}
			pods := 0
			for _, n := range st.Counts {
				pods += n
			}
			gpuNodes := 0
			for _, n := range st.Nodes {
				if len(n.GPUs) > 0 {
					gpuNodes++
				}
			}
			if len(st.Nodes) != tc.nodes || pods != tc.pods || gpuNodes != tc.wantGPUNodes {
				t.Errorf("synced with %d nodes (%d with GPUs) and %d pods indexed, want %d, %d and %d",
					len(st.Nodes), gpuNodes, pods, tc.nodes, tc.wantGPUNodes, tc.pods)
			}
		})
	}
}
