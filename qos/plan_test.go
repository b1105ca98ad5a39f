package qos_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/qos"
)

// entryString renders a plan entry compactly: kind[index]=cores(write|hold: reason).
func entryString(e qos.CPUEntry) string {
	verb := "hold"
	if e.Write {
		verb = "write"
	}
	return fmt.Sprintf("%s[%d]=%.3f/%v %s %s", e.Kind, e.Index, e.Cores, e.Quota, verb, e.Reason)
}

func TestPlanCPU(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	p := qos.WritePolicy{CFSPeriod: 100 * time.Millisecond, MinPodCPU: 0.01}
	inForce := func(cores float64, ago time.Duration) qos.CPULimit {
		return qos.CPULimit{Cores: cores, Written: now.Add(-ago)}
	}
	idle := func(cores float64, ago time.Duration) qos.CPUConsumer {
		return qos.CPUConsumer{ID: "c", DemandOK: true, InForce: inForce(cores, ago)}
	}
	tests := []struct {
		name string
		in   qos.CPUPlanInput
		want []string
	}{
		{
			name: "first period: every limit unknown is written, the tier alone takes the budget",
			in:   qos.CPUPlanInput{Budget: 1, Tier: qos.CPUConsumer{ID: "tier", InForce: qos.UnknownCPULimit()}},
			want: []string{"tier[0]=1.000/100ms write " + qos.WriteUnknown},
		},
		{
			name: "cuts before raises, tier pods cut before the tier and raised after it",
			in: qos.CPUPlanInput{Budget: 1,
				Tier:     qos.CPUConsumer{ID: "tier", Demand: 1, DemandOK: true, InForce: inForce(0.3, time.Second)},
				TierPods: []qos.CPUConsumer{{ID: "tp", Limit: 2, InForce: inForce(0.3, time.Second)}},
				InPlace:  []qos.CPUConsumer{idle(0.7, time.Second)}},
			want: []string{
				"inPlacePod[0]=0.010/1ms write " + qos.WriteCut,
				"tier[0]=0.990/99ms write " + qos.WriteRaise,
				"tierPod[0]=0.990/99ms write " + qos.WriteRaise,
			},
		},
		{
			name: "a change within the deadband is held",
			in:   qos.CPUPlanInput{Budget: 0.53, Tier: idle(0.5, time.Second)},
			want: []string{"tier[0]=0.530/53ms hold " + qos.WriteDeadbandHeld},
		},
		{
			name: "a raise within a CFS period of the last write is held, a cut is not",
			in: qos.CPUPlanInput{Budget: 1, Tier: qos.CPUConsumer{ID: "tier", Demand: 0.9, DemandOK: true, InForce: inForce(0.5, 50*time.Millisecond)},
				InPlace: []qos.CPUConsumer{idle(0.8, 50*time.Millisecond)}},
			want: []string{
				"inPlacePod[0]=0.010/1ms write " + qos.WriteCut,
				"tier[0]=0.990/99ms hold " + qos.WritePaced,
			},
		},
		{
			name: "the 1 ms floor: a zero share is written as the kernel's minimum",
			in:   qos.CPUPlanInput{Budget: 0, Tier: idle(0.5, time.Second)},
			want: []string{"tier[0]=0.000/1ms write " + qos.WriteCut},
		},
		{
			name: "a cut the kernel clamped is not asked for again while unchanged",
			in: qos.CPUPlanInput{Budget: 0.1, Tier: qos.CPUConsumer{ID: "tier", DemandOK: true,
				InForce: qos.CPULimit{Cores: 2, Written: now.Add(-time.Second), Clamped: 0.1}}},
			want: []string{"tier[0]=0.100/10ms hold " + qos.WriteClamped},
		},
		{
			name: "a cut away from the clamped one is asked for",
			in: qos.CPUPlanInput{Budget: 0.5, Tier: qos.CPUConsumer{ID: "tier", DemandOK: true,
				InForce: qos.CPULimit{Cores: 2, Written: now.Add(-time.Second), Clamped: 0.1}}},
			want: []string{"tier[0]=0.500/50ms write " + qos.WriteCut},
		},
		{
			name: "shutdown writes every change, deadband and pacing aside",
			in: qos.CPUPlanInput{Budget: 0.02, Final: true, Tier: idle(0.05, 0),
				InPlace: []qos.CPUConsumer{idle(0.05, 0)}},
			want: []string{
				"tier[0]=0.010/1ms write " + qos.WriteShutdown,
				"inPlacePod[0]=0.010/1ms write " + qos.WriteShutdown,
			},
		},
		{
			name: "shutdown leaves a limit already at its share alone",
			in:   qos.CPUPlanInput{Budget: 0.1, Final: true, Tier: idle(0.1, 0)},
			want: []string{"tier[0]=0.100/10ms hold " + qos.WriteUnchanged},
		},
		{
			name: "the tier needs no more than its pods' limits when every pod has one",
			in: qos.CPUPlanInput{Budget: 1, Tier: qos.CPUConsumer{ID: "tier", InForce: qos.UnknownCPULimit()},
				TierPods: []qos.CPUConsumer{{ID: "tp", Limit: 0.3, InForce: qos.UnknownCPULimit()}}},
			want: []string{
				"tierPod[0]=0.300/30ms write " + qos.WriteUnknown,
				"tier[0]=0.300/30ms write " + qos.WriteUnknown,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.in.Now = now
			plan := p.PlanCPU(tc.in)
			var got []string
			sum := 0.0
			for _, e := range plan {
				got = append(got, entryString(e))
				if e.Kind != qos.TargetTierPod {
					sum += e.Cores
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if sum > tc.in.Budget+1e-9 {
				t.Fatalf("shares add up to %v > budget %v", sum, tc.in.Budget)
			}
		})
	}
}

func TestPlanMemory(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	const mib = 1 << 20
	at := func(bytes float64, written, busy time.Duration) qos.MemoryLimit {
		l := qos.MemoryLimit{Bytes: bytes, Written: now.Add(-written)}
		if busy > 0 {
			l.Busy = now.Add(-busy)
		}
		return l
	}
	tests := []struct {
		name   string
		cur    qos.MemoryLimit
		want   float64
		write  bool
		reason string
	}{
		{"unknown is written", qos.UnknownMemoryLimit(), 512 * mib, true, qos.WriteUnknown},
		{"a cut is written at once", at(1024*mib, 0, 0), 1000 * mib, true, qos.WriteCut},
		{"a refused cut waits a second", at(1024*mib, time.Minute, 500*time.Millisecond), 512 * mib, false, qos.WriteMemoryBusy},
		{"a refused cut is retried after a second", at(1024*mib, time.Minute, 2*time.Second), 512 * mib, true, qos.WriteCut},
		{"a raise within the deadband is held", at(1024*mib, time.Minute, 0), 1030 * mib, false, qos.WriteDeadbandHeld},
		{"a raise within a second of the last write is held", at(1024*mib, 500*time.Millisecond, 0), 2048 * mib, false, qos.WriteMemoryPaced},
		{"a raise past both is written", at(1024*mib, 2*time.Second, 0), 2048 * mib, true, qos.WriteRaise},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := qos.PlanMemory(tc.cur, tc.want, now)
			if e.Write != tc.write || e.Reason != tc.reason || e.Max != int64(tc.want) ||
				e.High != int64(float64(int64(tc.want))*qos.MemoryHighShare) {
				t.Fatalf("PlanMemory = %+v; want write %t (%s) of %v", e, tc.write, tc.reason, tc.want)
			}
		})
	}
}

func TestTierMemoryLimit(t *testing.T) {
	t.Parallel()
	const gib = 1 << 30
	for _, tc := range []struct {
		name                    string
		capacity, ls, threshold float64
		want                    float64
	}{
		{"capacity × threshold − LS", 16 * gib, 4 * gib, 0.9, 16*gib*0.9 - 4*gib},
		{"never below the 64 MiB floor", 16 * gib, 15 * gib, 0.9, qos.MinTierMemory},
		{"never above the capacity", 16 * gib, 0, 1.5, 16 * gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := qos.TierMemoryLimit(tc.capacity, tc.ls, tc.threshold); got != tc.want {
				t.Fatalf("TierMemoryLimit = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWantsMore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		usage, quota float64
		want         bool
	}{
		{0.95, 1, true},   // within 10 %
		{0.85, 1, false},  // not
		{0.09, 0.1, true}, // within 0.02
		{0.07, 0.1, false},
		{0, 0.01, false}, // idle at a tiny quota: not hungry (the split used to flip)
		{0.006, 0.01, true},
		{1, math.NaN(), false},
		{1, -1, false},
	} {
		if got := qos.WantsMore(tc.usage, tc.quota); got != tc.want {
			t.Errorf("WantsMore(%v, %v) = %t, want %t", tc.usage, tc.quota, got, tc.want)
		}
	}
}

func TestAttribute(t *testing.T) {
	t.Parallel()
	ls := func(u float64, fresh bool) qos.PodSample {
		return qos.PodSample{Class: qos.ClassLS, Fresh: fresh, Open: true, Usage: u}
	}
	inPlace := qos.PodSample{Class: qos.ClassBatch, Mismatched: true, Fresh: true, Open: true, Usage: 0.5}
	be := qos.PodSample{Class: qos.ClassBE, Open: true, Usage: 0.2}
	tests := []struct {
		name string
		in   qos.CPUSample
		want qos.Attribution
	}{
		{
			name: "aggregates: LS is kubepods less BestEffort, the tier and the pods outside their class's cgroup",
			in: qos.CPUSample{CPUs: 4, NodeCores: 3, Kubepods: 2.5, KubepodsOK: true, BestEffort: 0.2, BestEffortOK: true,
				Tier: 0.6, TierOK: true, Pods: []qos.PodSample{ls(0.9, false), inPlace, be}},
			want: qos.Attribution{LS: 0.9, LSEstimate: 2.5 - 0.2 - 0.6 - 0.5, UnknownPods: 2.5 - 0.2 - 0.6 - 0.5 - 0.9,
				BE: 0.2, Batch: 1.1, System: 0.5, HasBatch: true},
		},
		{
			name: "a tier inside BestEffort is not subtracted twice",
			in: qos.CPUSample{NodeCores: 3, Kubepods: 2.5, KubepodsOK: true, BestEffort: 0.8, BestEffortOK: true,
				Tier: 0.6, TierOK: true, TierInBE: true, Pods: []qos.PodSample{ls(1.7, true)}},
			want: qos.Attribution{LS: 1.7, LSEstimate: 1.7, BE: 0, Batch: 0.6, System: 0.5},
		},
		{
			name: "no aggregates: fresh LS pods plus what the last slow period left unattributed",
			in: qos.CPUSample{NodeCores: 3, Kubepods: 2.5, KubepodsOK: true, Unattributed: 0.3,
				Pods: []qos.PodSample{ls(1, true), ls(0.4, false), inPlace}},
			want: qos.Attribution{LS: 1, LSEstimate: 1.3, UnknownPods: 0.3, Unattributed: 0.3, Batch: 0.5, System: 0.5,
				HasBatch: true},
		},
		{
			name: "a slow period measures what is unattributed",
			in: qos.CPUSample{NodeCores: 3, Kubepods: 2.5, KubepodsOK: true, Unattributed: 0.3, Slow: true,
				Pods: []qos.PodSample{ls(1, true), inPlace}},
			want: qos.Attribution{LS: 1, LSEstimate: 2, UnknownPods: 1, Unattributed: 1, Batch: 0.5, System: 0.5,
				HasBatch: true},
		},
		{
			name: "without kubepods, system is the node less what the pods used",
			in:   qos.CPUSample{NodeCores: 3, Pods: []qos.PodSample{ls(1, true), inPlace, be}},
			want: qos.Attribution{LS: 1, LSEstimate: 1, BE: 0.2, Batch: 0.5, System: 1.3, HasBatch: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := qos.Attribute(tc.in)
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if !near(got.LS, tc.want.LS) || !near(got.LSEstimate, tc.want.LSEstimate) ||
				!near(got.UnknownPods, tc.want.UnknownPods) || !near(got.BE, tc.want.BE) ||
				!near(got.Batch, tc.want.Batch) || !near(got.System, tc.want.System) ||
				!near(got.Unattributed, tc.want.Unattributed) || got.HasBatch != tc.want.HasBatch {
				t.Fatalf("Attribute = %+v\nwant        %+v", got, tc.want)
			}
		})
	}
}
