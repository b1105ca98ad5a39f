package extender

import (
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
)

// maxQueuedEvents bounds the events waiting to be emitted; more are dropped.
const maxQueuedEvents = 1024

// event is a Kubernetes Event to emit on a pod once the index lock is released.
type event struct {
	namespace, name string
	uid             types.UID
	warning         bool
	reason, msg     string
}

// nudge is a pod the extender annotates so kube-scheduler retries it soon.
type nudge struct {
	namespace, name string
	uid             types.UID
	value           string
}

// outbox queues what the index decides under its lock but must not do there
// (API writes): Events and gang nudges, emitted by Server.flush. It has its own
// small lock, so draining it never waits for the index.
type outbox struct {
	mu      sync.Mutex
	events  []event
	nudges  []nudge
	pending atomic.Bool // something is queued: drain is cheap when not
}

func (o *outbox) event(e event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.events) < maxQueuedEvents {
		o.events = append(o.events, e)
		o.pending.Store(true)
	}
}

func (o *outbox) nudge(n nudge) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.nudges = append(o.nudges, n)
	o.pending.Store(true)
}

// drain takes the queued events and nudges.
func (o *outbox) drain() ([]event, []nudge) {
	if !o.pending.Load() {
		return nil, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	evs, ns := o.events, o.nudges
	o.events, o.nudges = nil, nil
	o.pending.Store(false)
	return evs, ns
}
