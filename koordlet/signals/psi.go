package signals

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/understory/understory/koordlet/signals/psi"
	"github.com/understory/understory/qos"
)

// trigger is one PSI trigger firing: its key and when the event was read.
type trigger struct {
	key  string
	at   time.Time
	gone bool // the group went (its trigger is dropped)
}

// triggers is the part of psi.Watcher the PSI source uses (adapted in psiwatch.go).
type triggers interface {
	Add(key, path string, stall, window time.Duration) error
	Remove(key string) error
	Events() <-chan trigger
	Run(ctx context.Context) error
	Close() error
}

// sampler reads one pod's cumulative stall (only withStall) and throttled time
// (psi.Reader and psi.ThrottleReader; fakes in tests).
type sampler interface {
	Sample(now time.Time, withStall bool) (psi.Sample, error)
	Close() error
}

// PSI is the pressure stall source.
type PSI struct {
	o         Options
	w         triggers
	newSample func(stallPath, statPath string) (sampler, error)
	now       func() time.Time
	q         *queue

	// readStall: the triggers are privileged (CAP_SYS_RESOURCE), so the pressure files
	// may be read. See OpenPSI for why an unprivileged source never reads them.
	readStall bool

	mu     sync.Mutex
	closed bool
	pods   map[string]*psiPod // by UID
	byKey  map[string]*psiPod // by trigger key
	dead   error              // why the watcher stopped; nil while it runs
}

// psiPod is one watched LS pod: its readers and its last two samples, refreshed every
// PSI window so that a trigger is confirmed over one to two windows.
type psiPod struct {
	uid    string
	name   string
	s      sampler
	recent [2]psi.Sample // [0] newest
}

var _ Source = (*PSI)(nil)

// OpenPSI readies per-pod CPU and memory triggers after checking that this node can
// arm one (on the cgroup2 root's cpu.pressure). Errors wrap psi.ErrUnsupported (no PSI,
// no triggers), psi.ErrPermission or ErrNoCgroup2.
//
// Without CAP_SYS_RESOURCE the kernel takes only windows that are multiples of 2 s
// (evaluated by its 2 s averaging, so a wake-up comes up to 2 s late): the window is then
// rounded up to one, the stalls scaled with it, and the log says so.
//
// Trap (measured on Linux 6.18): such an unprivileged trigger is evaluated on the same
// aggregation as reads of the pressure file, and a read consumes the change the 2 s work
// would have seen: a pod whose cpu.pressure someone reads every second never fires. The
// source then never reads pressure files; it confirms a CPU trigger with the stall the
// trigger guarantees (cpuStall per window) less the pod's own throttling. Other readers
// of LS pods' pressure files (an exporter, kubelet) starve unprivileged triggers too:
// give the agent CAP_SYS_RESOURCE.
func OpenPSI(o Options) (Source, error) {
	o = o.withDefaults()
	if o.Cgroup2Root == "" {
		return nil, fmt.Errorf("psi: per-pod pressure needs cgroup2: %w", ErrNoCgroup2)
	}
	priv, err := psi.Privileged()
	if err != nil {
		priv = false
	}
	if !priv && o.PSIWindow%psi.UnprivilegedStep != 0 {
		w := (o.PSIWindow/psi.UnprivilegedStep + 1) * psi.UnprivilegedStep
		scale := float64(w) / float64(o.PSIWindow)
		o.CPUStall = time.Duration(float64(o.CPUStall) * scale)
		o.MemoryStall = time.Duration(float64(o.MemoryStall) * scale)
		o.Logger.Warn("psi: no CAP_SYS_RESOURCE: PSI trigger window rounded up to a multiple of 2s; "+
			"harm is seen up to 2s late", "window", w)
		o.PSIWindow = w
	}
	w, err := newPSIWatcher()
	if err != nil {
		return nil, fmt.Errorf("psi: %w", err)
	}
	// A kernel with PSI but per-group pressure off (cgroup.pressure=0, psi=0), or one
	// refusing triggers, answers on the root's file first.
	root, err := psi.CgroupFile(o.Cgroup2Root, "", psi.CPU)
	if err == nil {
		err = w.Add("probe", root, o.CPUStall, o.PSIWindow)
	}
	if err == nil {
		err = w.Remove("probe")
	}
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("psi: %w", err)
	}
	s := newPSI(o, w, openSampler, time.Now)
	s.readStall = priv
	return s, nil
}

// newPSI builds the source over a watcher (tests pass fakes).
func newPSI(o Options, w triggers, newSample func(string, string) (sampler, error), now func() time.Time) *PSI {
	return &PSI{o: o.withDefaults(), w: w, newSample: newSample, now: now, q: newQueue(o.Logger),
		pods: map[string]*psiPod{}, byKey: map[string]*psiPod{}}
}

// Mode is ModePSI.
func (s *PSI) Mode() Mode { return ModePSI }

// Wake receives a value when a trigger showed harm.
func (s *PSI) Wake() <-chan struct{} { return s.q.wake }

// Take returns the harm seen since the last Take; once the watcher died, its error every
// time: a source that cannot see must not pass for one that sees no harm.
func (s *PSI) Take(dst []Harm) ([]Harm, error) {
	dst, err := s.q.take(dst)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead != nil {
		err = s.dead
	}
	return dst, err
}

// cpuKey and memKey are a pod's trigger keys.
func cpuKey(uid string) string { return "cpu/" + uid }
func memKey(uid string) string { return "memory/" + uid }

// Watch arms triggers on the pod's cpu.pressure and memory.pressure and opens its
// readers.
//
// Trap: memory is watched per LS pod, not on the node's /proc/pressure/memory: the node's
// "some" stall counts batch's own reclaim against its memory limit, which a CPU cut does
// not help and which does not harm LS by itself.
func (s *PSI) Watch(p Pod) error {
	stall, err := psi.CgroupFile(s.o.Cgroup2Root, p.Cgroup, psi.CPU)
	if err != nil {
		return fmt.Errorf("psi: watching %s: %w", p.Cgroup, err)
	}
	mem, err := psi.CgroupFile(s.o.Cgroup2Root, p.Cgroup, psi.Memory)
	if err != nil {
		return fmt.Errorf("psi: watching %s: %w", p.Cgroup, err)
	}
	smp, err := s.newSample(stall, filepath.Join(s.o.CPUCgroupRoot, p.Cgroup, "cpu.stat"))
	if err != nil {
		if errors.Is(err, psi.ErrNotExist) {
			return fmt.Errorf("psi: watching %s: %w: %w", p.Cgroup, ErrNotExist, err)
		}
		return fmt.Errorf("psi: watching %s: %w", p.Cgroup, err)
	}
	first, err := smp.Sample(s.now(), s.readStall)
	if err != nil {
		_ = smp.Close()
		return fmt.Errorf("psi: watching %s: %w", p.Cgroup, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = smp.Close()
		return ErrClosed
	}
	if old := s.pods[p.UID]; old != nil {
		s.unwatchLocked(p.UID, old)
	}
	err = s.w.Add(cpuKey(p.UID), stall, s.o.CPUStall, s.o.PSIWindow)
	if err == nil {
		if err = s.w.Add(memKey(p.UID), mem, s.o.MemoryStall, s.o.PSIWindow); err != nil {
			_ = s.w.Remove(cpuKey(p.UID))
		}
	}
	if err != nil {
		_ = smp.Close()
		if errors.Is(err, psi.ErrNotExist) {
			return fmt.Errorf("psi: watching %s: %w: %w", p.Cgroup, ErrNotExist, err)
		}
		return fmt.Errorf("psi: watching %s: %w", p.Cgroup, err)
	}
	pd := &psiPod{uid: p.UID, name: p.Namespace + "/" + p.Name, s: smp, recent: [2]psi.Sample{first, first}}
	s.pods[p.UID], s.byKey[cpuKey(p.UID)], s.byKey[memKey(p.UID)] = pd, pd, pd
	return nil
}

// Unwatch drops the pod's trigger and readers.
func (s *PSI) Unwatch(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pd := s.pods[uid]; pd != nil && !s.closed {
		s.unwatchLocked(uid, pd)
	}
}

func (s *PSI) unwatchLocked(uid string, pd *psiPod) {
	for _, k := range []string{cpuKey(uid), memKey(uid)} {
		if err := s.w.Remove(k); err != nil && !errors.Is(err, psi.ErrUnknownKey) {
			s.o.Logger.Debug("psi: removing a pod's trigger", "pod", pd.name, "err", err)
		}
		delete(s.byKey, k)
	}
	_ = pd.s.Close()
	delete(s.pods, uid)
}

// Run runs the watcher and turns its events into harm until ctx ends; every PSI window
// it refreshes the pods' samples, the baselines a CPU trigger is confirmed against.
func (s *PSI) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.w.Run(ctx) }()
	t := time.NewTicker(s.o.PSIWindow)
	defer t.Stop()
	events := s.w.Events()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				// Blind from now: utilisation decides every period.
				err = fmt.Errorf("psi: watcher stopped: %w", err)
				s.mu.Lock()
				s.dead = err
				s.mu.Unlock()
				return err
			}
			return nil
		case <-t.C:
			s.refresh(s.now())
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			s.handle(ev)
		}
	}
}

// refresh takes a new sample of every pod.
func (s *PSI) refresh(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pd := range s.pods {
		smp, err := pd.s.Sample(now, s.readStall)
		if err != nil {
			continue // a pod going away; the agent unwatches it
		}
		pd.recent[1], pd.recent[0] = pd.recent[0], smp
	}
}

// handle turns one trigger into harm: a pod's memory trigger at once; its CPU trigger
// only when the stall its own CFS throttling does not explain (psi.Harm) is at the
// trigger's rate (cpuStall per window) over the last one to two windows.
func (s *PSI) handle(ev trigger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pd := s.byKey[ev.key]
	if pd == nil || ev.gone {
		return
	}
	if ev.key == memKey(pd.uid) {
		s.q.report(Harm{Signal: qos.SignalPSIMemory, At: ev.at, Since: ev.at.Add(-s.o.PSIWindow), Pod: pd.name,
			Value: s.o.MemoryStall})
		return
	}
	cur, err := pd.s.Sample(ev.at, s.readStall)
	if err != nil {
		return
	}
	// The baseline: the newest sample at least one window old, so the interval holds the
	// trigger's window and the throttled time that lags the stall by a CFS period.
	base := pd.recent[0]
	if cur.Time.Sub(base.Time) < s.o.PSIWindow {
		base = pd.recent[1]
	}
	if !s.readStall {
		// Unread (unprivileged triggers): the stall the trigger guarantees over the
		// interval, rounded up so that a pod with no throttling passes the rate below.
		cur.Stall = base.Stall + time.Duration(math.Ceil(float64(s.o.CPUStall)*
			float64(cur.Time.Sub(base.Time))/float64(s.o.PSIWindow)))
	}
	w := cur.Since(base)
	if w.Wall <= 0 {
		return
	}
	harm := psi.Harm(w)
	if float64(harm)*float64(s.o.PSIWindow) >= float64(s.o.CPUStall)*float64(w.Wall) {
		s.q.report(Harm{Signal: qos.SignalPSICPU, At: ev.at, Since: ev.at.Add(-s.o.PSIWindow), Pod: pd.name,
			Value: harm})
	}
}

// Close stops the watcher and closes every reader.
func (s *PSI) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for uid, pd := range s.pods {
		_ = pd.s.Close()
		delete(s.pods, uid)
	}
	clear(s.byKey)
	if err := s.w.Close(); err != nil && !errors.Is(err, psi.ErrClosed) {
		return err
	}
	return nil
}

// podSampler reads a pod's cpu.pressure and its cpu.stat throttled time through kept-open
// files.
type podSampler struct {
	stall *psi.Reader
	thr   *psi.ThrottleReader // nil: no throttling statistics (no CPU limit possible)
}

// openSampler opens a pod's readers. A cpu.stat without throttling fields (no cpu
// controller there) means no discount: nothing throttles the pod. (Opening reads the
// pressure file once, which at worst delays an unprivileged trigger by one 2 s round.)
func openSampler(stallPath, statPath string) (sampler, error) {
	r, err := psi.OpenReader(stallPath)
	if err != nil {
		return nil, err
	}
	t, err := psi.OpenThrottleReader(statPath)
	if err != nil {
		if !errors.Is(err, psi.ErrNoThrottle) && !errors.Is(err, psi.ErrNotExist) {
			_ = r.Close()
			return nil, err
		}
		t = nil
	}
	return &podSampler{stall: r, thr: t}, nil
}

// Sample reads the cumulative throttled time and, withStall, the stall. Usage stays
// unknown (0): the discount then takes the pod to be throttled on one CPU at a time, which
// explains more of the stall, never less: the side of leaving batch alone.
func (p *podSampler) Sample(now time.Time, withStall bool) (psi.Sample, error) {
	smp := psi.Sample{Time: now}
	if withStall {
		pr, err := p.stall.Read()
		if err != nil {
			return psi.Sample{}, err
		}
		smp.Stall = pr.Some.Total
	}
	if p.thr != nil {
		if t, err := p.thr.Read(); err == nil {
			smp.Throttled = t.Time
		}
	}
	return smp, nil
}

func (p *podSampler) Close() error {
	err := p.stall.Close()
	if p.thr != nil {
		err = errors.Join(err, p.thr.Close())
	}
	return err
}
