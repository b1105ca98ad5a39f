package controlplane

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WaitForPodsBound polls until at least want pods in namespace matching
// opts (label/field selectors) have spec.nodeName set, or ctx ends.
func (cp *ControlPlane) WaitForPodsBound(ctx context.Context, namespace string, opts metav1.ListOptions, want int) error {
	opts.ResourceVersion = "0" // served from the watch cache
	bound, total := 0, 0
	for {
		pods, err := cp.client.CoreV1().Pods(namespace).List(ctx, opts)
		if err == nil {
			bound, total = 0, len(pods.Items)
			for i := range pods.Items {
				if pods.Items[i].Spec.NodeName != "" {
					bound++
				}
			}
			if bound >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d bound pods in %q: %d of %d bound (last list error: %v): %w", want, namespace, bound, total, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
