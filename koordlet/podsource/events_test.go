package podsource

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/understory/understory/internal/testenv"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestDedup(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	d := newDedup(newSinkConfig([]SinkOption{WithClock(clock.now)}))
	a := kubePod("ns", "a", testNode)
	b := kubePod("ns", "b", testNode)
	steps := []struct {
		name    string
		advance time.Duration
		pod     *corev1.Pod
		reason  string
		msg     string
		want    bool
	}{
		{"first", 0, a, "InvalidQoS", "bad value x", true},
		{"repeat", time.Second, a, "InvalidQoS", "bad value x", false},
		{"other message", 0, a, "InvalidQoS", "bad value y", true},
		{"other reason", 0, a, "Other", "bad value x", true},
		{"other pod", 0, b, "InvalidQoS", "bad value x", true},
		{"just inside window", DedupWindow - 2*time.Second, a, "InvalidQoS", "bad value x", false},
		{"window elapsed", time.Second, a, "InvalidQoS", "bad value x", true},
		{"repeat after re-record", time.Minute, a, "InvalidQoS", "bad value x", false},
	}
	for _, st := range steps {
		clock.advance(st.advance)
		if got := d.allow(st.pod, st.reason, st.msg); got != st.want {
			t.Errorf("%s: allow = %v, want %v", st.name, got, st.want)
		}
	}
	// Old keys are swept so the map does not grow forever.
	clock.advance(3 * DedupWindow)
	d.allow(a, "x", "y")
	d.mu.Lock()
	n := len(d.last)
	d.mu.Unlock()
	if n != 1 {
		t.Errorf("dedup map holds %d keys after sweep, want 1", n)
	}
}

func TestEventSinkRecordsDeduplicatedWarnings(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	clock := &fakeClock{t: time.Now()}
	sink := NewEventSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, "understory-koordlet", testNode, WithClock(clock.now))
	defer sink.Shutdown()

	pod := kubePod("team-a", "web", testNode)
	pod.ManagedFields = nil
	long := strings.Repeat("é", 600) // 1200 bytes: must be truncated on a rune boundary
	for range 5 {                    // the agent calls every control period
		sink.Warn(pod, "InvalidQoSAnnotation", `understory.io/qos "X" is not one of LS, BE`)
	}
	sink.Warn(pod, "LongMessage", long)
	sink.Warn(nil, "Ignored", "nil pod")
	// The broadcaster records in order: once this last event is there, every event
	// before it has been recorded or dropped, wrong extra ones included.
	sink.Warn(pod, "Sentinel", "last")

	var list *corev1.EventList
	testenv.WaitFor(t, waitTimeout, "the sentinel event", func() bool {
		var err error
		if list, err = client.CoreV1().Events("").List(t.Context(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(list.Items, func(e corev1.Event) bool { return e.Reason == "Sentinel" })
	})
	list.Items = slices.DeleteFunc(list.Items, func(e corev1.Event) bool { return e.Reason == "Sentinel" })
	if len(list.Items) != 2 {
		t.Fatalf("got %d events, want 2: %+v", len(list.Items), list.Items)
	}
	byReason := map[string]corev1.Event{}
	for _, e := range list.Items {
		byReason[e.Reason] = e
	}
	e, ok := byReason["InvalidQoSAnnotation"]
	if !ok {
		t.Fatalf("no InvalidQoSAnnotation event: %+v", list.Items)
	}
	if e.Type != corev1.EventTypeWarning || e.Count != 1 ||
		e.InvolvedObject.Kind != "Pod" || e.InvolvedObject.Name != "web" ||
		e.InvolvedObject.Namespace != "team-a" || e.InvolvedObject.UID != pod.UID ||
		e.Source.Component != "understory-koordlet" || e.Source.Host != testNode {
		t.Errorf("unexpected event: %+v", e)
	}
	lm := byReason["LongMessage"].Message
	if len(lm) > maxEventMessage || !utf8.ValidString(lm) || !strings.HasSuffix(lm, "...") {
		t.Errorf("long message not truncated cleanly: %d bytes, valid=%v", len(lm), utf8.ValidString(lm))
	}

	sink.Shutdown()
	sink.Shutdown() // idempotent
	sink.Warn(pod, "AfterShutdown", "dropped")
}

func TestLogSink(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(0, 0)}
	sink := NewLogSink(slog.New(slog.NewTextHandler(&buf, nil)), WithClock(clock.now), WithDedupWindow(time.Minute))
	pod := kubePod("ns", "web", testNode)
	sink.Warn(pod, "InvalidQoSAnnotation", "bad")
	sink.Warn(pod, "InvalidQoSAnnotation", "bad")
	clock.advance(time.Minute)
	sink.Warn(pod, "InvalidQoSAnnotation", "bad")
	sink.Warn(nil, "x", "y")
	sink.Shutdown()

	out := buf.String()
	if n := strings.Count(out, "reason=InvalidQoSAnnotation"); n != 2 {
		t.Errorf("logged %d times, want 2:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "pod=ns/web", "uid=ns-web", "msg=bad"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456..."},
		{"ééééé", 8, "éé..."}, // 10 bytes; cut at 5 falls inside a rune
	}
	for _, tc := range tests {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestEventSinkRecordsNormalEvents(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	sink := NewEventSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, "understory-koordlet", testNode)
	defer sink.Shutdown()
	pod := kubePod("team-a", "train", testNode)
	for range 3 {
		sink.Normal(pod, "MPSClient", "container main runs as an MPS client")
	}
	sink.Normal(nil, "Ignored", "nil pod")
	// The broadcaster records in order: once this last event is there, every event
	// before it has been recorded or dropped.
	sink.Normal(pod, "Sentinel", "last")
	var list *corev1.EventList
	testenv.WaitFor(t, waitTimeout, "the sentinel event", func() bool {
		var err error
		if list, err = client.CoreV1().Events("").List(t.Context(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(list.Items, func(e corev1.Event) bool { return e.Reason == "Sentinel" })
	})
	var mps []corev1.Event
	for _, e := range list.Items {
		if e.Reason != "Sentinel" {
			mps = append(mps, e)
		}
	}
	if len(mps) != 1 || mps[0].Type != corev1.EventTypeNormal || mps[0].Reason != "MPSClient" || mps[0].Count != 1 {
		t.Fatalf("events %+v; want one Normal MPSClient (repeats suppressed, nil pod ignored)", mps)
	}
}
