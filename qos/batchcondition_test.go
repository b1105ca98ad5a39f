package qos

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestNextBatchCondition(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	written := func(r BatchSlowReason, msg string, at, since time.Time) *WrittenBatchCondition {
		return &WrittenBatchCondition{BatchCondition: BatchCondition{Reason: r, Message: msg}, At: at, Since: since}
	}
	cases := []struct {
		name      string
		prev      *WrittenBatchCondition
		next      BatchCondition
		now       time.Time
		write     bool
		wantSince time.Time
	}{
		{"never written, running: nothing", nil, BatchCondition{BatchRunning, "free"}, t0, false, t0},
		{"never written, empty reason is running", nil, BatchCondition{}, t0, false, t0},
		{"never written, throttled: at once", nil, BatchCondition{BatchThrottled, "50%"}, t0, true, t0},
		{"same state, same message: nothing", written(BatchThrottled, "50%", t0, t0),
			BatchCondition{BatchThrottled, "50%"}, t0.Add(time.Hour), false, t0},
		{"same state, new numbers, too soon", written(BatchThrottled, "50%", t0, t0),
			BatchCondition{BatchThrottled, "60%"}, t0.Add(4 * time.Minute), false, t0},
		{"same state, new numbers, due: keeps the transition time", written(BatchThrottled, "50%", t0.Add(time.Minute), t0),
			BatchCondition{BatchThrottled, "60%"}, t0.Add(6 * time.Minute), true, t0},
		{"harder at once", written(BatchThrottled, "50%", t0, t0),
			BatchCondition{BatchFrozen, "frozen"}, t0.Add(time.Second), true, t0.Add(time.Second)},
		{"suspended is harder than frozen", written(BatchFrozen, "f", t0, t0),
			BatchCondition{BatchSuspended, "s"}, t0.Add(time.Second), true, t0.Add(time.Second)},
		{"milder waits", written(BatchFrozen, "frozen", t0, t0),
			BatchCondition{BatchRunning, "free"}, t0.Add(10 * time.Second), false, t0},
		{"milder when due", written(BatchFrozen, "frozen", t0, t0),
			BatchCondition{BatchRunning, "free"}, t0.Add(time.Minute), true, t0.Add(time.Minute)},
		{"clock went back: due", written(BatchThrottled, "50%", t0, t0),
			BatchCondition{BatchRunning, "free"}, t0.Add(-time.Hour), true, t0.Add(-time.Hour)},
		{"evicted is final", written(BatchEvicted, "evicted", t0, t0),
			BatchCondition{BatchRunning, "free"}, t0.Add(time.Hour), false, t0},
		{"evicted after running, at once", written(BatchRunning, "free", t0, t0),
			BatchCondition{BatchEvicted, "evicted"}, t0.Add(time.Second), true, t0.Add(time.Second)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w, ok := NextBatchCondition(c.prev, c.next, c.now)
			if ok != c.write {
				t.Fatalf("write = %v, want %v", ok, c.write)
			}
			if !w.Since.Equal(c.wantSince) {
				t.Errorf("since = %v, want %v", w.Since, c.wantSince)
			}
			if ok && (w.Message != c.next.Message || !w.At.Equal(c.now)) {
				t.Errorf("written %+v, want message %q at %v", w, c.next.Message, c.now)
			}
		})
	}
}

func TestBatchConditionPodCondition(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		reason BatchSlowReason
		status corev1.ConditionStatus
	}{{BatchRunning, corev1.ConditionFalse}, {BatchThrottled, corev1.ConditionTrue}, {BatchEvicted, corev1.ConditionTrue}} {
		pc := WrittenBatchCondition{BatchCondition: BatchCondition{c.reason, "m"}, At: t0, Since: t0}.PodCondition()
		if pc.Type != ConditionBatchSlowed || pc.Status != c.status || pc.Reason != string(c.reason) ||
			!pc.LastTransitionTime.Time.Equal(t0) || pc.Message != "m" {
			t.Errorf("%s: %+v", c.reason, pc)
		}
	}
}
