package podsource

import (
	"context"

	corev1 "k8s.io/api/core/v1"
)

// source is a copy of the interface the agent (koordlet) owns.
type source interface {
	Run(ctx context.Context) error
	HasSynced() bool
	List() []*corev1.Pod
	Changed() <-chan struct{}
}

// warner is the agent-side view of the event sinks.
type warner interface {
	Warn(pod *corev1.Pod, reason, message string)
	Shutdown()
}

var (
	_ source = (*Static)(nil)
	_ source = (*Kube)(nil)
	_ warner = (*EventSink)(nil)
	_ warner = (*LogSink)(nil)
)
