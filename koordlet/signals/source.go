package signals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/understory/understory/qos"
)

// Mode is a harm signal source, or auto (the best this node allows).
type Mode string

// Modes, best first. The agent config's signals.mode takes these four words.
const (
	ModeAuto     Mode = "auto"
	ModeEBPF     Mode = "ebpf"
	ModePSI      Mode = "psi"
	ModeSampling Mode = "sampling"
)

// ParseMode checks a configured mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeEBPF, ModePSI, ModeSampling:
		return m, nil
	}
	return "", fmt.Errorf("signal mode %q must be auto, ebpf, psi or sampling: %w", s, ErrInvalidOptions)
}

// Sentinels.
var (
	// ErrInvalidOptions wraps every bad Options field.
	ErrInvalidOptions = errors.New("invalid signal options")
	// ErrNotExist: a pod's cgroup is not there (yet); Watch again later.
	ErrNotExist = errors.New("cgroup does not exist")
	// ErrNoCgroup2: the node has no cgroup2 hierarchy (a v1-only node): neither the
	// eBPF probe (keyed by cgroup2 ids) nor per-pod PSI can work.
	ErrNoCgroup2 = errors.New("no cgroup2 hierarchy")
	// ErrClosed: the source was closed.
	ErrClosed = errors.New("signal source closed")
)

// Pod is an LS pod the source watches.
type Pod struct {
	UID       string
	Namespace string
	Name      string
	// Cgroup is the pod's cgroup relative to the cgroup2 root (kubepods/burstable/pod<uid>).
	Cgroup string
}

// Harm is one observation of LS harm.
type Harm struct {
	Signal qos.Signal
	// At is when it was seen: the PSI event's arrival, the eBPF map read.
	At time.Time
	// Since is the start of the window it was measured over (the previous map read; the
	// PSI trigger window before At).
	Since time.Time
	// Pod is the namespace/name of the harmed LS pod; "" for the node (memory PSI).
	Pod string
	// Value is the delay quantile (runqueue_delay) or the stall in the window (PSI).
	Value time.Duration
}

// Source is a harm signal source. See the package doc for its traps.
type Source interface {
	// Mode is the source: ModeEBPF, ModePSI or ModeSampling.
	Mode() Mode
	// Watch starts watching an LS pod (again, with a new cgroup, if already watched).
	Watch(p Pod) error
	// Unwatch stops watching the pod with this UID; unknown UIDs are ignored.
	Unwatch(uid string)
	// Wake receives a value when harm was queued; nil for a source that never wakes.
	Wake() <-chan struct{}
	// Take appends the harm queued since the last Take to dst, earliest first, and
	// returns the first error since then (the source was blind for a while).
	Take(dst []Harm) ([]Harm, error)
	// Run runs the source's background work (map reads, the PSI watcher) until ctx
	// ends or Close.
	Run(ctx context.Context) error
	// Close releases the source (BPF programs, file descriptors).
	Close() error
}

// Fallback is a better source that could not be used.
type Fallback struct {
	Mode Mode `json:"mode"`
	// Reason is a word for metrics: permission, no_btf, no_tracefs, no_cgroup2,
	// unsupported, error.
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// State is what Open picked and why.
type State struct {
	// Requested is the configured mode.
	Requested Mode `json:"requested"`
	// Active is the source in use: ebpf, psi or sampling.
	Active Mode `json:"active"`
	// Fallbacks are the better sources tried before Active, in order.
	Fallbacks []Fallback `json:"fallbacks,omitempty"`
	// BatchOnly: the eBPF source counts only the run-queue delays batch caused as harm
	// (Options.RunqueueAnyCause off, and the probe tells them apart).
	BatchOnly bool `json:"batchOnly,omitempty"`
}

// maxQueued bounds the harm a source keeps between two Takes (one every period at
// most 100 ms apart, or less with wake-ups): beyond it only the count grows.
const maxQueued = 64

// queue is the harm waiting for Take and the wake-up channel, shared by the sources.
type queue struct {
	mu      sync.Mutex
	harm    []Harm
	dropped int
	err     error
	wake    chan struct{}
	log     *slog.Logger
}

func newQueue(log *slog.Logger) *queue {
	return &queue{wake: make(chan struct{}, 1), log: log}
}

// report queues h and wakes the agent.
func (q *queue) report(h Harm) {
	q.mu.Lock()
	if len(q.harm) < maxQueued {
		q.harm = append(q.harm, h)
	} else {
		q.dropped++
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// fail records the first error until the next Take.
func (q *queue) fail(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
}

func (q *queue) take(dst []Harm) ([]Harm, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.harm...)
	// Earliest first: the first harm sets the cut's reaction time. Reports come from one
	// goroutine in time order, but the memory and CPU watchers may interleave.
	for i := len(dst) - len(q.harm) + 1; i < len(dst); i++ {
		for j := i; j > len(dst)-len(q.harm) && dst[j].At.Before(dst[j-1].At); j-- {
			dst[j], dst[j-1] = dst[j-1], dst[j]
		}
	}
	if q.dropped > 0 && q.log != nil {
		q.log.Debug("harm reports dropped between two takes", "dropped", q.dropped)
	}
	err := q.err
	q.harm, q.dropped, q.err = q.harm[:0], 0, nil
	return dst, err
}

// sampling is the source with no harm signal.
type sampling struct{}

var _ Source = sampling{}

// Sampling returns the source with no harm signal: utilisation only.
func Sampling() Source { return sampling{} }

func (sampling) Mode() Mode                      { return ModeSampling }
func (sampling) Watch(Pod) error                 { return nil }
func (sampling) Unwatch(string)                  {}
func (sampling) Wake() <-chan struct{}           { return nil }
func (sampling) Take(dst []Harm) ([]Harm, error) { return dst, nil }
func (sampling) Run(ctx context.Context) error   { <-ctx.Done(); return nil }
func (sampling) Close() error                    { return nil }
