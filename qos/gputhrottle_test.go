package qos_test

import (
	"encoding/json"
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
		Period: escDur(100 * time.Millisecond), LSUtilOnPercent: 25, LSUtilOffPercent: 10,
		ActiveDuty: 0.3, MaxDuty: 0.9, RestorePerSecond: 0.1,
		Hold: escDur(2 * time.Second), StarveAfter: escDur(5 * time.Minute),
	}
	if p != want {
		t.Fatalf("DefaultGPUThrottlePolicy() = %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestGPUThrottlePolicyValidate(t *testing.T) {
	t.Parallel()
	with := withDefaults(qos.DefaultGPUThrottlePolicy)
	tests := []struct {
		name   string
		p      qos.GPUThrottlePolicy
		wantIn []string // substrings of the error; nil = valid
	}{
		{name: "default", p: qos.DefaultGPUThrottlePolicy()},
		{name: "utilisation only", p: with(func(p *qos.GPUThrottlePolicy) { p.ActiveDuty = 0 })},
		{name: "full freeze", p: with(func(p *qos.GPUThrottlePolicy) { p.MaxDuty, p.ActiveDuty = 1, 1 })},
		{name: "no hold, no escalation", p: with(func(p *qos.GPUThrottlePolicy) { p.Hold, p.StarveAfter = escDur(0), escDur(0) })},
		{name: "off 0", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = 0 })},
		{name: "period bounds", p: with(func(p *qos.GPUThrottlePolicy) { p.Period = escDur(time.Second) })},

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
		{name: "off equals on", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = 25 }),
			wantIn: []string{"lsUtilOffPercent: 25 must be below lsUtilOnPercent (25)"}},
		{name: "off negative", p: with(func(p *qos.GPUThrottlePolicy) { p.LSUtilOffPercent = -1 }),
			wantIn: []string{"lsUtilOffPercent: -1 must be in [0, lsUtilOnPercent)"}},
		{name: "max 0", p: with(func(p *qos.GPUThrottlePolicy) { p.MaxDuty, p.ActiveDuty = 0, 0 }),
			wantIn: []string{"maxDuty: 0 must be in (0, 1]"}},
		{name: "max above 1", p: with(func(p *qos.GPUThrottlePolicy) { p.MaxDuty = 1.5 }),
			wantIn: []string{"maxDuty: 1.5"}},
		{name: "active above max", p: with(func(p *qos.GPUThrottlePolicy) { p.ActiveDuty = 0.95 }),
			wantIn: []string{"activeDuty: 0.95 must not exceed maxDuty (0.9)"}},
		{name: "active NaN", p: with(func(p *qos.GPUThrottlePolicy) { p.ActiveDuty = math.NaN() }),
			wantIn: []string{"activeDuty: NaN must be in [0, maxDuty]"}},
		{name: "restore 0", p: with(func(p *qos.GPUThrottlePolicy) { p.RestorePerSecond = 0 }),
			wantIn: []string{"restorePerSecond: 0 must be a finite duty per second > 0"}},
		{name: "restore Inf", p: with(func(p *qos.GPUThrottlePolicy) { p.RestorePerSecond = math.Inf(1) }),
			wantIn: []string{"restorePerSecond: +Inf"}},
		{name: "hold negative", p: with(func(p *qos.GPUThrottlePolicy) { p.Hold = escDur(-time.Second) }),
			wantIn: []string{"hold: -1s must be >= 0"}},
		{name: "starveAfter negative", p: with(func(p *qos.GPUThrottlePolicy) { p.StarveAfter = escDur(-time.Second) }),
			wantIn: []string{"starveAfter: -1s must be >= 0"}},
		{name: "zero policy", p: qos.GPUThrottlePolicy{},
			wantIn: []string{"period", "lsUtilOnPercent", "maxDuty", "restorePerSecond"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkValidate(t, tc.p.Validate(), tc.wantIn)
		})
	}
}

// A policy read from YAML over the defaults keeps the fields it does not name.
func TestGPUThrottlePolicyYAML(t *testing.T) {
	t.Parallel()
	p := qos.DefaultGPUThrottlePolicy()
	if err := yaml.Unmarshal([]byte("period: 50ms\nmaxDuty: 1\nstarveAfter: 0s\n"), &p); err != nil {
		t.Fatal(err)
	}
	want := qos.DefaultGPUThrottlePolicy()
	want.Period, want.MaxDuty, want.StarveAfter = escDur(50*time.Millisecond), 1, escDur(0)
	if p != want {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestNewGPUThrottleForcesRange(t *testing.T) {
	t.Parallel()
	bad := qos.GPUThrottlePolicy{
		Period: escDur(time.Hour), LSUtilOnPercent: math.NaN(), LSUtilOffPercent: 50, ActiveDuty: 2,
		MaxDuty: -1, RestorePerSecond: math.Inf(1), Hold: escDur(-1), StarveAfter: escDur(-1),
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
	p.LSUtilOnPercent, p.LSUtilOffPercent = 6, 8
	if got := qos.NewGPUThrottle(p, gpuStep).Policy(); got.LSUtilOffPercent != 3 {
		t.Fatalf("off forced to %v, want 3", got.LSUtilOffPercent)
	}
}

// gpuStepCase is one Step of a scripted trace for GPU 0 and what it must decide.
type gpuStepCase struct {
	at         time.Duration // since gpuT0
	in         qos.GPUThrottleInput
	duty       float64
	reason     string
	starvedFor *time.Duration // nil: not checked
	escalate   bool
	clockJump  bool
	sanitized  string // substring; "" = must be empty
}

// ls builds an input for GPU 0 with one batch pod.
func ls(active bool, util float64) qos.GPUThrottleInput {
	return qos.GPUThrottleInput{LSActive: active, LSUtil: util, BatchUtil: 40, BatchPods: 1}
}

// every repeats in every gpuStep from `from` to `to` (inclusive), expecting duty and reason.
func every(from, to time.Duration, in qos.GPUThrottleInput, duty float64, reason string) []gpuStepCase {
	var out []gpuStepCase
	for at := from; at <= to; at += gpuStep {
		out = append(out, gpuStepCase{at: at, in: in, duty: duty, reason: reason})
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
		{name: "idle: no LS, batch runs", steps: every(0, 3*s, ls(false, 0), 0, qos.GPUReasonIdle)},
		{name: "no batch: nothing to freeze, then a batch pod is cut at once", steps: concat(
			every(0, s, qos.GPUThrottleInput{LSActive: true, LSUtil: 80}, 0, qos.GPUReasonNoBatch),
			[]gpuStepCase{{at: 1100 * ms, in: ls(true, 80), duty: 0.9, reason: qos.GPUReasonLSUtil}},
		)},
		{name: "LS becomes active: cut to activeDuty at once", steps: concat(
			every(0, 500*ms, ls(false, 0), 0, qos.GPUReasonIdle),
			every(600*ms, 2*s, ls(true, 0), 0.3, qos.GPUReasonLSActive),
		)},
		{name: "burst: cut to maxDuty in the same step, hold, then restore at 0.1/s", steps: concat(
			every(0, 200*ms, ls(false, 0), 0, qos.GPUReasonIdle),
			every(300*ms, 1*s, ls(true, 90), 0.9, qos.GPUReasonLSUtil),
			// LS gone at 1.1 s: hold until 1 s + 2 s.
			every(1100*ms, 2900*ms, ls(false, 0), 0.9, qos.GPUReasonHold),
			[]gpuStepCase{
				{at: 3 * s, in: ls(false, 0), duty: 0.89, reason: qos.GPUReasonRestoring},
				{at: 4 * s, in: ls(false, 0), duty: 0.79, reason: qos.GPUReasonRestoring},
				{at: 11 * s, in: ls(false, 0), duty: 0.09, reason: qos.GPUReasonRestoring},
				{at: 12 * s, in: ls(false, 0), duty: 0, reason: qos.GPUReasonIdle},
				{at: 13 * s, in: ls(false, 0), duty: 0, reason: qos.GPUReasonIdle},
			},
		)},
		{name: "hysteresis: between off and on keeps the cut; below off restores to activeDuty", steps: concat(
			every(0, 0, ls(true, 30), 0.9, qos.GPUReasonLSUtil),
			every(100*ms, s, ls(true, 15), 0.9, qos.GPUReasonLSUtil), // 10 <= 15 < 25: still high
			every(1100*ms, 2900*ms, ls(true, 20), 0.9, qos.GPUReasonLSUtil),
			// Released at 3 s; the last trigger was at 2.9 s, so the hold ends at 4.9 s.
			every(3*s, 4800*ms, ls(true, 5), 0.9, qos.GPUReasonHold),
			[]gpuStepCase{
				{at: 4900 * ms, in: ls(true, 5), duty: 0.89, reason: qos.GPUReasonRestoring},
				{at: 9900 * ms, in: ls(true, 5), duty: 0.39, reason: qos.GPUReasonRestoring},
				{at: 10900 * ms, in: ls(true, 5), duty: 0.3, reason: qos.GPUReasonLSActive},
				// Back between off and on: not re-engaged (15 < 25).
				{at: 11900 * ms, in: ls(true, 15), duty: 0.3, reason: qos.GPUReasonLSActive},
			},
		)},
		{name: "flapping utilisation: duty never moves", steps: func() []gpuStepCase {
			var out []gpuStepCase
			for i := range 100 {
				util := 80.0
				if i%2 == 1 {
					util = 0
				}
				out = append(out, gpuStepCase{at: time.Duration(i) * gpuStep, in: ls(true, util), duty: 0.9})
			}
			return out
		}()},
		{name: "flapping presence: duty stays at activeDuty", steps: func() []gpuStepCase {
			var out []gpuStepCase
			for i := range 100 {
				out = append(out, gpuStepCase{at: time.Duration(i) * gpuStep, in: ls(i%3 != 2, 0), duty: 0.3})
			}
			return out
		}()},
		{name: "flapping every second, longer than hold of 0.5 s, restores between bursts", policy: func(p *qos.GPUThrottlePolicy) {
			p.Hold, p.RestorePerSecond = escDur(500*ms), 1
		}, steps: []gpuStepCase{
			{at: 0, in: ls(true, 90), duty: 0.9, reason: qos.GPUReasonLSUtil},
			{at: 400 * ms, in: ls(false, 0), duty: 0.9, reason: qos.GPUReasonHold},
			{at: 600 * ms, in: ls(false, 0), duty: 0.7, reason: qos.GPUReasonRestoring},
			{at: 700 * ms, in: ls(false, 0), duty: 0.6, reason: qos.GPUReasonRestoring},
			{at: 800 * ms, in: ls(true, 90), duty: 0.9, reason: qos.GPUReasonLSUtil},
		}},
		{name: "starvation: escalate after starveAfter at maxDuty", policy: func(p *qos.GPUThrottlePolicy) {
			p.StarveAfter = escDur(5 * s)
		}, steps: []gpuStepCase{
			{at: 0, in: ls(true, 0), duty: 0.3, reason: qos.GPUReasonLSActive},
			{at: s, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(0)},
			{at: 5900 * ms, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(4900 * ms)},
			{at: 6 * s, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(5 * s), escalate: true},
			{at: 7 * s, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(6 * s), escalate: true},
			// LS leaves: still at max during the hold, so still starved.
			{at: 8 * s, in: ls(false, 0), duty: 0.9, reason: qos.GPUReasonHold, starvedFor: dur(7 * s), escalate: true},
			// Hold over (last trigger at 7 s): 1.1 s of restore at 0.1/s.
			{at: 9100 * ms, in: ls(false, 0), duty: 0.79, reason: qos.GPUReasonRestoring},
			// Back at max: the timer starts over.
			{at: 9200 * ms, in: ls(true, 60), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(0)},
			{at: 10 * s, in: ls(true, 60), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(800 * ms)},
		}},
		{name: "starveAfter 0 never escalates", policy: func(p *qos.GPUThrottlePolicy) { p.StarveAfter = escDur(0) },
			steps: []gpuStepCase{
				{at: 0, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil},
				{at: time.Hour / 2, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(0), clockJump: true},
			}},
		{name: "activeDuty = maxDuty: LS presence alone starves batch", policy: func(p *qos.GPUThrottlePolicy) {
			p.ActiveDuty, p.StarveAfter = 0.9, escDur(time.Second)
		}, steps: concat(
			every(0, 900*ms, ls(true, 0), 0.9, qos.GPUReasonLSActive),
			[]gpuStepCase{{at: s, in: ls(true, 0), duty: 0.9, reason: qos.GPUReasonLSActive, starvedFor: dur(s), escalate: true}},
		)},
		{name: "unknown GPU holds duty and restarts the starvation timer", policy: func(p *qos.GPUThrottlePolicy) {
			p.StarveAfter = escDur(time.Second)
		}, steps: []gpuStepCase{
			{at: 0, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil},
			{at: 900 * ms, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(900 * ms)},
			{at: s, in: qos.GPUThrottleInput{Unknown: true}, duty: 0.9, reason: qos.GPUReasonUnknown, starvedFor: dur(0),
				sanitized: "unknown GPU"},
			{at: 1900 * ms, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(900 * ms)},
			{at: 2 * s, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil, starvedFor: dur(s), escalate: true},
		}},
		{name: "clock back: no restore, hold restarts", policy: func(p *qos.GPUThrottlePolicy) { p.Hold = escDur(s) },
			steps: []gpuStepCase{
				{at: 10 * s, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil},
				{at: 5 * s, in: ls(false, 0), duty: 0.9, reason: qos.GPUReasonHold, clockJump: true},
				{at: 5900 * ms, in: ls(false, 0), duty: 0.9, reason: qos.GPUReasonHold},
				{at: 6 * s, in: ls(false, 0), duty: 0.89, reason: qos.GPUReasonRestoring},
			}},
		{name: "forward gap earns no restore", policy: func(p *qos.GPUThrottlePolicy) { p.Hold = escDur(0) },
			steps: []gpuStepCase{
				{at: 0, in: ls(true, 50), duty: 0.9, reason: qos.GPUReasonLSUtil},
				{at: time.Hour, in: ls(false, 0), duty: 0.9, reason: qos.GPUReasonRestoring, clockJump: true},
				{at: time.Hour + s, in: ls(false, 0), duty: 0.8, reason: qos.GPUReasonRestoring},
			}},
		{name: "bad inputs are worst for LS", steps: []gpuStepCase{
			{at: 0, in: qos.GPUThrottleInput{LSUtil: math.NaN(), BatchPods: 1}, duty: 0.9, reason: qos.GPUReasonLSUtil,
				sanitized: "lsUtil=NaN unusable: assumed 100"},
			{at: gpuStep, in: qos.GPUThrottleInput{LSUtil: -3, BatchUtil: math.Inf(1), BatchPods: 1}, duty: 0.9,
				reason: qos.GPUReasonLSUtil, sanitized: "batchUtil=+Inf unusable"},
			{at: 2 * gpuStep, in: qos.GPUThrottleInput{LSUtil: 250, BatchPods: -2}, duty: 0, reason: qos.GPUReasonNoBatch,
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
			// Steps are sparse where nothing changes (up to 7 s apart): a control period of a
			// minute puts the jump check at 10 minutes; the jump cases jump further.
			c := qos.NewGPUThrottle(p, time.Minute)
			for i, st := range tc.steps {
				out := c.Step(gpuT0.Add(st.at), []qos.GPUThrottleInput{st.in})
				if len(out) != 1 {
					t.Fatalf("step %d: %d decisions", i, len(out))
				}
				d := out[0]
				if math.Abs(d.Duty-st.duty) > 1e-9 || (st.reason != "" && d.Reason != st.reason) {
					t.Fatalf("step %d at %v: duty %v reason %q, want %v %q (%+v)", i, st.at, d.Duty, d.Reason, st.duty, st.reason, d)
				}
				if math.Abs(d.BatchShare-(1-d.Duty)) > 1e-12 {
					t.Fatalf("step %d: batchShare %v with duty %v", i, d.BatchShare, d.Duty)
				}
				if wantStarved := st.duty >= p.MaxDuty; d.Starved != wantStarved {
					t.Fatalf("step %d at %v: starved %v, want %v", i, st.at, d.Starved, wantStarved)
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

// The duty never oscillates under a random flapping LS: once cut, every later change
// before LS stays away for hold is upwards.
func TestGPUThrottleNoOscillation(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	x := uint64(42)
	prev, downs := 0.0, 0
	for i := range 3000 { // 5 minutes at 100 ms
		x = x*6364136223846793005 + 1442695040888963407
		util := float64(x>>33) / float64(1<<31) * 100 // 0..100, changes every step
		active := x&(1<<20) != 0
		d := c.Step(gpuT0.Add(time.Duration(i)*gpuStep), []qos.GPUThrottleInput{{LSActive: active, LSUtil: util, BatchPods: 2}})[0]
		if d.Duty < prev {
			downs++
		}
		prev = d.Duty
	}
	if downs != 0 {
		t.Fatalf("duty went down %d times under a flapping LS (hold 2 s, steps of 100 ms)", downs)
	}
}

func TestGPUThrottleManyGPUs(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	out := c.Step(gpuT0, []qos.GPUThrottleInput{
		{Index: 3, LSActive: true, LSUtil: 60, BatchPods: 1},
		{Index: 1, BatchPods: 2},
		{Index: 2, LSActive: true, BatchPods: 1},
	})
	got := []struct {
		gpu    int
		duty   float64
		reason string
	}{}
	for _, d := range out {
		got = append(got, struct {
			gpu    int
			duty   float64
			reason string
		}{d.GPU, d.Duty, d.Reason})
	}
	want := []struct {
		gpu    int
		duty   float64
		reason string
	}{{1, 0, qos.GPUReasonIdle}, {2, 0.3, qos.GPUReasonLSActive}, {3, 0.9, qos.GPUReasonLSUtil}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decisions %+v, want %+v (sorted by GPU)", got, want)
	}

	// GPU 3 missing from a step is forgotten; back without LS, it starts from 0.
	c.Step(gpuT0.Add(gpuStep), []qos.GPUThrottleInput{{Index: 1, BatchPods: 1}})
	out = c.Step(gpuT0.Add(2*gpuStep), []qos.GPUThrottleInput{{Index: 3, BatchPods: 1}})
	if out[0].Duty != 0 || out[0].Reason != qos.GPUReasonIdle {
		t.Fatalf("a forgotten GPU came back with %+v", out[0])
	}

	// A repeated index is merged, worst case for LS, and noted.
	out = c.Step(gpuT0.Add(3*gpuStep), []qos.GPUThrottleInput{
		{Index: 0, LSActive: false, LSUtil: 0, BatchPods: 1},
		{Index: 0, LSActive: true, LSUtil: 70, BatchPods: 3},
		{Index: 0, Unknown: true},
	})
	if len(out) != 1 || out[0].Duty != 0.9 || out[0].BatchPods != 3 || !strings.Contains(out[0].Sanitized, "merged") {
		t.Fatalf("merged duplicate = %+v", out)
	}

	c.Reset()
	out = c.Step(gpuT0.Add(4*gpuStep), []qos.GPUThrottleInput{{Index: 0, BatchPods: 1}})
	if out[0].Duty != 0 || out[0].Reason != qos.GPUReasonIdle {
		t.Fatalf("after Reset: %+v", out[0])
	}
	if out := c.Step(gpuT0.Add(5*gpuStep), nil); len(out) != 0 {
		t.Fatalf("no GPUs: %+v", out)
	}
}

// Decisions go to /status as JSON and come back unchanged.
func TestGPUThrottleDecisionJSON(t *testing.T) {
	t.Parallel()
	c := qos.NewGPUThrottle(qos.DefaultGPUThrottlePolicy(), gpuStep)
	in := []qos.GPUThrottleInput{{Index: 1, LSActive: true, LSUtil: 80, BatchUtil: 30, BatchPods: 2}}
	c.Step(gpuT0, in)
	d := c.Step(gpuT0.Add(900*time.Millisecond), in)[0]
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"gpu":1`, `"duty":0.9`, `"reason":"ls-util-above-threshold"`, `"lsUtilPercent":80`,
		`"batchUtilPercent":30`, `"starvedFor":"900ms"`, `"starved":true`} {
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

// Whatever the inputs and the clock, every decision stays in range and JSON-encodable.
func FuzzGPUThrottle(f *testing.F) {
	f.Add(true, 50.0, 20.0, 1, int64(100), false, true, math.NaN(), 0.0, 0, int64(-5000), true)
	f.Add(false, -1.0, math.Inf(1), -3, int64(0), true, false, 101.0, 7.0, 2, int64(3600_000), false)
	f.Fuzz(func(t *testing.T, act1 bool, ls1, b1 float64, pods1 int, dt1 int64, unk1 bool,
		act2 bool, ls2, b2 float64, pods2 int, dt2 int64, unk2 bool) {
		p := qos.DefaultGPUThrottlePolicy()
		p.StarveAfter = escDur(time.Second)
		c := qos.NewGPUThrottle(p, gpuStep)
		now := gpuT0
		for i := range 50 {
			in := qos.GPUThrottleInput{LSActive: act1, LSUtil: ls1, BatchUtil: b1, BatchPods: pods1, Unknown: unk1}
			dt := dt1
			if i%2 == 1 {
				in = qos.GPUThrottleInput{LSActive: act2, LSUtil: ls2, BatchUtil: b2, BatchPods: pods2, Unknown: unk2}
				dt = dt2
			}
			now = now.Add(time.Duration(dt) * time.Millisecond)
			for _, d := range c.Step(now, []qos.GPUThrottleInput{in}) {
				if !(d.Duty >= 0 && d.Duty <= p.MaxDuty) || !(d.Target >= 0 && d.Target <= p.MaxDuty) ||
					!(d.LSUtil >= 0 && d.LSUtil <= 100) || !(d.BatchUtil >= 0 && d.BatchUtil <= 100) || d.BatchPods < 0 ||
					d.StarvedFor.Duration < 0 || (d.Escalate && !d.Starved) {
					t.Fatalf("step %d: out of range %+v", i, d)
				}
				if _, err := json.Marshal(d); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
		}
	})
}
