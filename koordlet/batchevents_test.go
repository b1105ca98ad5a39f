package koordlet

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

func batchPodState(name string, inTier bool, quota float64) *podState {
	st := &podState{uid: types.UID("uid-" + name), namespace: "jobs", name: name, class: qos.ClassBatch, inTier: inTier,
		quota: unknownCPU()}
	st.quota.Cores = quota
	return st
}

// A freeze tells every batch pod the agent knows by name, with the numbers behind it,
// once per batchEventEvery; LS pods, terminating pods and nameless (static) pods get
// nothing.
func TestBatchEventsFrozen(t *testing.T) {
	t.Parallel()
	rec := &fakeEvents{}
	e := newBatchEvents(rec)
	ls := batchPodState("ls", false, 0)
	ls.class = qos.ClassLS
	gone := batchPodState("gone", true, 0)
	gone.terminating = true
	nameless := batchPodState("", true, 0)
	pods := []*podState{batchPodState("a", true, 0), batchPodState("b", false, 0.5), ls, gone, nameless}
	d := qos.EscalationDecision{Froze: true, Freeze: true, StarvedFor: metav1.Duration{Duration: 12 * time.Second}}
	b := qos.Budget{NodeCPUs: 2, LSUsage: 1.7, SystemUsage: 0.2, Raw: -0.1, Min: 0.1}
	now := time.Unix(1000, 0)
	e.frozen(pods, d, b, now)
	if len(rec.msgs) != 2 {
		t.Fatalf("events %q: want one on each of the two batch pods", rec.msgs)
	}
	for i, name := range []string{"a", "b"} {
		m := rec.msgs[i]
		for _, want := range []string{name + ": " + EventBatchFrozen, "LS (1.70 cores)", "leave batch 0.00 of 2 CPUs",
			"floor of 0.10", "for 12s"} {
			if !strings.Contains(m, want) {
				t.Errorf("event %q lacks %q", m, want)
			}
		}
	}
	e.frozen(pods, d, b, now.Add(batchEventEvery-time.Second))
	if len(rec.msgs) != 2 {
		t.Fatalf("a second freeze within %v recorded again: %q", batchEventEvery, rec.msgs)
	}
	e.frozen(pods, d, b, now.Add(batchEventEvery))
	if len(rec.msgs) != 4 {
		t.Fatalf("a freeze %v later: %d events, want 4", batchEventEvery, len(rec.msgs))
	}
}

// Throttled in most CFS periods: an in-place pod hears of its own throttling, the pods
// below the tier of the tier's; lightly throttled groups and too short intervals say
// nothing.
func TestBatchEventsThrottled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ts   func(inPlace *podState) []throttling
		want []string // "pod: reason" prefixes, in order
		text []string
	}{
		{"in-place pod throttled hard", func(p *podState) []throttling {
			return []throttling{{st: p, periods: 10, throttled: 8}}
		}, []string{"inplace: " + EventBatchThrottled}, []string{"80% of its CFS periods", "(8 of 10)", "quota of 0.40 cores",
			"its share of the batch budget, 1.20 cores"}},
		{"the tier throttled hard", func(*podState) []throttling {
			return []throttling{{periods: 10, throttled: 6}}
		}, []string{"tier1: " + EventBatchThrottled, "tier2: " + EventBatchThrottled},
			[]string{"60% of its CFS periods", "quota of 0.90 cores", "the batch tier's share"}},
		{"throttled lightly", func(p *podState) []throttling {
			return []throttling{{st: p, periods: 10, throttled: 4}, {periods: 10, throttled: 1}}
		}, nil, nil},
		{"too few periods", func(p *podState) []throttling {
			return []throttling{{st: p, periods: 3, throttled: 3}}
		}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &fakeEvents{}
			e := newBatchEvents(rec)
			inPlace := batchPodState("inplace", false, 0.4)
			pods := []*podState{batchPodState("tier1", true, 0), batchPodState("tier2", true, 0), inPlace}
			e.throttled(pods, tc.ts(inPlace), 0.9, 1.2, 10*time.Second, time.Unix(1000, 0))
			if len(rec.msgs) != len(tc.want) {
				t.Fatalf("events %q, want %d", rec.msgs, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(rec.msgs[i], w) {
					t.Errorf("event %q, want it to start %q", rec.msgs[i], w)
				}
				for _, s := range tc.text {
					if !strings.Contains(rec.msgs[i], s) {
						t.Errorf("event %q lacks %q", rec.msgs[i], s)
					}
				}
			}
		})
	}
}
