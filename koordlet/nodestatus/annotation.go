package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
)

// NodeAnnotator publishes node metrics on the agent's own Node, with a merge patch that
// touches nothing else: understory.io/node-metrics (version 1, for readers that know
// only it) and understory.io/node-metrics-v2 (version 2: also the GPUs).
type NodeAnnotator struct {
	nodes    nodePatcher
	nodeName string
}

// nodePatcher patches Nodes (podsource.CoreClient.Nodes, or client-go's typed client).
type nodePatcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
}

// NewNodeAnnotator returns a publisher patching node nodeName.
func NewNodeAnnotator(nodes nodePatcher, nodeName string) *NodeAnnotator {
	return &NodeAnnotator{nodes: nodes, nodeName: nodeName}
}

// Publish patches both annotations in one write.
func (n *NodeAnnotator) Publish(ctx context.Context, m contract.NodeMetrics) error {
	values, err := m.EncodeAnnotations()
	if err != nil {
		return fmt.Errorf("encoding node metrics: %w", err)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": values},
	})
	if err != nil {
		return fmt.Errorf("encoding patch: %w", err)
	}
	if _, err := n.nodes.Patch(ctx, n.nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching node %s: %w", n.nodeName, err)
	}
	return nil
}
