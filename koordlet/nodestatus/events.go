package nodestatus

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// NodeEvents records Warning events on the agent's Node (involvedObject Kind Node, the
// node's name as its UID, as kubelet records them, so `kubectl describe node` shows
// them). Safe for concurrent use.
type NodeEvents struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	ref         *corev1.ObjectReference
}

// NewNodeEvents starts an event broadcaster writing to sink (podsource.CoreClient.Events)
// with source component/node. Call Shutdown when done.
func NewNodeEvents(sink record.EventSink, component, node string) *NodeEvents {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(sink)
	return &NodeEvents{broadcaster: b,
		recorder: b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: component, Host: node}),
		ref:      &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)}}
}

// Warn records a Warning event on the Node; it never blocks on the API server.
func (e *NodeEvents) Warn(reason, message string) {
	const maxMessage = 1024 // the API server's limit on an event's message
	if len(message) > maxMessage {
		message = strings.ToValidUTF8(message[:maxMessage-3], "") + "..."
	}
	e.recorder.Event(e.ref, corev1.EventTypeWarning, reason, message)
}

// Shutdown stops the broadcaster; events still queued may be dropped.
func (e *NodeEvents) Shutdown() { e.broadcaster.Shutdown() }
