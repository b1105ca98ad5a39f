package duty

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/understory/understory/cgroups"
)

// Period bounds of New, and the bounds on each freezer write.
const (
	MinPeriod = 10 * time.Millisecond
	MaxPeriod = time.Second
	// OpTimeout bounds one waited-for freeze or thaw: of the pin, Release, ThawAll and
	// the thaw when Run ends. The periodic windows' writes do not wait (see request): a
	// task in uninterruptible sleep keeps a v1 group FREEZING, and the cycle must go on.
	OpTimeout = 50 * time.Millisecond
	// ShutdownTimeout bounds the thaw of everything when Run ends.
	ShutdownTimeout = 5 * time.Second
	// RestartRise is the smallest rise of a group's duty that starts a new period at once
	// (from 0, any rise does): a cut must not wait for the next period, but the agent
	// re-sending nearly the same duty every step must not shift the phase each time.
	RestartRise = 0.1
	// minWindow: a frozen or thawed window shorter than this is not worth two writes;
	// such duties are rounded to 0 or 1.
	minWindow = time.Millisecond
)

// ReleasedKey is the key under which Status lists groups that left every key (or were
// released) but could not be thawed yet.
const ReleasedKey = ""

// Sentinel errors callers branch on.
var (
	ErrInvalidPeriod = errors.New("duty: period out of range")
	ErrInvalidDuty   = errors.New("duty: duty must be a number in [0, 1]")
	ErrInvalidGroup  = errors.New("duty: nil cgroup")
	ErrRunning       = errors.New("duty: cycler already running")
	// ErrThaw: a group could not be thawed (it may stay frozen until thawed by hand or by
	// the next agent's start-up recovery).
	ErrThaw = errors.New("duty: thaw failed")
)

// Cycler duty-cycles sets of cgroups with the freezer: each set (a key, e.g. one GPU) has
// a duty d, and each of its groups is frozen for d*period of every period and thawed for
// the rest. A group in several keys gets the highest of their duties. All groups share
// one period clock and are frozen at the start of every period, so the batch pods of one
// GPU are frozen together: LS gets the device only while all of them are. One goroutine
// (Run) does every freezer write; Set, Release, ThawAll and Status are safe from any
// goroutine.
type Cycler struct {
	period time.Duration
	epoch  time.Time // periods start at epoch + k*period
	log    *slog.Logger
	retry  time.Duration

	// ioMu serialises freezer writes between Run's loop and ThawAll/Release, so that a
	// freeze the loop planned before a release never lands after the release's thaw.
	ioMu sync.Mutex
	// writers: the open freezer files of the cycled groups, by path, with the handle
	// each was opened for (the map under mu); Run's goroutine alone writes through
	// them, and closes those of groups the cycler forgot before it sleeps.
	writers map[string]openWriter

	mu      sync.Mutex
	keys    map[string]*keyState
	groups  map[string]*groupState // by cgroup path
	running bool
	wake    chan struct{}
	pin     *cgroups.Group // SetPin; read by Run

	// Run goroutine's state of the pin.
	pinned   bool // the pin is frozen (or a freeze of it was tried since its last thaw)
	pinRetry time.Time
	pinErr   error
}

type keyState struct {
	duty  float64
	paths []string
}

// groupState is one cgroup the cycler drives (or still has to thaw).
type groupState struct {
	g       *cgroups.Group
	duty    float64 // the highest duty of its keys, rounded (effectiveDuty)
	managed bool    // in some key; false: thaw it, then forget it
	// extraUntil: a rise of the duty froze the group at once, outside the periodic
	// window; it stays frozen until then.
	extraUntil time.Time
	// frozen: the loop froze it, or tried to (a freeze that timed out may have left it
	// partly frozen), and has not thawed it since.
	frozen    bool
	retryAt   time.Time // after a failed write, the next try
	lastErr   error
	lastErrAt time.Time
}

// New returns a Cycler with the given period (MinPeriod..MaxPeriod). log may be nil.
func New(period time.Duration, log *slog.Logger) (*Cycler, error) {
	if period < MinPeriod || period > MaxPeriod {
		return nil, fmt.Errorf("duty cycler period %v not in [%v, %v]: %w", period, MinPeriod, MaxPeriod, ErrInvalidPeriod)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cycler{
		period:  period,
		epoch:   time.Now(),
		log:     log,
		retry:   max(period/4, 10*time.Millisecond),
		keys:    map[string]*keyState{},
		groups:  map[string]*groupState{},
		writers: map[string]openWriter{},
		wake:    make(chan struct{}, 1),
	}, nil
}

// PinRetry is how long the cycler waits to try again after a write to its pin failed.
const PinRetry = 10 * time.Second

// SetPin gives the cycler an empty cgroup to keep frozen while it cycles any group (nil:
// none); call it before Run. On cgroup v1 the kernel turns a static key on when the
// first cgroup starts freezing and off when the last one thaws, and each turn patches
// kernel text on every CPU: on the machines measured that was most of a duty cycle's
// cost (a freeze and a thaw of a pod's cgroup took 0.2-0.4 ms of the agent's CPU, and
// under 0.05 ms with another cgroup frozen). With the pin frozen first, the cycle's
// writes never turn the key. The pin must hold no task: nothing in it is ever thawed by
// a window. cgroup v2 (cgroup.freeze) has no such key, and no pin is needed there.
func (c *Cycler) SetPin(g *cgroups.Group) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pin = g
}

// Period returns the duty-cycle period.
func (c *Cycler) Period() time.Duration { return c.period }

// NextPeriod returns the start of the first period after t. Every group is frozen from
// the start of each period for duty*period (e.g. to align a measurement with the cycle).
func (c *Cycler) NextPeriod(t time.Time) time.Time { return c.periodStart(t).Add(c.period) }

// periodStart is the start of the period holding t.
func (c *Cycler) periodStart(t time.Time) time.Time {
	n := t.Sub(c.epoch) / c.period
	if t.Before(c.epoch) {
		n-- // floor, not truncation towards zero
	}
	return c.epoch.Add(n * c.period)
}

// Set makes groups the set of key and duty its duty, replacing what key had. Duty 0 or
// no groups removes the key; a group left in no key is thawed (if the cycler froze it)
// and forgotten. A group whose duty rises from 0 (or by RestartRise or more while it is
// thawed) is frozen at once, within one loop turn, for duty*period, on top of the
// periodic windows: a cut does not wait for the next period. A NaN or out-of-range duty
// or a nil group changes nothing and returns an error wrapping ErrInvalidDuty or
// ErrInvalidGroup.
func (c *Cycler) Set(key string, groups []*cgroups.Group, duty float64) error {
	if !(duty >= 0 && duty <= 1) {
		return fmt.Errorf("duty of %q: %v: %w", key, duty, ErrInvalidDuty)
	}
	if slices.Contains(groups, nil) {
		return fmt.Errorf("groups of %q: %w", key, ErrInvalidGroup)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if duty == 0 || len(groups) == 0 {
		if _, ok := c.keys[key]; !ok {
			return nil
		}
		delete(c.keys, key)
	} else {
		old := c.keys[key]
		same := old != nil && old.duty == duty && samePaths(old.paths, groups)
		for _, g := range groups {
			gs := c.groups[g.Path()]
			if gs == nil {
				gs = &groupState{}
				c.groups[g.Path()] = gs
				same = false
			}
			gs.g = g // the newest handle wins
		}
		if same {
			// The agent re-sends every GPU's duty each step; nothing changed (and
			// nothing is allocated).
			return nil
		}
		ks := &keyState{duty: duty}
		for _, g := range groups {
			if p := g.Path(); !slices.Contains(ks.paths, p) {
				ks.paths = append(ks.paths, p)
			}
		}
		c.keys[key] = ks
	}
	c.recompute(time.Now())
	c.poke()
	return nil
}

// samePaths reports whether paths (a key's groups, deduplicated in order of first
// appearance) are the paths of groups.
func samePaths(paths []string, groups []*cgroups.Group) bool {
	n := 0
	for _, g := range groups {
		p := g.Path()
		if slices.Contains(paths[:n], p) {
			continue // a repeat, deduplicated in paths
		}
		if n == len(paths) || paths[n] != p {
			return false
		}
		n++
	}
	return n == len(paths)
}

// recompute sets every group's duty from its keys; c.mu is held.
func (c *Cycler) recompute(now time.Time) {
	want := make(map[string]float64, len(c.groups))
	for _, ks := range c.keys {
		for _, p := range ks.paths {
			want[p] = math.Max(want[p], ks.duty)
		}
	}
	for p, gs := range c.groups {
		d, ok := want[p]
		old := gs.duty
		gs.managed = ok
		gs.duty = c.effectiveDuty(d)
		if gs.duty > old && (old == 0 || (!gs.frozen && gs.duty-old >= RestartRise)) {
			gs.extraUntil = now.Add(time.Duration(gs.duty * float64(c.period)))
		}
	}
}

// effectiveDuty rounds duties whose frozen or thawed window would be shorter than
// minWindow.
func (c *Cycler) effectiveDuty(d float64) float64 {
	switch on := time.Duration(d * float64(c.period)); {
	case on < minWindow:
		return 0
	case c.period-on < minWindow:
		return 1
	}
	return d
}

func (c *Cycler) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// action is one planned freezer write.
type action struct {
	path   string
	g      *cgroups.Group
	freeze bool
}

// Run cycles the groups until ctx ends, then thaws every group it froze (bounded by
// ShutdownTimeout) and returns nil, or an error wrapping ErrThaw for groups that stayed
// frozen. Only one Run at a time (ErrRunning).
func (c *Cycler) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return ErrRunning
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		c.pinFor(ctx, now)
		acts, next := c.plan(now)
		if len(acts) > 0 {
			c.apply(ctx, acts)
			if ctx.Err() == nil {
				continue // time has passed during the writes: plan again
			}
		}
		if ctx.Err() != nil {
			break
		}
		c.closeWriters(false)
		if next.IsZero() {
			timer.Reset(time.Hour)
		} else {
			timer.Reset(max(next.Sub(time.Now()), 0))
		}
		select {
		case <-ctx.Done():
		case <-c.wake:
		case <-timer.C:
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	err := c.thawFrozen(sctx, true)
	c.pinWrite(sctx, false, time.Now())
	c.closeWriters(true)
	return err
}

// pinFor freezes the pin while some key has groups to cycle and thaws it once none has
// (Run's goroutine). Set wakes Run, so the pin is frozen before the first group is.
func (c *Cycler) pinFor(ctx context.Context, now time.Time) {
	c.mu.Lock()
	want := c.pin != nil && len(c.keys) > 0
	c.mu.Unlock()
	if want != c.pinned && !now.Before(c.pinRetry) {
		c.pinWrite(ctx, want, now)
	}
}

// pinWrite freezes or thaws the pin. A failure is logged once and tried again after
// PinRetry: the pin only saves CPU. A pin that vanished is dropped.
func (c *Cycler) pinWrite(ctx context.Context, freeze bool, now time.Time) {
	c.mu.Lock()
	pin := c.pin
	c.mu.Unlock()
	if pin == nil || (!freeze && !c.pinned) {
		return
	}
	opCtx, cancel := context.WithTimeout(ctx, OpTimeout)
	err := write(opCtx, pin, freeze)
	cancel()
	switch {
	case err == nil:
		c.pinned, c.pinErr, c.pinRetry = freeze, nil, time.Time{}
	case errors.Is(err, cgroups.ErrNotExist):
		c.log.Warn("duty cycler: freezer pin vanished; cycling without it", "cgroup", pin.Path())
		c.mu.Lock()
		c.pin = nil
		c.mu.Unlock()
		c.pinned = false
	default:
		if freeze {
			c.pinned = true // thaw it in any case later
		}
		c.pinRetry = now.Add(PinRetry)
		if c.pinErr == nil || c.pinErr.Error() != err.Error() {
			c.log.Warn("duty cycler: freezer pin write failed; retrying later", "cgroup", pin.Path(),
				"freeze", freeze, "err", err)
		}
		c.pinErr = err
	}
}

// plan returns the writes due at now and when the next one is due (zero: none).
func (c *Cycler) plan(now time.Time) ([]action, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		acts []action
		next time.Time
	)
	soonest := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for p, gs := range c.groups {
		want, at := c.schedule(gs, now)
		if want == gs.frozen {
			if !gs.managed {
				delete(c.groups, p) // thawed and in no key
				continue
			}
			soonest(at)
			continue
		}
		if now.Before(gs.retryAt) {
			soonest(gs.retryAt)
			continue
		}
		acts = append(acts, action{path: p, g: gs.g, freeze: want})
		soonest(at)
	}
	return acts, next
}

// schedule says whether gs should be frozen at now and when to look again (zero: not
// before its duty changes): frozen in [periodStart, periodStart + duty*period) of every
// period, and until extraUntil after a rise.
func (c *Cycler) schedule(gs *groupState, now time.Time) (bool, time.Time) {
	switch {
	case !gs.managed || gs.duty <= 0:
		return false, time.Time{}
	case gs.duty >= 1:
		return true, time.Time{}
	}
	ps := c.periodStart(now)
	windowEnd := ps.Add(time.Duration(gs.duty * float64(c.period)))
	inWindow := now.Before(windowEnd)
	next := ps.Add(c.period)
	if inWindow {
		next = windowEnd
	}
	extra := now.Before(gs.extraUntil)
	if extra && gs.extraUntil.Before(next) {
		next = gs.extraUntil
	}
	return inWindow || extra, next
}

// apply performs the writes, none waiting for the kernel (see request), checking under
// c.mu just before each that it is still wanted (Release or ThawAll may have run since plan).
func (c *Cycler) apply(ctx context.Context, acts []action) {
	c.ioMu.Lock()
	defer c.ioMu.Unlock()
	for _, a := range acts {
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		gs := c.groups[a.path]
		stale := gs == nil || gs.g != a.g || (a.freeze && (!gs.managed || gs.duty <= 0)) || gs.frozen == a.freeze
		c.mu.Unlock()
		if stale {
			continue
		}
		c.record(a.path, a.g, a.freeze, c.request(a))
	}
}

// openWriter is a group's open freezer file and the handle it was opened for.
type openWriter struct {
	g *cgroups.Group
	w *cgroups.FreezeWriter
}

// request makes a's write through the group's open freezer file, opening it first when
// needed; a failed write closes it (the next write opens it again). Without a writer
// (the open failed) it falls back to one open-write-close. Run's goroutine only.
func (c *Cycler) request(a action) error {
	c.mu.Lock()
	ow, ok := c.writers[a.path]
	c.mu.Unlock()
	if ok && ow.g != a.g {
		_ = ow.w.Close() // the group was handed in again: a new handle wins
		ok = false
	}
	if !ok {
		w, err := a.g.FreezeWriter()
		if err != nil {
			c.setWriter(a.path, openWriter{})
			return request(a.g, a.freeze)
		}
		ow = openWriter{g: a.g, w: w}
		c.setWriter(a.path, ow)
	}
	err := ow.w.Request(a.freeze)
	if err != nil {
		_ = ow.w.Close()
		c.setWriter(a.path, openWriter{})
	}
	return err
}

// setWriter records path's open writer (none: forget it).
func (c *Cycler) setWriter(path string, ow openWriter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ow.w == nil {
		delete(c.writers, path)
		return
	}
	c.writers[path] = ow
}

// closeWriters closes the open freezer files of groups the cycler forgot (all of them
// when all is set: Run is ending). Run's goroutine only.
func (c *Cycler) closeWriters(all bool) {
	if len(c.writers) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, ow := range c.writers {
		if gs := c.groups[p]; all || gs == nil || gs.g != ow.g {
			_ = ow.w.Close()
			delete(c.writers, p)
		}
	}
}

// request makes one write of the cycle. It does not wait for the kernel to stop the
// group's tasks: a freeze completes on its own within microseconds (a task in
// uninterruptible sleep stops when it wakes), and waiting for it cost a timer wake-up and
// a few more reads per freeze, most of the cycle's CPU. A task that escaped a v1 freeze
// (forked while it began) runs until the next period's freeze. A thaw is complete when
// written, unless an ancestor (the CPU escalation's tier) is frozen: that freeze holds.
func request(g *cgroups.Group, freeze bool) error {
	if freeze {
		return g.FreezeNoWait()
	}
	return g.ThawNoWait()
}

func write(ctx context.Context, g *cgroups.Group, freeze bool) error {
	if freeze {
		return g.FreezeContext(ctx)
	}
	return g.ThawContext(ctx)
}

// record stores the outcome of one write. A group that vanished is dropped from every
// key. A failed freeze counts as frozen (it may be partly frozen): it is thawed at the end
// of its window like any other.
func (c *Cycler) record(path string, g *cgroups.Group, freeze bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gs := c.groups[path]
	if gs == nil || gs.g != g {
		return
	}
	now := time.Now()
	switch {
	case err == nil:
		gs.frozen = freeze
		gs.retryAt = time.Time{}
	case errors.Is(err, cgroups.ErrNotExist):
		c.log.Info("duty cycler: cgroup vanished; dropping it", "cgroup", path)
		c.drop(path)
	default:
		if freeze {
			gs.frozen = true
		}
		gs.retryAt = now.Add(c.retry)
		if gs.lastErr == nil || gs.lastErr.Error() != err.Error() {
			c.log.Warn("duty cycler: freezer write failed; retrying", "cgroup", path, "freeze", freeze, "err", err)
		}
		gs.lastErr, gs.lastErrAt = err, now
	}
}

// drop forgets path everywhere; c.mu is held.
func (c *Cycler) drop(path string) {
	delete(c.groups, path)
	for k, ks := range c.keys {
		ks.paths = slices.DeleteFunc(ks.paths, func(p string) bool { return p == path })
		if len(ks.paths) == 0 {
			delete(c.keys, k)
		}
	}
}

// ThawAll removes every key and thaws every group the cycler froze, waiting for the
// writes (each bounded by OpTimeout and ctx). It returns an error wrapping ErrThaw for
// groups that stayed frozen; they are retried by Run (if it runs) and appear in Status
// under ReleasedKey. Set may add keys again afterwards.
func (c *Cycler) ThawAll(ctx context.Context) error {
	c.mu.Lock()
	clear(c.keys)
	c.recompute(time.Now())
	c.mu.Unlock()
	err := c.thawFrozen(ctx, false)
	c.poke()
	return err
}

// Release takes g out of every key and thaws it, whether or not the cycler froze it (for
// a pod about to be evicted or suspended: a frozen task cannot handle SIGTERM, and
// cuda-checkpoint cannot suspend a frozen process). It waits for the write, bounded by
// OpTimeout and ctx. A vanished group is not an error.
func (c *Cycler) Release(ctx context.Context, g *cgroups.Group) error {
	if g == nil {
		return ErrInvalidGroup
	}
	path := g.Path()
	c.mu.Lock()
	for k, ks := range c.keys {
		ks.paths = slices.DeleteFunc(ks.paths, func(p string) bool { return p == path })
		if len(ks.paths) == 0 {
			delete(c.keys, k)
		}
	}
	gs := c.groups[path]
	if gs == nil {
		gs = &groupState{g: g}
		c.groups[path] = gs
	}
	c.recompute(time.Now())
	gs.frozen = true // thaw it in any case
	c.mu.Unlock()
	err := c.thawFrozen(ctx, false)
	c.poke()
	return err
}

// thawFrozen thaws the frozen groups that are in no key (all frozen groups when all is
// set: Run is ending) and forgets the released ones it thawed. Each write is bounded by
// OpTimeout and ctx.
func (c *Cycler) thawFrozen(ctx context.Context, all bool) error {
	c.ioMu.Lock()
	defer c.ioMu.Unlock()
	c.mu.Lock()
	var acts []action
	for p, gs := range c.groups {
		if gs.frozen && (all || !gs.managed) {
			acts = append(acts, action{path: p, g: gs.g})
		}
	}
	c.mu.Unlock()
	slices.SortFunc(acts, func(a, b action) int { return cmp.Compare(a.path, b.path) })
	var errs []error
	for _, a := range acts {
		opCtx, cancel := context.WithTimeout(ctx, OpTimeout)
		err := a.g.ThawContext(opCtx)
		cancel()
		c.record(a.path, a.g, false, err)
		if err != nil && !errors.Is(err, cgroups.ErrNotExist) {
			errs = append(errs, fmt.Errorf("thawing cgroup %s: %w: %w", a.path, ErrThaw, err))
		}
	}
	c.mu.Lock()
	for p, gs := range c.groups {
		if !gs.managed && !gs.frozen {
			delete(c.groups, p)
		}
	}
	c.mu.Unlock()
	return errors.Join(errs...)
}

// KeyStatus is one key's state for /status.
type KeyStatus struct {
	Key string `json:"key"`
	// Duty is the key's duty as Set; a group may run at a higher one from another key.
	Duty float64 `json:"duty"`
	// Frozen: every group of the key is frozen now.
	Frozen bool          `json:"frozen"`
	Groups []GroupStatus `json:"groups"`
	// LastError is the newest freezer error among the key's groups.
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
}

// GroupStatus is one cgroup of a key.
type GroupStatus struct {
	Path string `json:"path"`
	// Duty is the group's effective duty: the highest of its keys, rounded where a window
	// would be under 1 ms.
	Duty        float64   `json:"duty"`
	Frozen      bool      `json:"frozen"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
}

// Status returns every key, sorted, with its groups; groups still to be thawed after
// leaving every key are listed under ReleasedKey.
func (c *Cycler) Status() []KeyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	gstat := func(p string) GroupStatus {
		gs := c.groups[p]
		st := GroupStatus{Path: p}
		if gs == nil {
			return st
		}
		st.Duty, st.Frozen = gs.duty, gs.frozen
		if gs.lastErr != nil {
			st.LastError, st.LastErrorAt = gs.lastErr.Error(), gs.lastErrAt
		}
		return st
	}
	fill := func(ks *KeyStatus, paths []string) {
		ks.Frozen = len(paths) > 0
		for _, p := range paths {
			g := gstat(p)
			ks.Groups = append(ks.Groups, g)
			ks.Frozen = ks.Frozen && g.Frozen
			if g.LastErrorAt.After(ks.LastErrorAt) {
				ks.LastError, ks.LastErrorAt = g.LastError, g.LastErrorAt
			}
		}
		slices.SortFunc(ks.Groups, func(a, b GroupStatus) int { return cmp.Compare(a.Path, b.Path) })
	}
	out := make([]KeyStatus, 0, len(c.keys)+1)
	for k, ks := range c.keys {
		st := KeyStatus{Key: k, Duty: ks.duty}
		fill(&st, ks.paths)
		out = append(out, st)
	}
	var released []string
	for p, gs := range c.groups {
		if !gs.managed {
			released = append(released, p)
		}
	}
	if len(released) > 0 {
		st := KeyStatus{Key: ReleasedKey}
		fill(&st, released)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b KeyStatus) int { return cmp.Compare(a.Key, b.Key) })
	return out
}
