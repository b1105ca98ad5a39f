package signals

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/koordlet/signals/runqlat"
	"github.com/understory/understory/qos"
)

// probe is the part of runqlat.Probe the eBPF source uses.
type probe interface {
	Watch(id uint64, children ...uint64) error
	Unwatch(id uint64) error
	Read(dst map[uint64]runqlat.Histogram) error
	SetThreshold(d time.Duration) error
	SetBatchOnly(on bool) error
	Attributes() bool
	SlowEvents() (uint64, error)
	Close() error
}

var _ probe = (*runqlat.Probe)(nil)

// waker is the part of runqlat.Probe that wakes the source when a watched task waited
// the slow-event threshold (Linux 5.8+), instead of it polling the count.
type waker interface {
	Arm() error
	Wake() <-chan struct{}
}

var _ waker = (*runqlat.Probe)(nil)

const (
	// rescanEvery is how often the eBPF source looks for new container cgroups below
	// a pod it watches (a pod's tasks run in its containers' cgroups) while the pod is
	// young (watched less than youngFor ago: its containers are being created) or has
	// none yet; rescanSettled afterwards (a container restarts rarely). With 110 pods a
	// rescan every 2 s of every pod was a third of the source's CPU.
	rescanEvery   = 2 * time.Second
	rescanSettled = 30 * time.Second
	youngFor      = 30 * time.Second
	// accumulateWindow is how many poll intervals a pod's delays are counted over at
	// most before they are judged, while fewer than RunqueueMinSamples arrived; longer
	// (up to maxAccumulate) for a pod whose delays are mostly long ones (see window).
	accumulateWindow = 5
	// maxAccumulate bounds the window of a pod whose tasks wait a whole slice each
	// time: its harm is judged within a second whatever its delays.
	maxAccumulate = time.Second
	// refreshEvery is how long the slow-event gate may keep the histograms unread: a
	// read at least this often keeps the baselines recent (see poll).
	refreshEvery = time.Second
)

// EBPF is the run-queue delay source.
type EBPF struct {
	o        Options
	p        probe
	cgroupID func(path string) (uint64, error)
	now      func() time.Time
	q        *queue
	coll     *runqlat.Collector

	// gate: the probe counts the delays in harm buckets and up (SetThreshold
	// worked), so a poll that sees the count unmoved can skip the read. harmBucket is
	// the first bucket whose delays count as harm.
	gate       bool
	harmBucket int
	// batchOnly: only batch's slow delays are harm (Options.RunqueueAnyCause off, and
	// the probe attributes); the kernel's slow-event count and wake-up count only those.
	batchOnly bool

	mu       sync.Mutex
	closed   bool
	pods     map[string]*ebpfPod // by UID
	byID     map[uint64]*ebpfPod
	cur      map[uint64]runqlat.Histogram
	lastRead time.Time
	lastPoll time.Time
	slowSeen uint64 // SlowEvents before the last read
	skipped  bool   // a poll since the last read skipped it
	fresh    bool   // a pod has no baseline yet: read at the next poll
}

// ebpfPod is one watched LS pod: its cgroup id (the histogram's key), the container
// cgroups counted into it and its histogram at the last read.
type ebpfPod struct {
	pod      Pod
	name     string
	dir      string
	id       uint64
	children map[uint64]bool
	prev     runqlat.Histogram
	havePrev bool
	prevAt   time.Time // when prev was read: the start of the window being judged
	// carried is how many slow delays judgeMerged left out of prev for the next poll to
	// judge (0: none); a later merged read carries again only if more came since.
	carried uint64
	// watchedAt is when Watch took the pod; nextScan when its containers are looked
	// for again (rescanLocked sets it).
	watchedAt, nextScan time.Time
}

var _ Source = (*EBPF)(nil)

// OpenEBPF loads the run-queue delay probe. Errors wrap runqlat's ErrPermission,
// ErrNoBTF or ErrNoTracefs, or ErrNoCgroup2.
func OpenEBPF(o Options) (Source, error) {
	o = o.withDefaults()
	if o.Cgroup2Root == "" {
		return nil, fmt.Errorf("ebpf: run-queue delay is keyed by cgroup2 ids: %w", ErrNoCgroup2)
	}
	if _, err := runqlat.CgroupID(o.Cgroup2Root); err != nil {
		return nil, fmt.Errorf("ebpf: %s: %w: %w", o.Cgroup2Root, ErrNoCgroup2, err)
	}
	p, err := runqlat.Load(runqlat.Options{})
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	return newEBPF(o, p, runqlat.CgroupID, time.Now), nil
}

// newEBPF builds the source over a loaded probe (tests pass fakes).
func newEBPF(o Options, p probe, cgroupID func(string) (uint64, error), now func() time.Time) *EBPF {
	o = o.withDefaults()
	s := &EBPF{o: o, p: p, cgroupID: cgroupID, now: now, q: newQueue(o.Logger),
		pods: map[string]*ebpfPod{}, byID: map[uint64]*ebpfPod{}, cur: map[uint64]runqlat.Histogram{}}
	if r, ok := p.(runqlat.Reader); ok {
		s.coll = runqlat.NewCollector(r)
	}
	s.harmBucket = harmBucket(o.RunqueueThreshold)
	if gate := SlowThreshold(o.RunqueueThreshold); gate > 0 {
		if err := p.SetThreshold(gate); err != nil {
			o.Logger.Warn("ebpf: no slow-event gate; reading every pod's histogram every poll", "err", err)
		} else {
			s.gate = true
		}
	}
	// Batch's delays are counted against the gate's threshold: without it, none are.
	switch {
	case o.RunqueueAnyCause:
	case !s.gate || !p.Attributes():
		o.Logger.Info("ebpf: the probe cannot tell batch's run-queue delays from the rest; every slow delay counts")
	default:
		if err := p.SetBatchOnly(true); err != nil {
			o.Logger.Warn("ebpf: every slow delay counts, not only batch's", "err", err)
		} else {
			s.batchOnly = true
		}
	}
	return s
}

// harmBucket is the first histogram bucket whose delays count as harm under threshold
// (poll's rule: the bucket's lower bound, half its upper, is at or above it).
func harmBucket(threshold time.Duration) int {
	bucket := 0
	for ; bucket < runqlat.NumBuckets-1; bucket++ {
		if runqlat.BucketUpper(bucket)/2 >= threshold {
			break
		}
	}
	return bucket
}

// SlowThreshold is the delay from which a probe's slow-event count (and
// runqlat.Histogram.Batch) counts exactly the delays that are harm under threshold:
// the lower bound of the first harm bucket (harmBucket). The kernel's bucket for a
// delay at or above it is that bucket or above, and for one below it a bucket below.
// It is 0 when bucket 0 (which also holds delays under 1 µs) is a harm bucket: every
// delay would count, and no count can gate. The eBPF source sets it on its probe; a
// program that loads a probe of its own sets the same to count what the agent counts.
func SlowThreshold(threshold time.Duration) time.Duration {
	bucket := harmBucket(threshold)
	if bucket == 0 {
		return 0
	}
	return runqlat.BucketUpper(bucket - 1)
}

// BatchOnly says whether only batch's slow delays are harm (see Options.RunqueueAnyCause).
func (s *EBPF) BatchOnly() bool { return s.batchOnly }

var _ batchOnlySource = (*EBPF)(nil)

// Mode is ModeEBPF.
func (s *EBPF) Mode() Mode { return ModeEBPF }

// Collector exports the watched pods' run-queue delay histograms
// (understory_ls_runqueue_delay_seconds{namespace,pod}); the agent registers it.
func (s *EBPF) Collector() prometheus.Collector {
	if s.coll == nil {
		return nil
	}
	return s.coll
}

// Wake receives a value when a read saw harm.
func (s *EBPF) Wake() <-chan struct{} { return s.q.wake }

// Take returns the harm seen since the last Take.
func (s *EBPF) Take(dst []Harm) ([]Harm, error) { return s.q.take(dst) }

// Watch counts the run-queue delay of the pod's tasks: its cgroup and its container
// cgroups (found again every rescanEvery).
func (s *EBPF) Watch(p Pod) error {
	dir := filepath.Join(s.o.Cgroup2Root, p.Cgroup)
	id, err := s.cgroupID(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("ebpf: watching %s: %w: %w", p.Cgroup, ErrNotExist, err)
		}
		return fmt.Errorf("ebpf: watching %s: %w", p.Cgroup, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if old := s.pods[p.UID]; old != nil {
		s.unwatchLocked(old)
	}
	if other := s.byID[id]; other != nil {
		s.unwatchLocked(other) // the same cgroup under another UID: the newest wins
	}
	pd := &ebpfPod{pod: p, name: p.Namespace + "/" + p.Name, dir: dir, id: id, children: map[uint64]bool{},
		watchedAt: s.now()}
	if err := s.p.Watch(id); err != nil {
		return fmt.Errorf("ebpf: watching %s: %w", p.Cgroup, err)
	}
	s.pods[p.UID], s.byID[id] = pd, pd
	s.fresh = true
	if s.coll != nil {
		s.coll.Label(id, p.Namespace, p.Name)
	}
	s.rescanLocked(pd)
	return nil
}

// Unwatch stops counting the pod.
func (s *EBPF) Unwatch(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pd := s.pods[uid]; pd != nil && !s.closed {
		s.unwatchLocked(pd)
	}
}

func (s *EBPF) unwatchLocked(pd *ebpfPod) {
	if err := s.p.Unwatch(pd.id); err != nil {
		s.o.Logger.Debug("ebpf: unwatching a pod", "pod", pd.name, "err", err)
	}
	if s.coll != nil {
		s.coll.Forget(pd.id)
	}
	delete(s.pods, pd.pod.UID)
	delete(s.byID, pd.id)
}

// rescanLocked counts the pod's container cgroups (one level down: kubelet's pod cgroup
// holds one cgroup per container, with either driver) into its histogram, and stops
// counting the ones that went.
func (s *EBPF) rescanLocked(pd *ebpfPod) {
	now := s.now()
	defer func() {
		every := rescanSettled
		if now.Sub(pd.watchedAt) < youngFor || len(pd.children) == 0 {
			every = rescanEvery
		}
		pd.nextScan = now.Add(every)
	}()
	entries, err := os.ReadDir(pd.dir)
	if err != nil {
		return // the pod is going; the agent unwatches it
	}
	seen := make(map[uint64]bool, len(entries))
	var add []uint64
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id, err := s.cgroupID(filepath.Join(pd.dir, e.Name()))
		if err != nil {
			continue
		}
		seen[id] = true
		if !pd.children[id] {
			add = append(add, id)
		}
	}
	if len(add) > 0 {
		if err := s.p.Watch(pd.id, add...); err != nil {
			s.o.Logger.Debug("ebpf: watching a pod's containers", "pod", pd.name, "err", err)
			return
		}
		for _, id := range add {
			pd.children[id] = true
		}
	}
	for id := range pd.children {
		if !seen[id] {
			_ = s.p.Unwatch(id)
			delete(pd.children, id)
		}
	}
}

// Run reads the maps until ctx ends, and looks for new containers of each pod when its
// scan is due (rescanEvery while young or without containers, then rescanSettled).
//
// When the probe can wake it (Linux 5.8+ and the slow-event gate on), Run sleeps until
// the kernel says a watched task waited a harm bucket's delay, or for refreshEvery: a
// quiet node costs one wake-up a second, not one per PollInterval (each one a context
// switch: 50 a second cost 1.1 % of a core on the development VM). From a wake-up
// it reads at once and then every PollInterval while the slow-event count keeps moving
// (harm is judged over one interval, see poll), and re-arms the probe when a poll finds
// the count unmoved. Otherwise it polls every PollInterval.
func (s *EBPF) Run(ctx context.Context) error {
	w, ok := s.p.(waker)
	if !ok || !s.gate || w.Wake() == nil {
		return s.runPolling(ctx)
	}
	err := w.Arm()
	switch {
	case err == nil:
		return s.runWoken(ctx, w)
	case errors.Is(err, os.ErrClosed):
		return nil
	}
	s.o.Logger.Info("ebpf: the probe cannot wake the source; polling", "err", err)
	return s.runPolling(ctx)
}

// runPolling polls every PollInterval.
func (s *EBPF) runPolling(ctx context.Context) error {
	t := time.NewTicker(s.o.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := s.now()
		if err := s.poll(now); errors.Is(err, ErrClosed) {
			return nil
		}
		s.rescanDue(now)
	}
}

// runWoken waits for the probe's wake-ups (armed when called), see Run.
func (s *EBPF) runWoken(ctx context.Context, w waker) error {
	wake := w.Wake()
	refresh := time.NewTicker(refreshEvery)
	defer refresh.Stop()
	tick := time.NewTimer(s.o.PollInterval)
	tick.Stop()
	defer tick.Stop()
	var (
		tickC  <-chan time.Time // nil while waiting for a wake-up
		armed  = true
		forced bool
	)
	for {
		forced = false
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-wake:
			if !ok {
				// The probe's reader ended: Close, or it failed.
				if s.isClosed() {
					return nil
				}
				s.o.Logger.Info("ebpf: the probe stopped waking the source; polling")
				return s.runPolling(ctx)
			}
			armed = false // the probe disarms itself as it sends
		case <-tickC:
		case <-refresh.C:
			forced = true
		}
		again, err := s.wakeStep(w, s.now(), forced, &armed)
		if errors.Is(err, ErrClosed) {
			return nil
		}
		tickC = nil
		if again {
			tick.Reset(s.o.PollInterval)
			tickC = tick.C
		}
	}
}

// wakeStep is one turn of runWoken at now: it polls (reading the histograms when forced,
// see pollMoved), rescans what is due, and says whether to poll again in PollInterval:
// while the slow-event count moves, or the probe could not be re-armed. Otherwise the
// probe is armed on return (*armed) and runWoken waits for its wake-up.
func (s *EBPF) wakeStep(w waker, now time.Time, force bool, armed *bool) (again bool, err error) {
	moved, err := s.pollMoved(now, force)
	if errors.Is(err, ErrClosed) {
		return false, err
	}
	s.rescanDue(now)
	if moved || err != nil {
		return true, nil
	}
	if *armed {
		return false, nil
	}
	if err := w.Arm(); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return false, ErrClosed
		}
		s.o.Logger.Debug("ebpf: re-arming the probe", "err", err)
		return true, nil
	}
	*armed = true
	// A slow delay between that poll and Arm sent nothing: look once more (a memory
	// load when the count did not move).
	moved, err = s.pollMoved(now, false)
	if errors.Is(err, ErrClosed) {
		return false, err
	}
	return moved || err != nil, nil
}

// rescanDue rescans the pods whose scan is due.
func (s *EBPF) rescanDue(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, pd := range s.pods {
		if !now.Before(pd.nextScan) {
			s.rescanLocked(pd)
		}
	}
}

func (s *EBPF) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// poll reads every watched pod's histogram and queues harm for each pod whose delay
// over the interval passed the threshold.
//
// Trap: the probe's buckets are powers of two (bucket i holds [2^i, 2^(i+1)) µs), so
// Quantile is a bucket's upper bound. A pod counts as harmed only when the bucket holding
// its quantile starts at or above the threshold: every delay from that rank up is
// certainly above it (the effective threshold rounds up to a power of two µs: 2 ms →
// 2.048 ms). The other way round, 2 ms would fire on quantiles from 1.024 ms.
//
// The slow-event gate: the probe counts every delay in a harm bucket (SlowThreshold), or
// with batchOnly every such delay that was batch's, in one counter that costs no
// syscall to read. While it does not move, no pod can be harmed, and poll skips the
// read (one syscall and a quantile per pod), but for a refresh every refreshEvery and for new pods' baselines. When it moves after skipped
// polls, the histograms' delta spans every interval since the last read, not only the
// last, and the rule over the last interval alone cannot be computed: the delays in harm
// buckets (S) are all from the last interval, but how many delays it had in all is not
// known. So such a read reports harm only when it is certain the last interval alone
// would have: S ≥ RunqueueMinSamples and the quantile over the whole delta is in a harm
// bucket (the interval has at least S and at most all the delays, and fewer delays only
// raise the quantile). Otherwise its slow delays are carried into the next poll, which
// judges them with the delays of its own interval (judgeMerged): a harm is reported one
// poll later at worst, as when it begins late in an interval. The first read in a while
// (the wake-up after a quiet refresh) spans as much, and is judged the same way.
func (s *EBPF) poll(now time.Time) error {
	_, err := s.pollMoved(now, false)
	return err
}

// pollMoved is poll, reading the histograms even when the count did not move if force
// (runWoken's refresh). moved: the slow-event count moved since the last read (or could
// not be read), so a delay in a harm bucket may be under way.
func (s *EBPF) pollMoved(now time.Time, force bool) (moved bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, ErrClosed
	}
	prevPoll := s.lastPoll
	s.lastPoll = now
	if len(s.pods) == 0 {
		s.lastRead, s.skipped = now, false
		return false, nil
	}
	var slow uint64
	if s.gate {
		n, err := s.p.SlowEvents()
		switch {
		case err != nil:
			// Read anyway: the gate is an economy, the read the signal.
			s.o.Logger.Debug("ebpf: reading the slow-event count", "err", err)
			n, moved = s.slowSeen+1, true
		case n != s.slowSeen:
			moved = true
		case !s.fresh && !force && now.Sub(s.lastRead) < refreshEvery:
			s.skipped = true
			return false, nil
		}
		slow = n
	}
	if err := s.p.Read(s.cur); err != nil {
		s.q.fail(fmt.Errorf("ebpf: reading run-queue delays: %w", err))
		return moved, err
	}
	// The count before the read: a delay counted after it (its histogram first) was
	// either in this read, or opens the next.
	s.slowSeen, s.fresh = slow, false
	// A read more than twice accumulateWindow polls after the last one spans more
	// than one window: judged as one it would dilute or mix old delays. Like a read
	// after skipped polls, it is judged by judgeMerged. It is the first read in a
	// while (a wake-up after a refresh).
	merged := s.skipped || now.Sub(s.lastRead) > 2*accumulateWindow*s.o.PollInterval
	s.skipped = false
	s.lastRead = now
	for id, h := range s.cur {
		pd := s.byID[id]
		if pd == nil {
			continue
		}
		if !pd.havePrev {
			pd.prev, pd.prevAt, pd.havePrev = h, now, true
			continue
		}
		d := h.Sub(pd.prev)
		span := now.Sub(pd.prevAt)
		if merged {
			s.judgeMerged(pd, h, d, now, prevPoll)
			continue
		}
		// Too few delays to judge yet: keep counting from the same baseline for up to
		// the pod's window (CPU-bound LS tasks wait a whole slice, a few ms, so one
		// 20 ms interval may hold fewer than RunqueueMinSamples delays however long
		// they wait).
		if d.Total() < s.o.RunqueueMinSamples && span < s.window(d) {
			continue
		}
		from := pd.prevAt
		pd.reset(h, now)
		upper, harm := s.judge(d)
		if !harm {
			continue
		}
		s.q.report(Harm{Signal: qos.SignalRunqueueDelay, At: now, Since: from, Pod: pd.name, Value: upper})
	}
	return moved, nil
}

// window is how long a pod's delays d are counted from one baseline while fewer than
// RunqueueMinSamples arrived: accumulateWindow polls. A pod at least half of whose
// delays are in harm buckets gets longer: its tasks wait a whole slice each time, and
// the kernel's slice can be so long that accumulateWindow polls cannot hold
// RunqueueMinSamples of them however harmed the pod is (Linux before 6.6, CFS: 6 ms
// times 1 + log2 of the CPUs, up to 8, shared by the runnable tasks; two CPU-bound tasks
// on one CPU of a 2-CPU node each wait about 8 ms, 12 delays in 100 ms). Its window
// is the time RunqueueMinSamples delays of its median's bucket bound take when the pod
// waits half the time, up to maxAccumulate.
func (s *EBPF) window(d runqlat.Histogram) time.Duration {
	base := accumulateWindow * s.o.PollInterval
	total := d.Total()
	if total == 0 || 2*s.harmed(d) < total {
		return base
	}
	n := time.Duration(min(s.o.RunqueueMinSamples, 1<<20))
	long := maxAccumulate
	if u := d.Quantile(0.5); u < maxAccumulate/(2*n) {
		long = 2 * n * u
	}
	return max(base, long)
}

// reset makes the read (h, now) the baseline.
func (pd *ebpfPod) reset(h runqlat.Histogram, now time.Time) {
	pd.prev, pd.prevAt, pd.carried = h, now, 0
}

// judgeMerged judges pod pd's delta d (histogram now h) read after skipped polls, or at
// the first read in a while (see poll): the count had not moved at prevPoll, so every
// delay of d in a harm bucket came after it. Harm is reported at once when certain;
// otherwise those slow delays are carried into the next poll's delta (the baseline
// leaves them out) and that poll is forced to read: it judges them with the delays of its own interval, over the span
// since prevPoll. Without the carry a burst of slow delays shorter than a poll interval
// would end in a merged read that is never sure, and LS harmed in such bursts, each
// after a quiet interval, would go unreported until a refresh. Slow delays carried once
// and still not judged (the next read was merged again) are carried again only with
// new ones, so that old evidence cannot wait for a later interval to tip.
func (s *EBPF) judgeMerged(pd *ebpfPod, h, d runqlat.Histogram, now, prevPoll time.Time) {
	carried := pd.carried
	pd.reset(h, now)
	slow := s.harmed(d)
	evidence := slow // the slow delays that count
	if s.batchOnly {
		evidence = min(d.Batch, slow)
	}
	if evidence <= carried {
		return
	}
	if upper, harm := s.judge(d); harm && evidence >= s.o.RunqueueMinSamples {
		s.q.report(Harm{Signal: qos.SignalRunqueueDelay, At: now, Since: prevPoll, Pod: pd.name, Value: upper})
		return
	}
	for i := s.harmBucket; i < len(d.Buckets); i++ {
		pd.prev.Buckets[i] -= d.Buckets[i]
	}
	pd.prev.Count -= min(pd.prev.Count, slow)
	pd.prev.Batch -= min(pd.prev.Batch, d.Batch)
	// The carried delays came after prevPoll; once woken, just before now. Either way
	// they are taken as the last poll interval's: the next read judges them over a
	// window of two intervals.
	pd.prevAt = prevPoll
	if start := now.Add(-s.o.PollInterval); start.After(prevPoll) {
		pd.prevAt = start
	}
	pd.carried, s.fresh = evidence, true
}

// judge is the source's harm rule over the delays d (RunqueueHarm).
func (s *EBPF) judge(d runqlat.Histogram) (upper time.Duration, harmed bool) {
	return RunqueueHarm(d, s.o.RunqueueQuantile, s.o.RunqueueThreshold, s.o.RunqueueMinSamples, s.batchOnly)
}

// RunqueueHarm is the eBPF source's harm rule over the delays d: at least minSamples of
// them, and the bucket holding their quantile q starting at or above threshold (see
// EBPF.poll: Quantile is a bucket's upper bound, so the bucket starts at half of it);
// with batchOnly, batch's slow delays must alone be enough for that (batchHarm). upper
// is that bound. The colo bench's own probe judges LS harm with it too.
func RunqueueHarm(d runqlat.Histogram, q float64, threshold time.Duration, minSamples uint64,
	batchOnly bool) (upper time.Duration, harmed bool) {
	if d.Total() < minSamples {
		return 0, false
	}
	upper = d.Quantile(q)
	harmed = upper/2 >= threshold
	if harmed && batchOnly {
		harmed = batchHarm(d, q)
	}
	return upper, harmed
}

// batchHarm says whether batch's slow delays in d (runqlat.Histogram.Batch: those past
// the probe's threshold, a harm bucket's lower bound, that took the CPU from batch) are
// alone enough to put d's quantile q in a harm bucket: more of them than the delays
// ranked above q. Had the others been short, the quantile would still be there.
func batchHarm(d runqlat.Histogram, q float64) bool {
	return d.Total() > 0 && d.Batch > d.Total()-d.Rank(q)
}

// harmed is the number of delays of d in harm buckets.
func (s *EBPF) harmed(d runqlat.Histogram) uint64 {
	var n uint64
	for _, b := range d.Buckets[s.harmBucket:] {
		n += b
	}
	return n
}

// Close detaches the probe.
func (s *EBPF) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.p.Close()
}
