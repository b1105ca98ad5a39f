package psi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/understory/understory/internal/testenv"
)

// newTestWatcher makes a watcher closed at cleanup.
func newTestWatcher(t *testing.T) *Watcher {
	t.Helper()
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return w
}

// runWatcher starts Run and returns a channel with its result.
func runWatcher(t *testing.T, ctx context.Context, w *Watcher) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return done
}

// waitRunning waits until the Run that runWatcher started has begun: before that a
// Close would find no Run to stop, and a second Run would be the first.
func waitRunning(t *testing.T, w *Watcher) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "Run to start", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.running
	})
}

// fakeTrigger installs a trigger whose fd is an eventfd outside epoll: the
// tests play the kernel by handing dispatch the events epoll would return.
func fakeTrigger(t *testing.T, w *Watcher, key string) uint64 {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	return fakeTriggerFD(t, w, key, fd)
}

// fakeTriggerFD installs a trigger on fd, which the watcher then owns.
func fakeTriggerFD(t *testing.T, w *Watcher, key string, fd int) uint64 {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	tr := &trigger{id: w.nextID, key: key, path: "fake/" + key, fd: fd}
	w.keys[key], w.ids[tr.id] = tr, tr
	return tr.id
}

func epollEvent(id uint64, events uint32) unix.EpollEvent {
	ev := unix.EpollEvent{Events: events}
	setID(&ev, id)
	return ev
}

func fire(w *Watcher, at time.Time, ids ...uint64) {
	evs := make([]unix.EpollEvent, 0, len(ids))
	for _, id := range ids {
		evs = append(evs, epollEvent(id, unix.EPOLLPRI))
	}
	w.dispatch(evs, at, nil)
}

func recv(t *testing.T, c <-chan Event, within time.Duration) (Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-c:
		return ev, ok
	case <-time.After(within):
		return Event{}, false
	}
}

func TestWatcherIDs(t *testing.T) {
	t.Parallel()
	for _, id := range []uint64{0, 1, 1<<32 - 1, 1 << 32, 1<<64 - 1} {
		if got := getID(epollEvent(id, 0)); got != id {
			t.Errorf("id %d came back as %d", id, got)
		}
	}
}

// TestWatcherSlowConsumer: wake-ups never block the epoll side, and those
// that pile up while nobody reads merge per trigger without loss.
func TestWatcherSlowConsumer(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	a, b := fakeTrigger(t, w, "pod-a"), fakeTrigger(t, w, "pod-b")
	done := runWatcher(t, t.Context(), w)

	t0 := time.Unix(1000, 0)
	const n = 10000
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		for i := range n {
			fire(w, t0.Add(time.Duration(i)*time.Millisecond), a)
		}
		fire(w, t0.Add(n*time.Millisecond), b)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("dispatch blocked on a consumer that does not read")
	}

	counts := map[string]int{}
	events := map[string]int{}
	for counts["pod-a"] < n || counts["pod-b"] < 1 {
		ev, ok := recv(t, w.C(), 2*time.Second)
		if !ok {
			t.Fatalf("missing events: counts %v", counts)
		}
		if ev.Gone || ev.Count < 1 {
			t.Fatalf("unexpected %+v", ev)
		}
		counts[ev.Key] += ev.Count
		events[ev.Key]++
	}
	// The deliverer holds at most one event per trigger while blocked on C,
	// and the rest merge into one pending event.
	if events["pod-a"] > 2 || events["pod-b"] != 1 || counts["pod-a"] != n || counts["pod-b"] != 1 {
		t.Fatalf("events %v counts %v; want ≤2 events carrying %d wake-ups for pod-a, 1 for pod-b",
			events, counts, n)
	}
	if ev, ok := recv(t, w.C(), 100*time.Millisecond); ok {
		t.Fatalf("extra event %+v", ev)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, ok := <-w.C(); ok {
		t.Fatal("C not closed after Run returned")
	}
}

func TestWatcherTakeEarliestFirst(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	ids := []uint64{fakeTrigger(t, w, "c"), fakeTrigger(t, w, "a"), fakeTrigger(t, w, "b")}
	t0 := time.Unix(1000, 0)
	fire(w, t0.Add(3*time.Millisecond), ids[0])
	fire(w, t0.Add(1*time.Millisecond), ids[1])
	fire(w, t0.Add(2*time.Millisecond), ids[2])
	fire(w, t0.Add(9*time.Millisecond), ids[1]) // merges, keeps the first time
	batch := w.take(nil)
	var keys []string
	for _, d := range batch {
		keys = append(keys, d.ev.Key)
	}
	if len(keys) != 3 || keys[0] != "a" || keys[1] != "b" || keys[2] != "c" {
		t.Fatalf("order %v, want [a b c]", keys)
	}
	if batch[0].ev.Count != 2 || !batch[0].ev.Time.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("merged event %+v, want Count 2 at the first wake-up", batch[0].ev)
	}
	if len(w.take(nil)) != 0 {
		t.Fatal("take left events pending")
	}
}

// TestWatcherGone: POLLERR (the group was removed) drops the key, closes
// its fd and is reported once.
func TestWatcherGone(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	// The trigger's fd is a pipe's read end: once the watcher closes it,
	// writing to the other end fails with EPIPE (fd numbers get reused).
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(p[1]) })
	id := fakeTriggerFD(t, w, "pod-a", p[0])
	fakeTrigger(t, w, "pod-b")
	runWatcher(t, t.Context(), w)

	at := time.Unix(1000, 0)
	fire(w, at, id)
	w.dispatch([]unix.EpollEvent{epollEvent(id, unix.EPOLLERR|unix.EPOLLPRI)}, at.Add(time.Millisecond), nil)
	// Level-triggered epoll would report it again: ignored, the id is gone.
	w.dispatch([]unix.EpollEvent{epollEvent(id, unix.EPOLLERR|unix.EPOLLPRI)}, at.Add(2*time.Millisecond), nil)

	var got []Event
	for {
		ev, ok := recv(t, w.C(), 200*time.Millisecond)
		if !ok {
			break
		}
		got = append(got, ev)
	}
	last := got[len(got)-1]
	if !last.Gone || last.Key != "pod-a" {
		t.Fatalf("events %+v, want a Gone event for pod-a last", got)
	}
	wakeups := 0
	for _, ev := range got {
		wakeups += ev.Count
	}
	if wakeups != 1 || len(got) > 2 {
		t.Fatalf("events %+v, want the one wake-up and one Gone", got)
	}
	if keys := w.Keys(); len(keys) != 1 || keys[0] != "pod-b" {
		t.Fatalf("Keys = %v, want [pod-b]", keys)
	}
	if err := w.Remove("pod-a"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Remove after Gone = %v, want ErrUnknownKey", err)
	}
	if _, err := unix.Write(p[1], []byte{1}); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("write to the gone trigger's pipe = %v, want EPIPE (its fd closed)", err)
	}
}

// TestWatcherRemoveDropsPending: a wake-up still pending when its key is
// removed is not delivered.
func TestWatcherRemoveDropsPending(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	id := fakeTrigger(t, w, "pod-a")
	fire(w, time.Unix(1000, 0), id) // Run not started: stays pending
	if err := w.Remove("pod-a"); err != nil {
		t.Fatal(err)
	}
	runWatcher(t, t.Context(), w)
	w.kick <- struct{}{}
	if ev, ok := recv(t, w.C(), 200*time.Millisecond); ok {
		t.Fatalf("got %+v for a removed key", ev)
	}
	if err := w.Remove("pod-a"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("second Remove = %v, want ErrUnknownKey", err)
	}
}

func TestWatcherLifecycle(t *testing.T) {
	t.Parallel()
	t.Run("Close stops Run", func(t *testing.T) {
		t.Parallel()
		w := newTestWatcher(t)
		fakeTrigger(t, w, "x")
		done := runWatcher(t, t.Context(), w)
		waitRunning(t, w)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		// Close has waited for Run's shutdown: C is closed already.
		select {
		case _, ok := <-w.C():
			if ok {
				t.Fatal("event after Close")
			}
		default:
			t.Fatal("C still open when Close returned")
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Run did not return after Close")
		}
		if err := w.Run(t.Context()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Run after Close = %v, want ErrClosed", err)
		}
		if err := w.Add("y", "/proc/pressure/cpu", time.Millisecond, 2*time.Second); !errors.Is(err, ErrClosed) {
			t.Fatalf("Add after Close = %v, want ErrClosed", err)
		}
		if err := w.Remove("x"); !errors.Is(err, ErrClosed) {
			t.Fatalf("Remove after Close = %v, want ErrClosed", err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("second Close = %v", err)
		}
	})
	t.Run("cancel stops Run and closes", func(t *testing.T) {
		t.Parallel()
		w := newTestWatcher(t)
		ctx, cancel := context.WithCancel(t.Context())
		done := runWatcher(t, ctx, w)
		waitRunning(t, w)
		if err := w.Run(t.Context()); !errors.Is(err, ErrRunning) {
			t.Fatalf("second Run = %v, want ErrRunning", err)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
		if _, ok := <-w.C(); ok {
			t.Fatal("C open after Run returned")
		}
		if err := w.Remove("x"); !errors.Is(err, ErrClosed) {
			t.Fatalf("Remove after Run returned = %v, want ErrClosed", err)
		}
	})
	t.Run("Close without Run", func(t *testing.T) {
		t.Parallel()
		w := newTestWatcher(t)
		fakeTrigger(t, w, "x")
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-w.C(); ok {
			t.Fatal("C open after Close")
		}
	})
	t.Run("cancelled before Run", func(t *testing.T) {
		t.Parallel()
		w := newTestWatcher(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := w.Run(ctx); err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestWatcherAddValidation(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	const node = "/proc/pressure/cpu"
	ms := time.Millisecond
	tests := []struct {
		name          string
		key, path     string
		stall, window time.Duration
	}{
		{"empty key", "", node, 10 * ms, 2000 * ms},
		{"window too short", "k", node, 10 * ms, 499 * ms},
		{"window too long", "k", node, 10 * ms, 10*time.Second + time.Microsecond},
		{"zero stall", "k", node, 0, 2000 * ms},
		{"negative stall", "k", node, -ms, 2000 * ms},
		{"sub-microsecond stall", "k", node, 999, 2000 * ms},
		{"stall equals window", "k", node, 2000 * ms, 2000 * ms},
		{"stall above window", "k", node, 3000 * ms, 2000 * ms},
		{"not a pressure file", "k", "/proc/stat", 10 * ms, 2000 * ms},
		{"cgroup.pressure", "k", "/sys/fs/cgroup/unified/cgroup.pressure", 10 * ms, 2000 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := w.Add(tc.key, tc.path, tc.stall, tc.window); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Add = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestWatcherAddFakeFiles: files on an ordinary filesystem get no trigger
// and are not written to.
func TestWatcherAddFakeFiles(t *testing.T) {
	t.Parallel()
	w := newTestWatcher(t)
	dir := t.TempDir()
	plain := filepath.Join(dir, "cpu.pressure")
	writeFile(t, plain, sampleGroupCPU)
	tests := []struct {
		name string
		path string
		want error
	}{
		{"regular file", plain, ErrUnsupported},
		{"file missing, directory there (no PSI)", filepath.Join(dir, "memory.pressure"), ErrUnsupported},
		{"group gone", filepath.Join(dir, "pod1", "cpu.pressure"), ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := w.Add("k", tc.path, 10*time.Millisecond, 2*time.Second); !errors.Is(err, tc.want) {
				t.Fatalf("Add = %v, want %v", err, tc.want)
			}
		})
	}
	b, err := os.ReadFile(plain)
	if err != nil || string(b) != sampleGroupCPU {
		t.Fatalf("regular file changed to %q (%v)", b, err)
	}
	if keys := w.Keys(); len(keys) != 0 {
		t.Fatalf("Keys = %v after failed Adds", keys)
	}
}

// TestRegularFileTakesTrigger records what the kernel does with a trigger
// on a regular file, the reason Add checks the filesystem first: the write
// succeeds (the text is appended) and epoll refuses the fd with EPERM.
func TestRegularFileTakesTrigger(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cpu.pressure")
	writeFile(t, path, "")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte("some 10000 2000000\x00")); err != nil {
		t.Fatalf("write on a regular file: %v", err)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	ev := unix.EpollEvent{Events: unix.EPOLLPRI}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); !errors.Is(err, unix.EPERM) {
		t.Fatalf("epoll_ctl on a regular file = %v, want EPERM", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "some 10000 2000000\x00" {
		t.Fatalf("file holds %q", b)
	}
}
