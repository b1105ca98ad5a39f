package koordlet

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/qos"
)

func (r *rig) freezerState(cg string) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.root, "freezer", cg, "freezer.state"))
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// When LS and the system leave batch less than its floor for longer than freezeAfter,
// the tier and the in-place batch pods are frozen; they are thawed once LS leaves room
// again for thawAfter, and on shutdown.
func TestAgentFreezesAndThawsBatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V1Separate, nil)
	crowded := map[string]float64{r.lsCg: 1.95, r.inPlace: 0.02, r.inTier: 0.02}
	r.step(0, nil)
	for range 10 { // 1 s: not yet
		r.step(2, crowded)
	}
	if s := r.freezerState(r.tier); s != "THAWED" {
		t.Fatalf("tier %s after 1 s of contention, want THAWED (freezeAfter 2s)", s)
	}
	for range 15 {
		r.step(2, crowded)
	}
	if s, p := r.freezerState(r.tier), r.freezerState(r.inPlace); s != "FROZEN" || p != "FROZEN" {
		t.Fatalf("tier %s, in-place pod %s after 2.5 s of contention, want FROZEN", s, p)
	}
	st := r.agent.Status()
	if st.Escalation.Level != qos.EscalationFreeze || st.Escalation.Reason != qos.EscalationReasonCPUContention {
		t.Fatalf("escalation = %+v, want freeze for cpu-contention", st.Escalation)
	}
	if v := testutil.ToFloat64(r.agent.escMetrics.Freezes.WithLabelValues(qos.EscalationReasonCPUContention)); v != 1 {
		t.Fatalf("freezes counted %v, want 1", v)
	}
	// Each batch pod was told, with the numbers (kubectl describe shows it).
	for _, name := range []string{"batch-inplace", "batch-tier"} {
		if !r.events.has(name + ": " + EventBatchFrozen + ": frozen by the node agent: LS (") {
			t.Errorf("no %s event on %s; events: %q", EventBatchFrozen, name, r.events.all())
		}
	}
	calm := map[string]float64{r.lsCg: 0.3, r.inPlace: 0, r.inTier: 0}
	for range 70 {
		r.step(0.4, calm)
	}
	if s, p := r.freezerState(r.tier), r.freezerState(r.inPlace); s != "THAWED" || p != "THAWED" {
		t.Fatalf("tier %s, in-place pod %s after LS calmed, want THAWED", s, p)
	}
	// Frozen again, then shut down: nothing stays frozen.
	for range 25 {
		r.step(2, crowded)
	}
	if s := r.freezerState(r.tier); s != "FROZEN" {
		t.Fatalf("tier %s, want FROZEN again", s)
	}
	if p := r.freezerState(r.inPlace); p != "FROZEN" {
		t.Fatalf("in-place pod %s, want FROZEN again", p)
	}
	// A frozen pod that leaves batch runs again at once.
	r.changePods(func(i int, p *corev1.Pod) {
		if i == 1 {
			p.Annotations = map[string]string{"understory.io/qos-class": "LS"}
		}
	})
	if p := r.freezerState(r.inPlace); p != "THAWED" {
		t.Fatalf("pod that left batch is %s, want THAWED", p)
	}
	r.agent.shutdown()
	if s, p := r.freezerState(r.tier), r.freezerState(r.inPlace); s != "THAWED" || p != "THAWED" {
		t.Fatalf("after shutdown tier %s, in-place pod %s: a freeze must never outlive the agent", s, p)
	}
}

// A tier a crashed agent left frozen is thawed when the agent starts.
func TestAgentThawsLeftoverFreezeAtStart(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V1Separate, nil)
	if err := os.WriteFile(filepath.Join(r.root, "freezer", r.tier, "freezer.state"), []byte("FROZEN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(r.agent.cfg, Deps{Pods: newFakePods(), NodeCPU: r.cpu, Logger: r.agent.log}); err != nil {
		t.Fatal(err)
	}
	if s := r.freezerState(r.tier); s != "THAWED" {
		t.Fatalf("tier %s after start, want THAWED", s)
	}
}

// Node memory past the eviction threshold makes the agent submit an eviction of batch
// pods; without an API server (static mode) it is reported, not performed.
func TestAgentReportsEvictionOnMemoryPressure(t *testing.T) {
	t.Parallel()
	m := newMemRig(t, cgroupstest.V2, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = m.agent.evictor.Run(ctx) }()
	busy := map[string]float64{m.lsCg: 0.3, m.inPlace: 0.5, m.inTier: 0.6}
	m.step(0, nil)
	m.step(1, busy)
	m.meminfo(16*gib, gib/2) // 97 % used
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.step(1, busy)
		st := m.agent.Status()
		if st.Escalation.Level == qos.EscalationEvict && st.Evictions.LastRequest != nil &&
			st.Evictions.LastRequest.Outcome != "pending" {
			if st.Escalation.Reason != qos.EvictReasonMemoryPressure || !st.Evictions.DryRun {
				t.Fatalf("escalation %+v, evictions %+v: want a dry-run memory-pressure eviction", st.Escalation, st.Evictions)
			}
			if st.Evictions.LastEviction == nil || !strings.HasPrefix(st.Evictions.LastEviction.Name, "batch-") {
				t.Fatalf("last eviction %+v: want a batch pod reported", st.Evictions.LastEviction)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no eviction reported; escalation %+v evictions %+v", st.Escalation, st.Evictions)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A freeze the kernel does not finish within the control loop's bound (a busy or slow
// node: cgroup v2's cgroup.events still says "frozen 0") goes on in the kernel, since
// cgroup.freeze stays 1: the thaw must still reach the tier once LS leaves room. The fake
// v2 root never reports frozen, so every freeze here times out.
func TestAgentThawsTierWhoseFreezeTimedOut(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	crowded := map[string]float64{r.lsCg: 1.95, r.inPlace: 0.02, r.inTier: 0.02}
	r.step(0, nil)
	for range 25 {
		r.step(2, crowded)
	}
	if f, p := r.file(r.tier, "cgroup.freeze"), r.file(r.inPlace, "cgroup.freeze"); f != "1" || p != "1" {
		t.Fatalf("tier cgroup.freeze %q, in-place pod %q after 2.5 s of contention: want 1 (asked to freeze)", f, p)
	}
	calm := map[string]float64{r.lsCg: 0.3, r.inPlace: 0, r.inTier: 0}
	for range 70 {
		r.step(0.4, calm)
	}
	if f, p := r.file(r.tier, "cgroup.freeze"), r.file(r.inPlace, "cgroup.freeze"); f != "0" || p != "0" {
		t.Fatalf("tier cgroup.freeze %q, in-place pod %q after LS calmed: want 0 (a timed-out freeze thawed too)", f, p)
	}
}
