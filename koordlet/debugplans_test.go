package koordlet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/qos"
)

// names names pod entries by kind and index.
type names struct{}

func (names) podName(kind qos.CPUTargetKind, i int) string { return fmt.Sprintf("jobs/%s-%d", kind, i) }

// The log keeps the plans that did something, oldest first, within its size; a period
// that did nothing is only counted, on the next record.
func TestPlanLog(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	cut := func(cores float64) qos.Plan {
		return qos.Plan{Budget: qos.Budget{Applied: cores, Reason: qos.ReasonCut},
			CPU: []qos.CPUEntry{{Kind: qos.TargetTier, ID: "tier", Cores: cores, Write: true, Reason: qos.WriteCut}}}
	}
	frozen := func(now bool) qos.Plan {
		return qos.Plan{Budget: qos.Budget{Applied: 1}, Escalation: qos.EscalationDecision{Level: qos.EscalationFreeze,
			Reason: qos.EscalationReasonCPUContention, Freeze: true, Froze: now}}
	}
	held := func(cores float64) qos.Plan {
		return qos.Plan{Budget: qos.Budget{Applied: cores, Reason: qos.ReasonHold},
			CPU: []qos.CPUEntry{{Kind: qos.TargetTier, Cores: cores, Reason: qos.WriteDeadbandHeld}}}
	}
	tests := []struct {
		name       string
		plans      []qos.Plan
		wantBudget []float64 // the records' budgets, oldest first
		wantQuiet  []int     // their quietPeriodsBefore
		quietNow   int
	}{
		{"a plan that writes is kept", []qos.Plan{cut(1)}, []float64{1}, []int{0}, 0},
		{"periods that do nothing are counted, not kept", []qos.Plan{cut(1), held(1), held(1), cut(0.5), held(0.5)},
			[]float64{1, 0.5}, []int{0, 2}, 1},
		{"a budget that moved without a write is only counted",
			[]qos.Plan{cut(1), {Budget: qos.Budget{Applied: 0.98, Reason: qos.ReasonCut}}}, []float64{1}, []int{0}, 1},
		{"a graded action that changed is kept, one that lasts is counted",
			[]qos.Plan{cut(1), frozen(false), frozen(false), frozen(true), frozen(false)}, []float64{1, 1, 1}, []int{0, 0, 1},
			1},
		{"the oldest go past the size", []qos.Plan{cut(4), cut(3), cut(2), cut(1), cut(0.5)}, []float64{2, 1, 0.5},
			[]int{0, 0, 0}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newPlanLog(3)
			for i, p := range tc.plans {
				l.add(t0.Add(time.Duration(i)*time.Second), planKindPeriod, p, names{})
			}
			s := l.snapshot()
			var budgets []float64
			var quiet []int
			for _, r := range s.Plans {
				budgets = append(budgets, r.BudgetCores)
				quiet = append(quiet, r.QuietPeriodsBefore)
			}
			if fmt.Sprint(budgets) != fmt.Sprint(tc.wantBudget) || fmt.Sprint(quiet) != fmt.Sprint(tc.wantQuiet) ||
				s.QuietPeriods != tc.quietNow || s.Capacity != 3 {
				t.Fatalf("records %v quiet %v (now %d, capacity %d), want %v %v (%d, 3)", budgets, quiet, s.QuietPeriods,
					s.Capacity, tc.wantBudget, tc.wantQuiet, tc.quietNow)
			}
		})
	}
}

// A record says every write with its group, pod and reason, the freezer writes, the
// escalation, the eviction's candidates, the batch resources handed over, the events and
// the conditions.
func TestPlanRecord(t *testing.T) {
	t.Parallel()
	req := qos.EvictionRequest{Reason: qos.EvictReasonCPUStarvation}
	p := qos.Plan{Budget: qos.Budget{Applied: 0.1, Reason: qos.ReasonCut}, Cause: qos.SignalPSICPU,
		PodMemory: []qos.MemoryEntry{{ID: "u", Max: 1 << 30, Write: true, Reason: qos.WriteUnknown}, {Reason: qos.WriteDeadbandHeld}},
		CPU: []qos.CPUEntry{{Kind: qos.TargetInPlacePod, Index: 1, Cores: 0.05, Write: true, Reason: qos.WriteCut},
			{Kind: qos.TargetTier, Cores: 0.05, Reason: qos.WriteDeadbandHeld}},
		TierMemory:      qos.MemoryEntry{Max: 2 << 30, Write: true, Reason: qos.WriteCut},
		Escalation:      qos.EscalationDecision{Level: qos.EscalationEvict, Reason: qos.EvictReasonCPUStarvation, Evict: &req},
		Freezes:         []qos.FreezeEntry{{Kind: qos.TargetInPlacePod, Index: 2, Freeze: true, Reason: qos.FreezeStarved}},
		EvictCandidates: []qos.EvictionCandidate{{Namespace: "jobs", Name: "a"}, {Namespace: "jobs", Name: "b"}},
		Reclaim:         true, Reclaimed: qos.Reclaimed{CPU: qos.ReclaimTerms{Published: 1.5, Write: true, Reason: qos.ReasonReclaimDrop}},
		Notices: []qos.Notice{{UID: "u", Pod: "jobs/a", Kind: qos.NoticeFrozen, Message: "frozen"}},
		Conditions: []qos.ConditionWrite{{Pod: "jobs/a", Condition: qos.WrittenBatchCondition{
			BatchCondition: qos.BatchCondition{Reason: qos.BatchFrozen, Message: "frozen"}}}},
		Forget: []types.UID{"gone"}}
	r, ok := recordOf(p, names{}, true)
	if !ok {
		t.Fatal("a plan that writes is not recorded")
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"budgetCores":0.1,"reason":"cut","cause":"psi_cpu"`,
		`{"target":"podMemory","pod":"jobs/podMemory-0","bytes":1073741824,"reason":"unknown limit: rewrite"}`,
		`{"target":"inPlacePod","pod":"jobs/inPlacePod-1","cores":0.05,"reason":"cut"}`,
		`{"target":"tierMemory","bytes":2147483648,"reason":"cut"}`,
		`"freezes":[{"target":"inPlacePod","pod":"jobs/batchPod-2","freeze":true,"reason":"` + qos.FreezeStarved + `"}]`,
		`"level":"evict"`, `"evictCandidates":["jobs/a","jobs/b"]`,
		`"batchResources":{"cpuMilli":1500,"memoryBytes":0,"cpuReason":"drop","memoryReason":""}`,
		`"events":[{"uid":"u","pod":"jobs/a","kind":"BatchFrozen","message":"frozen"}]`,
		`"conditions":[{"pod":"jobs/a","status":"True","reason":"Frozen","message":"frozen"}]`,
		`"forgotConditions":["gone"]`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("record %s\nlacks %s", b, want)
		}
	}
	if strings.Contains(string(b), "deadband") {
		t.Errorf("record %s shows held entries; it lists writes only", b)
	}
}

// /debug/plans on the agent's HTTP server: the last periods' writes with their reasons,
// pods by name, as JSON.
func TestDebugPlansHTTP(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	srv := httptest.NewServer(r.agent.Handler(r.reg))
	defer srv.Close()
	r.warmUp()
	crowded := map[string]float64{r.lsCg: 1.6, r.inPlace: 0.1, r.inTier: 0.1}
	r.step(1.9, crowded) // LS rises: the budget is cut
	for range 3 {
		r.step(1.9, crowded)
	}
	resp, err := http.Get(srv.URL + "/debug/plans")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/debug/plans = %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var got planLogStatus
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Capacity != planLogSize || len(got.Plans) < 2 {
		t.Fatalf("capacity %d, %d plans: want %d and the first period and the cut:\n%s", got.Capacity, len(got.Plans),
			planLogSize, body)
	}
	last := got.Plans[len(got.Plans)-1]
	var inPlace bool
	for _, w := range last.Writes {
		if w.Target == string(qos.TargetInPlacePod) && w.Pod == "default/batch-inplace" && w.Cores != nil && w.Reason == qos.WriteCut {
			inPlace = true
		}
	}
	if last.Kind != planKindPeriod || last.Reason != qos.ReasonCut || !inPlace {
		t.Fatalf("last record %+v: want the cut, the in-place pod's quota cut by name", last)
	}
	if got.QuietPeriods == 0 {
		t.Fatalf("quiet periods 0 after three periods of the same load:\n%s", body)
	}
}
