package podsource

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// DedupWindow is how long a sink suppresses a repeat of the same
// (pod UID, reason, message).
const DedupWindow = 10 * time.Minute

// maxEventMessage bounds the message sent to the API server (the events
// API caps notes at 1 KiB). Deduplication uses the full message.
const maxEventMessage = 1024

// SinkOption configures EventSink and LogSink.
type SinkOption func(*sinkConfig)

type sinkConfig struct {
	window time.Duration
	now    func() time.Time
}

// WithDedupWindow replaces DedupWindow. Non-positive values are ignored.
func WithDedupWindow(d time.Duration) SinkOption {
	return func(c *sinkConfig) {
		if d > 0 {
			c.window = d
		}
	}
}

// WithClock replaces time.Now for deduplication (tests).
func WithClock(now func() time.Time) SinkOption {
	return func(c *sinkConfig) {
		if now != nil {
			c.now = now
		}
	}
}

func newSinkConfig(opts []SinkOption) sinkConfig {
	c := sinkConfig{window: DedupWindow, now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	return c
}

type dedupKey struct {
	uid             types.UID
	namespace, name string
	reason, message string
}

// dedup remembers when each key was last let through.
type dedup struct {
	window    time.Duration
	now       func() time.Time
	mu        sync.Mutex
	last      map[dedupKey]time.Time
	lastSweep time.Time
}

func newDedup(c sinkConfig) *dedup {
	return &dedup{window: c.window, now: c.now, last: map[dedupKey]time.Time{}}
}

// allow reports whether the key was not let through within the window, and
// records it if so. Expired keys are swept at most once per window, so the
// map holds at most the keys seen in the last two windows.
func (d *dedup) allow(pod *corev1.Pod, reason, message string) bool {
	k := dedupKey{pod.UID, pod.Namespace, pod.Name, reason, message}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if now.Sub(d.lastSweep) >= d.window {
		for key, t := range d.last {
			if now.Sub(t) >= d.window {
				delete(d.last, key)
			}
		}
		d.lastSweep = now
	}
	if t, ok := d.last[k]; ok && now.Sub(t) < d.window {
		return false
	}
	d.last[k] = now
	return true
}

// EventSink records Warning events on pods through the API server.
// Warn is safe for concurrent use.
type EventSink struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	dedup       *dedup
	stopped     atomic.Bool
	stopOnce    sync.Once
}

// NewEventSink starts an event broadcaster writing core/v1 Events to sink (CoreClient.Events,
// or client-go's typed EventSinkImpl) with source component/nodeName. Call Shutdown when done.
func NewEventSink(sink record.EventSink, component, nodeName string, opts ...SinkOption) *EventSink {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(sink)
	return &EventSink{
		broadcaster: b,
		recorder:    b.NewRecorder(podScheme(), corev1.EventSource{Component: component, Host: nodeName}),
		dedup:       newDedup(newSinkConfig(opts)),
	}
}

// podScheme tells the recorder the group, version and kind of a Pod, the only object
// events are recorded on.
func podScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Pod{})
	return s
}

// Warn records a Warning event on pod unless the same (pod, reason, message)
// was recorded within the dedup window. It never blocks on the API server;
// after Shutdown it does nothing.
func (s *EventSink) Warn(pod *corev1.Pod, reason, message string) {
	if pod == nil || s.stopped.Load() || !s.dedup.allow(pod, reason, message) {
		return
	}
	s.recorder.Event(pod, corev1.EventTypeWarning, reason, truncate(message, maxEventMessage))
}

// Normal records a Normal event on pod, deduplicated and dropped after Shutdown
// like Warn.
func (s *EventSink) Normal(pod *corev1.Pod, reason, message string) {
	if pod == nil || s.stopped.Load() || !s.dedup.allow(pod, reason, message) {
		return
	}
	s.recorder.Event(pod, corev1.EventTypeNormal, reason, truncate(message, maxEventMessage))
}

// Shutdown stops the broadcaster; events still queued may be dropped.
// It is safe to call more than once.
func (s *EventSink) Shutdown() {
	s.stopOnce.Do(func() {
		s.stopped.Store(true)
		s.broadcaster.Shutdown()
	})
}

// LogSink is the static-mode sink: it logs what EventSink would record.
type LogSink struct {
	logger *slog.Logger
	dedup  *dedup
}

// NewLogSink returns a sink logging to logger (nil discards).
func NewLogSink(logger *slog.Logger, opts ...SinkOption) *LogSink {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &LogSink{logger: logger, dedup: newDedup(newSinkConfig(opts))}
}

// Warn logs a warning about pod, deduplicated like EventSink.Warn.
func (s *LogSink) Warn(pod *corev1.Pod, reason, message string) {
	if pod == nil || !s.dedup.allow(pod, reason, message) {
		return
	}
	s.logger.Warn(message, "pod", pod.Namespace+"/"+pod.Name, "uid", string(pod.UID), "reason", reason)
}

// Normal logs an informational event about pod, deduplicated like EventSink.Normal.
func (s *LogSink) Normal(pod *corev1.Pod, reason, message string) {
	if pod == nil || !s.dedup.allow(pod, reason, message) {
		return
	}
	s.logger.Info(message, "pod", pod.Namespace+"/"+pod.Name, "uid", string(pod.UID), "reason", reason)
}

// Shutdown exists for symmetry with EventSink; it does nothing.
func (s *LogSink) Shutdown() {}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
