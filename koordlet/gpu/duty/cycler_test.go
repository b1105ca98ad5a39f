package duty

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// Tests on a fake hybrid root (v1 freezer files in t.TempDir()): the kernel's part is
// played by the files, so a freeze "succeeds" as soon as freezer.state reads FROZEN.
// Behaviour on the real kernel is in real_test.go.

const fakeKind = cgroupstest.Hybrid

type fakeRoot struct {
	t    *testing.T
	root string
	h    *cgroups.Hierarchy
}

func newFakeRoot(t *testing.T) *fakeRoot {
	t.Helper()
	root := cgroupstest.NewRoot(t, fakeKind)
	return &fakeRoot{t: t, root: root, h: cgroups.OpenLayout(root, cgroups.LayoutHybrid)}
}

func (f *fakeRoot) group(rel string) *cgroups.Group {
	f.t.Helper()
	cgroupstest.AddGroup(f.t, f.root, fakeKind, rel)
	g, err := f.h.Load(rel)
	if err != nil {
		f.t.Fatal(err)
	}
	return g
}

func (f *fakeRoot) stateFile(rel string) string {
	return filepath.Join(f.root, "freezer", rel, "freezer.state")
}

func (f *fakeRoot) state(rel string) string {
	f.t.Helper()
	b, err := os.ReadFile(f.stateFile(rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// waitState waits (up to 5 s) until rel's freezer.state reads want.
func (f *fakeRoot) waitState(rel, want string) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.state(rel) != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: freezer.state %q, want %q", rel, f.state(rel), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// startRun runs c until the test ends; the returned func cancels it and returns Run's error.
func startRun(t *testing.T, c *Cycler) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var stopped bool
	var err error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newCycler(t *testing.T, period time.Duration) *Cycler {
	t.Helper()
	c, err := New(period, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewPeriod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		period time.Duration
		ok     bool
	}{
		{MinPeriod, true}, {100 * time.Millisecond, true}, {MaxPeriod, true},
		{0, false}, {-time.Second, false}, {MinPeriod - 1, false}, {MaxPeriod + 1, false},
	} {
		c, err := New(tc.period, nil)
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, ErrInvalidPeriod)) {
			t.Errorf("New(%v) = %v", tc.period, err)
		}
		if tc.ok && c.Period() != tc.period {
			t.Errorf("Period() = %v, want %v", c.Period(), tc.period)
		}
	}
}

func TestSetInvalid(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	g := f.group("a")
	c := newCycler(t, 100*time.Millisecond)
	if err := c.Set("gpu0", []*cgroups.Group{g}, 0.5); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		groups []*cgroups.Group
		duty   float64
		want   error
	}{
		{"NaN", []*cgroups.Group{g}, math.NaN(), ErrInvalidDuty},
		{"negative", []*cgroups.Group{g}, -0.1, ErrInvalidDuty},
		{"above 1", []*cgroups.Group{g}, 1.01, ErrInvalidDuty},
		{"+Inf", []*cgroups.Group{g}, math.Inf(1), ErrInvalidDuty},
		{"nil group", []*cgroups.Group{g, nil}, 0.5, ErrInvalidGroup},
	} {
		if err := c.Set("gpu0", tc.groups, tc.duty); !errors.Is(err, tc.want) {
			t.Errorf("%s: Set = %v, want %v", tc.name, err, tc.want)
		}
	}
	// Nothing was lost.
	st := c.Status()
	if len(st) != 1 || st[0].Key != "gpu0" || st[0].Duty != 0.5 || len(st[0].Groups) != 1 {
		t.Fatalf("Status after rejected Sets = %+v", st)
	}
	if err := c.Release(context.Background(), nil); !errors.Is(err, ErrInvalidGroup) {
		t.Fatalf("Release(nil) = %v", err)
	}
}

// Keys, the max over keys, rounding, removal, a vanished group and shutdown, with duties
// 0 and 1 (no timing involved).
func TestCyclerKeys(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	a, b, gone := f.group("kubepods/besteffort/poda"), f.group("kubepods/besteffort/podb"), f.group("podgone")
	c := newCycler(t, 100*time.Millisecond)
	stop := startRun(t, c)

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Set("gpu0", []*cgroups.Group{a, b}, 1))
	f.waitState(a.Path(), "FROZEN")
	f.waitState(b.Path(), "FROZEN")
	waitStatus(t, c, func(st []KeyStatus) bool { return len(st) == 1 && st[0].Frozen })

	// b also on gpu1 at a lower duty: still the max (1). Then gpu0 drops b: b runs at
	// gpu1's duty, which is rounded to 0 (a 0.5 ms window), so it is thawed.
	must(c.Set("gpu1", []*cgroups.Group{b}, 0.005))
	must(c.Set("gpu0", []*cgroups.Group{a}, 1))
	f.waitState(b.Path(), "THAWED")
	if got := f.state(a.Path()); got != "FROZEN" {
		t.Fatalf("a = %s after b left gpu0", got)
	}
	st := c.Status()
	if len(st) != 2 || st[1].Key != "gpu1" || st[1].Groups[0].Duty != 0 || st[1].Duty != 0.005 || st[1].Frozen {
		t.Fatalf("Status = %+v", st)
	}
	// Nearly 1 is rounded to 1: frozen for whole periods.
	must(c.Set("gpu1", []*cgroups.Group{b}, 0.995))
	f.waitState(b.Path(), "FROZEN")

	// A group that vanished is dropped, with its key when that is left empty.
	cgroupstest.RemoveGroup(t, f.root, fakeKind, gone.Path())
	must(c.Set("gpu2", []*cgroups.Group{gone}, 1))
	waitStatus(t, c, func(st []KeyStatus) bool {
		for _, k := range st {
			if k.Key == "gpu2" {
				return false
			}
		}
		return true
	})

	// Duty 0 removes the key and thaws.
	must(c.Set("gpu1", []*cgroups.Group{b}, 0))
	f.waitState(b.Path(), "THAWED")

	// Shutdown thaws what is still frozen.
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := f.state(a.Path()); got != "THAWED" {
		t.Fatalf("a = %s after Run ended", got)
	}
	// The keys stay (a new Run would cycle them again).
	if st := c.Status(); len(st) != 1 || st[0].Key != "gpu0" || st[0].Frozen {
		t.Fatalf("Status after Run = %+v", st)
	}
}

func waitStatus(t *testing.T, c *Cycler, ok func([]KeyStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(c.Status()) {
		if time.Now().After(deadline) {
			t.Fatalf("Status never matched: %+v", c.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// At duty 0.5 the group alternates; a rise from 0 freezes at once.
func TestCyclerCycles(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	g := f.group("pod1")
	c := newCycler(t, 20*time.Millisecond)
	startRun(t, c)
	if err := c.Set("gpu0", []*cgroups.Group{g}, 0.5); err != nil {
		t.Fatal(err)
	}
	f.waitState(g.Path(), "FROZEN")
	changes, last := 0, "FROZEN"
	// 50 periods a second: about 100 changes; a loaded machine loses some samples, never
	// all. At least 10 within 5 s (250 periods).
	if !testenv.Poll(5*time.Second, func() bool {
		if s := f.state(g.Path()); s != last {
			changes, last = changes+1, s
		}
		return changes >= 10
	}) {
		t.Fatalf("%d freezer changes in 5 s at a 20 ms period", changes)
	}
}

// A rise from 0 freezes at once, in the thawed part of a period, and the periodic windows
// of all groups are aligned whenever each joined.
func TestCyclerRiseAndPhase(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	a, b := f.group("poda"), f.group("podb")
	c := newCycler(t, 100*time.Millisecond)
	startRun(t, c)
	// 60 ms into a period: past a 0.5 window.
	time.Sleep(time.Until(c.NextPeriod(time.Now()).Add(60 * time.Millisecond)))
	if err := c.Set("gpu0", []*cgroups.Group{a}, 0.5); err != nil {
		t.Fatal(err)
	}
	setAt := time.Now()
	c.mu.Lock()
	want, _ := c.schedule(c.groups[a.Path()], setAt)
	c.mu.Unlock()
	if !want {
		t.Fatalf("not to be frozen %v after a period start, right after a rise from 0", setAt.Sub(c.periodStart(setAt)))
	}
	f.waitState(a.Path(), "FROZEN")

	// b joins later, in another key: the schedule of both is the same once their rise
	// windows have passed.
	time.Sleep(30 * time.Millisecond)
	if err := c.Set("gpu1", []*cgroups.Group{b}, 0.5); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ga, gb := c.groups[a.Path()], c.groups[b.Path()]
	from := c.NextPeriod(gb.extraUntil)
	for at := from; at.Before(from.Add(time.Second)); at = at.Add(7 * time.Millisecond) {
		wa, _ := c.schedule(ga, at)
		wb, _ := c.schedule(gb, at)
		if wa != wb {
			t.Fatalf("at %v after a period start: a frozen %v, b frozen %v", at.Sub(c.periodStart(at)), wa, wb)
		}
		if inWindow := at.Sub(c.periodStart(at)) < 50*time.Millisecond; wa != inWindow {
			t.Fatalf("at %v after a period start: frozen %v", at.Sub(c.periodStart(at)), wa)
		}
	}
	// Before the epoch too (a clock read before New), periods are floored.
	if ps := c.periodStart(c.epoch.Add(-time.Millisecond)); !ps.Equal(c.epoch.Add(-100 * time.Millisecond)) {
		t.Fatalf("periodStart before the epoch = %v", ps.Sub(c.epoch))
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	c := newCycler(t, 100*time.Millisecond)
	startRun(t, c)
	waitRunning(t, c)
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
}

func waitRunning(t *testing.T, c *Cycler) {
	t.Helper()
	for {
		c.mu.Lock()
		r := c.running
		c.mu.Unlock()
		if r {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestThawAllAndRelease(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	a, b, other := f.group("poda"), f.group("podb"), f.group("podother")
	c := newCycler(t, 100*time.Millisecond)
	startRun(t, c)
	if err := c.Set("gpu0", []*cgroups.Group{a, b}, 1); err != nil {
		t.Fatal(err)
	}
	f.waitState(a.Path(), "FROZEN")
	f.waitState(b.Path(), "FROZEN")

	// Release thaws at once and takes the group out of its key.
	if err := c.Release(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if got := f.state(a.Path()); got != "THAWED" {
		t.Fatalf("released a = %s", got)
	}
	if st := c.Status(); len(st) != 1 || len(st[0].Groups) != 1 || st[0].Groups[0].Path != b.Path() {
		t.Fatalf("Status after Release = %+v", st)
	}
	// Release also thaws a group frozen by someone else.
	if err := os.WriteFile(f.stateFile(other.Path()), []byte("FROZEN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if got := f.state(other.Path()); got != "THAWED" {
		t.Fatalf("released other = %s", got)
	}

	if err := c.ThawAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.state(b.Path()); got != "THAWED" {
		t.Fatalf("b = %s after ThawAll", got)
	}
	if st := c.Status(); len(st) != 0 {
		t.Fatalf("Status after ThawAll = %+v", st)
	}
	// Run closes the freezer files it kept open for the forgotten groups, and b stays
	// thawed meanwhile: nothing is left to cycle.
	testenv.WaitFor(t, 5*time.Second, "Run to close the freezer files of the groups ThawAll forgot", func() bool {
		if got := f.state(b.Path()); got != "THAWED" {
			t.Fatalf("b = %s after ThawAll, with %d freezer files open", got, openWriters(c))
		}
		return openWriters(c) == 0
	})
	// Longer than a period: b is never frozen again.
	testenv.Hold(t, 150*time.Millisecond, "b thawed after ThawAll", func() bool { return f.state(b.Path()) == "THAWED" })
}

// openWriters is how many freezer files c keeps open; it stops c's Run loop from
// racing the read by taking the lock Run takes before it prunes.
func openWriters(c *Cycler) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.writers)
}

// A group that cannot be thawed is reported by Run's shutdown (ErrThaw) and in Status.
func TestShutdownThawError(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	g := f.group("podstuck")
	c := newCycler(t, 100*time.Millisecond)
	stop := startRun(t, c)
	if err := c.Set("gpu0", []*cgroups.Group{g}, 1); err != nil {
		t.Fatal(err)
	}
	f.waitState(g.Path(), "FROZEN")
	// A directory in place of freezer.state: writes fail with EISDIR (not "gone").
	if err := os.Remove(f.stateFile(g.Path())); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.stateFile(g.Path()), 0o755); err != nil {
		t.Fatal(err)
	}
	err := stop()
	if !errors.Is(err, ErrThaw) || !strings.Contains(err.Error(), g.Path()) {
		t.Fatalf("Run = %v, want ErrThaw naming %s", err, g.Path())
	}
	st := c.Status()
	if len(st) != 1 || !st[0].Groups[0].Frozen || st[0].LastError == "" || st[0].LastErrorAt.IsZero() {
		t.Fatalf("Status = %+v; want the group frozen with its error", st)
	}
}

func TestThawStaleFake(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	frozen, thawed, gone, broken := f.group("pod1"), f.group("pod2"), f.group("pod3"), f.group("pod4")
	if err := os.WriteFile(f.stateFile(frozen.Path()), []byte("FROZEN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cgroupstest.RemoveGroup(t, f.root, fakeKind, gone.Path())
	stale, err := ThawStale(context.Background(), []*cgroups.Group{frozen, thawed, gone, nil})
	if err != nil || len(stale) != 1 || stale[0] != frozen.Path() {
		t.Fatalf("ThawStale = %v, %v; want [%s]", stale, err, frozen.Path())
	}
	for _, g := range []*cgroups.Group{frozen, thawed} {
		if s := f.state(g.Path()); s != "THAWED" {
			t.Fatalf("%s = %s", g.Path(), s)
		}
	}
	// A directory in place of freezer.state: the thaw write fails (EISDIR).
	if err := os.Remove(f.stateFile(broken.Path())); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.stateFile(broken.Path()), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ThawStale(context.Background(), []*cgroups.Group{broken}); !errors.Is(err, ErrThaw) {
		t.Fatalf("ThawStale on an unwritable group = %v, want ErrThaw", err)
	}
}

// TestSamePaths: Set's "nothing changed" check matches the deduplicated paths it stores.
func TestSamePaths(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	a, b := f.group("a"), f.group("b")
	g := func(gs ...*cgroups.Group) []*cgroups.Group { return gs }
	tests := []struct {
		paths  []string
		groups []*cgroups.Group
		want   bool
	}{
		{nil, nil, true},
		{[]string{"a"}, g(a), true},
		{[]string{"a", "b"}, g(a, b), true},
		{[]string{"a", "b"}, g(a, a, b, a), true},
		{[]string{"a", "b"}, g(b, a), false},
		{[]string{"a", "b"}, g(a), false},
		{[]string{"a"}, g(a, b), false},
		{nil, g(a), false},
		{[]string{"a"}, nil, false},
	}
	for _, tt := range tests {
		if got := samePaths(tt.paths, tt.groups); got != tt.want {
			var ps []string
			for _, x := range tt.groups {
				ps = append(ps, x.Path())
			}
			t.Errorf("samePaths(%q, %q) = %t, want %t", tt.paths, ps, got, tt.want)
		}
	}
}

// TestCyclerPin: the pin is frozen while some key has groups to cycle, before them, and
// thawed once none has and when Run ends; a pin that vanished is dropped and cycling
// goes on.
func TestCyclerPin(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	pin, a := f.group("understory-freezer-pin"), f.group("poda")
	c := newCycler(t, 100*time.Millisecond)
	c.SetPin(pin)
	stop := startRun(t, c)
	waitRunning(t, c)
	if got := f.state(pin.Path()); got != "THAWED" {
		t.Fatalf("pin %s with nothing to cycle", got)
	}
	if err := c.Set("gpu0", []*cgroups.Group{a}, 1); err != nil {
		t.Fatal(err)
	}
	f.waitState(a.Path(), "FROZEN")
	if got := f.state(pin.Path()); got != "FROZEN" {
		t.Fatalf("group frozen, pin %s: the pin must be frozen first", got)
	}
	if err := c.Set("gpu0", nil, 0); err != nil {
		t.Fatal(err)
	}
	f.waitState(a.Path(), "THAWED")
	f.waitState(pin.Path(), "THAWED")
	if err := c.Set("gpu0", []*cgroups.Group{a}, 0.5); err != nil {
		t.Fatal(err)
	}
	f.waitState(pin.Path(), "FROZEN")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := f.state(pin.Path()); got != "THAWED" {
		t.Fatalf("pin %s after Run ended", got)
	}

	// A pin that vanished: dropped, the groups are still cycled.
	c2 := newCycler(t, 100*time.Millisecond)
	gone := f.group("understory-freezer-pin-gone")
	if err := os.RemoveAll(filepath.Join(f.root, "freezer", gone.Path())); err != nil {
		t.Fatal(err)
	}
	c2.SetPin(gone)
	startRun(t, c2)
	if err := c2.Set("gpu0", []*cgroups.Group{a}, 1); err != nil {
		t.Fatal(err)
	}
	f.waitState(a.Path(), "FROZEN")
}

// Duty 1 is the agent's on/off freeze: frozen at once on a rise from 0, and never thawed
// by a period while it lasts (no write is planned); duty 0 thaws at once.
func TestCyclerSolidFreeze(t *testing.T) {
	t.Parallel()
	f := newFakeRoot(t)
	g := f.group("pod1")
	c := newCycler(t, 20*time.Millisecond)
	startRun(t, c)
	if err := c.Set("gpu0", []*cgroups.Group{g}, 1); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	gs := c.groups[g.Path()]
	for at := time.Now(); at.Before(time.Now().Add(time.Second)); at = at.Add(3 * time.Millisecond) {
		if want, next := c.schedule(gs, at); !want || !next.IsZero() {
			c.mu.Unlock()
			t.Fatalf("duty 1 at %v: frozen %v, next look %v; want frozen and no planned write", at, want, next)
		}
	}
	c.mu.Unlock()
	f.waitState(g.Path(), "FROZEN")
	testenv.Hold(t, 200*time.Millisecond, "a solid freeze over 10 periods of 20 ms",
		func() bool { return f.state(g.Path()) == "FROZEN" })
	if err := c.Set("gpu0", []*cgroups.Group{g}, 0); err != nil {
		t.Fatal(err)
	}
	f.waitState(g.Path(), "THAWED")
}
