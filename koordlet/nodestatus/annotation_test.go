package nodestatus

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/understory/understory/contract"
)

func TestNodeAnnotatorPatchesOnlyItsAnnotation(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Annotations: map[string]string{"other": "kept"}, Labels: map[string]string{"l": "v"}}})
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: time.Now().UTC().Truncate(time.Second),
		WindowMillis: 1000, CPU: contract.CPUMetrics{Capacity: 2000, Used: 500}}
	if err := NewNodeAnnotator(client.CoreV1().Nodes(), "n1").Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := contract.DecodeNodeMetrics(n.Annotations[contract.AnnotationNodeMetrics])
	if err != nil || got != m {
		t.Fatalf("annotation decodes to %+v, %v; want %+v", got, err, m)
	}
	// Version 2 (for readers that know it) carries the same figures, and a GPU section.
	m.GPU = &contract.GPUMetrics{Devices: []contract.GPUDevice{{Index: 0, UUID: "GPU-a", Healthy: true, Util: 40,
		LSUtil: 30, MemTotal: 1 << 30, Reclaimable: 0.7}}}
	m.Version = contract.NodeMetricsVersion2
	if err := NewNodeAnnotator(client.CoreV1().Nodes(), "n1").Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if n, err = client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	v1, err := contract.DecodeNodeMetrics(n.Annotations[contract.AnnotationNodeMetrics])
	if err != nil || v1.Version != contract.NodeMetricsVersion || v1.GPU != nil || v1.CPU != m.CPU {
		t.Fatalf("v1 annotation decodes to %+v, %v", v1, err)
	}
	v2, err := contract.DecodeNodeAnnotations(n.Annotations)
	if err != nil || v2.GPU == nil || len(v2.GPU.Devices) != 1 || v2.GPU.Devices[0].Reclaimable != 0.7 {
		t.Fatalf("v2 annotation decodes to %+v, %v", v2, err)
	}
	if n.Annotations["other"] != "kept" || n.Labels["l"] != "v" {
		t.Fatalf("patch touched other fields: %+v", n.ObjectMeta)
	}
	// An invalid value is refused before it reaches the API server.
	if err := NewNodeAnnotator(client.CoreV1().Nodes(), "n1").Publish(context.Background(), contract.NodeMetrics{}); !errors.Is(err, contract.ErrInvalidNodeMetrics) {
		t.Fatalf("publishing an invalid value: %v", err)
	}
	if err := NewNodeAnnotator(client.CoreV1().Nodes(), "missing").Publish(context.Background(), m); err == nil {
		t.Fatal("patching a missing node succeeded")
	}
}
