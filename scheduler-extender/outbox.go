package extender

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/gang"
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

// outbox queues what the index and the gangs decide under the index lock but
// must not do there (API writes): Events and gang nudges. flush sends them,
// with no index lock held. The queue has its own small lock, so draining it
// never waits for the index.
type outbox struct {
	mu      sync.Mutex
	events  []event
	nudges  []nudge
	pending atomic.Bool // something is queued: drain is cheap when not

	// Where flush sends, set by setSink before the outbox is shared: nil
	// recorder drops Events; nudge false drops nudges (no API client).
	recorder   eventRecorder
	api        podAPI
	nudge      bool
	apiTimeout time.Duration
	log        *slog.Logger
	nudgeWG    sync.WaitGroup // nudges in flight (wait)
	// muted: flush drops what is queued (a standby replica writes nothing).
	muted atomic.Bool
}

// setMuted mutes (a standby) or unmutes (the leader) the outbox.
func (o *outbox) setMuted(m bool) { o.muted.Store(m) }

// setSink says where flush sends. Call before the outbox is shared.
func (o *outbox) setSink(recorder eventRecorder, api podAPI, nudge bool, apiTimeout time.Duration, log *slog.Logger) {
	o.recorder, o.api, o.nudge, o.apiTimeout, o.log = recorder, api, nudge, apiTimeout, log
}

// Emit queues an Event on p (a pod entry, or a gang member: gang.Outbox).
func (o *outbox) Emit(p gang.Pod, warning bool, reason, msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.events) < maxQueuedEvents {
		o.events = append(o.events, event{p.Namespace(), p.Name(), p.UID(), warning, reason, msg})
		o.pending.Store(true)
	}
}

// Nudge queues a write of the gang-state annotation value on gang member p.
func (o *outbox) Nudge(p gang.Pod, value string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.nudges = append(o.nudges, nudge{p.Namespace(), p.Name(), p.UID(), value})
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

// flush emits the queued events and starts the queued nudges (in the
// background, each API call bounded by apiTimeout). Call with no index lock held.
func (o *outbox) flush() {
	evs, nudges := o.drain()
	if o.muted.Load() {
		return
	}
	for _, e := range evs {
		if o.recorder == nil {
			continue
		}
		kind := corev1.EventTypeNormal
		if e.warning {
			kind = corev1.EventTypeWarning
		}
		ref := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, UID: e.uid}}
		o.recorder.Eventf(ref, kind, e.reason, "%s", e.msg)
	}
	if len(nudges) == 0 || !o.nudge {
		return
	}
	o.nudgeWG.Add(1)
	go func() {
		defer o.nudgeWG.Done()
		for _, n := range nudges {
			ctx, cancel := context.WithTimeout(context.Background(), o.apiTimeout)
			if err := o.api.PatchPodAnnotation(ctx, n.namespace, n.name, n.uid, contract.AnnotationGangState, n.value); err != nil {
				o.log.Warn("nudging gang member", "pod", n.namespace+"/"+n.name, "err", err)
			}
			cancel()
		}
	}()
}

// wait waits for the nudges in flight.
func (o *outbox) wait() { o.nudgeWG.Wait() }
