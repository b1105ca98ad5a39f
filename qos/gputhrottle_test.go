package qos_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

const gpuStep = 100 * time.Millisecond

var gpuT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func TestDefaultGPUThrottlePolicy(t *testing.T) {
	t.Parallel()
	p := qos.DefaultGPUThrottlePolicy()
	want := qos.GPUThrottlePolicy{
		Period: escDur(100 * time.Millisecond), LSUtilOnPercent: 2, LSUtilOffPercent: 1,
		Hold: escDur(time.Second), LSWakeCPUPercent: 20, StarveAfter: escDur(5 * time.Minute),
		MPS: qos.GPUMPSPolicy{LSHeadroomPercent: 25, MinBatchPercent: 10, MaxBatchPercent: 25,
			FreezeMarginPercent: 5, DemandWindow: escDur(time.Minute)},
	}
	if p != want {
		t.Fatalf("DefaultGPUThrottlePolicy() = %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func fptr(v float64) *float64 { return &v }

func TestGPUThrottlePolicyValidate(t *testing.T) {
	t.Parallel()
	with := withDefaults(qos.DefaultGPUThrottlePolicy)
	tests := []struct {
		name   string
		p      qos.GPUThrottlePolicy
		wantIn []string // substrings of the error; nil = valid
	}{
		{name: "default", p: qos.DefaultGPUThrottlePolicy()},
		{name: "no hold, no escalation", p: with(func(p *qos.GPUThrottlePolicy) { p.Hold, p.StarveAfter = escDur(0), escDur(0) })},
		{name: "off 0", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = 0 })},
		{name: "period bounds", p: with(func(p *qos.GPUThrottlePolicy) { p.Period = escDur(time.Second) })},
		{name: "mps batch 1..99", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.MinBatchPercent, p.MPS.MaxBatchPercent = 1, 99 })},

		{name: "period too short", p: with(func(p *qos.GPUThrottlePolicy) { p.Period = escDur(time.Millisecond) }),
			wantIn: []string{"gpu throttle period: 1ms must be in [10ms, 1s]"}},
		{name: "period too long", p: with(func(p *qos.GPUThrottlePolicy) { p.Period = escDur(2 * time.Second) }),
			wantIn: []string{"period: 2s"}},
		{name: "on 0", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOnPercent = 0 }),
			wantIn: []string{"lsUtilOnPercent: 0 must be in (0, 100]"}},
		{name: "on NaN", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOnPercent = math.NaN() }),
			wantIn: []string{"lsUtilOnPercent: NaN"}},
		{name: "on above 100", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOnPercent = 101 }),
			wantIn: []string{"lsUtilOnPercent: 101"}},
		{name: "off equals on", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = 2 }),
			wantIn: []string{"lsUtilOffPercent: 2 must be below lsUtilOnPercent (2)"}},
		{name: "off negative", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = -1 }),
			wantIn: []string{"lsUtilOffPercent: -1 must be in [0, lsUtilOnPercent)"}},
		{name: "hold negative", p: with(func(p *qos.GPUThrottlePolicy) { p.Hold = escDur(-time.Second) }),
			wantIn: []string{"hold: -1s must be >= 0"}},
		{name: "starveAfter negative", p: with(func(p *qos.GPUThrottlePolicy) { p.StarveAfter = escDur(-time.Second) }),
			wantIn: []string{"starveAfter: -1s must be >= 0"}},
		{name: "wake off", p: with(func(p *qos.GPUThrottlePolicy) { p.LSWakeCPUPercent = 0 })},
		{name: "wake negative", p: with(func(p *qos.GPUThrottlePolicy) { p.LSWakeCPUPercent = -1 }),
			wantIn: []string{"lsWakeCPUPercent: -1 must be in [0, 10000] (0: off)"}},
		{name: "wake NaN", p: with(func(p *qos.GPUThrottlePolicy) { p.LSWakeCPUPercent = math.NaN() }),
			wantIn: []string{"lsWakeCPUPercent: NaN"}},
		{name: "removed activeDuty names its replacement", p: with(func(p *qos.GPUThrottlePolicy) { p.RemovedActiveDuty = fptr(0.3) }),
			wantIn: []string{"gpu throttle activeDuty: 0.3: key removed with the fractional duty cycle", "gpu.throttle.hold"}},
		{name: "removed maxDuty", p: with(func(p *qos.GPUThrottlePolicy) { p.RemovedMaxDuty = fptr(0.9) }),
			wantIn: []string{"maxDuty: 0.9: key removed", "gpu.throttle.starveAfter"}},
		{name: "removed restorePerSecond", p: with(func(p *qos.GPUThrottlePolicy) { p.RemovedRestorePerSecond = fptr(0.1) }),
			wantIn: []string{"restorePerSecond: 0.1: key removed", "gpu.throttle.hold"}},
		{name: "mps max batch 100 (unlimited)", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.MaxBatchPercent = 100 }),
			wantIn: []string{"mps.maxBatchPercent: 100 must be in [1, 99]: never an unlimited batch client"}},
		{name: "mps min above max", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.MinBatchPercent = 30 }),
			wantIn: []string{"mps.minBatchPercent: 30 must not exceed maxBatchPercent (25)"}},
		{name: "mps ls cap above 100", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.LSCapPercent = 101 }),
			wantIn: []string{"mps.lsCapPercent: 101 must be in [0, 100]"}},
		{name: "mps min 0", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.MinBatchPercent = 0 }),
			wantIn: []string{"mps.minBatchPercent: 0 must be in [1, maxBatchPercent]"}},
		{name: "mps headroom NaN", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.LSHeadroomPercent = math.NaN() }),
			wantIn: []string{"mps.lsHeadroomPercent: NaN"}},
		{name: "mps margin", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.FreezeMarginPercent = -1 }),
			wantIn: []string{"mps.freezeMarginPercent: -1"}},
		{name: "mps window", p: with(func(p *qos.GPUThrottlePolicy) { p.MPS.DemandWindow = escDur(0) }),
			wantIn: []string{"mps.demandWindow: 0s must be in [1s, 1h0m0s]"}},
		{name: "zero policy", p: qos.GPUThrottlePolicy{},
			wantIn: []string{"period", "lsUtilOnPercent", "mps.maxBatchPercent", "mps.demandWindow"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.p.Validate()
			checkValidate(t, err, tc.wantIn)
			if removed := strings.Contains(tc.name, "removed"); removed != errors.Is(err, qos.ErrGPUThrottleKeyRemoved) {
				t.Fatalf("errors.Is(err, ErrGPUThrottleKeyRemoved) = %v, want %v", !removed, removed)
			}
		})
	}
}

// A policy read from YAML over the defaults keeps the fields it does not name; a removed
// key of the duty cycle is read, and refused by Validate.
func TestGPUThrottlePolicyYAML(t *testing.T) {
	t.Parallel()
	p := qos.DefaultGPUThrottlePolicy()
	if err := yaml.UnmarshalStrict([]byte("period: 50ms\nhold: 2s\nstarveAfter: 0s\nmps:\n  maxBatchPercent: 20\n"), &p); err != nil {
		t.Fatal(err)
	}
	want := qos.DefaultGPUThrottlePolicy()
	want.Period, want.Hold, want.StarveAfter, want.MPS.MaxBatchPercent = escDur(50*time.Millisecond), escDur(2*time.Second), escDur(0), 20
	if p != want {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	old := qos.DefaultGPUThrottlePolicy()
	if err := yaml.UnmarshalStrict([]byte("maxDuty: 0.9\nactiveDuty: 0.3\n"), &old); err != nil {
		t.Fatal(err)
	}
	if err := old.Validate(); !errors.Is(err, qos.ErrGPUThrottleKeyRemoved) || !errors.Is(err, qos.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "maxDuty") || !strings.Contains(err.Error(), "activeDuty") {
		t.Fatalf("an old duty-cycle config: %v", err)
	}
	// The defaults marshal without the removed keys.
	b, err := yaml.Marshal(qos.DefaultGPUThrottlePolicy())
	if err != nil || strings.Contains(string(b), "Duty") || strings.Contains(string(b), "restore") {
		t.Fatalf("defaults marshal to %s (%v)", b, err)
	}
}

func TestNewGPUThrottleForcesRange(t *testing.T) {
	t.Parallel()
	bad := qos.GPUThrottlePolicy{
		Period: escDur(time.Hour), LSUtilOnPercent: math.NaN(), LSUtilOffPercent: 50, Hold: escDur(-1),
		LSWakeCPUPercent: math.Inf(1), StarveAfter: escDur(-1), RemovedMaxDuty: fptr(2),
		MPS: qos.GPUMPSPolicy{LSHeadroomPercent: -1, MinBatchPercent: 50, MaxBatchPercent: 100,
			FreezeMarginPercent: math.Inf(1), DemandWindow: escDur(-1)},
	}
	got := qos.NewGPUThrottle(bad, gpuStep).Policy()
	if err := got.Validate(); err != nil {
		t.Fatalf("forced policy does not validate: %v (%+v)", err, got)
	}
	want := qos.DefaultGPUThrottlePolicy()
	want.StarveAfter = escDur(0) // a broken starveAfter never escalates
	if got != want {
		t.Fatalf("forced = %+v, want %+v", got, want)
	}
	// An off threshold above a valid but low on threshold is bounded by it.
	p := qos.DefaultGPUThrottlePolicy()
	p.LSUtilOnPercent, p.LSUtilOffPercent = 0.5, 8
	if got := qos.NewGPUThrottle(p, gpuStep).Policy(); got.LSUtilOffPercent != 0.25 {
		t.Fatalf("off forced to %v, want 0.25", got.LSUtilOffPercent)
	}
}

// gpuStepCase is one Step of a scripted trace for GPU 0 and what it must decide.
type gpuStepCase struct {
	at         time.Duration // since gpuT0
	in         qos.GPUThrottleInput
	frozen     bool
	reason     string
	starvedFor *time.Duration // nil: not checked
	escalate   bool
	clockJump  bool
	sanitized  string // substring; "" = must be empty
}

// ls builds an input for GPU 0 with one batch pod, time-sliced (the freeze lever).
func ls(active bool, util float64) qos.GPUThrottleInput {
	return qos.GPUThrottleInput{LSActive: active, LSUtil: util, BatchUtil: 40, BatchPods: 1}
}

// tsl is in on the timeslice lever.
func tsl(in qos.GPUThrottleInput) qos.GPUThrottleInput {
	in.Timeslice = true
	return in
}

// arrive is ls(true, util) with an LS process that was not there at the last step.
func arrive(util float64) qos.GPUThrottleInput {
	in := ls(true, util)
	in.LSArrived = true
	return in
}

// cpu is ls(true, util) with LS's CPU measured at pct percent of a core.
func cpu(util, pct float64) qos.GPUThrottleInput {
	in := ls(true, util)
	in.LSCPUPercent, in.LSCPUKnown = pct, true
	return in
}

// mps is an LS process and a batch pod both MPS clients with caps lsCap and batchCap.
func mps(util float64, lsCap, batchCap int) qos.GPUThrottleInput {
	in := ls(true, util)
	in.MPS, in.LSCapPercent, in.BatchCapPercent = true, lsCap, batchCap
	return in
}

// every repeats in every gpuStep from `from` to `to` (inclusive), expecting frozen and reason.
func every(from, to time.Duration, in qos.GPUThrottleInput, frozen bool, reason string) []gpuStepCase {
	var out []gpuStepCase
	for at := from; at <= to; at += gpuStep {
		out = append(out, gpuStepCase{at: at, in: in, frozen: frozen, reason: reason})
	}
	return out
}

func dur(d time.Duration) *time.Duration { return &d }

func concat(parts ...[]gpuStepCase) []gpuStepCase {
	var out []gpuStepCase
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestGPUThrottleTraces(t *testing.T) {
	t.Parallel()
	const s = time.Second
	const ms = time.Millisecond
	def := qos.DefaultGPUThrottlePolicy()
	tests := []struct {
		name   string
		policy func(*qos.GPUThrottlePolicy)
		steps  []gpuStepCase
	}{
		{name: "idle: no LS, batch runs", steps: every(0, 3*s, ls(false, 0), false, qos.GPUReasonIdle)},
		{name: "no batch: nothing to freeze, then a batch pod is frozen at once", steps: concat(
			every(0, s, qos.GPUThrottleInput{LSActive: true, LSUtil: 80}, false, qos.GPUReasonNoBatch),
			[]gpuStepCase{{at: 1100 * ms, in: ls(true, 80), frozen: true, reason: qos.GPUReasonLSUtil}},
		)},
		{name: "LS arrives where batch runs: frozen in the same step", steps: concat(
			every(0, 500*ms, ls(false, 0), false, qos.GPUReasonIdle),
			[]gpuStepCase{{at: 600 * ms, in: arrive(0), frozen: true, reason: qos.GPUReasonLSArrived}},
			// The driver's sample lags: LS reads 0 for 700 ms, then shows its work.
			every(700*ms, 1300*ms, ls(true, 0), true, qos.GPUReasonHold),
			every(1400*ms, 5*s, ls(true, 33), true, qos.GPUReasonLSUtil),
		)},
		{name: "LS holds its context and sends nothing: thawed after hold (1 s)", steps: concat(
			[]gpuStepCase{{at: 0, in: arrive(0), frozen: true, reason: qos.GPUReasonLSArrived}},
			every(100*ms, 900*ms, ls(true, 0), true, qos.GPUReasonHold),
			// Batch runs at full speed from 1 s on: no duty, within the 2 s target.
			every(s, 10*s, ls(true, 0), false, qos.GPUReasonIdle),
		)},
		{name: "burst: frozen in the same step, thawed hold after LS went idle", steps: concat(
			every(0, 200*ms, ls(false, 0), false, qos.GPUReasonIdle),
			every(300*ms, 1*s, ls(true, 90), true, qos.GPUReasonLSUtil),
			// LS idle from 1.1 s (it keeps its context): hold until 1 s + 1 s.
			every(1100*ms, 1900*ms, ls(true, 0), true, qos.GPUReasonHold),
			every(2*s, 3*s, ls(true, 0), false, qos.GPUReasonIdle),
		)},
		{name: "hysteresis: between off and on stays frozen; below on does not freeze again", steps: concat(
			every(0, 0, ls(true, 30), true, qos.GPUReasonLSUtil),
			every(100*ms, s, ls(true, 1.5), true, qos.GPUReasonLSUtil), // 1 <= 1.5 < 2: still needed
			every(1100*ms, 1900*ms, ls(true, 0.5), true, qos.GPUReasonHold),
			every(2000*ms, 3*s, ls(true, 0.5), false, qos.GPUReasonIdle),
			every(3100*ms, 4*s, ls(true, 1.5), false, qos.GPUReasonIdle), // not re-engaged below on
			every(4100*ms, 4100*ms, ls(true, 2), true, qos.GPUReasonLSUtil),
		)},
		{name: "flapping utilisation: never thawed", steps: func() []gpuStepCase {
			var out []gpuStepCase
			for i := range 100 {
				util := 80.0
				if i%2 == 1 {
					util = 0
				}
				out = append(out, gpuStepCase{at: time.Duration(i) * gpuStep, in: ls(true, util), frozen: true})
			}
			return out
		}()},
		{name: "LS wakes on the CPU before its GPU sample: frozen in the same step", steps: concat(
			every(0, 500*ms, cpu(0, 1), false, qos.GPUReasonIdle),
			[]gpuStepCase{{at: 600 * ms, in: cpu(0, 60), frozen: true, reason: qos.GPUReasonLSWoke}},
			// Still busy on the CPU, the sample not in yet: the hold keeps batch frozen...
			every(700*ms, 1*s, cpu(0, 60), true, qos.GPUReasonHold),
			// ... until the driver's sample shows the work.
			every(1100*ms, 3*s, cpu(33, 60), true, qos.GPUReasonLSUtil),
		)},
		{name: "busy on the CPU, never on the GPU: one hold, not a freeze for as long as it is busy", steps: concat(
			every(0, 100*ms, cpu(0, 0), false, qos.GPUReasonIdle),
			[]gpuStepCase{{at: 200 * ms, in: cpu(0, 100), frozen: true, reason: qos.GPUReasonLSWoke}},
			every(300*ms, 1100*ms, cpu(0, 100), true, qos.GPUReasonHold),
			every(1200*ms, 4*s, cpu(0, 100), false, qos.GPUReasonIdle),
			// Idle on the CPU, then busy again: a second wake.
			every(4100*ms, 4100*ms, cpu(0, 5), false, qos.GPUReasonIdle),
			[]gpuStepCase{{at: 4200 * ms, in: cpu(0, 100), frozen: true, reason: qos.GPUReasonLSWoke}},
		)},
		{name: "no wake without a measured step before: first measurement busy, or after a gap", steps: []gpuStepCase{
			{at: 0, in: cpu(0, 90), frozen: false, reason: qos.GPUReasonIdle},
			{at: gpuStep, in: ls(true, 0), frozen: false, reason: qos.GPUReasonIdle},
			{at: 2 * gpuStep, in: cpu(0, 90), frozen: false, reason: qos.GPUReasonIdle},
			{at: 3 * gpuStep, in: qos.GPUThrottleInput{Unknown: true}, frozen: false, reason: qos.GPUReasonUnknown,
				sanitized: "unknown GPU"},
			{at: 4 * gpuStep, in: cpu(0, 0), frozen: false, reason: qos.GPUReasonIdle},
			{at: 5 * gpuStep, in: cpu(0, 90), frozen: true, reason: qos.GPUReasonLSWoke},
		}},
		{name: "wake below the threshold, or the signal off", policy: func(p *qos.GPUThrottlePolicy) {
			p.LSWakeCPUPercent = 0
		}, steps: []gpuStepCase{
			{at: 0, in: cpu(0, 0), frozen: false, reason: qos.GPUReasonIdle},
			{at: gpuStep, in: cpu(0, 100), frozen: false, reason: qos.GPUReasonIdle},
		}},
		{name: "an unusable CPU figure is no wake", steps: []gpuStepCase{
			{at: 0, in: cpu(0, 0), frozen: false, reason: qos.GPUReasonIdle},
			{at: gpuStep, in: cpu(0, math.NaN()), frozen: false, reason: qos.GPUReasonIdle, sanitized: "lsCpu=NaN unusable"},
			{at: 2 * gpuStep, in: cpu(0, 100), frozen: false, reason: qos.GPUReasonIdle},
		}},
		{name: "MPS: a wake is no reason to freeze", steps: []gpuStepCase{
			{at: 0, in: func() qos.GPUThrottleInput { in := mps(10, 75, 25); in.LSCPUKnown = true; return in }(),
				frozen: false, reason: qos.GPUReasonMPSWithinCap},
			{at: gpuStep, in: func() qos.GPUThrottleInput {
				in := mps(10, 75, 25)
				in.LSCPUPercent, in.LSCPUKnown = 100, true
				return in
			}(), frozen: false, reason: qos.GPUReasonMPSWithinCap},
		}},
		{name: "hold 0: thawed the step LS goes idle", policy: func(p *qos.GPUThrottlePolicy) { p.Hold = escDur(0) },
			steps: []gpuStepCase{
				{at: 0, in: arrive(0), frozen: true, reason: qos.GPUReasonLSArrived},
				{at: gpuStep, in: ls(true, 0), frozen: false, reason: qos.GPUReasonIdle},
			}},
		{name: "MPS: LS within its partition never freezes, not even on arrival", steps: concat(
			[]gpuStepCase{{at: 0, in: func() qos.GPUThrottleInput { in := mps(0, 75, 25); in.LSArrived = true; return in }(),
				frozen: false, reason: qos.GPUReasonMPSWithinCap}},
			every(100*ms, 3*s, mps(45, 75, 25), false, qos.GPUReasonMPSWithinCap),
			every(3100*ms, 4*s, mps(69.9, 75, 25), false, qos.GPUReasonMPSWithinCap),
		)},
		{name: "MPS: LS outgrows what batch's fixed cap leaves: frozen, thawed hold after", steps: concat(
			every(0, 500*ms, mps(30, 90, 40), false, qos.GPUReasonMPSWithinCap),
			// protected = min(90, 100-40) = 60; 55 >= 60-5.
			every(600*ms, s, mps(55, 90, 40), true, qos.GPUReasonMPSCapStale),
			every(1100*ms, 1900*ms, mps(20, 90, 40), true, qos.GPUReasonHold),
			every(2*s, 2*s, mps(20, 90, 40), false, qos.GPUReasonMPSWithinCap),
		)},
		{name: "MPS: LS at its own cap freezes", steps: []gpuStepCase{
			{at: 0, in: mps(71, 75, 25), frozen: true, reason: qos.GPUReasonMPSCapStale},
		}},
		{name: "MPS: an unlimited batch cap protects nothing", steps: []gpuStepCase{
			{at: 0, in: mps(0, 0, 100), frozen: true, reason: qos.GPUReasonMPSCapStale,
				sanitized: "batchCap=100: no partition"},
		}},
		{name: "MPS turns off (a non-client LS arrives): the freeze lever", steps: []gpuStepCase{
			{at: 0, in: mps(30, 75, 25), frozen: false, reason: qos.GPUReasonMPSWithinCap},
			{at: gpuStep, in: arrive(30), frozen: true, reason: qos.GPUReasonLSUtil},
		}},
		{name: "timeslice lever: LS working never freezes batch", steps: []gpuStepCase{
			{at: 0, in: tsl(arrive(50)), frozen: false, reason: qos.GPUReasonTimeslice},
			{at: gpuStep, in: tsl(ls(true, 90)), frozen: false, reason: qos.GPUReasonTimeslice},
		}},
		{name: "timeslice lever left while LS works: frozen at once", steps: []gpuStepCase{
			{at: 0, in: tsl(ls(true, 50)), frozen: false, reason: qos.GPUReasonTimeslice},
			{at: gpuStep, in: ls(true, 0), frozen: true, reason: qos.GPUReasonHold},
			{at: 2 * gpuStep, in: ls(true, 60), frozen: true, reason: qos.GPUReasonLSUtil},
		}},
		{name: "timeslice lever left with LS idle: nothing frozen", steps: []gpuStepCase{
			{at: 0, in: tsl(ls(true, 0)), frozen: false, reason: qos.GPUReasonTimeslice},
			{at: gpuStep, in: ls(true, 0), frozen: false, reason: qos.GPUReasonIdle},
		}},
		{name: "timeslice with MPS: ignored, the MPS lever", steps: []gpuStepCase{
			{at: 0, in: tsl(mps(71, 75, 25)), frozen: true, reason: qos.GPUReasonMPSCapStale},
		}},
		{name: "timeslice lever without batch", steps: []gpuStepCase{
			{at: 0, in: tsl(qos.GPUThrottleInput{LSActive: true, LSUtil: 40}), frozen: false, reason: qos.GPUReasonNoBatch},
		}},
		{name: "starvation: escalate after starveAfter frozen", policy: func(p *qos.GPUThrottlePolicy) {
			p.StarveAfter = escDur(5 * s)
		}, steps: []gpuStepCase{
			{at: 0, in: ls(true, 0), frozen: false, reason: qos.GPUReasonIdle},
			{at: s, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(0)},
			{at: 5900 * ms, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(4900 * ms)},
			{at: 6 * s, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(5 * s), escalate: true},
			// LS leaves: still frozen during the hold, so still starved.
			{at: 6500 * ms, in: ls(false, 0), frozen: true, reason: qos.GPUReasonHold, starvedFor: dur(5500 * ms), escalate: true},
			{at: 7 * s, in: ls(false, 0), frozen: false, reason: qos.GPUReasonIdle},
			// Frozen again: the timer starts over.
			{at: 7100 * ms, in: ls(true, 60), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(0)},
			{at: 8 * s, in: ls(true, 60), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(900 * ms)},
		}},
		{name: "starveAfter 0 never escalates", policy: func(p *qos.GPUThrottlePolicy) { p.StarveAfter = escDur(0) },
			steps: []gpuStepCase{
				{at: 0, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil},
				{at: 9 * time.Minute, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(9 * time.Minute)},
			}},
		{name: "unknown GPU holds its state and restarts the starvation timer", policy: func(p *qos.GPUThrottlePolicy) {
			p.StarveAfter = escDur(time.Second)
		}, steps: []gpuStepCase{
			{at: 0, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil},
			{at: 900 * ms, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(900 * ms)},
			{at: s, in: qos.GPUThrottleInput{Unknown: true}, frozen: true, reason: qos.GPUReasonUnknown, starvedFor: dur(0),
				sanitized: "unknown GPU"},
			{at: 1900 * ms, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(900 * ms)},
			{at: 2 * s, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil, starvedFor: dur(s), escalate: true},
		}},
		{name: "clock back: the hold restarts", steps: []gpuStepCase{
			{at: 10 * s, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil},
			{at: 5 * s, in: ls(false, 0), frozen: true, reason: qos.GPUReasonHold, clockJump: true},
			{at: 5900 * ms, in: ls(false, 0), frozen: true, reason: qos.GPUReasonHold},
			{at: 6 * s, in: ls(false, 0), frozen: false, reason: qos.GPUReasonIdle},
		}},
		{name: "forward gap: the hold restarts", steps: []gpuStepCase{
			{at: 0, in: ls(true, 50), frozen: true, reason: qos.GPUReasonLSUtil},
			{at: time.Hour, in: ls(false, 0), frozen: true, reason: qos.GPUReasonHold, clockJump: true},
			{at: time.Hour + s, in: ls(false, 0), frozen: false, reason: qos.GPUReasonIdle},
		}},
		{name: "bad inputs are worst for LS", steps: []gpuStepCase{
			{at: 0, in: qos.GPUThrottleInput{LSUtil: math.NaN(), BatchPods: 1}, frozen: true, reason: qos.GPUReasonLSUtil,
				sanitized: "lsUtil=NaN unusable: assumed 100"},
			{at: gpuStep, in: qos.GPUThrottleInput{LSUtil: -3, BatchUtil: math.Inf(1), BatchPods: 1}, frozen: true,
				reason: qos.GPUReasonLSUtil, sanitized: "batchUtil=+Inf unusable"},
			{at: 2 * gpuStep, in: qos.GPUThrottleInput{LSUtil: 250, BatchPods: -2}, frozen: false, reason: qos.GPUReasonNoBatch,
				sanitized: "batchPods=-2 negative"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := def
			if tc.policy != nil {
				tc.policy(&p)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("test policy invalid: %v", err)
			}
			// Steps are sparse where nothing changes: a control period of a minute puts the
			// jump check at 10 minutes; the jump cases jump further.
			c := qos.NewGPUThrottle(p, time.Minute)
			for i, st := range tc.steps {
				out := c.Step(gpuT0.Add(st.at), []qos.GPUThrottleInput{st.in})
				if len(out) != 1 {
					t.Fatalf("step %d: %d decisions", i, len(out))
				}
				d := out[0]
				if d.Frozen != st.frozen || (st.reason != "" && d.Reason != st.reason) {
					t.Fatalf("step %d at %v: frozen %v reason %q, want %v %q (%+v)", i, st.at, d.Frozen, d.Reason,
						st.frozen, st.reason, d)
				}
				if wantDuty := map[bool]float64{true: 1, false: 0}[d.Frozen]; d.Duty != wantDuty {
					t.Fatalf("step %d: duty %v with frozen %v", i, d.Duty, d.Frozen)
				}
				wantLever := map[bool]string{true: qos.GPULeverMPS, false: qos.GPULeverFreeze}[st.in.MPS && !st.in.Unknown]
				if st.in.Timeslice && !st.in.MPS && !st.in.Unknown {
					wantLever = qos.GPULeverTimeslice
				}
				if d.Lever != wantLever {
					t.Fatalf("step %d: lever %q, want %q", i, d.Lever, wantLever)
				}
				if d.Starved != d.Frozen {
					t.Fatalf("step %d at %v: starved %v, frozen %v", i, st.at, d.Starved, d.Frozen)
				}
				if st.starvedFor != nil && d.StarvedFor.Duration != *st.starvedFor {
					t.Fatalf("step %d at %v: starvedFor %v, want %v", i, st.at, d.StarvedFor.Duration, *st.starvedFor)
				}
				if !d.Starved && d.StarvedFor.Duration != 0 {
					t.Fatalf("step %d: starvedFor %v while not starved", i, d.StarvedFor.Duration)
				}
				if d.Escalate != st.escalate || d.ClockJump != st.clockJump {
					t.Fatalf("step %d at %v: escalate %v clockJump %v, want %v %v", i, st.at, d.Escalate, d.ClockJump,
						st.escalate, st.clockJump)
				}
				if (st.sanitized == "") != (d.Sanitized == "") || !strings.Contains(d.Sanitized, st.sanitized) {
					t.Fatalf("step %d: sanitized %q, want %q", i, d.Sanitized, st.sanitized)
				}
			}
		})
	}
}

// Under a random flapping LS that never stays idle for hold, batch is never thawed once
// frozen: no burst of batch work for the next LS request to wait behind.
func TestGPUThrottleNoOscillation(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	x := uint64(42)
	thaws, lastBusy := 0, 0
	frozen := false
	for i := range 3000 { // 5 minutes at 100 ms
		x = x*6364136223846793005 + 1442695040888963407
		util := 0.0
		if x&(3<<20) != 0 || i-lastBusy >= 5 { // busy at least every 500 ms (hold: 1 s)
			util, lastBusy = float64(x>>33)/float64(1<<31)*100+2, i
		}
		d := c.Step(gpuT0.Add(time.Duration(i)*gpuStep), []qos.GPUThrottleInput{{LSActive: true, LSUtil: util, BatchPods: 2}})[0]
		if frozen && !d.Frozen {
			thaws++
		}
		frozen = d.Frozen
	}
	if thaws != 0 || !frozen {
		t.Fatalf("batch thawed %d times under a flapping LS (hold 1 s, LS busy every 500 ms)", thaws)
	}
}

func TestGPUThrottleManyGPUs(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	out := c.Step(gpuT0, []qos.GPUThrottleInput{
		{Index: 3, LSActive: true, LSUtil: 60, BatchPods: 1},
		{Index: 1, BatchPods: 2},
		{Index: 2, LSActive: true, BatchPods: 1},
		{Index: 4, LSActive: true, LSUtil: 30, BatchPods: 1, MPS: true, LSCapPercent: 75, BatchCapPercent: 25},
	})
	type row struct {
		gpu    int
		frozen bool
		reason string
	}
	var got []row
	for _, d := range out {
		got = append(got, row{d.GPU, d.Frozen, d.Reason})
	}
	want := []row{{1, false, qos.GPUReasonIdle}, {2, false, qos.GPUReasonIdle}, {3, true, qos.GPUReasonLSUtil},
		{4, false, qos.GPUReasonMPSWithinCap}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decisions %+v, want %+v (sorted by GPU)", got, want)
	}

	// GPU 3 missing from a step is forgotten; back without LS, it starts thawed.
	c.Step(gpuT0.Add(gpuStep), []qos.GPUThrottleInput{{Index: 1, BatchPods: 1}})
	out = c.Step(gpuT0.Add(2*gpuStep), []qos.GPUThrottleInput{{Index: 3, BatchPods: 1}})
	if out[0].Frozen || out[0].Reason != qos.GPUReasonIdle {
		t.Fatalf("a forgotten GPU came back with %+v", out[0])
	}

	// A repeated index is merged, worst case for LS, and noted: MPS only if both are.
	out = c.Step(gpuT0.Add(3*gpuStep), []qos.GPUThrottleInput{
		{Index: 0, LSActive: true, LSUtil: 10, BatchPods: 1, MPS: true, LSCapPercent: 75, BatchCapPercent: 25},
		{Index: 0, LSActive: true, LSUtil: 0, BatchPods: 3},
		{Index: 0, Unknown: true},
	})
	if len(out) != 1 || !out[0].Frozen || out[0].Lever != qos.GPULeverFreeze || out[0].BatchPods != 3 ||
		!strings.Contains(out[0].Sanitized, "merged") {
		t.Fatalf("merged duplicate = %+v", out)
	}
	// Two MPS entries: the larger batch cap and memory limit and the smaller LS cap.
	out = c.Step(gpuT0.Add(4*gpuStep), []qos.GPUThrottleInput{
		{Index: 5, LSActive: true, LSUtil: 10, BatchPods: 1, MPS: true, LSCapPercent: 75, BatchCapPercent: 25,
			BatchMemLimitMiB: 2048},
		{Index: 5, LSActive: true, LSUtil: 10, BatchPods: 1, MPS: true, LSCapPercent: 90, BatchCapPercent: 40,
			BatchMemLimitMiB: 4096},
	})
	if d := out[0]; d.Lever != qos.GPULeverMPS || d.LSCapPercent != 75 || d.BatchCapPercent != 40 || d.ProtectedPercent != 60 ||
		d.BatchMemLimitMiB != 4096 {
		t.Fatalf("merged MPS entries = %+v", d)
	}
	// One of them unbounded: unbounded.
	out = c.Step(gpuT0.Add(4*gpuStep), []qos.GPUThrottleInput{
		{Index: 5, LSActive: true, LSUtil: 10, BatchPods: 1, MPS: true, LSCapPercent: 75, BatchCapPercent: 25,
			BatchMemLimitMiB: 2048},
		{Index: 5, LSActive: true, LSUtil: 10, BatchPods: 1, MPS: true, LSCapPercent: 75, BatchCapPercent: 25},
	})
	if d := out[0]; d.Lever != qos.GPULeverMPS || d.BatchMemLimitMiB != 0 {
		t.Fatalf("merged MPS entries, one unbounded = %+v", d)
	}
	// The freeze lever reports no memory limit.
	out = c.Step(gpuT0.Add(4*gpuStep), []qos.GPUThrottleInput{
		{Index: 5, LSActive: true, LSUtil: 10, BatchPods: 1, BatchMemLimitMiB: 2048},
	})
	if d := out[0]; d.Lever != qos.GPULeverFreeze || d.BatchMemLimitMiB != 0 {
		t.Fatalf("freeze lever = %+v", d)
	}

	c.Reset()
	out = c.Step(gpuT0.Add(5*gpuStep), []qos.GPUThrottleInput{{Index: 0, BatchPods: 1}})
	if out[0].Frozen || out[0].Reason != qos.GPUReasonIdle {
		t.Fatalf("after Reset: %+v", out[0])
	}
	if out := c.Step(gpuT0.Add(6*gpuStep), nil); len(out) != 0 {
		t.Fatalf("no GPUs: %+v", out)
	}
}

// Decisions go to /status as JSON and come back unchanged.
func TestGPUThrottleDecisionJSON(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	in := []qos.GPUThrottleInput{{Index: 1, LSActive: true, LSUtil: 80, BatchUtil: 30, BatchPods: 2, MPS: true,
		LSCapPercent: 75, BatchCapPercent: 25}}
	c.Step(gpuT0, in)
	d := c.Step(gpuT0.Add(900*time.Millisecond), in)[0]
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"gpu":1`, `"lever":"mps"`, `"frozen":true`, `"duty":1`, `"reason":"mps-cap-stale"`,
		`"lsUtilPercent":80`, `"batchUtilPercent":30`, `"lsCapPercent":75`, `"batchCapPercent":25`,
		`"protectedPercent":75`, `"starvedFor":"900ms"`, `"starved":true`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
	var back qos.GPUThrottleDecision
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, d) {
		t.Fatalf("round trip %+v != %+v", back, d)
	}
}

// Whatever the inputs and the clock, every decision stays in range and JSON-encodable,
// and batch is frozen whenever LS needs the GPU.
func FuzzGPUThrottle(f *testing.F) {
	f.Add(true, 50.0, 20.0, 1, int64(100), false, true, math.NaN(), 0.0, 0, int64(-5000), true, false, 0, 0)
	f.Add(false, -1.0, math.Inf(1), -3, int64(0), true, false, 101.0, 7.0, 2, int64(3600_000), false, true, 75, 25)
	f.Add(true, 70.0, 0.0, 1, int64(50), false, true, 71.0, 7.0, 1, int64(50), false, true, 200, -4)
	f.Fuzz(func(t *testing.T, act1 bool, ls1, b1 float64, pods1 int, dt1 int64, unk1 bool,
		act2 bool, ls2, b2 float64, pods2 int, dt2 int64, unk2 bool, useMPS bool, lsCap, batchCap int) {
		p := qos.DefaultGPUThrottlePolicy()
		p.StarveAfter = escDur(time.Second)
		c := qos.NewGPUThrottle(p, gpuStep)
		now := gpuT0
		for i := range 50 {
			in := qos.GPUThrottleInput{LSActive: act1, LSArrived: i == 0, LSUtil: ls1, BatchUtil: b1, BatchPods: pods1, Unknown: unk1}
			dt := dt1
			if i%2 == 1 {
				in = qos.GPUThrottleInput{LSActive: act2, LSUtil: ls2, BatchUtil: b2, BatchPods: pods2, Unknown: unk2}
				dt = dt2
			}
			in.MPS, in.LSCapPercent, in.BatchCapPercent = useMPS, lsCap, batchCap
			now = now.Add(time.Duration(dt) * time.Millisecond)
			for _, d := range c.Step(now, []qos.GPUThrottleInput{in}) {
				if (d.Duty != 0 && d.Duty != 1) || d.Frozen != (d.Duty == 1) ||
					!(d.LSUtil >= 0 && d.LSUtil <= 100) || !(d.BatchUtil >= 0 && d.BatchUtil <= 100) || d.BatchPods < 0 ||
					d.StarvedFor.Duration < 0 || (d.Escalate && !d.Starved) || d.Starved != d.Frozen ||
					d.ProtectedPercent < 0 || d.ProtectedPercent > 100 {
					t.Fatalf("step %d: out of range %+v", i, d)
				}
				if d.Reason == qos.GPUReasonLSUtil || d.Reason == qos.GPUReasonLSArrived || d.Reason == qos.GPUReasonMPSCapStale {
					if d.BatchPods > 0 && !d.Frozen {
						t.Fatalf("step %d: LS needs the GPU (%s) but batch runs: %+v", i, d.Reason, d)
					}
				}
				if _, err := json.Marshal(d); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
		}
	})
}
