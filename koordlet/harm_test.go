package koordlet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/qos"
)

// fakeSignals is a harm signal source the test drives: harm it reports wakes the agent.
type fakeSignals struct {
	mode signals.Mode
	wake chan struct{}

	mu       sync.Mutex
	harm     []signals.Harm
	err      error
	watched  map[string]string // UID -> cgroup
	watchErr map[string]error  // UID -> error for its next Watch
	unwatch  []string
	closed   bool
}

var _ signals.Source = (*fakeSignals)(nil)

func newFakeSignals(mode signals.Mode) *fakeSignals {
	return &fakeSignals{mode: mode, wake: make(chan struct{}, 1), watched: map[string]string{},
		watchErr: map[string]error{}}
}

func (f *fakeSignals) Mode() signals.Mode { return f.mode }
func (f *fakeSignals) Watch(p signals.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.watchErr[p.UID]; err != nil {
		delete(f.watchErr, p.UID)
		return err
	}
	f.watched[p.UID] = p.Cgroup
	return nil
}
func (f *fakeSignals) Unwatch(uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.watched, uid)
	f.unwatch = append(f.unwatch, uid)
}
func (f *fakeSignals) Wake() <-chan struct{} { return f.wake }
func (f *fakeSignals) Take(dst []signals.Harm) ([]signals.Harm, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dst = append(dst, f.harm...)
	err := f.err
	f.harm, f.err = nil, nil
	return dst, err
}
func (f *fakeSignals) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (f *fakeSignals) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// report queues harm seen now (over the last 20 ms) and wakes the agent.
func (f *fakeSignals) report(sig qos.Signal, pod string) {
	now := time.Now()
	f.mu.Lock()
	f.harm = append(f.harm, signals.Harm{Signal: sig, At: now, Since: now.Add(-20 * time.Millisecond), Pod: pod,
		Value: 4 * time.Millisecond})
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fakeSignals) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeSignals) watchedCgroup(uid string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cg, ok := f.watched[uid]
	return cg, ok
}

// newSignalRig is a rig whose agent has the fake source src in mode src.Mode().
func newSignalRig(t *testing.T, src *fakeSignals, mutate func(*config.Config)) *rig {
	t.Helper()
	return newRigWith(t, cgroupstest.V2, func(c *config.Config) {
		c.Signals.Mode = string(src.mode)
		if mutate != nil {
			mutate(c)
		}
	}, nil, func(o signals.Options) (signals.Source, signals.State, error) {
		if o.Mode != src.mode {
			t.Errorf("opener got mode %q, want %q", o.Mode, src.mode)
		}
		if o.Cgroup2Root == "" || o.PollInterval != signals.DefaultPollInterval {
			t.Errorf("opener options %+v: want the cgroup2 root and the default poll interval", o)
		}
		return src, signals.State{Requested: src.mode, Active: src.mode}, nil
	})
}

// In a signal mode, LS usage rising with no harm signal does not cut batch; harm does,
// at once, and the cut records its signal in the metrics and /status.
func TestAgentHarmCutsUtilisationDoesNot(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModeEBPF)
	r := newSignalRig(t, src, nil)
	busy := r.warmUp()
	before := r.agent.Status().Budget.Applied
	// LS jumps from 0.3 to 1.2 cores: sampling mode cuts here (TestAgentCutObservesReaction).
	for range 5 {
		r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
		if st := r.agent.Status(); st.Budget.Applied < before || st.Budget.Reason == qos.ReasonCut {
			t.Fatalf("budget %+v after an LS rise without harm: want no cut below %v", st.Budget, before)
		}
	}
	if v := testutil.ToFloat64(r.agent.metrics.Actions.WithLabelValues("cut")); v != 0 {
		t.Fatalf("%v cuts without harm", v)
	}
	// Harm in the next period: a cut, toward the utilisation target.
	applied := r.agent.Status().Budget.Applied
	src.report(qos.SignalRunqueueDelay, "default/ls")
	r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
	st := r.agent.Status()
	if st.Budget.Reason != qos.ReasonCut || st.Budget.Applied >= applied {
		t.Fatalf("budget %+v after harm, want a cut below %v", st.Budget, applied)
	}
	if !strings.Contains(st.Budget.Formula, "utilisation alone never cuts") {
		t.Fatalf("formula %q: want the guard's", st.Budget.Formula)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Cuts.WithLabelValues("runqueue_delay")); v != 1 {
		t.Fatalf("runqueue_delay cuts %v, want 1", v)
	}
	if v := testutil.ToFloat64(r.agent.metrics.HarmSignals.WithLabelValues("runqueue_delay")); v != 1 {
		t.Fatalf("runqueue_delay harm %v, want 1", v)
	}
	c := st.Signals.LastCut
	if c == nil || c.Signal != "runqueue_delay" || c.Pod != "default/ls" || c.ReactionSeconds <= 0 || c.ReactionSeconds > 1 {
		t.Fatalf("status lastCut %+v, want the runqueue_delay cut of default/ls", c)
	}
	if st.Signals.Active != signals.ModeEBPF || st.Signals.LastHarm == nil || st.Signals.WatchedPods != 2 {
		t.Fatalf("status signals %+v: want ebpf, the last harm and the two LS pods watched", st.Signals)
	}
	// The harm goes: the budget holds for restoreHold (1 s, 10 periods), then grows.
	for i := range 12 {
		r.step(1.5, busy)
		if b := r.agent.Status().Budget; i < 9 && b.Applied != st.Budget.Applied {
			t.Fatalf("period %d after harm: budget %+v, want it held at %v", i, b, st.Budget.Applied)
		}
	}
	if b := r.agent.Status().Budget; b.Applied <= st.Budget.Applied {
		t.Fatalf("budget %+v after the hold, want it restoring above %v", b, st.Budget.Applied)
	}
}

// A harm signal between two periods cuts batch at once: the control loop wakes on it
// and writes the quota long before the next period (10 s here).
func TestAgentHarmWakesTheLoop(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModePSI)
	r := newSignalRig(t, src, func(c *config.Config) { c.Period = metav1.Duration{Duration: 10 * time.Second} })
	r.now = time.Now().Add(-time.Minute) // the loop's own ticks use the real clock
	busy := r.warmUp()
	for range 30 { // past the CFS period, so that the raises are written
		r.step(1.5, busy)
	}
	before := r.quota(r.tier) + r.quota(r.inPlace)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	launched := time.Now()
	go func() { done <- r.agent.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Past Run's first tick (on the real clock): the loop now waits out its 10 s period.
	testenv.WaitFor(t, 5*time.Second, "Run's first control period", func() bool {
		return !r.agent.Status().Time.Before(launched)
	})
	start := time.Now()
	src.report(qos.SignalPSICPU, "default/ls")
	for r.quota(r.tier)+r.quota(r.inPlace) >= before {
		if time.Since(start) > 3*time.Second {
			t.Fatalf("batch quotas still %v 3 s after harm: the loop waited for its 10 s period", before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The loop counts the cut and publishes /status just after the writes the test saw.
	testenv.WaitFor(t, 3*time.Second, "the cut in /status", func() bool {
		c := r.agent.Status().Signals.LastCut
		return c != nil && c.Signal == "psi_cpu"
	})
	if v := testutil.ToFloat64(r.agent.metrics.Cuts.WithLabelValues("psi_cpu")); v != 1 {
		t.Fatalf("psi_cpu cuts %v, want 1", v)
	}
}

// A source that cannot read makes the agent blind for the period: utilisation decides,
// as in sampling mode, and the error shows.
func TestAgentBlindSignalFallsBackToUtilisation(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModeEBPF)
	r := newSignalRig(t, src, nil)
	r.warmUp()
	src.fail(errors.New("map read failed"))
	r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
	st := r.agent.Status()
	if st.Budget.Reason != qos.ReasonCut || st.Signals.LastCut == nil || st.Signals.LastCut.Signal != "utilisation" {
		t.Fatalf("budget %+v, last cut %+v: want a utilisation cut while blind", st.Budget, st.Signals.LastCut)
	}
	if !strings.Contains(st.Signals.Error, "map read failed") {
		t.Fatalf("status signals error %q", st.Signals.Error)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Errors.WithLabelValues("signal_read")); v != 1 {
		t.Fatalf("signal_read errors %v, want 1", v)
	}
}

// LS pods are watched by their cgroup as they come (a missing cgroup is tried again) and
// unwatched as they go or leave LS; batch pods are never watched.
func TestAgentWatchesLSPods(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModeEBPF)
	src.watchErr[string(lsUID)] = fmt.Errorf("not yet: %w", signals.ErrNotExist)
	r := newSignalRig(t, src, nil)
	r.warmUp()
	if _, ok := src.watchedCgroup(string(lsUID)); ok {
		t.Fatal("watched although Watch failed")
	}
	for range 2 * slowEvery {
		r.step(1.5, nil)
	}
	if cg, ok := src.watchedCgroup(string(lsUID)); !ok || cg != r.lsCg {
		t.Fatalf("LS pod watched as %q (%v), want %q after the retry", cg, ok, r.lsCg)
	}
	if _, ok := src.watchedCgroup(string(batchUID1)); ok {
		t.Fatal("a batch pod is watched")
	}
	if _, ok := src.watchedCgroup(string(invalidUID)); !ok {
		t.Fatal("the LS pod with an invalid annotation is not watched")
	}
	// The LS pod becomes batch: unwatched.
	r.changePods(func(i int, p *corev1.Pod) {
		if i == 0 {
			p.Annotations = map[string]string{"understory.io/qos-class": "batch"}
		}
	})
	r.step(1.5, nil)
	if _, ok := src.watchedCgroup(string(lsUID)); ok {
		t.Fatal("a pod that left LS is still watched")
	}
	if st := r.agent.Status(); st.Signals.WatchedPods != 1 {
		t.Fatalf("watched pods %d, want 1", st.Signals.WatchedPods)
	}
	// Shutdown unwatches all and closes the source.
	r.agent.shutdown()
	if _, ok := src.watchedCgroup(string(invalidUID)); ok || !src.closed {
		t.Fatal("shutdown left a pod watched or the source open")
	}
}

// The agent opens the best source from its mode down and says why the better ones
// failed: eBPF denied → PSI; PSI unsupported too → sampling.
func TestAgentSignalFallback(t *testing.T) {
	t.Parallel()
	denied := fmt.Errorf("loading: %w", errPermissionFake)
	tests := []struct {
		name     string
		mode     signals.Mode
		psiErr   error
		active   signals.Mode
		fallback []string // mode:reason
	}{
		{"auto: eBPF denied, PSI", signals.ModeAuto, nil, signals.ModePSI, []string{"ebpf:error"}},
		{"ebpf requested, denied, PSI unsupported", signals.ModeEBPF, fmt.Errorf("no: %w", errors.ErrUnsupported),
			signals.ModeSampling, []string{"ebpf:error", "psi:unsupported"}},
		{"sampling asked for", signals.ModeSampling, nil, signals.ModeSampling, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			psiSrc := newFakeSignals(signals.ModePSI)
			openers := []signals.Opener{
				{Mode: signals.ModeEBPF, Open: func(signals.Options) (signals.Source, error) { return nil, denied }},
				{Mode: signals.ModePSI, Open: func(signals.Options) (signals.Source, error) {
					if tc.psiErr != nil {
						return nil, tc.psiErr
					}
					return psiSrc, nil
				}},
			}
			r := newRigWith(t, cgroupstest.Hybrid, func(c *config.Config) { c.Signals.Mode = string(tc.mode) }, nil,
				func(o signals.Options) (signals.Source, signals.State, error) {
					if !strings.HasSuffix(o.Cgroup2Root, "/unified") || !strings.HasSuffix(o.CPUCgroupRoot, "/cpu") {
						t.Errorf("hybrid roots %q, %q: want unified/ and cpu/", o.Cgroup2Root, o.CPUCgroupRoot)
					}
					return signals.OpenWith(o, openers)
				})
			st := r.agent.Status().Signals
			var got []string
			for _, f := range st.Fallbacks {
				got = append(got, string(f.Mode)+":"+f.Reason)
			}
			if st.Active != tc.active || st.Requested != tc.mode || strings.Join(got, ",") != strings.Join(tc.fallback, ",") {
				t.Fatalf("signals %+v, want %s with fallbacks %v", st, tc.active, tc.fallback)
			}
			for _, m := range []signals.Mode{signals.ModeEBPF, signals.ModePSI, signals.ModeSampling} {
				want := 0.0
				if m == tc.active {
					want = 1
				}
				if v := testutil.ToFloat64(r.agent.metrics.SignalSource.WithLabelValues(string(m))); v != want {
					t.Fatalf("understory_signal_source{source=%q} %v, want %v", m, v, want)
				}
			}
			if (tc.active == signals.ModeSampling) == r.agent.ctl.signalled() {
				t.Fatalf("signalled() = %v with %s active", r.agent.ctl.signalled(), tc.active)
			}
		})
	}
}

var errPermissionFake = errors.New("operation not permitted")

// A restarted agent continues from the tier limit the previous run left in force (its
// shutdown budget, or a harm cut): its first budget is at most that, not the utilisation
// target, and stays there for restoreHold, as after harm; then it grows back.
func TestAgentStartsFromTheTierLimitInForce(t *testing.T) {
	t.Parallel()
	src := newFakeSignals(signals.ModeEBPF)
	r := newSignalRig(t, src, func(c *config.Config) {
		h, err := cgroups.Open(c.CgroupRoot)
		if err != nil {
			t.Fatal(err)
		}
		g, err := h.Load("kubepods/understory-batch")
		if err != nil {
			t.Fatal(err)
		}
		// What the previous run left: 0.3 cores.
		if err := g.SetCPULimit(30*time.Millisecond, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	})
	busy := r.warmUp()
	st := r.agent.Status()
	if st.Budget.Applied > 0.3+1e-9 || st.Budget.Target <= 0.3 {
		t.Fatalf("first budget %+v: want at most the 0.3 cores found in force, below the target", st.Budget)
	}
	first := st.Budget.Applied
	for i := range 12 {
		r.step(1.5, busy)
		if b := r.agent.Status().Budget; i < 8 && b.Applied != first {
			t.Fatalf("period %d after the start: budget %+v, want it held at %v", i, b, first)
		}
	}
	if b := r.agent.Status().Budget; b.Applied <= first {
		t.Fatalf("budget %+v after restoreHold, want it growing above %v", b, first)
	}
}
