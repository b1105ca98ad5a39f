package config

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/qos"
)

// fakeApplier records what a Reloader hands the agent.
type fakeApplier struct {
	mu      sync.Mutex
	cfgs    []Config
	updates []Status
}

var _ Applier = (*fakeApplier)(nil)

func (f *fakeApplier) ApplyConfig(cfg Config, st Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfgs = append(f.cfgs, cfg)
	f.updates = append(f.updates, st)
}

// last returns the last configuration and status handed over, and how many there were.
func (f *fakeApplier) last() (Config, Status, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.cfgs) == 0 {
		return Config{}, Status{}, 0
	}
	return f.cfgs[len(f.cfgs)-1], f.updates[len(f.updates)-1], len(f.cfgs)
}

// fakeWarner records Node events as "reason: message".
type fakeWarner struct {
	mu     sync.Mutex
	events []string
}

func (f *fakeWarner) Warn(reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, reason+": "+message)
}

func (f *fakeWarner) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

const baseConfigYAML = `cgroupRoot: /host/sys/fs/cgroup

period: 100ms
cfsPeriod: 100ms
policy: {threshold: 0.9, minBatchCPU: 0.1}
`

// reloadRig is a Reloader on a configuration file in a temporary directory, driven
// poll by poll.
type reloadRig struct {
	t      *testing.T
	path   string
	r      *Reloader
	agent  *fakeApplier
	events *fakeWarner
	reg    *prometheus.Registry
}

func newReloadRig(t *testing.T, initial string, override func(Config) Config) *reloadRig {
	t.Helper()
	rr := &reloadRig{t: t, path: filepath.Join(t.TempDir(), "config.yaml"), agent: &fakeApplier{},
		events: &fakeWarner{}, reg: prometheus.NewRegistry()}
	if err := os.WriteFile(rr.path, []byte(initial), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load([]byte(initial))
	if err != nil {
		t.Fatal(err)
	}
	if override != nil {
		cfg = override(cfg)
	}
	rr.r, err = NewReloader(cfg, []byte(initial), rr.agent, ReloaderOptions{Path: rr.path, Override: override,
		Events: rr.events, Registry: rr.reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

func (rr *reloadRig) write(content string) {
	rr.t.Helper()
	if err := os.WriteFile(rr.path, []byte(content), 0o644); err != nil {
		rr.t.Fatal(err)
	}
}

func (rr *reloadRig) metric(result string) float64 {
	return testutil.ToFloat64(rr.r.metrics.Reloads.WithLabelValues(result))
}

func TestReloaderAppliesOrRefuses(t *testing.T) {
	t.Parallel()
	listenFlag := func(c Config) Config { c.ListenAddress = "127.0.0.1:1"; return c }
	type step struct {
		content string
		// result is applied, rejected or "" (no change seen).
		result string
		// changed and needsRestart are the fields the step reports.
		changed, needsRestart []string
		// errHas is in the refusal's error (and the event).
		errHas string
		// threshold and period are what the agent runs with after the step.
		threshold float64
		period    time.Duration
	}
	for _, tc := range []struct {
		name     string
		override func(Config) Config
		steps    []step
	}{
		{name: "valid live change applied", steps: []step{{
			content: strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 0.7", 1),
			result:  ReloadApplied, changed: []string{"policy.threshold"}, threshold: 0.7, period: 100 * time.Millisecond}}},
		{name: "unchanged file is a no-op", steps: []step{{content: baseConfigYAML, threshold: 0.9,
			period: 100 * time.Millisecond}}},
		{name: "comments only: applied, nothing changed", steps: []step{{content: "# edited\n" + baseConfigYAML,
			result: ReloadApplied, threshold: 0.9, period: 100 * time.Millisecond}}},
		{name: "parse error refused, old kept", steps: []step{{content: "policy: {threshold: [\n",
			result: ReloadRejected, errHas: "invalid config", threshold: 0.9, period: 100 * time.Millisecond}}},
		{name: "unknown field refused", steps: []step{{content: baseConfigYAML + "polcy: {}\n",
			result: ReloadRejected, errHas: "polcy", threshold: 0.9, period: 100 * time.Millisecond}}},
		{name: "failed validation refused", steps: []step{{
			content: strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 1.5", 1),
			result:  ReloadRejected, errHas: "policy.threshold", threshold: 0.9, period: 100 * time.Millisecond}}},
		{name: "restart-only field reported, live one applied", steps: []step{{
			content: strings.NewReplacer("period: 100ms\ncfs", "period: 200ms\ncfs", "threshold: 0.9", "threshold: 0.8").
				Replace(baseConfigYAML),
			result: ReloadApplied, changed: []string{"policy.threshold"}, needsRestart: []string{"period"},
			threshold: 0.8, period: 100 * time.Millisecond}}},
		{name: "live field invalid with the fields in force refused", steps: []step{{
			// Valid with its own cfsPeriod (1s: floor 0.001), not with the one in force
			// (100ms: floor 0.01).
			content: strings.Replace(baseConfigYAML, "cfsPeriod: 100ms", "cfsPeriod: 1s\nminPodCPU: 0.005", 1),
			result:  ReloadRejected, errHas: "minPodCPU", threshold: 0.9, period: 100 * time.Millisecond}}},
		{name: "a flag outranks the file", override: listenFlag, steps: []step{{
			content: baseConfigYAML + "listenAddress: :9999\n", result: ReloadApplied, threshold: 0.9,
			period: 100 * time.Millisecond}}},
		{name: "refused then valid applies again", steps: []step{
			{content: "policy: {threshold: 0}\n", result: ReloadRejected, errHas: "policy.threshold", threshold: 0.9,
				period: 100 * time.Millisecond},
			{content: "policy: {threshold: 0}\n", threshold: 0.9, period: 100 * time.Millisecond},
			{content: strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 0.6", 1), result: ReloadApplied,
				changed: []string{"policy.threshold"}, threshold: 0.6, period: 100 * time.Millisecond},
		}},
		{name: "back to the file in force after a refusal", steps: []step{
			{content: "nope: 1\n", result: ReloadRejected, errHas: "nope", threshold: 0.9, period: 100 * time.Millisecond},
			{content: baseConfigYAML, result: ReloadApplied, threshold: 0.9, period: 100 * time.Millisecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rr := newReloadRig(t, baseConfigYAML, tc.override)
			startHash := rr.r.status.Hash
			var applied, rejected float64
			inForceHash := startHash
			for i, s := range tc.steps {
				rr.write(s.content)
				_, _, before := rr.agent.last()
				eventsBefore := len(rr.events.all())
				if res := rr.r.poll(); res != nil {
					t.Fatalf("step %d: a change acted on at its first read: %+v", i, res)
				}
				res := rr.r.poll()
				cfg, st, n := rr.agent.last()
				if s.result == "" {
					if res != nil || n != before {
						t.Fatalf("step %d: unchanged file gave %+v and %d updates, want nothing", i, res, n-before)
					}
					continue
				}
				if res == nil || res.Result != s.result || n != before+1 {
					t.Fatalf("step %d: result %+v (%d updates), want %s and one update", i, res, n-before, s.result)
				}
				if !reflect.DeepEqual(res.Changed, s.changed) || !reflect.DeepEqual(st.NeedsRestart, s.needsRestart) {
					t.Errorf("step %d: changed %v needsRestart %v, want %v and %v", i, res.Changed, st.NeedsRestart,
						s.changed, s.needsRestart)
				}
				if cfg.Policy.Threshold != s.threshold || cfg.Period.Duration != s.period || st.InForce.Policy.Threshold != s.threshold {
					t.Errorf("step %d: agent runs threshold %v period %v, want %v and %v", i, cfg.Policy.Threshold,
						cfg.Period.Duration, s.threshold, s.period)
				}
				if tc.override != nil && cfg.ListenAddress != "127.0.0.1:1" {
					t.Errorf("step %d: listenAddress %q, want the flag's", i, cfg.ListenAddress)
				}
				if !reflect.DeepEqual(st.LastReload, res) {
					t.Errorf("step %d: status last reload %+v, want %+v", i, st.LastReload, res)
				}
				events := rr.events.all()[eventsBefore:]
				switch s.result {
				case ReloadApplied:
					applied++
					inForceHash = Hash([]byte(s.content))
					if len(events) != 0 || res.Error != "" {
						t.Errorf("step %d: applied with events %q error %q", i, events, res.Error)
					}
					if got := testutil.ToFloat64(rr.r.metrics.LastSuccess); got != 1 {
						t.Errorf("step %d: last reload success = %v, want 1", i, got)
					}
				case ReloadRejected:
					rejected++
					if !strings.Contains(res.Error, s.errHas) {
						t.Errorf("step %d: error %q, want it to name %q", i, res.Error, s.errHas)
					}
					if len(events) != 1 || !strings.HasPrefix(events[0], ReasonRejected+": ") ||
						!strings.Contains(events[0], res.Error) || !strings.Contains(events[0], short(inForceHash)) {
						t.Errorf("step %d: events %q, want one %s naming the error and the hash kept", i, events,
							ReasonRejected)
					}
					if got := testutil.ToFloat64(rr.r.metrics.LastSuccess); got != 0 {
						t.Errorf("step %d: last reload success = %v, want 0", i, got)
					}
				}
				if st.Hash != inForceHash {
					t.Errorf("step %d: status hash %s, want %s", i, st.Hash, inForceHash)
				}
				if got := testutil.ToFloat64(rr.r.metrics.Info.WithLabelValues(inForceHash)); got != 1 {
					t.Errorf("step %d: config_info{hash=%s} = %v, want 1", i, short(inForceHash), got)
				}
				if got := testutil.CollectAndCount(rr.r.metrics.Info); got != 1 {
					t.Errorf("step %d: %d config_info series, want 1", i, got)
				}
			}
			if a, r := rr.metric(ReloadApplied), rr.metric(ReloadRejected); a != applied || r != rejected {
				t.Errorf("reloads applied %v rejected %v, want %v and %v", a, r, applied, rejected)
			}
		})
	}
}

// An unreadable file (the ConfigMap's key removed) is refused once, not every poll.
func TestReloaderUnreadableFile(t *testing.T) {
	t.Parallel()
	rr := newReloadRig(t, baseConfigYAML, nil)
	if err := os.Remove(rr.path); err != nil {
		t.Fatal(err)
	}
	rr.r.poll()
	res := rr.r.poll()
	if res == nil || res.Result != ReloadRejected || !strings.Contains(res.Error, "reading") || res.Hash != "" {
		t.Fatalf("result %+v, want a refusal that says the file could not be read", res)
	}
	if res := rr.r.poll(); res != nil {
		t.Fatalf("third poll of the same missing file: %+v, want no change", res)
	}
	if ev := rr.events.all(); len(ev) != 1 {
		t.Fatalf("events %q, want one", ev)
	}
	if cfg, st, _ := rr.agent.last(); cfg.Policy.Threshold != 0.9 || st.Hash != Hash([]byte(baseConfigYAML)) {
		t.Fatalf("agent got threshold %v hash %s: want the configuration in force", cfg.Policy.Threshold, st.Hash)
	}
}

// kubeletSwap updates a mounted ConfigMap's key the way kubelet's atomic writer does:
// the data in a new timestamped directory, a new ..data symlink renamed over the old
// one (atomic), the old directory removed. dir/config.yaml is a symlink to
// ..data/config.yaml throughout.
func kubeletSwap(t *testing.T, dir string, gen int, content string) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_11_28_00_00_0"+string(rune('0'+gen)))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "config.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
}

func TestReloaderFollowsKubeletSymlinkSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	kubeletSwap(t, dir, 1, baseConfigYAML)
	path := filepath.Join(dir, "config.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(data)
	if err != nil {
		t.Fatal(err)
	}
	agent, events := &fakeApplier{}, &fakeWarner{}
	r, err := NewReloader(cfg, data, agent, ReloaderOptions{Path: path, Interval: 5 * time.Millisecond, Events: events,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Run publishes the configuration in force first.
	testenv.WaitFor(t, 10*time.Second, "the configuration in force published", func() bool {
		_, st, n := agent.last()
		return n == 1 && st.Hash == Hash(data) && st.LastReload == nil
	})
	for gen, tc := range []struct {
		content   string
		result    string
		threshold float64
	}{
		{strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 0.5", 1), ReloadApplied, 0.5},
		{"policy: {threshold: -1}\n", ReloadRejected, 0.5},
		{strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 0.4", 1), ReloadApplied, 0.4},
	} {
		kubeletSwap(t, dir, gen+2, tc.content)
		hash := Hash([]byte(tc.content))
		testenv.WaitFor(t, 10*time.Second, "the swapped file's "+tc.result, func() bool {
			_, st, _ := agent.last()
			return st.LastReload != nil && st.LastReload.Hash == hash && st.LastReload.Result == tc.result
		})
		if cfg, _, _ := agent.last(); cfg.Policy.Threshold != tc.threshold {
			t.Fatalf("swap %d: threshold %v, want %v", gen, cfg.Policy.Threshold, tc.threshold)
		}
	}
	if ev := events.all(); len(ev) != 1 || !strings.HasPrefix(ev[0], ReasonRejected) {
		t.Fatalf("events %q, want one %s", ev, ReasonRejected)
	}
}

// Every live field is named in LiveFields and copied by CopyLive, and nothing else is.
func TestLiveFieldsAreCopied(t *testing.T) {
	t.Parallel()
	base := Default()
	changed := Default()
	budget := 0.3
	changed.Policy = qos.Policy{Threshold: 0.5, MinBatchCPU: 0.2, MaxBatchCPU: 3, RestoreStepPercent: 5}
	changed.Signals.GuardConfig = qos.GuardConfig{CutPercent: 30, RestoreHold: metav1.Duration{Duration: 2 * time.Second},
		RestorePercentPerSecond: 20}
	changed.MinPodCPU = 0.05
	changed.ShutdownBudgetCPU = &budget
	// And every other kind of field.
	changed.Period.Duration = time.Second
	changed.ListenAddress = ":1"
	changed.Escalation.FreezeAfter.Duration = time.Minute
	changed.GPU.Mode = GPUModeOff
	got := base
	CopyLive(&got, changed)
	if fields := changedFields(base, got); !sameSet(fields, LiveFields()) {
		t.Fatalf("CopyLive changed %v, want exactly the live fields %v", fields, LiveFields())
	}
	if restart := changedFields(got, changed); !reflect.DeepEqual(restart,
		[]string{"escalation.freezeAfter", "gpu.mode", "listenAddress", "period"}) {
		t.Fatalf("fields left for a restart: %v", restart)
	}
	budget = 9 // CopyLive copied the value, not the pointer
	if *got.ShutdownBudgetCPU != 0.3 {
		t.Fatalf("shutdownBudgetCPU shares the source's pointer")
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		seen[s]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// A file read half-written (empty, here) and complete at the next read is taken only
// once it reads the same twice: the empty file, every default, is never applied.
func TestReloaderWaitsForAStableFile(t *testing.T) {
	t.Parallel()
	rr := newReloadRig(t, baseConfigYAML, nil)
	valid := strings.Replace(baseConfigYAML, "threshold: 0.9", "threshold: 0.7", 1)
	for i, content := range []string{"", valid} {
		rr.write(content)
		if res := rr.r.poll(); res != nil {
			t.Fatalf("read %d: acted on a file read once: %+v", i, res)
		}
	}
	res := rr.r.poll()
	if res == nil || res.Result != ReloadApplied || res.Hash != Hash([]byte(valid)) {
		t.Fatalf("result %+v, want the complete file applied", res)
	}
	if _, _, n := rr.agent.last(); n != 1 {
		t.Fatalf("%d configurations handed over, want 1", n)
	}
}
