package qos_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

const (
	escPeriod  = 100 * time.Millisecond
	escGiB     = int64(1) << 30
	escNodeMem = 16 * escGiB
	escFloor   = 0.1 // Budget.Min in these tests
)

var escT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func escDur(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

// withDefaults returns a builder of config table rows: def() changed by f.
// The escalation and reclaim Validate tests share it.
func withDefaults[T any](def func() T) func(f func(*T)) T {
	return func(f func(*T)) T {
		c := def()
		f(&c)
		return c
	}
}

// checkValidate checks Validate's err for a table row: nil when wantIn is
// nil, else an error wrapping ErrInvalidConfig that contains every wantIn.
func checkValidate(t *testing.T, err error, wantIn []string) {
	t.Helper()
	if wantIn == nil {
		if err != nil {
			t.Fatalf("Validate() = %v, want nil", err)
		}
		return
	}
	if !errors.Is(err, qos.ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidConfig", err)
	}
	for _, s := range wantIn {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Validate() = %q, want it to contain %q", err, s)
		}
	}
}

func TestDefaultEscalationConfig(t *testing.T) {
	t.Parallel()
	c := qos.DefaultEscalationConfig()
	want := qos.EscalationConfig{
		MemoryEvictThreshold: 0.95, MemoryEvictTarget: 0.90,
		FreezeAfter: escDur(2 * time.Second), ThawAfter: escDur(5 * time.Second), ThawMarginCPU: 0.5,
		StarvationTimeout: escDur(5 * time.Minute), EvictionInterval: escDur(30 * time.Second),
		MaxEvictionsPerMinute: 2, EvictionBackoff: escDur(30 * time.Second), MaxEvictionBackoff: escDur(10 * time.Minute),
	}
	if c != want {
		t.Fatalf("DefaultEscalationConfig() = %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestEscalationConfigValidate(t *testing.T) {
	t.Parallel()
	with := withDefaults(qos.DefaultEscalationConfig)
	tests := []struct {
		name   string
		c      qos.EscalationConfig
		wantIn []string // substrings of the error; nil = valid
	}{
		{name: "default", c: qos.DefaultEscalationConfig()},
		{name: "memory eviction off", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictThreshold, c.MemoryEvictTarget = 0, 0 })},
		{name: "freezing off", c: with(func(c *qos.EscalationConfig) { c.FreezeAfter = escDur(0) })},
		{name: "starvation eviction off", c: with(func(c *qos.EscalationConfig) { c.StarvationTimeout = escDur(0) })},
		{name: "threshold 1", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictThreshold = 1 })},
		{name: "backoff equals max", c: with(func(c *qos.EscalationConfig) { c.MaxEvictionBackoff = c.EvictionBackoff })},

		{name: "threshold above 1", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictThreshold = 1.5 }),
			wantIn: []string{"memoryEvictThreshold: 1.5 must be in (0, 1]"}},
		{name: "threshold NaN", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictThreshold = math.NaN() }),
			wantIn: []string{"memoryEvictThreshold: NaN"}},
		{name: "target at threshold", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictTarget = 0.95 }),
			wantIn: []string{"memoryEvictTarget: 0.95 must be in (0, memoryEvictThreshold=0.95)"}},
		{name: "target 0", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictTarget = 0 }),
			wantIn: []string{"memoryEvictTarget: 0 must be in (0, memoryEvictThreshold"}},
		{name: "target negative", c: with(func(c *qos.EscalationConfig) { c.MemoryEvictTarget = -0.1 }),
			wantIn: []string{"memoryEvictTarget: -0.1"}},
		{name: "freezeAfter negative", c: with(func(c *qos.EscalationConfig) { c.FreezeAfter = escDur(-time.Second) }),
			wantIn: []string{"freezeAfter: -1s must be >= 0"}},
		{name: "thawAfter negative", c: with(func(c *qos.EscalationConfig) { c.ThawAfter = escDur(-time.Second) }),
			wantIn: []string{"thawAfter: -1s"}},
		{name: "margin Inf", c: with(func(c *qos.EscalationConfig) { c.ThawMarginCPU = math.Inf(1) }),
			wantIn: []string{"thawMarginCPU: +Inf"}},
		{name: "starvation before freeze", c: with(func(c *qos.EscalationConfig) { c.StarvationTimeout = escDur(time.Second) }),
			wantIn: []string{"starvationTimeout: 1s must exceed freezeAfter (2s)"}},
		{name: "interval 0", c: with(func(c *qos.EscalationConfig) { c.EvictionInterval = escDur(0) }),
			wantIn: []string{"evictionInterval: 0s must be > 0"}},
		{name: "rate 0", c: with(func(c *qos.EscalationConfig) { c.MaxEvictionsPerMinute = 0 }),
			wantIn: []string{"maxEvictionsPerMinute: 0 must be in [1, 600]"}},
		{name: "backoff 0", c: with(func(c *qos.EscalationConfig) { c.EvictionBackoff = escDur(0) }),
			wantIn: []string{"evictionBackoff: 0s must be > 0"}},
		{name: "max backoff below backoff", c: with(func(c *qos.EscalationConfig) { c.MaxEvictionBackoff = escDur(time.Second) }),
			wantIn: []string{"maxEvictionBackoff: 1s must be >= evictionBackoff (30s)"}},
		{name: "zero config", c: qos.EscalationConfig{},
			wantIn: []string{"evictionInterval", "maxEvictionsPerMinute", "evictionBackoff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkValidate(t, tt.c.Validate(), tt.wantIn)
			// NewEscalator forces any config into a valid one.
			if err := qos.NewEscalator(tt.c, escPeriod).Config().Validate(); err != nil {
				t.Errorf("forced config does not validate: %v", err)
			}
		})
	}
}

func TestEscalationConfigYAML(t *testing.T) {
	t.Parallel()
	c := qos.DefaultEscalationConfig()
	doc := "memoryEvictThreshold: 0.9\nmemoryEvictTarget: 0.8\nfreezeAfter: 3s\nstarvationTimeout: 10m\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.MemoryEvictThreshold != 0.9 || c.MemoryEvictTarget != 0.8 || c.FreezeAfter.Duration != 3*time.Second ||
		c.StarvationTimeout.Duration != 10*time.Minute || c.ThawAfter.Duration != qos.DefaultThawAfter {
		t.Errorf("parsed %+v", c)
	}
	out, err := yaml.Marshal(qos.DefaultEscalationConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"memoryEvictThreshold: 0.95", "memoryEvictTarget: 0.9", "freezeAfter: 2s", "thawAfter: 5s",
		"thawMarginCPU: 0.5", "starvationTimeout: 5m0s", "evictionInterval: 30s", "maxEvictionsPerMinute: 2",
		"evictionBackoff: 30s", "maxEvictionBackoff: 10m0s"} {
		if !strings.Contains(string(out), key) {
			t.Errorf("YAML of the defaults lacks %q:\n%s", key, out)
		}
	}
	bad := qos.DefaultEscalationConfig()
	if err := yaml.UnmarshalStrict([]byte("freezeAfter: soon\n"), &bad); err == nil {
		t.Error("freezeAfter: soon parsed")
	}
}

// escStep is one control period's input relative to the previous call.
type escStep struct {
	dt       time.Duration // time since the previous call (escPeriod if 0)
	raw      float64       // Budget.Raw; Min is escFloor
	mem      float64       // memory used as a fraction of escNodeMem
	noBatch  bool
	unknown  bool // Budget sanitized
	memStale bool // MemoryAt stays at the last fresh reading
}

// escRun feeds an Escalator and keeps the clock and the last fresh memory
// reading time.
type escRun struct {
	e       *qos.Escalator
	now     time.Time
	memAt   time.Time
	ds      []qos.EscalationDecision
	started bool
}

func newEscRun(c qos.EscalationConfig) *escRun {
	return &escRun{e: qos.NewEscalator(c, escPeriod), now: escT0}
}

func (r *escRun) step(s escStep) qos.EscalationDecision {
	dt := s.dt
	if dt == 0 {
		dt = escPeriod
	}
	if r.started {
		r.now = r.now.Add(dt)
	}
	r.started = true
	if !s.memStale {
		r.memAt = r.now
	}
	b := qos.Budget{Raw: s.raw, Min: escFloor, Applied: math.Max(s.raw, escFloor)}
	if s.unknown {
		b.Sanitized = "lsUsage=NaN unusable"
	}
	d := r.e.Decide(qos.EscalationInput{
		Now: r.now, Budget: b, HasBatch: !s.noBatch,
		MemoryUsed: int64(s.mem * float64(escNodeMem)), MemoryCapacity: escNodeMem, MemoryAt: r.memAt,
	})
	r.ds = append(r.ds, d)
	return d
}

// hold runs s every escPeriod for d (once when d is 0) and returns the
// decisions of that span.
func (r *escRun) hold(d time.Duration, s escStep) []qos.EscalationDecision {
	from := len(r.ds)
	r.step(s)
	for i := escPeriod; i < d; i += escPeriod {
		r.step(s)
	}
	return r.ds[from:]
}

type escTally struct{ froze, thawed, evictions int }

func escCount(ds []qos.EscalationDecision) (t escTally, reasons []string) {
	for _, d := range ds {
		if d.Froze {
			t.froze++
		}
		if d.Thawed {
			t.thawed++
		}
		if d.Evict != nil {
			t.evictions++
			reasons = append(reasons, d.Evict.Reason)
		}
	}
	return t, reasons
}

const (
	escBusy = -2.0 // raw below the floor: LS needs the CPU
	escNear = 0.4  // raw above the floor but below floor + margin (0.6)
	escIdle = 3.0  // raw well above the floor
)

// escPhase is a span of identical periods and what must happen in it.
type escPhase struct {
	d     time.Duration
	s     escStep
	want  escTally
	level qos.EscalationLevel
	// freeze is the Freeze flag of the phase's last decision.
	freeze bool
}

func TestEscalatorStateMachine(t *testing.T) {
	t.Parallel()
	noFreeze := qos.DefaultEscalationConfig()
	noFreeze.FreezeAfter = escDur(0)
	tests := []struct {
		name   string
		cfg    *qos.EscalationConfig
		phases []escPhase
	}{
		{name: "throttle while LS leaves batch its floor", phases: []escPhase{
			{d: time.Minute, s: escStep{raw: escIdle, mem: 0.5}, level: qos.EscalationThrottle},
			{d: time.Minute, s: escStep{raw: escNear, mem: 0.5}, level: qos.EscalationThrottle},
		}},
		{name: "freeze after freezeAfter below the floor", phases: []escPhase{
			{d: 1900 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}, level: qos.EscalationThrottle},
			{d: 200 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1},
				level: qos.EscalationFreeze, freeze: true},
		}},
		{name: "a short LS burst does not freeze", phases: []escPhase{
			{d: 1500 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}},
			{d: 100 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.5}},
			{d: 1500 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}},
		}},
		{name: "noise around the floor does not reset the freeze timer", phases: []escPhase{
			{d: 1 * time.Second, s: escStep{raw: escBusy, mem: 0.5}},
			{d: 100 * time.Millisecond, s: escStep{raw: escNear, mem: 0.5}},
			{d: 1 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1},
				level: qos.EscalationFreeze, freeze: true},
		}},
		{name: "thaw only after thawAfter at floor + margin", phases: []escPhase{
			{d: 3 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1}, level: qos.EscalationFreeze, freeze: true},
			{d: 10 * time.Second, s: escStep{raw: escNear, mem: 0.5}, level: qos.EscalationFreeze, freeze: true},
			{d: 4900 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.5}, level: qos.EscalationFreeze, freeze: true},
			{d: 200 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.5}, want: escTally{thawed: 1}, level: qos.EscalationThrottle},
		}},
		{name: "a dip restarts the thaw timer", phases: []escPhase{
			{d: 3 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1}, freeze: true, level: qos.EscalationFreeze},
			{d: 4 * time.Second, s: escStep{raw: escIdle, mem: 0.5}, freeze: true, level: qos.EscalationFreeze},
			{d: 100 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}, freeze: true, level: qos.EscalationFreeze},
			{d: 4900 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.5}, freeze: true, level: qos.EscalationFreeze},
			{d: 200 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.5}, want: escTally{thawed: 1}},
		}},
		{name: "starvation evicts after the timeout, then one per interval", phases: []escPhase{
			{d: 4*time.Minute + 59*time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1},
				level: qos.EscalationFreeze, freeze: true},
			{d: 2 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{evictions: 1}, level: qos.EscalationEvict, freeze: true},
			{d: 60 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{evictions: 2}, level: qos.EscalationEvict, freeze: true},
			// LS calms down: thaw after thawAfter, no more evictions.
			{d: 6 * time.Second, s: escStep{raw: escIdle, mem: 0.5}, want: escTally{thawed: 1}, level: qos.EscalationThrottle},
		}},
		{name: "starvation counts without freezing when freezing is off", cfg: &noFreeze, phases: []escPhase{
			{d: 4*time.Minute + 59*time.Second, s: escStep{raw: escBusy, mem: 0.5}, level: qos.EscalationThrottle},
			{d: 2 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{evictions: 1}, level: qos.EscalationEvict},
		}},
		{name: "memory: evict above the threshold, down to the target", phases: []escPhase{
			{d: time.Minute, s: escStep{raw: escIdle, mem: 0.94}},
			{d: 100 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.96}, want: escTally{evictions: 1}, level: qos.EscalationEvict},
			// Still above the target: one more decision per interval.
			{d: 61 * time.Second, s: escStep{raw: escIdle, mem: 0.92}, want: escTally{evictions: 2}, level: qos.EscalationEvict},
			{d: time.Minute, s: escStep{raw: escIdle, mem: 0.89}, level: qos.EscalationThrottle},
			// Below the threshold again, without crossing it: nothing.
			{d: time.Minute, s: escStep{raw: escIdle, mem: 0.93}, level: qos.EscalationThrottle},
		}},
		{name: "a stale memory reading never triggers the next eviction", phases: []escPhase{
			{d: 100 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.97}, want: escTally{evictions: 1}, level: qos.EscalationEvict},
			{d: 2 * time.Minute, s: escStep{raw: escIdle, mem: 0.97, memStale: true}, level: qos.EscalationEvict},
			{d: 100 * time.Millisecond, s: escStep{raw: escIdle, mem: 0.97}, want: escTally{evictions: 1}, level: qos.EscalationEvict},
		}},
		{name: "no batch: nothing to freeze or evict", phases: []escPhase{
			{d: 3 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1}, freeze: true, level: qos.EscalationFreeze},
			{d: 100 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.99, noBatch: true}, want: escTally{thawed: 1}},
			{d: 10 * time.Minute, s: escStep{raw: escBusy, mem: 0.99, noBatch: true}},
			// A batch pod arrives: fresh timers.
			{d: 1900 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}},
		}},
		{name: "unknown CPU figures neither freeze nor thaw", phases: []escPhase{
			{d: 1500 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}},
			{d: 1 * time.Second, s: escStep{raw: escBusy, mem: 0.5, unknown: true}},
			{d: 1500 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}},
			{d: 1 * time.Second, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1}, freeze: true, level: qos.EscalationFreeze},
			{d: 10 * time.Minute, s: escStep{raw: escIdle, mem: 0.5, unknown: true}, freeze: true, level: qos.EscalationFreeze},
		}},
		{name: "memory pressure outranks starvation", phases: []escPhase{
			{d: 5*time.Minute + time.Second, s: escStep{raw: escBusy, mem: 0.99}, want: escTally{froze: 1, evictions: 11},
				level: qos.EscalationEvict, freeze: true},
		}},
		{name: "a late period within the gap still counts", phases: []escPhase{
			{d: 1 * time.Second, s: escStep{raw: escBusy, mem: 0.5}},
			{s: escStep{raw: escBusy, mem: 0.5, dt: 900 * time.Millisecond}}, // one period, 900 ms late
			{d: 200 * time.Millisecond, s: escStep{raw: escBusy, mem: 0.5}, want: escTally{froze: 1}, freeze: true, level: qos.EscalationFreeze},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := qos.DefaultEscalationConfig()
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			r := newEscRun(cfg)
			for i, p := range tt.phases {
				ds := r.hold(p.d, p.s)
				got, _ := escCount(ds)
				last := r.ds[len(r.ds)-1]
				if got != p.want || last.Level != p.level || last.Freeze != p.freeze {
					t.Fatalf("phase %d: %+v, level %v, freeze %v; want %+v, level %v, freeze %v (last %+v)",
						i, got, last.Level, last.Freeze, p.want, p.level, p.freeze, last)
				}
				for _, d := range ds {
					if d.ClockJump {
						t.Fatalf("phase %d: unexpected clock jump %+v", i, d)
					}
				}
			}
		})
	}
}

func TestEscalatorMemoryRequest(t *testing.T) {
	t.Parallel()
	e := qos.NewEscalator(qos.DefaultEscalationConfig(), escPeriod)
	used := escNodeMem * 97 / 100
	d := e.Decide(qos.EscalationInput{Now: escT0, Budget: qos.Budget{Raw: escIdle, Min: escFloor},
		MemoryUsed: used, MemoryCapacity: escNodeMem, HasBatch: true})
	if d.Evict == nil {
		t.Fatalf("no eviction at 97%%: %+v", d)
	}
	target := int64(math.Floor(0.9 * float64(escNodeMem)))
	want := qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: used - target, MemoryUsed: used,
		MemoryCapacity: escNodeMem, Threshold: 0.95, Target: 0.9}
	if *d.Evict != want {
		t.Fatalf("request %+v, want %+v", *d.Evict, want)
	}
	if d.Level != qos.EscalationEvict || d.Reason != qos.EvictReasonMemoryPressure || !d.MemoryPressure ||
		d.MemoryUsedRatio != float64(used)/float64(escNodeMem) {
		t.Errorf("decision %+v", d)
	}
	if !d.NextEvictionAt.Equal(escT0.Add(30 * time.Second)) {
		t.Errorf("NextEvictionAt %v, want +30s", d.NextEvictionAt)
	}
	s := d.Evict.String()
	for _, part := range []string{"memory-pressure", "97.0%", ">= 95.0%", "to reach 90.0%"} {
		if !strings.Contains(s, part) {
			t.Errorf("String() = %q lacks %q", s, part)
		}
	}
	// Unknown memory: no eviction, flagged.
	d = e.Decide(qos.EscalationInput{Now: escT0.Add(time.Hour), Budget: qos.Budget{Raw: escIdle, Min: escFloor},
		MemoryUsed: used, HasBatch: true})
	if !d.MemoryUnknown || d.Evict != nil {
		t.Errorf("capacity 0: %+v, want MemoryUnknown and no eviction", d)
	}
}

func TestEscalatorClockJumps(t *testing.T) {
	t.Parallel()
	busy := escStep{raw: escBusy, mem: 0.5}
	tests := []struct {
		name string
		jump time.Duration // the jumping call's dt (negative: backwards)
	}{
		{name: "backwards", jump: -time.Hour},
		{name: "backwards a little", jump: -time.Second},
		{name: "forward gap", jump: 10 * time.Minute},
		{name: "forward just past the gap", jump: 1100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newEscRun(qos.DefaultEscalationConfig())
			// Frozen, one second before the starvation timeout.
			if got, _ := escCount(r.hold(4*time.Minute+59*time.Second, busy)); got != (escTally{froze: 1}) {
				t.Fatalf("before the jump: %+v", got)
			}
			s := busy
			s.dt = tt.jump
			d := r.step(s)
			if !d.ClockJump || d.Evict != nil || !d.Freeze || d.StarvedFor.Duration != 0 {
				t.Fatalf("jumping call: %+v, want a clock jump, still frozen, timers restarted, no eviction", d)
			}
			// The timers restarted: no eviction for another starvationTimeout.
			if got, _ := escCount(r.hold(4*time.Minute+59*time.Second, busy)); got != (escTally{}) {
				t.Fatalf("after the jump: %+v, want nothing (timers restarted)", got)
			}
			if got, reasons := escCount(r.hold(2*time.Second, busy)); got != (escTally{evictions: 1}) ||
				!slices.Equal(reasons, []string{qos.EvictReasonCPUStarvation}) {
				t.Fatalf("past the restarted timeout: %+v %v, want one cpu-starvation eviction", got, reasons)
			}
		})
	}
}

func TestEscalatorJumpRestartsFreezeAndEvictionTimers(t *testing.T) {
	t.Parallel()
	r := newEscRun(qos.DefaultEscalationConfig())
	// 1.9 s below the floor, then the clock goes back: the freeze timer restarts.
	r.hold(1900*time.Millisecond, escStep{raw: escBusy, mem: 0.5})
	if d := r.step(escStep{raw: escBusy, mem: 0.5, dt: -time.Minute}); !d.ClockJump || d.Froze {
		t.Fatalf("jump: %+v", d)
	}
	if got, _ := escCount(r.hold(1900*time.Millisecond, escStep{raw: escBusy, mem: 0.5})); got.froze != 0 {
		t.Fatalf("froze %d times within freezeAfter of the jump", got.froze)
	}
	// An eviction, then the clock goes back an hour: the next one comes one
	// interval after the jump, not an hour later, and not at once.
	r2 := newEscRun(qos.DefaultEscalationConfig())
	if got, _ := escCount(r2.hold(100*time.Millisecond, escStep{raw: escIdle, mem: 0.97})); got.evictions != 1 {
		t.Fatalf("first eviction: %+v", got)
	}
	if d := r2.step(escStep{raw: escIdle, mem: 0.97, dt: -time.Hour}); !d.ClockJump || d.Evict != nil {
		t.Fatalf("jump: %+v", d)
	}
	if got, _ := escCount(r2.hold(29*time.Second, escStep{raw: escIdle, mem: 0.97})); got.evictions != 0 {
		t.Fatalf("%d evictions within the interval after the jump", got.evictions)
	}
	if got, _ := escCount(r2.hold(2*time.Second, escStep{raw: escIdle, mem: 0.97})); got.evictions != 1 {
		t.Fatalf("%d evictions one interval after the jump, want 1", got.evictions)
	}
}

func TestEscalationDecisionJSON(t *testing.T) {
	t.Parallel()
	r := newEscRun(qos.DefaultEscalationConfig())
	r.hold(5*time.Minute+time.Second, escStep{raw: escBusy, mem: 0.97})
	d := r.ds[len(r.ds)-1]
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{`"level":"evict"`, `"reason":"memory-pressure"`, `"freeze":true`, `"starved":true`,
		`"starvedFor":"5m0.9s"`, `"nextEvictionAt":"2025-03-01T12:05:30Z"`} {
		if !strings.Contains(string(data), part) {
			t.Errorf("JSON %s lacks %s", data, part)
		}
	}
	for l, want := range map[qos.EscalationLevel]string{qos.EscalationThrottle: "throttle", qos.EscalationFreeze: "freeze",
		qos.EscalationEvict: "evict", 7: "EscalationLevel(7)"} {
		if l.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(l), l.String(), want)
		}
	}
}

func TestOrderEvictionCandidates(t *testing.T) {
	t.Parallel()
	old, recent := escT0.Add(-24*time.Hour), escT0.Add(-time.Minute)
	c := func(name string, class qos.Class, prio int32, mem int64, start time.Time) qos.EvictionCandidate {
		return qos.EvictionCandidate{UID: types.UID("uid-" + name), Namespace: "ml", Name: name, Class: class,
			Priority: prio, MemoryBytes: mem, StartTime: start}
	}
	tests := []struct {
		name string
		in   []qos.EvictionCandidate
		want []string
	}{
		{name: "empty", in: nil, want: nil},
		{name: "lowest priority first", in: []qos.EvictionCandidate{
			c("p10", qos.ClassBatch, 10, escGiB, old), c("p-5", qos.ClassBatch, -5, escGiB, old), c("p0", qos.ClassBatch, 0, escGiB, old)},
			want: []string{"p-5", "p0", "p10"}},
		{name: "then the largest memory user", in: []qos.EvictionCandidate{
			c("small", qos.ClassBatch, 0, escGiB, old), c("big", qos.ClassBatch, 0, 4*escGiB, old), c("low-prio-small", qos.ClassBatch, -1, 1, old)},
			want: []string{"low-prio-small", "big", "small"}},
		{name: "then the most recently started", in: []qos.EvictionCandidate{
			c("old", qos.ClassBatch, 0, escGiB, old), c("recent", qos.ClassBatch, 0, escGiB, recent), c("unknown", qos.ClassBatch, 0, escGiB, time.Time{})},
			want: []string{"recent", "old", "unknown"}},
		{name: "then by name", in: []qos.EvictionCandidate{
			c("b", qos.ClassBatch, 0, escGiB, old), c("a", qos.ClassBatch, 0, escGiB, old)},
			want: []string{"a", "b"}},
		{name: "LS and BE are never candidates", in: []qos.EvictionCandidate{
			c("ls", qos.ClassLS, -100, 64*escGiB, recent), c("batch", qos.ClassBatch, 100, 1, old),
			c("be", qos.ClassBE, -100, 64*escGiB, recent), c("none", "", -100, 64*escGiB, recent)},
			want: []string{"batch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, x := range qos.OrderEvictionCandidates(slices.Clone(tt.in)) {
				got = append(got, x.Name)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("order %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEvictionRequestSatisfied(t *testing.T) {
	t.Parallel()
	mem := func(n int64) qos.EvictionRequest {
		return qos.EvictionRequest{Reason: qos.EvictReasonMemoryPressure, MemoryToFree: n}
	}
	tests := []struct {
		name    string
		req     qos.EvictionRequest
		evicted int
		freed   int64
		want    bool
	}{
		{name: "starvation: one", req: qos.EvictionRequest{Reason: qos.EvictReasonCPUStarvation}, evicted: 1, want: true},
		{name: "starvation: none yet", req: qos.EvictionRequest{Reason: qos.EvictReasonCPUStarvation}, want: false},
		{name: "memory covered by the first", req: mem(escGiB), evicted: 1, freed: 2 * escGiB, want: true},
		{name: "memory: at least one even for a byte", req: mem(1), evicted: 0, freed: escGiB, want: false},
		{name: "memory covered exactly", req: mem(3 * escGiB), evicted: 2, freed: 3 * escGiB, want: true},
		{name: "memory one byte short", req: mem(3*escGiB + 1), evicted: 2, freed: 3 * escGiB, want: false},
		{name: "memory freed nothing", req: mem(escGiB), evicted: 3, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.req.Satisfied(tt.evicted, tt.freed); got != tt.want {
				t.Fatalf("Satisfied(%d, %d) = %v, want %v", tt.evicted, tt.freed, got, tt.want)
			}
		})
	}
}

// FuzzEscalator feeds arbitrary sequences of periods (clock jumps, NaN
// budgets, odd memory figures) and checks the invariants: nothing happens
// without batch pods, no burst of evictions, every decision encodes.
func FuzzEscalator(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x80\x00\x00\x00\xff\xff\xff\xff\x10\x00\x00\x00\x01\x02\x03\x04"))
	f.Add(slices.Repeat([]byte{1, 0, 0, 0, 0, 0, 0, 128, 200, 0, 0, 0}, 50))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := qos.DefaultEscalationConfig()
		cfg.FreezeAfter, cfg.StarvationTimeout, cfg.EvictionInterval = escDur(time.Second), escDur(3*time.Second), escDur(2*time.Second)
		e := qos.NewEscalator(cfg, escPeriod)
		now := escT0
		var sinceEvict time.Duration
		evicted := false
		for len(data) >= 8 {
			dtRaw := int32(binary.LittleEndian.Uint32(data))
			dt := time.Duration(dtRaw%4000) * time.Millisecond // -4 s .. +4 s
			rawBits, memB, flags := data[4], data[5], data[6]
			data = data[8:]
			now = now.Add(dt)
			raw := float64(int8(rawBits)) / 16
			if flags&1 != 0 {
				raw = math.NaN()
			}
			in := qos.EscalationInput{
				Now: now, Budget: qos.Budget{Raw: raw, Min: escFloor}, HasBatch: flags&2 == 0,
				MemoryUsed: int64(memB) * escNodeMem / 200, MemoryCapacity: escNodeMem,
			}
			if flags&4 != 0 {
				in.MemoryCapacity = -1
			}
			d := e.Decide(in)
			if _, err := json.Marshal(d); err != nil {
				t.Fatalf("decision does not encode: %v (%+v)", err, d)
			}
			if !in.HasBatch && (d.Freeze || d.Evict != nil || d.Level != qos.EscalationThrottle) {
				t.Fatalf("acts without batch pods: %+v", d)
			}
			if d.ClockJump {
				sinceEvict = 0
			} else if dt > 0 {
				sinceEvict += dt
			}
			if d.Evict != nil {
				if evicted && sinceEvict < cfg.EvictionInterval.Duration {
					t.Fatalf("eviction %v after the last one, interval %v", sinceEvict, cfg.EvictionInterval.Duration)
				}
				if d.Evict.Reason == qos.EvictReasonMemoryPressure && d.Evict.MemoryToFree <= 0 {
					t.Fatalf("memory eviction with nothing to free: %+v", d.Evict)
				}
				if d.Level != qos.EscalationEvict {
					t.Fatalf("eviction at level %v", d.Level)
				}
				evicted, sinceEvict = true, 0
			}
		}
	})
}

// FuzzEscalationConfig parses arbitrary YAML over the defaults: no panic,
// and whatever NewEscalator makes of it validates.
func FuzzEscalationConfig(f *testing.F) {
	for _, s := range []string{"", "freezeAfter: 3s\n", "memoryEvictThreshold: 1e-320\n", "memoryEvictTarget: 2\n",
		"starvationTimeout: 1s\n", "maxEvictionsPerMinute: -3\n", "thawMarginCPU: .nan\n", "evictionBackoff: -1h\n",
		"maxEvictionBackoff: 1ns\nevictionBackoff: 1h\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c := qos.DefaultEscalationConfig()
		if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
			return
		}
		if err := c.Validate(); err != nil && !errors.Is(err, qos.ErrInvalidConfig) {
			t.Fatalf("Validate() = %v, not wrapping ErrInvalidConfig", err)
		}
		if err := qos.NewEscalator(c, escPeriod).Config().Validate(); err != nil {
			t.Fatalf("forced config %+v does not validate: %v", c, err)
		}
	})
}

func TestEscalationLevelText(t *testing.T) {
	t.Parallel()
	for _, l := range []qos.EscalationLevel{qos.EscalationThrottle, qos.EscalationFreeze, qos.EscalationEvict} {
		b, err := l.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back qos.EscalationLevel
		if err := back.UnmarshalText(b); err != nil || back != l {
			t.Fatalf("round trip of %v: %v, %v", l, back, err)
		}
	}
	var l qos.EscalationLevel
	if err := l.UnmarshalText([]byte("panic")); !errors.Is(err, qos.ErrInvalidConfig) {
		t.Fatalf("unknown level: %v", err)
	}
}
