package qos_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

var reclaimT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const ctlPeriod = 100 * time.Millisecond

// steadyMem is a memory measurement that never changes.
var steadyMem = qos.ResourceUsage{Capacity: 64 << 30, LSUsage: 20 << 30, LSRequest: 24 << 30, BEUsage: 1 << 30,
	SystemUsage: 2 << 30}

// cpuAt is a 16-CPU node with 0.5 cores of BE and 0.5 of system usage: with the
// default threshold 0.9, computed = 13.4 - LS term.
func cpuAt(at time.Duration, ls float64) qos.ReclaimInput {
	return qos.ReclaimInput{Now: reclaimT0.Add(at), Memory: steadyMem,
		CPU: qos.ResourceUsage{Capacity: 16, LSUsage: ls, BEUsage: 0.5, SystemUsage: 0.5}}
}

// drive calls Next every control period in [from, to) with LS usage ls(at).
func drive(r *qos.Reclaimer, from, to time.Duration, ls func(time.Duration) float64) []qos.Reclaimed {
	var out []qos.Reclaimed
	for at := from; at < to; at += ctlPeriod {
		out = append(out, r.Next(cpuAt(at, ls(at))))
	}
	return out
}

func constant(v float64) func(time.Duration) float64 { return func(time.Duration) float64 { return v } }

// cpuWrites returns the CPU results that wrote.
func cpuWrites(rs []qos.Reclaimed) []qos.ReclaimTerms {
	var w []qos.ReclaimTerms
	for _, r := range rs {
		if r.CPU.Write {
			w = append(w, r.CPU)
		}
	}
	return w
}

func TestDefaultReclaimConfig(t *testing.T) {
	t.Parallel()
	c := qos.DefaultReclaimConfig()
	want := qos.ReclaimConfig{
		CPU:                      qos.ResourceReclaim{Policy: qos.ReclaimPolicyUsage, Threshold: 0.9, DeadbandPercent: 10},
		Memory:                   qos.ResourceReclaim{Policy: qos.ReclaimPolicyMaxUsageRequest, Threshold: 0.9, DeadbandPercent: 5},
		LSPercentile:             0.95,
		LSWindow:                 metav1.Duration{Duration: 5 * time.Minute},
		Smoothing:                metav1.Duration{Duration: 10 * time.Second},
		RiseStepPercentPerMinute: 10,
		RefreshInterval:          metav1.Duration{Duration: 15 * time.Minute},
	}
	if c != want {
		t.Fatalf("DefaultReclaimConfig() = %+v, want %+v", c, want)
	}
	if c.CPU.Threshold != qos.DefaultThreshold {
		t.Errorf("cpu.threshold %v is not the Budgeter's DefaultThreshold %v", c.CPU.Threshold, qos.DefaultThreshold)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	if got := qos.NewReclaimer(c).Config(); got != c {
		t.Errorf("NewReclaimer changed a valid config: %+v", got)
	}
}

func TestReclaimConfigValidate(t *testing.T) {
	t.Parallel()
	with := withDefaults(qos.DefaultReclaimConfig)
	tests := []struct {
		name   string
		c      qos.ReclaimConfig
		wantIn []string // nil: valid
	}{
		{name: "default", c: qos.DefaultReclaimConfig()},
		{name: "both usage", c: with(func(c *qos.ReclaimConfig) { c.Memory.Policy = qos.ReclaimPolicyUsage })},
		{name: "edges", c: with(func(c *qos.ReclaimConfig) {
			c.CPU.Threshold, c.CPU.DeadbandPercent, c.LSPercentile = 1, 0, 1
			c.LSWindow, c.Smoothing, c.RefreshInterval = escDur(10*time.Second), escDur(10*time.Second), escDur(time.Minute)
			c.RiseStepPercentPerMinute = 100
		})},
		{name: "cpu policy", c: with(func(c *qos.ReclaimConfig) { c.CPU.Policy = "Usage" }),
			wantIn: []string{`cpu.policy: "Usage" must be "usage" or "maxUsageRequest"`}},
		{name: "memory policy empty", c: with(func(c *qos.ReclaimConfig) { c.Memory.Policy = "" }),
			wantIn: []string{`memory.policy: ""`}},
		{name: "cpu threshold 0", c: with(func(c *qos.ReclaimConfig) { c.CPU.Threshold = 0 }),
			wantIn: []string{"cpu.threshold: 0 must be in (0, 1]"}},
		{name: "memory threshold NaN", c: with(func(c *qos.ReclaimConfig) { c.Memory.Threshold = math.NaN() }),
			wantIn: []string{"memory.threshold: NaN"}},
		{name: "cpu deadband negative", c: with(func(c *qos.ReclaimConfig) { c.CPU.DeadbandPercent = -1 }),
			wantIn: []string{"cpu.deadbandPercent: -1 must be in [0, 50]"}},
		{name: "memory deadband 51", c: with(func(c *qos.ReclaimConfig) { c.Memory.DeadbandPercent = 51 }),
			wantIn: []string{"memory.deadbandPercent: 51"}},
		{name: "percentile 0", c: with(func(c *qos.ReclaimConfig) { c.LSPercentile = 0 }),
			wantIn: []string{"lsPercentile: 0 must be in (0, 1]"}},
		{name: "percentile 95", c: with(func(c *qos.ReclaimConfig) { c.LSPercentile = 95 }),
			wantIn: []string{"lsPercentile: 95"}},
		{name: "window short", c: with(func(c *qos.ReclaimConfig) { c.LSWindow = escDur(time.Second) }),
			wantIn: []string{"lsWindow: 1s must be in [10s, 24h0m0s]", "smoothing: 10s must be in [1s, lsWindow (1s)]"}},
		{name: "window long", c: with(func(c *qos.ReclaimConfig) { c.LSWindow = escDur(25 * time.Hour) }),
			wantIn: []string{"lsWindow: 25h0m0s"}},
		{name: "smoothing 0", c: with(func(c *qos.ReclaimConfig) { c.Smoothing = escDur(0) }),
			wantIn: []string{"smoothing: 0s must be in [1s, lsWindow (5m0s)]"}},
		{name: "rise 0", c: with(func(c *qos.ReclaimConfig) { c.RiseStepPercentPerMinute = 0 }),
			wantIn: []string{"riseStepPercentPerMinute: 0 must be in (0, 100]"}},
		{name: "rise Inf", c: with(func(c *qos.ReclaimConfig) { c.RiseStepPercentPerMinute = math.Inf(1) }),
			wantIn: []string{"riseStepPercentPerMinute: +Inf"}},
		{name: "refresh short", c: with(func(c *qos.ReclaimConfig) { c.RefreshInterval = escDur(time.Second) }),
			wantIn: []string{"refreshInterval: 1s must be in [1m0s, 24h0m0s]"}},
		{name: "zero config", c: qos.ReclaimConfig{},
			wantIn: []string{"cpu.policy", "cpu.threshold", "memory.policy", "memory.threshold", "lsPercentile",
				"lsWindow", "riseStepPercentPerMinute", "refreshInterval"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkValidate(t, tt.c.Validate(), tt.wantIn)
			// Any config, invalid ones too, still gives a Reclaimer that yields finite values.
			r := qos.NewReclaimer(tt.c)
			for _, rs := range drive(r, 0, 2*time.Second, constant(3)) {
				checkTerms(t, rs.CPU)
				checkTerms(t, rs.Memory)
			}
		})
	}
}

func TestReclaimConfigYAML(t *testing.T) {
	t.Parallel()
	c := qos.DefaultReclaimConfig()
	doc := "cpu: {policy: maxUsageRequest, threshold: 0.7, deadbandPercent: 8}\nlsWindow: 10m\nsmoothing: 30s\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if c.CPU != (qos.ResourceReclaim{Policy: qos.ReclaimPolicyMaxUsageRequest, Threshold: 0.7, DeadbandPercent: 8}) ||
		c.LSWindow.Duration != 10*time.Minute || c.Smoothing.Duration != 30*time.Second ||
		c.Memory != qos.DefaultReclaimConfig().Memory || c.LSPercentile != 0.95 {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// checkTerms asserts the invariants of every result.
func checkTerms(t *testing.T, r qos.ReclaimTerms) {
	t.Helper()
	for name, v := range map[string]float64{"capacity": r.Capacity, "threshold": r.Threshold, "lsUsage": r.LSUsage,
		"lsRecent": r.LSRecent, "lsWindowPercentile": r.LSWindowPercentile, "lsRequest": r.LSRequest,
		"lsTerm": r.LSTerm, "beUsage": r.BEUsage, "beRecent": r.BERecent, "systemUsage": r.SystemUsage,
		"systemRecent": r.SystemRecent, "raw": r.Raw, "batchRequest": r.BatchRequest, "computed": r.Computed,
		"deadband": r.Deadband,
		"previous": r.Previous, "published": r.Published} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("%s = %v in %+v", name, v, r)
		}
	}
	if r.Published < 0 || r.Published > r.Capacity || r.Computed < 0 || r.Computed > r.Capacity {
		t.Fatalf("published %v / computed %v outside [0, capacity %v]: %+v", r.Published, r.Computed, r.Capacity, r)
	}
	if r.Published > r.Computed+r.Deadband+1e-9 {
		t.Fatalf("published %v above computed %v + deadband %v: %+v", r.Published, r.Computed, r.Deadband, r)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatalf("json: %v", err)
	}
}

func TestReclaimPolicies(t *testing.T) {
	t.Parallel()
	cfgWith := func(p qos.ReclaimPolicy) qos.ReclaimConfig {
		c := qos.DefaultReclaimConfig()
		c.CPU.Policy = p
		return c
	}
	tests := []struct {
		name                  string
		cfg                   qos.ReclaimConfig
		cpu                   qos.ResourceUsage
		wantLSTerm, wantReq   float64
		wantRaw, wantComputed float64
	}{
		{name: "usage ignores requests", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 16, LSUsage: 4, LSRequest: 10, BEUsage: 1, SystemUsage: 1},
			wantLSTerm: 4, wantReq: 0, wantRaw: 16*0.9 - 6, wantComputed: 8.4},
		{name: "maxUsageRequest: requests above usage", cfg: cfgWith(qos.ReclaimPolicyMaxUsageRequest),
			cpu:        qos.ResourceUsage{Capacity: 16, LSUsage: 4, LSRequest: 10, BEUsage: 1, SystemUsage: 1},
			wantLSTerm: 10, wantReq: 10, wantRaw: 16*0.9 - 12, wantComputed: 16*0.9 - 12},
		{name: "maxUsageRequest: usage above requests", cfg: cfgWith(qos.ReclaimPolicyMaxUsageRequest),
			cpu:        qos.ResourceUsage{Capacity: 16, LSUsage: 7, LSRequest: 2, BEUsage: 0, SystemUsage: 1},
			wantLSTerm: 7, wantReq: 2, wantRaw: 16*0.9 - 8, wantComputed: 16*0.9 - 8},
		{name: "negative raw clamps to 0", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 8, LSUsage: 7, BEUsage: 1, SystemUsage: 1},
			wantLSTerm: 7, wantRaw: 8*0.9 - 9, wantComputed: 0},
		// kubelet re-admits pods against allocatable at restart: never below what
		// the node's batch pods hold.
		{name: "batch requests are the floor", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 8, LSUsage: 7, BEUsage: 1, SystemUsage: 1, BatchRequest: 1.5},
			wantLSTerm: 7, wantRaw: 8*0.9 - 9, wantComputed: 1.5},
		{name: "the floor is capped at capacity", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 8, LSUsage: 7, BEUsage: 1, SystemUsage: 1, BatchRequest: 20},
			wantLSTerm: 7, wantRaw: 8*0.9 - 9, wantComputed: 8},
		{name: "a floor below what LS leaves changes nothing", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 16, LSUsage: 4, BEUsage: 1, SystemUsage: 1, BatchRequest: 2},
			wantLSTerm: 4, wantRaw: 16*0.9 - 6, wantComputed: 8.4},
		{name: "a NaN floor counts as none", cfg: cfgWith(qos.ReclaimPolicyUsage),
			cpu:        qos.ResourceUsage{Capacity: 8, LSUsage: 7, BEUsage: 1, SystemUsage: 1, BatchRequest: math.NaN()},
			wantLSTerm: 7, wantRaw: 8*0.9 - 9, wantComputed: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := qos.NewReclaimer(tt.cfg)
			got := r.Next(qos.ReclaimInput{Now: reclaimT0, CPU: tt.cpu, Memory: steadyMem})
			c := got.CPU
			checkTerms(t, c)
			if c.Policy != tt.cfg.CPU.Policy || !near(c.LSTerm, tt.wantLSTerm) || !near(c.LSRequest, tt.wantReq) ||
				!near(c.Raw, tt.wantRaw) || !near(c.Computed, tt.wantComputed) {
				t.Fatalf("got %+v, want lsTerm %v lsRequest %v raw %v computed %v",
					c, tt.wantLSTerm, tt.wantReq, tt.wantRaw, tt.wantComputed)
			}
			if !c.Write || c.Reason != qos.ReasonReclaimInitial || c.Published != c.Computed {
				t.Fatalf("first call must write computed as initial: %+v", c)
			}
			// Memory uses maxUsageRequest by default: 0.9*64Gi - 24Gi - 1Gi - 2Gi.
			want := 0.9*float64(64<<30) - float64(27<<30)
			if m := got.Memory; m.Policy != qos.ReclaimPolicyMaxUsageRequest || !near(m.Computed, want) {
				t.Fatalf("memory %+v, want computed %v", m, want)
			}
		})
	}
}

func TestReclaimMilliRoundsDown(t *testing.T) {
	t.Parallel()
	r := qos.Reclaimed{CPU: qos.ReclaimTerms{Published: 1.23456}, Memory: qos.ReclaimTerms{Published: 1024.9}}
	if r.BatchCPUMilli() != 1234 || r.BatchMemoryBytes() != 1024 {
		t.Fatalf("got %d millicores, %d bytes", r.BatchCPUMilli(), r.BatchMemoryBytes())
	}
	if (qos.Reclaimed{}).BatchCPUMilli() != 0 {
		t.Fatal("zero")
	}
}

// TestReclaimWindowPercentile: the window is the nearest-rank percentile of
// per-second peaks; a burst shorter than 5% of the window does not move p95.
func TestReclaimWindowPercentile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		highSeconds int // seconds at 10 cores in a 5-minute window of 2 cores
		want        float64
	}{
		{name: "no burst", highSeconds: 0, want: 2},
		{name: "15 s burst is the top 5%", highSeconds: 15, want: 2},
		{name: "16 s burst reaches p95", highSeconds: 16, want: 10},
		{name: "half the window", highSeconds: 150, want: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := qos.NewReclaimer(qos.DefaultReclaimConfig())
			// The burst ends 100 s before the check: it is well inside the window.
			from := 200*time.Second - time.Duration(tt.highSeconds)*time.Second
			ls := func(at time.Duration) float64 {
				if at >= from && at < 200*time.Second {
					return 10
				}
				return 2
			}
			rs := drive(r, 0, 300*time.Second+ctlPeriod, ls)
			last := rs[len(rs)-1].CPU
			if last.LSWindowSteps != 300 || last.LSWindowPercentile != tt.want {
				t.Fatalf("percentile %v over %d steps, want %v over 300", last.LSWindowPercentile, last.LSWindowSteps, tt.want)
			}
			if last.LSTerm != math.Max(last.LSRecent, last.LSWindowPercentile) {
				t.Fatalf("lsTerm %v is not max(recent %v, window %v)", last.LSTerm, last.LSRecent, last.LSWindowPercentile)
			}
			// The peak of each second counts, not its mean: one period at 10 in
			// 20 separate seconds is 20 peaks of 10.
			r2 := qos.NewReclaimer(qos.DefaultReclaimConfig())
			rs = drive(r2, 0, 300*time.Second+ctlPeriod, func(at time.Duration) float64 {
				if at%time.Second == 0 && at/time.Second%15 == 0 {
					return 10
				}
				return 2
			})
			if p := rs[len(rs)-1].CPU.LSWindowPercentile; p != 10 {
				t.Fatalf("peaks: percentile %v, want 10", p)
			}
		})
	}
}

// TestReclaimDropAtOnceRiseDamped: a rise of LS cuts batch within seconds; when LS
// falls back, batch waits for the window, then rises by at most the rise step.
func TestReclaimDropAtOnceRiseDamped(t *testing.T) {
	t.Parallel()
	cfg := qos.DefaultReclaimConfig()
	r := qos.NewReclaimer(cfg)
	ls := func(at time.Duration) float64 {
		if at >= 60*time.Second && at < 120*time.Second {
			return 8
		}
		return 2
	}
	rs := drive(r, 0, 15*time.Minute, ls)
	for _, x := range rs {
		checkTerms(t, x.CPU)
		checkTerms(t, x.Memory)
	}
	step := cfg.RiseStepPercentPerMinute / 100 * 16
	ws := cpuWrites(rs)
	if ws[0].Reason != qos.ReasonReclaimInitial || !near(ws[0].Published, 11.4) {
		t.Fatalf("first write %+v", ws[0])
	}
	at := func(i int) time.Duration { return time.Duration(i) * ctlPeriod }
	// Drop: the first write after LS rose is a drop, within 5 s.
	var firstDrop time.Duration
	for i, x := range rs {
		if x.CPU.Write && x.CPU.Reason == qos.ReasonReclaimDrop {
			firstDrop = at(i)
			break
		}
	}
	if firstDrop < 60*time.Second || firstDrop > 65*time.Second {
		t.Fatalf("first drop at %v, want within 5 s of the rise at 60 s", firstDrop)
	}
	// By 120 s batch is within the deadband of 13.4 - 8.
	if p := rs[1199].CPU.Published; p < 5.4 || p > 5.4+1.6+1e-9 {
		t.Fatalf("published %v at 120 s, want in [5.4, 7.0]", p)
	}
	// Nothing written while the window still holds LS at 8 (until ~405 s).
	lastPub := rs[1199].CPU.Published
	var prevWrite time.Duration
	for i := 1200; i < len(rs); i++ {
		x := rs[i].CPU
		if !x.Write {
			continue
		}
		if at(i) < 400*time.Second {
			t.Fatalf("write %+v at %v, while the window still holds the rise", x, at(i))
		}
		if x.Reason != qos.ReasonReclaimRise && x.Reason != qos.ReasonReclaimRiseDamped {
			t.Fatalf("write at %v is %q, want a rise", at(i), x.Reason)
		}
		if prevWrite == 0 {
			prevWrite = 400 * time.Second
		}
		allowed := step * (at(i) - prevWrite).Minutes()
		if x.Published-lastPub > allowed+step/600+1e-9 {
			t.Fatalf("rise of %v at %v in %v: more than %v/min", x.Published-lastPub, at(i), at(i)-prevWrite, step)
		}
		if x.Published-lastPub < 1.6-1e-9 && x.Reason == qos.ReasonReclaimRiseDamped {
			t.Fatalf("damped rise of %v below the deadband", x.Published-lastPub)
		}
		lastPub, prevWrite = x.Published, at(i)
	}
	if final := rs[len(rs)-1].CPU; !near(final.Published, 11.4) {
		t.Fatalf("final %+v, want back at 11.4", final)
	}
	if n := len(cpuWrites(rs[1200:])); n < 2 || n > 5 {
		t.Fatalf("%d rise writes, want a few damped steps", n)
	}
}

func TestReclaimDeadbandAndRefresh(t *testing.T) {
	t.Parallel()
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	rs := drive(r, 0, 20*time.Minute, func(at time.Duration) float64 {
		if at >= time.Minute {
			return 3 // computed 10.4: 1.0 below 11.4, inside the 1.6 deadband
		}
		return 2
	})
	ws := cpuWrites(rs)
	if len(ws) != 2 || ws[1].Reason != qos.ReasonReclaimRefresh || !near(ws[1].Published, 10.4) {
		t.Fatalf("writes %+v, want initial then one refresh to 10.4", ws)
	}
	if i := int(15 * time.Minute / ctlPeriod); !rs[i].CPU.Write {
		t.Fatalf("no refresh at 15 min: %+v", rs[i].CPU)
	}
	if x := rs[int(10*time.Minute/ctlPeriod)].CPU; x.Reason != qos.ReasonReclaimDeadband || x.Published != 11.4 {
		t.Fatalf("at 10 min %+v, want deadband holding 11.4", x)
	}
	if x := rs[len(rs)-1].CPU; x.Reason != qos.ReasonReclaimHold || x.Write {
		t.Fatalf("last %+v, want hold", x)
	}
}

// TestReclaimDropToTheFloorIgnoresDeadband: once LS leaves batch nothing beyond
// what its pods request, the published value falls to that floor at once, even
// when the drop is inside the deadband (1.6 cores here); above the floor the
// deadband holds as before.
func TestReclaimDropToTheFloorIgnoresDeadband(t *testing.T) {
	t.Parallel()
	at := func(sec int, ls, batchReq float64) qos.ReclaimInput {
		in := cpuAt(time.Duration(sec)*time.Second, ls)
		in.CPU.BatchRequest = batchReq
		return in
	}
	for _, tc := range []struct {
		name     string
		ls       float64 // after the first call, which publishes 13.4 - 12.0 = 1.4
		batchReq float64
		want     float64
	}{
		{"to the floor inside the deadband", 13.4, 0.5, 0.5},
		{"to 0 with no batch pods", 13.4, 0, 0},
		{"above the floor inside the deadband holds", 12.5, 0.5, 1.4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := qos.DefaultReclaimConfig()
			c.LSWindow.Duration = time.Second // the LS term follows the sample at once
			r := qos.NewReclaimer(c)
			first := r.Next(at(0, 12, tc.batchReq)).CPU
			if !first.Write || !near(first.Published, 1.4) {
				t.Fatalf("first %+v, want 1.4 written", first)
			}
			var got qos.ReclaimTerms
			for sec := 1; sec <= 30; sec++ {
				got = r.Next(at(sec, tc.ls, tc.batchReq)).CPU
			}
			if !near(got.Published, tc.want) {
				t.Fatalf("after LS %.1f for 30 s: %+v, want published %.1f", tc.ls, got, tc.want)
			}
		})
	}
}

// TestReclaimNeverZeroFromBursts: one period at full node, a NaN sample or a
// short burst never zero batch; LS that keeps the node busy does.
func TestReclaimNeverZeroFromBursts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		burst    float64
		length   time.Duration
		wantZero bool
	}{
		{name: "one period at capacity", burst: 16, length: ctlPeriod},
		{name: "one NaN sample", burst: math.NaN(), length: ctlPeriod},
		{name: "one -1 sample", burst: -1, length: ctlPeriod},
		{name: "one absurd sample", burst: 1e300, length: ctlPeriod},
		{name: "3 s at capacity", burst: 16, length: 3 * time.Second},
		{name: "30 s at capacity", burst: 16, length: 30 * time.Second, wantZero: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := qos.NewReclaimer(qos.DefaultReclaimConfig())
			rs := drive(r, 0, 3*time.Minute, func(at time.Duration) float64 {
				if at >= time.Minute && at < time.Minute+tt.length {
					return tt.burst
				}
				return 2
			})
			minPub, sanitized := math.Inf(1), false
			for _, x := range rs {
				checkTerms(t, x.CPU)
				minPub = math.Min(minPub, x.CPU.Published)
				sanitized = sanitized || x.CPU.Sanitized != ""
			}
			if (minPub == 0) != tt.wantZero {
				t.Fatalf("min published %v, want zero: %v", minPub, tt.wantZero)
			}
			if !tt.wantZero && minPub < 5 {
				t.Fatalf("min published %v: a burst of %v cut batch too deep", minPub, tt.length)
			}
			if bad := math.IsNaN(tt.burst) || tt.burst < 0 || tt.burst > 16; sanitized != bad {
				t.Fatalf("sanitized %v, want %v", sanitized, bad)
			}
		})
	}
}

func TestReclaimSanitize(t *testing.T) {
	t.Parallel()
	nan, inf := math.NaN(), math.Inf(1)
	mur := qos.DefaultReclaimConfig()
	mur.CPU.Policy = qos.ReclaimPolicyMaxUsageRequest
	tests := []struct {
		name         string
		cfg          qos.ReclaimConfig
		cpu          qos.ResourceUsage
		wantComputed float64
		wantNotes    []string // substrings of Sanitized; nil: empty
	}{
		{name: "clean", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 10, LSUsage: 1}, wantComputed: 8},
		{name: "ls NaN is the whole node", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 10, LSUsage: nan}, wantNotes: []string{"lsUsage=NaN unusable"}},
		{name: "be negative", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 10, BEUsage: -2}, wantNotes: []string{"beUsage=-2 unusable"}},
		{name: "system +Inf", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 10, SystemUsage: inf}, wantNotes: []string{"systemUsage=+Inf unusable"}},
		{name: "ls above capacity is clamped", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 10, LSUsage: 1e308}, wantNotes: []string{"above capacity: clamped to 10"}},
		{name: "request NaN under maxUsageRequest", cfg: mur,
			cpu: qos.ResourceUsage{Capacity: 10, LSRequest: nan}, wantNotes: []string{"lsRequest=NaN"}},
		{name: "request NaN ignored under usage", cfg: qos.DefaultReclaimConfig(),
			// Same time as the first call: the average still holds LS 1.
			cpu: qos.ResourceUsage{Capacity: 10, LSRequest: nan}, wantComputed: 8},
		{name: "capacity NaN", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: nan, LSUsage: 1}, wantNotes: []string{"capacity=NaN unusable"}},
		{name: "capacity 0", cfg: qos.DefaultReclaimConfig(),
			cpu: qos.ResourceUsage{Capacity: 0, LSUsage: inf}, wantNotes: []string{"capacity=0 unusable"}},
		{name: "huge capacity does not overflow", cfg: qos.DefaultReclaimConfig(),
			cpu:       qos.ResourceUsage{Capacity: math.MaxFloat64, LSUsage: -1, BEUsage: -1, SystemUsage: -1},
			wantNotes: []string{"lsUsage=-1", "beUsage=-1", "systemUsage=-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := qos.NewReclaimer(tt.cfg)
			// A clean first call, then the bad one: published must not rise.
			first := r.Next(qos.ReclaimInput{Now: reclaimT0, CPU: qos.ResourceUsage{Capacity: 10, LSUsage: 1},
				Memory: steadyMem})
			x := r.Next(qos.ReclaimInput{Now: reclaimT0, CPU: tt.cpu, Memory: steadyMem}).CPU
			checkTerms(t, x)
			if tt.wantNotes == nil {
				if x.Sanitized != "" || !near(x.Computed, tt.wantComputed) {
					t.Fatalf("got %+v, want computed %v and no note", x, tt.wantComputed)
				}
				return
			}
			for _, w := range tt.wantNotes {
				if !strings.Contains(x.Sanitized, w) {
					t.Errorf("sanitized %q does not contain %q", x.Sanitized, w)
				}
			}
			if x.Published > first.CPU.Published {
				t.Fatalf("bad input raised batch: %v > %v", x.Published, first.CPU.Published)
			}
			// On a fresh Reclaimer an unusable input gives batch nothing.
			y := qos.NewReclaimer(tt.cfg).Next(qos.ReclaimInput{Now: reclaimT0, CPU: tt.cpu, Memory: steadyMem}).CPU
			checkTerms(t, y)
			if y.Computed != 0 || y.Published != 0 {
				t.Fatalf("fresh reclaimer gave %+v for unusable input", y)
			}
		})
	}
}

// TestReclaimClockJumps: time going back or a gap longer than the window resets
// the window and the averages, and writes at most once.
func TestReclaimClockJumps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		jumpTo   time.Duration // the time after the jump; the last call was at 10 min - 100 ms
		wantNote string
		// maxWrites in the 10 minutes after the jump.
		maxWrites int
	}{
		{name: "back 5 minutes", jumpTo: 5 * time.Minute, wantNote: "clock went back by 4m59.9s", maxWrites: 0},
		{name: "back a day", jumpTo: -24 * time.Hour, wantNote: "clock went back by 24h9m59.9s", maxWrites: 0},
		{name: "forward 2 hours", jumpTo: 2*time.Hour + 10*time.Minute, wantNote: "gap of 2h0m0.1s",
			maxWrites: 1},
		// The refresh due 15 minutes after the initial write.
		{name: "forward 1 minute", jumpTo: 11 * time.Minute, maxWrites: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := qos.NewReclaimer(qos.DefaultReclaimConfig())
			drive(r, 0, 10*time.Minute, constant(2))
			rs := drive(r, tt.jumpTo, tt.jumpTo+10*time.Minute, constant(2))
			first := rs[0].CPU
			checkTerms(t, first)
			if tt.wantNote != "" {
				if !strings.Contains(first.Sanitized, tt.wantNote) || first.LSWindowSteps != 0 {
					t.Fatalf("after the jump %+v, want note %q and an empty window", first, tt.wantNote)
				}
				if rs[0].Memory.LSWindowSteps != 0 || !strings.Contains(rs[0].Memory.Sanitized, tt.wantNote) {
					t.Fatalf("memory window not reset: %+v", rs[0].Memory)
				}
			} else if first.Sanitized != "" {
				t.Fatalf("unexpected note %q", first.Sanitized)
			}
			if n := len(cpuWrites(rs)); n > tt.maxWrites {
				t.Fatalf("%d writes after the jump, want <= %d: %+v", n, tt.maxWrites, cpuWrites(rs))
			}
			for _, x := range rs {
				if !near(x.CPU.Published, 11.4) {
					t.Fatalf("published moved to %v", x.CPU.Published)
				}
			}
			// The refresh clock restarted at the jump, not at the old time.
			more := drive(r, tt.jumpTo+10*time.Minute, tt.jumpTo+16*time.Minute, constant(2))
			if n := len(cpuWrites(more)); n != 1 && tt.jumpTo < 10*time.Minute {
				t.Fatalf("%d writes 15 min after a backward jump, want the refresh", n)
			}
		})
	}
}

// TestReclaimForwardJumpDampsRise: a forward jump does not earn a big rise.
func TestReclaimForwardJumpDampsRise(t *testing.T) {
	t.Parallel()
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	drive(r, 0, time.Minute, constant(10)) // published 3.4
	// 4 minutes missing (within the window), then LS is low.
	rs := drive(r, 5*time.Minute, 5*time.Minute+10*time.Second, constant(2))
	for _, x := range rs {
		if x.CPU.Published > 3.4+1.6*1.2 { // one minute of rise credit at most, plus 10 s
			t.Fatalf("published %v right after the gap", x.CPU.Published)
		}
	}
}

func TestReclaimCapacityShrinks(t *testing.T) {
	t.Parallel()
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	drive(r, 0, time.Second, constant(0))
	x := r.Next(qos.ReclaimInput{Now: reclaimT0.Add(2 * time.Second),
		CPU: qos.ResourceUsage{Capacity: 1, LSUsage: 0}, Memory: steadyMem}).CPU
	checkTerms(t, x)
	if !x.Write || x.Reason != qos.ReasonReclaimDrop {
		t.Fatalf("capacity shrink: %+v", x)
	}
}

func TestReclaimReset(t *testing.T) {
	t.Parallel()
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	drive(r, 0, time.Minute, constant(2))
	r.Reset()
	x := r.Next(cpuAt(time.Minute, 2)).CPU
	if !x.Write || x.Reason != qos.ReasonReclaimInitial || x.LSWindowSteps != 0 || x.Previous != 0 {
		t.Fatalf("after Reset %+v", x)
	}
}

// TestReclaimNoAllocation is not parallel: testing.AllocsPerRun refuses to run
// in a parallel test (other tests' allocations would count).
func TestReclaimNoAllocation(t *testing.T) {
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	drive(r, 0, 6*time.Minute, func(at time.Duration) float64 { return 2 + float64(at%(7*time.Second))/1e9 })
	at := 6 * time.Minute
	allocs := testing.AllocsPerRun(2000, func() {
		at += ctlPeriod
		r.Next(cpuAt(at, 2+float64(at%(7*time.Second))/1e9))
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per Next in steady state", allocs)
	}
}

func FuzzReclaimerNext(f *testing.F) {
	f.Add(16.0, 2.0, 4.0, 0.5, 0.5, int64(ctlPeriod), 3.0, 8.0)
	f.Add(math.NaN(), 2.0, 4.0, 0.5, 0.5, int64(-time.Hour), math.Inf(1), -1.0)
	f.Add(1e308, 1e308, -1e308, 0.0, 0.0, int64(24*time.Hour), 0.0, 1e308)
	f.Add(0.001, 0.0, 0.0, 0.0, 0.0, int64(0), 1e-300, 5e-324)
	f.Fuzz(func(t *testing.T, capacity, ls, req, be, sys float64, dt int64, ls2, cap2 float64) {
		for _, cfg := range []qos.ReclaimConfig{qos.DefaultReclaimConfig(), {LSPercentile: math.NaN(),
			CPU: qos.ResourceReclaim{Threshold: 2, DeadbandPercent: math.NaN()}}} {
			r := qos.NewReclaimer(cfg)
			now := reclaimT0
			ins := []qos.ResourceUsage{
				{Capacity: capacity, LSUsage: ls, LSRequest: req, BEUsage: be, SystemUsage: sys},
				{Capacity: capacity, LSUsage: ls2, LSRequest: req, BEUsage: be, SystemUsage: sys},
				{Capacity: cap2, LSUsage: ls, LSRequest: ls2, BEUsage: sys, SystemUsage: be},
				{Capacity: capacity, LSUsage: ls2, LSRequest: req, BEUsage: be, SystemUsage: sys},
			}
			for _, u := range ins {
				now = now.Add(time.Duration(dt))
				out := r.Next(qos.ReclaimInput{Now: now, CPU: u, Memory: u})
				checkTerms(t, out.CPU)
				checkTerms(t, out.Memory)
				if out.BatchCPUMilli() < 0 || out.BatchMemoryBytes() < 0 {
					t.Fatalf("negative published %+v", out)
				}
			}
		}
	})
}

func BenchmarkReclaimerNext(b *testing.B) {
	r := qos.NewReclaimer(qos.DefaultReclaimConfig())
	at := time.Duration(0)
	for ; at < 6*time.Minute; at += ctlPeriod { // fill the window first
		r.Next(cpuAt(at, 2+float64(at%(7*time.Second))/1e9))
	}
	b.ReportAllocs()
	for b.Loop() {
		at += ctlPeriod
		r.Next(cpuAt(at, 2+float64(at%(7*time.Second))/1e9))
	}
}
