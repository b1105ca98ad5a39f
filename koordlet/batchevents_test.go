package koordlet

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

func notice(name string, kind qos.NoticeKind, msg string) qos.Notice {
	return qos.Notice{UID: types.UID("uid-" + name), Namespace: "jobs", Name: name, Pod: "jobs/" + name, Kind: kind,
		Message: msg}
}

// A pod hears each kind of notice at most once per batchEventEvery, whatever the message;
// another pod or another kind is not held back.
func TestBatchEventsRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	tests := []struct {
		name  string
		after time.Duration
		n     qos.Notice
		want  int // events recorded in all
	}{
		{"a new message within the interval is held back", batchEventEvery - time.Second,
			notice("a", qos.NoticeFrozen, "other numbers"), 1},
		{"after the interval it is recorded again", batchEventEvery, notice("a", qos.NoticeFrozen, "again"), 2},
		{"another kind is recorded at once", time.Second, notice("a", qos.NoticeThrottled, "throttled"), 2},
		{"another pod is recorded at once", time.Second, notice("b", qos.NoticeFrozen, "frozen"), 2},
		{"a clock gone back counts as time passed", -time.Second, notice("a", qos.NoticeFrozen, "back"), 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &fakeEvents{}
			e := newBatchEvents(rec)
			e.warn(notice("a", qos.NoticeFrozen, "frozen"), now, 4)
			e.warn(tc.n, now.Add(tc.after), 4)
			if got := rec.all(); len(got) != tc.want || got[0] != "a: "+EventBatchFrozen+": frozen" {
				t.Fatalf("events %q, want %d, the first a's", got, tc.want)
			}
		})
	}
}

// The rate limiter's memory stays bounded by the pods it serves: expired entries go once
// it has grown past them.
func TestBatchEventsForgetsExpired(t *testing.T) {
	t.Parallel()
	e := newBatchEvents(&fakeEvents{})
	now := time.Unix(1000, 0)
	for i := range 40 {
		e.warn(notice(fmt.Sprint(i), qos.NoticeThrottled, "m"), now, 2)
	}
	e.warn(notice("late", qos.NoticeThrottled, "m"), now.Add(batchEventEvery), 2)
	if len(e.last) != 1 {
		t.Fatalf("%d entries kept, want only the new one", len(e.last))
	}
}

// fakeBatchSink records what the Node writer is handed.
type fakeBatchSink struct{ set []nodestatus.Resources }

func (f *fakeBatchSink) Set(r nodestatus.Resources) bool { f.set = append(f.set, r); return false }
func (f *fakeBatchSink) Status() nodestatus.Status       { return nodestatus.Status{} }

var _ batchResourceSink = (*fakeBatchSink)(nil)

// The handoff hands each writer its part of the plan: the batch resources when a write is
// due, the events, and the conditions (forgotten pods first).
func TestHandoffSend(t *testing.T) {
	t.Parallel()
	m, err := metrics.NewAgent(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cond := qos.WrittenBatchCondition{BatchCondition: qos.BatchCondition{Reason: qos.BatchThrottled, Message: "80%"}}
	p := qos.Plan{Reclaim: true,
		Reclaimed: qos.Reclaimed{CPU: qos.ReclaimTerms{Published: 1.5, Write: true}, Memory: qos.ReclaimTerms{Published: 1 << 30}},
		Notices:   []qos.Notice{notice("a", qos.NoticeThrottled, "throttled")},
		Conditions: []qos.ConditionWrite{{UID: "uid-a", Namespace: "jobs", Name: "a", Pod: "jobs/a",
			Condition: cond}},
		Forget: []types.UID{"uid-gone"}}
	rec, sink, conds := &fakeEvents{}, &fakeBatchSink{}, &fakeConditions{}
	h := &handoff{metrics: m, log: slog.New(slog.NewTextHandler(io.Discard, nil)), batchSink: sink, events: newBatchEvents(rec), conditions: conds}
	h.send(p, 2, time.Unix(1000, 0))
	if want := (nodestatus.Resources{CPUMilli: 1500, MemoryBytes: 1 << 30}); len(sink.set) != 1 || sink.set[0] != want {
		t.Errorf("Node writer got %+v, want %+v", sink.set, want)
	}
	if got := rec.all(); len(got) != 1 || got[0] != "a: BatchThrottled: throttled" {
		t.Errorf("events %q", got)
	}
	if len(conds.forgot) != 1 || conds.forgot[0] != "uid-gone" || len(conds.set) != 1 || conds.set[0] != "a: Throttled: 80%" {
		t.Errorf("conditions forgot %q set %q", conds.forgot, conds.set)
	}
	// Nothing due: the Node writer is not called.
	p.Reclaimed.CPU.Write = false
	h.send(qos.Plan{Reclaim: true, Reclaimed: p.Reclaimed}, 2, time.Unix(1001, 0))
	if len(sink.set) != 1 {
		t.Errorf("Node writer called without a write due: %+v", sink.set)
	}
}
