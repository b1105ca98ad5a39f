package koordlet

import (
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/qos"
)

// fakeConditions records what the control loop hands the writer.
type fakeConditions struct {
	mu     sync.Mutex
	set    []string // "pod: reason: message"
	forgot []types.UID
}

func (f *fakeConditions) Set(pod *corev1.Pod, c corev1.PodCondition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = append(f.set, pod.Name+": "+c.Reason+": "+c.Message)
}

func (f *fakeConditions) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, uid)
}

var _ podConditionSink = (*fakeConditions)(nil)

// The control loop sets the condition end to end: a freeze shows as Frozen, with the
// numbers, on both batch pods at the next statistics interval, and the plan log says so.
func TestAgentSetsBatchConditions(t *testing.T) {
	t.Parallel()
	f := &fakeConditions{}
	r := newRigOpts(t, cgroupstest.V1Separate, rigOptions{conditions: f})
	crowded := map[string]float64{r.lsCg: 1.95, r.inPlace: 0.02, r.inTier: 0.02}
	r.step(0, nil)
	frozen := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, s := range f.set {
			if strings.Contains(s, ": Frozen: frozen by the node agent: LS (") {
				n++
			}
		}
		return n
	}
	for i := 0; frozen() < 2; i++ {
		if i == 2*int(statsInterval/r.period) {
			f.mu.Lock()
			defer f.mu.Unlock()
			t.Fatalf("conditions %q after %d periods of contention: want both batch pods Frozen", f.set, i)
		}
		r.step(2, crowded)
	}
	var said bool
	for _, rec := range r.agent.plans.snapshot().Plans {
		for _, c := range rec.Conditions {
			said = said || c.Reason == string(qos.BatchFrozen)
		}
	}
	if !said {
		t.Fatalf("/debug/plans does not show the Frozen condition: %+v", r.agent.plans.snapshot())
	}
}
