package qos

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func batchPod(name string, inTier bool) BatchPodSample {
	return BatchPodSample{UID: types.UID("uid-" + name), Namespace: "jobs", Name: name, InTier: inTier}
}

// The freezer entries make the tier and the in-place pods frozen as the escalation says:
// the tier first, a pod being deleted thawed, only what differs from what is held, and
// each with why.
func TestPlanFreezes(t *testing.T) {
	t.Parallel()
	a, b := batchPod("a", false), batchPod("b", false)
	gone := b
	gone.Terminating = true
	held := func(frozen ...bool) []PodInForce {
		return []PodInForce{{UID: a.UID, Freezable: true, Frozen: frozen[0]}, {UID: b.UID, Freezable: true, Frozen: frozen[1]}}
	}
	freeze := EscalationDecision{Freeze: true, Froze: true, Reason: EscalationReasonCPUContention}
	tests := []struct {
		name string
		d    EscalationDecision
		pods []BatchPodSample
		in   BatchLimits
		want []string
	}{
		{"a freeze freezes the tier, then each in-place pod", freeze, []BatchPodSample{a, b},
			BatchLimits{HasTier: true, Pods: held(false, false)},
			[]string{"tier:true:" + FreezeStarved, "uid-a:true:" + FreezeStarved, "uid-b:true:" + FreezeStarved}},
		{"what is frozen already is not written again", freeze, []BatchPodSample{a, b},
			BatchLimits{HasTier: true, TierFrozen: true, Pods: held(true, false)},
			[]string{"uid-b:true:" + FreezeStarved}},
		{"a pod being deleted is thawed, never frozen", freeze, []BatchPodSample{a, gone},
			BatchLimits{HasTier: true, TierFrozen: true, Pods: held(false, true)},
			[]string{"uid-a:true:" + FreezeStarved, "uid-b:false:" + ThawTerminating}},
		{"a pod whose cgroup is not open, or below the tier, is not frozen on its own", freeze,
			[]BatchPodSample{a, batchPod("t", true)},
			BatchLimits{HasTier: true, TierFrozen: true, Pods: []PodInForce{{UID: a.UID}, {UID: "uid-t"}}}, nil},
		{"no tier group: only the pods", freeze, []BatchPodSample{a}, BatchLimits{Pods: held(false, false)[:1]},
			[]string{"uid-a:true:" + FreezeStarved}},
		{"thawed after thawAfter", EscalationDecision{Thawed: true, Reason: EscalationReasonBudget}, []BatchPodSample{a, b},
			BatchLimits{HasTier: true, TierFrozen: true, Pods: held(true, true)},
			[]string{"tier:false:" + ThawRoom, "uid-a:false:" + ThawRoom, "uid-b:false:" + ThawRoom}},
		{"thawed when no batch pod is left", EscalationDecision{Thawed: true, Reason: EscalationReasonNoBatch}, nil,
			BatchLimits{HasTier: true, TierFrozen: true}, []string{"tier:false:" + ThawNoBatch}},
		{"a freeze the escalation did not decide (an earlier run's) is thawed", EscalationDecision{Reason: EscalationReasonBudget},
			[]BatchPodSample{a}, BatchLimits{HasTier: true, TierFrozen: true, Pods: held(false, false)[:1]},
			[]string{"tier:false:" + ThawNotDecided}},
		{"what is held for another pod counts as nothing", freeze, []BatchPodSample{b},
			BatchLimits{Pods: held(false, false)[:1]}, nil},
		{"nothing frozen, nothing to freeze: nothing", EscalationDecision{Reason: EscalationReasonBudget},
			[]BatchPodSample{a, b}, BatchLimits{HasTier: true, Pods: held(false, false)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, f := range planFreezes(tc.d, tc.pods, tc.in) {
				if f.Kind == TargetInPlacePod && tc.pods[f.Index].UID != types.UID(f.ID) {
					t.Errorf("entry %+v indexes pod %s", f, tc.pods[f.Index].UID)
				}
				got = append(got, f.ID+":"+map[bool]string{true: "true", false: "false"}[f.Freeze]+":"+f.Reason)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("freezes\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// Throttled in most CFS periods over a statistics interval: an in-place pod hears of its
// own throttling, the pods below the tier of the tier's; lightly throttled groups, too
// short intervals, pods being deleted and periods that are not a statistics interval say
// nothing. The quota said is what the plan leaves in force.
func TestPlanThrottledNotices(t *testing.T) {
	t.Parallel()
	throttled := func(periods, n uint64) (Throttling, bool) { return Throttling{Periods: periods, Throttled: n}, true }
	tests := []struct {
		name   string
		inTier Throttling
		own    func(*BatchPodSample)
		noStat bool
		want   []string // "pod kind" in order
		text   []string
	}{
		{name: "in-place pod throttled hard", own: func(p *BatchPodSample) { p.Throttle, p.ThrottleOK = throttled(10, 8) },
			want: []string{"jobs/inplace BatchThrottled"},
			text: []string{"80% of its CFS periods", "(8 of 10)", "quota of 0.40 cores", "its share of the batch budget, 1.20 cores"}},
		{name: "the tier throttled hard", inTier: Throttling{Periods: 10, Throttled: 6},
			want: []string{"jobs/tier1 BatchThrottled", "jobs/tier2 BatchThrottled"},
			text: []string{"60% of its CFS periods", "quota of 0.90 cores", "the batch tier's share"}},
		{name: "throttled lightly", inTier: Throttling{Periods: 10, Throttled: 1},
			own: func(p *BatchPodSample) { p.Throttle, p.ThrottleOK = throttled(10, 4) }},
		{name: "too few periods", own: func(p *BatchPodSample) { p.Throttle, p.ThrottleOK = throttled(3, 3) }},
		{name: "being deleted", own: func(p *BatchPodSample) {
			p.Throttle, p.ThrottleOK = throttled(10, 8)
			p.Terminating = true
		}},
		{name: "not a statistics interval", inTier: Throttling{Periods: 10, Throttled: 6}, noStat: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inPlace := batchPod("inplace", false)
			if tc.own != nil {
				tc.own(&inPlace)
			}
			s := Sample{Now: time.Unix(1000, 0), Batch: []BatchPodSample{inPlace, batchPod("tier1", true), batchPod("tier2", true)},
				Stats: StatsSample{Due: !tc.noStat, Interval: 10 * time.Second, Tier: tc.inTier, TierOK: true}}
			in := BatchLimits{Tier: CPUConsumer{InForce: CPULimit{Cores: 0.9}},
				Pods: []PodInForce{{UID: inPlace.UID, Freezable: true, Quota: 0.4}}}
			p := Plan{Budget: Budget{Applied: 1.2}}
			Controller{}.planStats(&p, s, in)
			var got []string
			for _, n := range p.Notices {
				got = append(got, n.Pod+" "+string(n.Kind))
				for _, want := range tc.text {
					if !strings.Contains(n.Message, want) {
						t.Errorf("notice %q lacks %q", n.Message, want)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("notices %q, want %q", got, tc.want)
			}
		})
	}
}

// Every statistics interval sets each batch pod's condition: Frozen before Throttled,
// Throttled for a group throttled hard, Running once free again (after the settle time);
// nothing for a pod that always ran free, nor for pods not told; a gone pod is forgotten.
func TestPlanConditions(t *testing.T) {
	t.Parallel()
	c := Controller{Conditions: NewBatchConditions()}
	inPlace, tier1, tier2, free := batchPod("inplace", false), batchPod("tier1", true), batchPod("tier2", true),
		batchPod("free", false)
	pods := []BatchPodSample{inPlace, tier1, tier2, free}
	t0 := time.Unix(1000, 0)
	step := func(now time.Time, tierFrozen bool, tier Throttling, tierOK bool, own map[types.UID]Throttling) Plan {
		s := Sample{Now: now, Batch: slices.Clone(pods), Stats: StatsSample{Due: true, Interval: 10 * time.Second,
			Tier: tier, TierOK: tierOK}}
		var held []PodInForce
		for i, pod := range s.Batch {
			s.Batch[i].Throttle, s.Batch[i].ThrottleOK = own[pod.UID]
			held = append(held, PodInForce{UID: pod.UID, Freezable: !pod.InTier, Quota: 0.4})
		}
		p := Plan{Budget: Budget{Applied: 1.2}}
		c.planStats(&p, s, BatchLimits{HasTier: true, TierFrozen: tierFrozen, Pods: held,
			Tier: CPUConsumer{InForce: CPULimit{Cores: 0.9}}})
		return p
	}
	conds := func(p Plan) []string {
		var out []string
		for _, w := range p.Conditions {
			out = append(out, w.Pod+" "+string(w.Condition.Reason))
		}
		return out
	}
	hard := map[types.UID]Throttling{inPlace.UID: {10, 8}, free.UID: {10, 1}}
	if got := conds(step(t0, false, Throttling{10, 1}, true, hard)); !slices.Equal(got, []string{"jobs/inplace Throttled"}) {
		t.Fatalf("first interval: %q, want only inplace Throttled", got)
	}
	if got := conds(step(t0.Add(10*time.Second), false, Throttling{10, 1}, true, hard)); len(got) != 0 {
		t.Fatalf("same state again: %q, want no write", got)
	}
	c.Conditions.freezeMsg = frozenMessage(Budget{NodeCPUs: 2, LSUsage: 1.8, Min: 0.1}, 5*time.Second)
	p := step(t0.Add(20*time.Second), true, Throttling{}, false, nil)
	if got := conds(p); !slices.Equal(got, []string{"jobs/tier1 Frozen", "jobs/tier2 Frozen"}) ||
		!strings.HasPrefix(p.Conditions[0].Condition.Message, "frozen by the node agent: LS (1.80 cores)") {
		t.Fatalf("tier frozen: %q, want tier1 and tier2 Frozen with the freeze's numbers", got)
	}
	calm := map[types.UID]Throttling{inPlace.UID: {10, 0}}
	if got := conds(step(t0.Add(30*time.Second), false, Throttling{10, 0}, true, calm)); len(got) != 0 {
		t.Fatalf("free again within the settle time: %q, want nothing yet", got)
	}
	got := conds(step(t0.Add(20*time.Second+BatchConditionSettle), false, Throttling{10, 0}, true, calm))
	if !slices.Equal(got, []string{"jobs/inplace Running", "jobs/tier1 Running", "jobs/tier2 Running"}) {
		t.Fatalf("after the settle time: %q, want the three held pods Running", got)
	}
	pods = []BatchPodSample{tier1}
	if p := step(t0.Add(time.Hour), false, Throttling{}, false, nil); !slices.Equal(p.Forget,
		[]types.UID{inPlace.UID, tier2.UID}) {
		t.Fatalf("forgot %q, want inplace and tier2", p.Forget)
	}
}

// A restarted agent takes the condition a pod carries from the earlier run: a stale True
// goes back to Running at once, a pod already Running is not written again.
func TestBatchConditionsSeed(t *testing.T) {
	t.Parallel()
	c := Controller{Conditions: NewBatchConditions()}
	t0 := time.Unix(1000, 0)
	carrying := func(name string, reason BatchSlowReason, msg string) (*corev1.Pod, BatchPodSample) {
		pod := batchPod(name, false)
		w := WrittenBatchCondition{BatchCondition: BatchCondition{Reason: reason, Message: msg}, At: t0, Since: t0}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{w.PodCondition()}}}, pod
	}
	stalePod, stale := carrying("stale", BatchFrozen, "frozen")
	freePod, free := carrying("free", BatchRunning, runningMessage())
	c.Conditions.Seed(stalePod)
	c.Conditions.Seed(freePod)
	c.Conditions.Seed(&corev1.Pod{}) // no UID: ignored
	c.Conditions.Seed(nil)
	if w, ok := c.Conditions.Written(stale.UID); !ok || w.Reason != BatchFrozen || !w.Since.Equal(t0) {
		t.Fatalf("seeded %+v %v, want Frozen since %v", w, ok, t0)
	}
	s := Sample{Now: t0.Add(time.Second), Batch: []BatchPodSample{stale, free},
		Stats: StatsSample{Due: true, Interval: 10 * time.Second}}
	s.Batch[0].Throttle, s.Batch[0].ThrottleOK = Throttling{Periods: 10}, true
	s.Batch[1].Throttle, s.Batch[1].ThrottleOK = Throttling{Periods: 10}, true
	p := Plan{}
	c.planStats(&p, s, BatchLimits{Pods: []PodInForce{{UID: stale.UID, Quota: math.NaN()}, {UID: free.UID}}})
	if len(p.Conditions) != 1 || p.Conditions[0].Pod != "jobs/stale" || p.Conditions[0].Condition.Reason != BatchRunning {
		t.Fatalf("after a restart: %+v, want only the stale pod set Running", p.Conditions)
	}
}

// Seed honours only what the agent writes: a reason it never writes reads as Running
// without a message, and an overlong message as none, and the next plan replaces either
// on a pod that runs free.
func TestBatchConditionsSeedBounds(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", maxSeededMessage+1)
	for _, tc := range []struct {
		name         string
		reason, msg  string
		want         BatchSlowReason
		wantMsg      string
		replacedFree bool // a pod that runs free gets Running written over it
	}{
		{"the agent's Frozen", "Frozen", "frozen", BatchFrozen, "frozen", true},
		{"the agent's Running", "Running", runningMessage(), BatchRunning, runningMessage(), false},
		{"a reason the agent never writes", "Finished", "done", BatchRunning, "", true},
		{"an empty reason", "", "x", BatchRunning, "", true},
		{"an overlong message", "Throttled", long, BatchThrottled, "", true},
		{"an overlong Running message", "Running", long, BatchRunning, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Controller{Conditions: NewBatchConditions()}
			free := batchPod("p", false)
			c.Conditions.Seed(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: free.UID, Namespace: free.Namespace, Name: free.Name},
				Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: ConditionBatchSlowed,
					Status: corev1.ConditionTrue, Reason: tc.reason, Message: tc.msg}}}})
			w, ok := c.Conditions.Written(free.UID)
			if !ok || w.Reason != tc.want || w.Message != tc.wantMsg {
				t.Fatalf("seeded %q/%.20q (%v), want %q/%.20q", w.Reason, w.Message, ok, tc.want, tc.wantMsg)
			}
			t0 := time.Unix(1000, 0)
			s := Sample{Now: t0, Batch: []BatchPodSample{free}, Stats: StatsSample{Due: true, Interval: 10 * time.Second}}
			s.Batch[0].Throttle, s.Batch[0].ThrottleOK = Throttling{Periods: 10}, true
			p := Plan{}
			c.planStats(&p, s, BatchLimits{Pods: []PodInForce{{UID: free.UID}}})
			replaced := len(p.Conditions) == 1 && p.Conditions[0].Condition.Reason == BatchRunning
			if replaced != tc.replacedFree || len(p.Conditions) > 1 {
				t.Fatalf("next plan's conditions %+v, want Running written over it: %v", p.Conditions, tc.replacedFree)
			}
		})
	}
}
