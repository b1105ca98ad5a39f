package koordlet

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/understory/understory/metrics"
)

// NodeAnnotator publishes node metrics as the understory.io/node-metrics annotation on
// the agent's own Node, with a merge patch that touches nothing else.
type NodeAnnotator struct {
	client   kubernetes.Interface
	nodeName string
}

var _ nodeMetricsPublisher = (*NodeAnnotator)(nil)

// NewNodeAnnotator returns a publisher patching node nodeName.
func NewNodeAnnotator(client kubernetes.Interface, nodeName string) *NodeAnnotator {
	return &NodeAnnotator{client: client, nodeName: nodeName}
}

// Publish patches the annotation.
func (n *NodeAnnotator) Publish(ctx context.Context, m metrics.NodeMetrics) error {
	value, err := m.Encode()
	if err != nil {
		return fmt.Errorf("encoding node metrics: %w", err)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{metrics.AnnotationNodeMetrics: string(value)}},
	})
	if err != nil {
		return fmt.Errorf("encoding patch: %w", err)
	}
	if _, err := n.client.CoreV1().Nodes().Patch(ctx, n.nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching node %s: %w", n.nodeName, err)
	}
	return nil
}
