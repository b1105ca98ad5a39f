package nodestatus

import (
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/internal/testenv"
)

// NodeEvents records a Warning on the Node, as kubelet names it.
func TestNodeEventsWarnsOnTheNode(t *testing.T) {
	t.Parallel()
	sink := &captureSink{}
	e := NewNodeEvents(sink, "understory-koordlet", "node-a")
	defer e.Shutdown()
	e.Warn("ConfigRejected", "configuration abc refused: "+strings.Repeat("x", 2000))
	testenv.WaitFor(t, 10*time.Second, "the event created", func() bool { return len(sink.all()) == 1 })
	ev := sink.all()[0]
	if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "node-a" || ev.InvolvedObject.UID != "node-a" ||
		ev.Type != corev1.EventTypeWarning || ev.Reason != "ConfigRejected" || ev.Source.Host != "node-a" ||
		len(ev.Message) > 1024 || !strings.HasPrefix(ev.Message, "configuration abc refused") {
		t.Fatalf("event %+v", ev)
	}
}

// captureSink is record.EventSink keeping the events created.
type captureSink struct {
	mu     sync.Mutex
	events []corev1.Event
}

func (c *captureSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, *ev)
	return ev, nil
}

func (c *captureSink) Update(ev *corev1.Event) (*corev1.Event, error) { return ev, nil }

func (c *captureSink) Patch(ev *corev1.Event, _ []byte) (*corev1.Event, error) {
	return ev, nil
}

func (c *captureSink) all() []corev1.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]corev1.Event(nil), c.events...)
}
