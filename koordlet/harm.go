package koordlet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// SignalsConfig is the agent's fast LS harm signals: which source (signals.mode) and
// when each one counts as harm, and how the budget answers harm (qos.GuardConfig:
// cutPercent, restoreHold, restorePercentPerSecond, at this level of the YAML).
type SignalsConfig struct {
	// Mode is auto (the best this node allows, eBPF → PSI → sampling), ebpf, psi or
	// sampling (utilisation only: the agent's behaviour before signals). An explicit
	// mode this node cannot give falls back down the same order, and /status and
	// understory_signal_source_unavailable say why.
	Mode string `json:"mode,omitempty"`
	// PollInterval is how often the eBPF source reads its maps.
	PollInterval metav1.Duration `json:"pollInterval,omitempty"`
	// RunqueueDelay is when an LS pod's run-queue delay (eBPF) is harm.
	RunqueueDelay RunqueueDelayConfig `json:"runqueueDelay"`
	// PSI is when pressure stall (PSI mode) is harm.
	PSI PSIConfig `json:"psi"`
	qos.GuardConfig
}

// RunqueueDelayConfig: an LS pod is harmed when its run-queue delay at Quantile, over
// one poll interval with at least MinSamples wake-ups, is above Threshold, and the
// delays above it that took the CPU from batch are alone enough for that (batch caused
// it), unless AnyCause.
type RunqueueDelayConfig struct {
	Quantile   float64         `json:"quantile,omitempty"`
	Threshold  metav1.Duration `json:"threshold,omitempty"`
	MinSamples uint64          `json:"minSamples,omitempty"`
	// AnyCause counts every slow delay as harm, whatever held the CPU: also delays
	// behind the pod's own or other LS tasks, which cutting batch cannot shorten.
	AnyCause bool `json:"anyCause,omitempty"`
}

// PSIConfig are the kernel PSI triggers on each LS pod: CPUStall of "some" stall per
// Window on its cpu.pressure (less its own CFS throttling), MemoryStall per Window on its
// memory.pressure.
type PSIConfig struct {
	CPUStall    metav1.Duration `json:"cpuStall,omitempty"`
	MemoryStall metav1.Duration `json:"memoryStall,omitempty"`
	Window      metav1.Duration `json:"window,omitempty"`
}

// DefaultSignalsConfig returns the signal defaults (see koordlet/signals for why).
func DefaultSignalsConfig() SignalsConfig {
	return SignalsConfig{
		Mode:         string(signals.ModeAuto),
		PollInterval: metav1.Duration{Duration: signals.DefaultPollInterval},
		RunqueueDelay: RunqueueDelayConfig{Quantile: signals.DefaultRunqueueQuantile,
			Threshold: metav1.Duration{Duration: signals.DefaultRunqueueThreshold}, MinSamples: signals.DefaultRunqueueMinSamples},
		PSI: PSIConfig{CPUStall: metav1.Duration{Duration: signals.DefaultCPUStall},
			MemoryStall: metav1.Duration{Duration: signals.DefaultMemoryStall},
			Window:      metav1.Duration{Duration: signals.DefaultPSIWindow}},
		GuardConfig: qos.DefaultGuardConfig(),
	}
}

// Validate names the first bad field.
func (c SignalsConfig) Validate() error {
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("signals.%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidConfig)
	}
	if _, err := signals.ParseMode(c.Mode); err != nil {
		return bad("mode", "%q must be auto, ebpf, psi or sampling", c.Mode)
	}
	if p := c.PollInterval.Duration; p < 5*time.Millisecond || p > time.Second {
		return bad("pollInterval", "%v must be within [5ms, 1s]", p)
	}
	if q := c.RunqueueDelay.Quantile; !(q > 0 && q <= 1) {
		return bad("runqueueDelay.quantile", "%v must be in (0, 1]", q)
	}
	// The probe's buckets are powers of two from 1 µs: a finer threshold means nothing.
	if th := c.RunqueueDelay.Threshold.Duration; th < 2*time.Microsecond || th > time.Second {
		return bad("runqueueDelay.threshold", "%v must be within [2µs, 1s]", th)
	}
	if c.RunqueueDelay.MinSamples < 1 {
		return bad("runqueueDelay.minSamples", "must be ≥ 1")
	}
	// The kernel's trigger limits: a window of 500ms to 10s, a stall within it.
	w := c.PSI.Window.Duration
	if w < 500*time.Millisecond || w > 10*time.Second {
		return bad("psi.window", "%v must be within [500ms, 10s] (the kernel's trigger windows)", w)
	}
	if s := c.PSI.CPUStall.Duration; s < time.Microsecond || s >= w {
		return bad("psi.cpuStall", "%v must be at least 1µs and below psi.window (%v)", s, w)
	}
	if s := c.PSI.MemoryStall.Duration; s < time.Microsecond || s >= w {
		return bad("psi.memoryStall", "%v must be at least 1µs and below psi.window (%v)", s, w)
	}
	if err := c.GuardConfig.Validate(); err != nil {
		return fmt.Errorf("signals.%w", err)
	}
	return nil
}

// signalSource is the agent's view of a harm signal source (signals.Source).
type signalSource interface {
	Watch(p signals.Pod) error
	Unwatch(uid string)
	Wake() <-chan struct{}
	Take(dst []signals.Harm) ([]signals.Harm, error)
	Run(ctx context.Context) error
	Close() error
}

var _ signalSource = signals.Source(nil)

// SignalOpener opens the harm signal source (signals.Open; tests pass fakes).
type SignalOpener func(signals.Options) (signals.Source, signals.State, error)

// signalOptions are the source's options from the config and the hierarchy's layout.
func signalOptions(cfg Config, h *cgroups.Hierarchy) signals.Options {
	s := cfg.Signals
	o := signals.Options{Mode: signals.Mode(s.Mode), ProcRoot: cfg.ProcRoot, PollInterval: s.PollInterval.Duration,
		RunqueueQuantile: s.RunqueueDelay.Quantile, RunqueueThreshold: s.RunqueueDelay.Threshold.Duration,
		RunqueueMinSamples: s.RunqueueDelay.MinSamples, RunqueueAnyCause: s.RunqueueDelay.AnyCause, CPUStall: s.PSI.CPUStall.Duration,
		MemoryStall: s.PSI.MemoryStall.Duration, PSIWindow: s.PSI.Window.Duration}
	switch h.Layout() {
	case cgroups.LayoutV2:
		o.Cgroup2Root, o.CPUCgroupRoot = cfg.CgroupRoot, cfg.CgroupRoot
	case cgroups.LayoutHybrid:
		// A pod's cgroup2 directory has the relative path of its v1 one, below unified/.
		o.Cgroup2Root, o.CPUCgroupRoot = filepath.Join(cfg.CgroupRoot, "unified"), filepath.Join(cfg.CgroupRoot, "cpu")
	}
	return o
}

// collectorSource is a source with metrics of its own (the eBPF source's run-queue delay
// histograms).
type collectorSource interface {
	Collector() prometheus.Collector
}

// openSignals opens the harm signal source, registers its metrics on reg and exports
// its state.
func (a *Agent) openSignals(open SignalOpener, reg prometheus.Registerer) error {
	if open == nil {
		open = signals.Open
	}
	o := signalOptions(a.cfg, a.hier)
	o.Logger = a.log
	src, st, err := open(o)
	if err != nil {
		return fmt.Errorf("opening the harm signal source: %w", err)
	}
	a.sig, a.sigState = src, st
	if cs, ok := src.(collectorSource); ok {
		if c := cs.Collector(); c != nil {
			if err := reg.Register(c); err != nil {
				_ = src.Close()
				return fmt.Errorf("registering the %s source's metrics: %w", st.Active, err)
			}
		}
	}
	for _, m := range []string{metrics.SourceEBPF, metrics.SourcePSI, metrics.SourceSampling} {
		v := 0.0
		if m == string(st.Active) {
			v = 1
		}
		a.metrics.SignalSource.WithLabelValues(m).Set(v)
	}
	for _, f := range st.Fallbacks {
		a.metrics.SignalUnavailable.WithLabelValues(string(f.Mode), f.Reason).Set(1)
	}
	switch {
	case len(st.Fallbacks) > 0 && st.Requested != signals.ModeAuto:
		a.log.Warn("the requested harm signal source is unavailable; falling back", "state", st.String())
	default:
		a.log.Info("harm signal source", "state", st.String())
	}
	if st.Active != signals.ModeSampling {
		a.guard = qos.NewGuard(a.cfg.Signals.GuardConfig)
	}
	return nil
}

// signalled reports whether the agent has a harm signal (eBPF or PSI): then only harm
// cuts batch; in sampling mode utilisation does.
func (a *Agent) signalled() bool { return a.guard != nil }

// watchBackoff is how long an LS pod whose cgroup could not be watched waits before the
// next try.
const watchBackoff = time.Second

// watchState is an LS pod the agent hands the signal source.
type watchState struct {
	st      *podState // the pod table's entry it was watched for
	ok      bool
	err     error
	retryAt time.Time
}

// syncWatches brings the source's watched pods in line with the LS pods in the table:
// new LS pods are watched (a missing cgroup is tried again every watchBackoff), pods that
// went or left LS are unwatched. Run on slow periods and after the pod set changed.
func (a *Agent) syncWatches(now time.Time) {
	if !a.signalled() {
		return
	}
	for uid, w := range a.watches {
		if cur := a.pods[uid]; cur != w.st || cur.class != qos.ClassLS {
			if w.ok {
				a.sig.Unwatch(string(uid))
			}
			delete(a.watches, uid)
		}
	}
	a.watchedLS = 0
	for _, st := range a.sorted {
		if st.class != qos.ClassLS || len(st.candidates) == 0 {
			continue
		}
		w := a.watches[st.uid]
		if w == nil {
			w = &watchState{st: st}
			a.watches[st.uid] = w
		}
		if !w.ok && !now.Before(w.retryAt) {
			err := a.sig.Watch(signals.Pod{UID: string(st.uid), Namespace: st.namespace, Name: st.name,
				Cgroup: st.candidates[0]})
			w.ok, w.err = err == nil, err
			if err != nil {
				w.retryAt = now.Add(watchBackoff)
				if !errors.Is(err, signals.ErrNotExist) {
					a.log.Debug("LS pod not watched for harm; retrying", "pod", st.key(), "err", err)
				}
			}
		}
		if w.ok {
			a.watchedLS++
		}
	}
}

// unwatchAll stops watching every pod (shutdown).
func (a *Agent) unwatchAll() {
	for uid, w := range a.watches {
		if w.ok {
			a.sig.Unwatch(string(uid))
		}
		delete(a.watches, uid)
	}
	a.watchedLS = 0
}

// cutRecord is the last budget cut, for /status.
type cutRecord struct {
	signal   qos.Signal
	at       time.Time
	seen     time.Time // when the signal was seen; the window start for utilisation
	pod      string
	value    time.Duration
	reaction time.Duration
}

// takeHarm takes the harm the source queued since the last call and picks the evidence
// the guard acts on: the freshest window (the latest Since; a tie goes to the earliest
// seen), which decides whether this harm may cut again after a cut.
func (a *Agent) takeHarm() (h signals.Harm, found bool, blind bool) {
	var err error
	a.harmBuf, err = a.sig.Take(a.harmBuf[:0])
	if err != nil {
		a.sigErr = err
		a.metrics.Errors.WithLabelValues(metrics.ErrKindSignalRead).Inc()
		a.log.Debug("harm signal unreadable; utilisation decides this period", "err", err)
	}
	for i, x := range a.harmBuf {
		a.metrics.HarmSignals.WithLabelValues(string(x.Signal)).Inc()
		if i == 0 || x.Since.After(h.Since) || (x.Since.Equal(h.Since) && x.At.Before(h.At)) {
			h = x
		}
	}
	if len(a.harmBuf) > 0 {
		a.lastHarm = h
	}
	return h, len(a.harmBuf) > 0, err != nil
}

// guarded replaces the utilisation budget b by the guard's decision on the harm seen
// since the last call (signal modes). It returns the harm behind a cut, if any.
func (a *Agent) guarded(b qos.Budget, now time.Time) (qos.Budget, qos.GuardDecision, signals.Harm) {
	h, found, blind := a.takeHarm()
	in := qos.GuardInput{Now: now, Budget: b, Blind: blind}
	if found {
		in.Harm, in.HarmSince = h.Signal, h.Since
	}
	d := a.guard.Next(in)
	b.Previous, b.Applied, b.Reason = d.Previous, d.Applied, d.Reason
	return b, d, h
}

// react answers a wake-up of the signal source between two periods: harm cuts batch at
// once, without waiting for the next utilisation sample. The budget's other terms are
// the last period's.
func (a *Agent) react(now time.Time) {
	if a.lastUtil.NodeCPUs <= 0 {
		// No period has measured the node yet: the tier is still at the start-up bound.
		_, _, _ = a.takeHarm()
		return
	}
	b, d, h := a.guarded(a.lastUtil, now)
	if b.Applied == a.last.Applied {
		// A hold (evidence from before the last cut, batch at its floor): the budget in
		// force stays; the next period's status shows it.
		return
	}
	a.enforce(b, now)
	a.recordBudget(b, d.Cause, h, now, time.Now(), 0)
	a.storeStatus(now, a.lastUsage, b, false)
}

// recordBudget counts a cut or a restore of the budget in force and remembers it. For a
// cut by a harm signal the reaction is from when the signal was seen to written, just
// after the quotas were written; for a utilisation cut it is window (from the start of
// the sample window in which the rise became visible to the write).
func (a *Agent) recordBudget(b qos.Budget, cause qos.Signal, h signals.Harm, now, written time.Time,
	window time.Duration) {
	switch {
	case b.Applied < a.last.Applied:
		if cause == qos.SignalNone {
			cause = qos.SignalUtilisation
		}
		rec := cutRecord{signal: cause, at: now, reaction: window, seen: now.Add(-window)}
		if cause != qos.SignalUtilisation {
			rec.reaction, rec.seen, rec.pod, rec.value = max(0, written.Sub(h.At)), h.At, h.Pod, h.Value
		}
		a.metrics.Actions.WithLabelValues(metrics.ActionCut).Inc()
		a.metrics.Cuts.WithLabelValues(string(cause)).Inc()
		a.metrics.CutReaction.WithLabelValues(string(cause)).Observe(rec.reaction.Seconds())
		a.lastCut = rec
	case b.Applied > a.last.Applied && a.ticks > 2:
		a.metrics.Actions.WithLabelValues(metrics.ActionRestore).Inc()
	}
	a.last = b
}
