package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

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
func signalOptions(cfg config.Config, h *cgroups.Hierarchy) signals.Options {
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

// harmWatch holds the agent's LS harm signals: the source, the LS pods it
// watches, and the harm it reported (read in the measure step of each period, and on a
// wake-up between two).
type harmWatch struct {
	sig     signalSource
	state   signals.State
	metrics *metrics.Agent
	log     *slog.Logger
	// signalled: the source is eBPF or PSI (the guard decides); in sampling mode
	// utilisation does and no pod is watched.
	signalled bool
	buf       []signals.Harm
	err       error        // the source's last read error, for /status
	last      signals.Harm // the last harm seen
	// watches are the LS pods handed to the source, watched how many are watched.
	watches map[types.UID]*watchState
	watched int
}

// openHarmWatch opens the harm signal source, registers its metrics on reg and exports
// its state. It returns the guard that decides the budget from harm, nil in sampling
// mode (utilisation decides).
func openHarmWatch(cfg config.Config, h *cgroups.Hierarchy, open SignalOpener, reg prometheus.Registerer, m *metrics.Agent,
	log *slog.Logger) (*harmWatch, *qos.Guard, error) {
	if open == nil {
		open = signals.Open
	}
	o := signalOptions(cfg, h)
	o.Logger = log
	src, st, err := open(o)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the harm signal source: %w", err)
	}
	if cs, ok := src.(collectorSource); ok {
		if c := cs.Collector(); c != nil {
			if err := reg.Register(c); err != nil {
				_ = src.Close()
				return nil, nil, fmt.Errorf("registering the %s source's metrics: %w", st.Active, err)
			}
		}
	}
	for _, s := range []string{metrics.SourceEBPF, metrics.SourcePSI, metrics.SourceSampling} {
		v := 0.0
		if s == string(st.Active) {
			v = 1
		}
		m.SignalSource.WithLabelValues(s).Set(v)
	}
	for _, f := range st.Fallbacks {
		m.SignalUnavailable.WithLabelValues(string(f.Mode), f.Reason).Set(1)
	}
	switch {
	case len(st.Fallbacks) > 0 && st.Requested != signals.ModeAuto:
		log.Warn("the requested harm signal source is unavailable; falling back", "state", st.String())
	default:
		log.Info("harm signal source", "state", st.String())
	}
	w := &harmWatch{sig: src, state: st, metrics: m, log: log, watches: map[types.UID]*watchState{}}
	var guard *qos.Guard
	if st.Active != signals.ModeSampling {
		w.signalled = true
		guard = qos.NewGuard(cfg.Signals.GuardConfig)
	}
	return w, guard, nil
}

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

// sync brings the source's watched pods in line with the LS pods in the table (pods, in
// the order sorted): new LS pods are watched (a missing cgroup is tried again every
// watchBackoff), pods that went or left LS are unwatched. Run on slow periods and after
// the pod set changed.
func (w *harmWatch) sync(now time.Time, pods map[types.UID]*podState, sorted []*podState) {
	if !w.signalled {
		return
	}
	for uid, ws := range w.watches {
		if cur := pods[uid]; cur != ws.st || cur.class != qos.ClassLS {
			if ws.ok {
				w.sig.Unwatch(string(uid))
			}
			delete(w.watches, uid)
		}
	}
	w.watched = 0
	for _, st := range sorted {
		if st.class != qos.ClassLS || len(st.candidates) == 0 {
			continue
		}
		ws := w.watches[st.uid]
		if ws == nil {
			ws = &watchState{st: st}
			w.watches[st.uid] = ws
		}
		if !ws.ok && !now.Before(ws.retryAt) {
			err := w.sig.Watch(signals.Pod{UID: string(st.uid), Namespace: st.namespace, Name: st.name,
				Cgroup: st.candidates[0]})
			ws.ok, ws.err = err == nil, err
			if err != nil {
				ws.retryAt = now.Add(watchBackoff)
				if !errors.Is(err, signals.ErrNotExist) {
					w.log.Debug("LS pod not watched for harm; retrying", "pod", st.key(), "err", err)
				}
			}
		}
		if ws.ok {
			w.watched++
		}
	}
}

// close stops watching every pod and closes the source (shutdown).
func (w *harmWatch) close() {
	for uid, ws := range w.watches {
		if ws.ok {
			w.sig.Unwatch(string(uid))
		}
		delete(w.watches, uid)
	}
	w.watched = 0
	if err := w.sig.Close(); err != nil {
		w.log.Warn("closing the harm signal source", "err", err)
	}
}

// take takes the harm the source queued since the last call and picks the evidence
// the guard acts on: the freshest window (the latest Since; a tie goes to the earliest
// seen), which decides whether this harm may cut again after a cut.
func (w *harmWatch) take() (signals.Harm, qos.HarmSample) {
	var err error
	var h signals.Harm
	w.buf, err = w.sig.Take(w.buf[:0])
	if err != nil {
		w.err = err
		w.metrics.Errors.WithLabelValues(metrics.ErrKindSignalRead).Inc()
		w.log.Debug("harm signal unreadable; utilisation decides this period", "err", err)
	}
	for i, x := range w.buf {
		w.metrics.HarmSignals.WithLabelValues(string(x.Signal)).Inc()
		if i == 0 || x.Since.After(h.Since) || (x.Since.Equal(h.Since) && x.At.Before(h.At)) {
			h = x
		}
	}
	hs := qos.HarmSample{Blind: err != nil}
	if len(w.buf) > 0 {
		w.last = h
		hs.Found, hs.Signal, hs.Since = true, h.Signal, h.Since
	}
	return h, hs
}

// status is the signal source's part of /status; lastCut is the last budget cut.
func (w *harmWatch) status(lastCut cutRecord) SignalsStatus {
	s := SignalsStatus{State: w.state, WatchedPods: w.watched, Error: errString(w.err)}
	if h := w.last; h.Signal != qos.SignalNone {
		s.LastHarm = &HarmStatus{Signal: string(h.Signal), Time: h.At, Pod: h.Pod, ValueSeconds: h.Value.Seconds()}
	}
	if c := lastCut; c.signal != qos.SignalNone {
		s.LastCut = &CutStatus{Signal: string(c.signal), Time: c.at, Pod: c.pod, ValueSeconds: c.value.Seconds(),
			ReactionSeconds: c.reaction.Seconds()}
	}
	return s
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
