package psi

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Trigger window bounds the watcher accepts. The kernel takes 500 ms..10 s
// (newer kernels accept shorter windows from privileged users; older ones
// do not, so the watcher does not either). Without CAP_SYS_RESOURCE the
// window must also be a multiple of UnprivilegedStep (see Privileged).
const (
	MinWindow        = 500 * time.Millisecond
	MaxWindow        = 10 * time.Second
	UnprivilegedStep = 2 * time.Second
)

// Event is one wake-up of the watcher.
type Event struct {
	// Key is the key the trigger was added with.
	Key string
	// Time is when the watcher saw the first of the wake-ups coalesced into
	// this event (the kernel had found the stall over the threshold within
	// the window just before).
	Time time.Time
	// Count is the number of trigger wake-ups coalesced into the event (the
	// kernel wakes at most once per window per trigger); 0 for a Gone event
	// with no wake-up before it.
	Count int
	// Gone: the file's group was removed (the kernel reported POLLERR). The
	// watcher has dropped the key and closed its file; Remove(Key) now
	// fails with ErrUnknownKey.
	Gone bool
}

// Watcher waits for PSI trigger wake-ups on many pressure files with one
// epoll instance and one goroutine (Run), and hands them out on C.
//
// Delivery never blocks the epoll goroutine: a wake-up is recorded in a set
// of pending events, one per trigger, and a doorbell (a channel of one) is
// rung without blocking; a second goroutine of Run takes the whole set,
// earliest first, and sends it on C, blocking only itself. While the
// consumer is slow, repeated wake-ups of a trigger merge into its pending
// event (Count grows, Time stays the first), so memory is bounded by the
// number of triggers and no trigger's wake-up is lost, only merged.
//
// Add, Remove and Close are safe for concurrent use with Run and each other.
type Watcher struct {
	epfd, evfd int // -1 once closed
	out        chan Event
	kick       chan struct{}
	runDone    chan struct{}
	// closers are the goroutines closing trigger fds (see closeLater);
	// closeSlots bounds how many run at once.
	closers    sync.WaitGroup
	closeSlots chan struct{}

	mu      sync.Mutex
	closed  bool
	ran     bool // Run was called (it runs once)
	running bool
	nextID  uint64
	keys    map[string]*trigger
	ids     map[uint64]*trigger
	pending map[uint64]Event // by trigger id
}

type trigger struct {
	id        uint64
	key, path string
	fd        int
}

// wakeID marks the eventfd in epoll data; trigger ids start at 1.
const wakeID = 0

// maxClosers bounds the goroutines (each on an OS thread while the kernel
// waits) closing trigger fds at once.
const maxClosers = 16

// NewWatcher makes a watcher with its epoll instance. Add triggers, then
// start Run in a goroutine and read C.
func NewWatcher() (*Watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setID(&ev, wakeID)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		_ = unix.Close(evfd)
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("epoll_ctl add eventfd: %w", err)
	}
	return &Watcher{
		epfd: epfd, evfd: evfd,
		out:        make(chan Event),
		kick:       make(chan struct{}, 1),
		runDone:    make(chan struct{}),
		closeSlots: make(chan struct{}, maxClosers),
		keys:       map[string]*trigger{},
		ids:        map[uint64]*trigger{},
		pending:    map[uint64]Event{},
	}, nil
}

// C returns the events channel. It is closed when Run returns, or by Close
// when Run never ran.
func (w *Watcher) C() <-chan Event { return w.out }

// Add opens path (a pressure file: a group's cpu.pressure or memory.pressure
// below the cgroup2 root, or <proc>/pressure/<resource>) and sets a trigger
// "some stall window" on it: the watcher wakes when the group's tasks were
// stalled for stall in total within window. The trigger lives as long as
// the watcher keeps the file open (until Remove, Gone or Close).
//
// stall and window are truncated to microseconds; 0 < stall < window and
// MinWindow <= window <= MaxWindow, else ErrInvalid. Errors: ErrExists for a
// key already added, ErrInvalid for a path that is not named like a pressure
// file, ErrNotExist when the group is gone, ErrUnsupported when the file is
// missing, not on procfs or cgroup2, or the kernel refuses the trigger,
// ErrPermission on EPERM/EACCES or a window that is not a multiple of 2 s
// without CAP_SYS_RESOURCE, ErrClosed after Close.
func (w *Watcher) Add(key, path string, stall, window time.Duration) error {
	if err := checkTrigger(key, path, stall, window); err != nil {
		return err
	}
	if err := w.check(key); err != nil {
		return err
	}
	// Open and write without the lock: a first privileged trigger on a
	// group makes the kernel start a thread, and Run must not wait for that.
	fd, err := openTrigger(path, stall, window)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.checkLocked(key); err != nil {
		_ = unix.Close(fd)
		return err
	}
	w.nextID++
	t := &trigger{id: w.nextID, key: key, path: path, fd: fd}
	// Level-triggered is right for PSI: the kernel clears a trigger's event
	// when epoll polls it, so it is reported once. EPOLLERR (group removed)
	// stays set and is handled by removing the fd.
	ev := unix.EpollEvent{Events: unix.EPOLLPRI | unix.EPOLLERR}
	setID(&ev, t.id)
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		_ = unix.Close(fd)
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("watching %s: file cannot be polled: %w: %w", path, ErrUnsupported, err)
		}
		return fmt.Errorf("watching %s: epoll_ctl: %w", path, err)
	}
	w.keys[key], w.ids[t.id] = t, t
	return nil
}

func checkTrigger(key, path string, stall, window time.Duration) error {
	if key == "" {
		return fmt.Errorf("empty trigger key: %w", ErrInvalid)
	}
	if window < MinWindow || window > MaxWindow {
		return fmt.Errorf("trigger window %v outside %v..%v: %w", window, MinWindow, MaxWindow, ErrInvalid)
	}
	if stall < time.Microsecond || stall >= window {
		return fmt.Errorf("trigger stall %v must be at least 1µs and below the window %v: %w",
			stall, window, ErrInvalid)
	}
	return checkTriggerFile(path)
}

func (w *Watcher) check(key string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checkLocked(key)
}

func (w *Watcher) checkLocked(key string) error {
	if w.closed {
		return ErrClosed
	}
	if _, ok := w.keys[key]; ok {
		return fmt.Errorf("trigger %q: %w", key, ErrExists)
	}
	return nil
}

// openTrigger opens path for a trigger and writes it; it returns the fd.
//
// Traps: the fd is a raw one, never an *os.File: Go's own poller would
// register a pollable kernfs file in its epoll, and whichever epoll polls
// the file first clears the trigger's event. A regular file would take the
// write (the trigger text appended to it) and then refuse epoll with EPERM,
// so the filesystem is checked before writing. The trailing NUL is needed:
// /proc/pressure/* overwrites the last byte written with one, which would
// cut the window's last digit.
func openTrigger(path string, stall, window time.Duration) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, openError(path, err)
	}
	ok, magic, err := pressureFS(fd)
	if err == nil && !ok {
		err = fmt.Errorf("not on procfs or cgroup2 (filesystem magic %#x): %w", magic, ErrUnsupported)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("trigger on %s: %w", path, err)
	}
	msg := fmt.Appendf(nil, "some %d %d\x00", stall.Microseconds(), window.Microseconds())
	for {
		_, err = unix.Write(fd, msg)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, writeError(path, msg[:len(msg)-1], window, err)
	}
	return fd, nil
}

func writeError(path string, msg []byte, window time.Duration, err error) error {
	switch {
	case errors.Is(err, syscall.EINVAL):
		if window%UnprivilegedStep != 0 {
			if priv, perr := Privileged(); perr == nil && !priv {
				return fmt.Errorf("trigger %q on %s: without CAP_SYS_RESOURCE the window must be a multiple of %v: "+
					"%w: %w", msg, path, UnprivilegedStep, ErrPermission, err)
			}
		}
		return fmt.Errorf("trigger %q on %s: refused by the kernel: %w: %w", msg, path, ErrUnsupported, err)
	case errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("trigger %q on %s: %w: %w", msg, path, ErrUnsupported, err)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("trigger %q on %s: %w: %w", msg, path, ErrPermission, err)
	case errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("trigger %q on %s: %w: %w", msg, path, ErrNotExist, err)
	}
	return fmt.Errorf("trigger %q on %s: %w", msg, path, err)
}

// Remove drops the trigger with this key and closes its file in the
// background (see closeLater). A pending event of the trigger is dropped;
// one already being handed to C may still arrive. ErrUnknownKey when there
// is no such key.
func (w *Watcher) Remove(key string) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	t, ok := w.keys[key]
	if !ok {
		w.mu.Unlock()
		return fmt.Errorf("trigger %q: %w", key, ErrUnknownKey)
	}
	w.dropLocked(t)
	delete(w.pending, t.id)
	w.closeLater(t.fd)
	w.mu.Unlock()
	return nil
}

// closeLater closes trigger fds in the background. Closing destroys the
// trigger, and the kernel waits for an RCU grace period in it (about 12 ms
// per trigger measured here, privileged or not): closed inline, 50 pods
// leaving at once would stall the epoll loop, a caller's Remove or Close
// for over half a second. The fds are out of epoll and of the maps already,
// so nothing can use them meanwhile; Close and Run's exit wait for these.
func (w *Watcher) closeLater(fds ...int) {
	for _, fd := range fds {
		w.closers.Go(func() {
			w.closeSlots <- struct{}{}
			_ = unix.Close(fd) // close(2) on Linux frees the fd even when it reports an error
			<-w.closeSlots
		})
	}
}

// dropLocked forgets t and takes its fd out of epoll; the caller closes it.
func (w *Watcher) dropLocked(t *trigger) {
	delete(w.keys, t.key)
	delete(w.ids, t.id)
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, t.fd, nil)
}

// Keys returns the watched keys, sorted.
func (w *Watcher) Keys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := make([]string, 0, len(w.keys))
	for k := range w.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Run waits for wake-ups and delivers them on C until ctx is done or Close
// is called; it returns nil then, or the error that stopped epoll. Either
// way the watcher is closed when Run returns (every trigger released, C
// closed). Run runs once: ErrRunning on a second call, ErrClosed after
// Close.
func (w *Watcher) Run(ctx context.Context) error {
	w.mu.Lock()
	switch {
	case w.closed:
		w.mu.Unlock()
		return ErrClosed
	case w.ran:
		w.mu.Unlock()
		return ErrRunning
	}
	w.ran, w.running = true, true
	w.mu.Unlock()

	stopWake := context.AfterFunc(ctx, w.wake)
	stopDeliver, delivered := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(delivered)
		w.deliver(stopDeliver)
	}()

	err := w.loop(ctx)

	stopWake()
	close(stopDeliver)
	<-delivered
	w.mu.Lock()
	w.closed, w.running = true, false
	cerr := w.releaseLocked()
	w.mu.Unlock()
	w.closers.Wait()
	close(w.out)
	close(w.runDone)
	return errors.Join(err, cerr)
}

// loop is the epoll goroutine: it records wake-ups and rings the doorbell,
// never blocking on anything but epoll_wait.
func (w *Watcher) loop(ctx context.Context) error {
	events := make([]unix.EpollEvent, 64)
	var gone []int
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		var stop bool
		if gone, stop = w.dispatch(events[:n], time.Now(), gone[:0]); stop || ctx.Err() != nil {
			return nil
		}
	}
}

// dispatch handles one epoll_wait's events: wake-ups go to the pending
// set, POLLERR drops its trigger, the eventfd asks to stop (when closed or
// cancelled). It reuses gone for the fds to close and returns it.
func (w *Watcher) dispatch(events []unix.EpollEvent, now time.Time, gone []int) ([]int, bool) {
	var stopReq, recorded bool
	w.mu.Lock()
	for _, ev := range events {
		id := getID(ev)
		if id == wakeID {
			var b [8]byte
			_, _ = unix.Read(w.evfd, b[:])
			stopReq = true
			continue
		}
		fd, rec := w.recordLocked(id, ev.Events, now)
		if fd >= 0 {
			gone = append(gone, fd)
		}
		recorded = recorded || rec
	}
	closed := w.closed
	w.closeLater(gone...)
	w.mu.Unlock()
	if recorded {
		select {
		case w.kick <- struct{}{}:
		default: // already rung; the deliverer takes this wake-up too
		}
	}
	return gone, stopReq && closed
}

// recordLocked merges a wake-up of trigger id into its pending event. On
// POLLERR/POLLHUP (the group was removed; the kernel keeps reporting it, so
// it would spin) the trigger is dropped and its fd returned for closing.
func (w *Watcher) recordLocked(id uint64, events uint32, now time.Time) (closeFD int, recorded bool) {
	t := w.ids[id]
	if t == nil {
		return -1, false // removed after epoll_wait returned it
	}
	ev, ok := w.pending[id]
	if !ok {
		ev = Event{Key: t.key, Time: now}
	}
	if events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		w.dropLocked(t)
		ev.Gone = true
		w.pending[id] = ev
		return t.fd, true
	}
	if events&unix.EPOLLPRI == 0 {
		return -1, false
	}
	ev.Count++
	w.pending[id] = ev
	return -1, true
}

type delivery struct {
	id uint64
	ev Event
}

// deliver sends pending events on C, blocking only itself.
func (w *Watcher) deliver(stop <-chan struct{}) {
	var batch []delivery
	for {
		select {
		case <-stop:
			return
		case <-w.kick:
		}
		batch = w.take(batch[:0])
		for _, d := range batch {
			if !w.current(d) {
				continue
			}
			select {
			case w.out <- d.ev:
			case <-stop:
				return
			}
		}
	}
}

// take moves the pending events into batch, earliest first.
func (w *Watcher) take(batch []delivery) []delivery {
	w.mu.Lock()
	for id, ev := range w.pending {
		batch = append(batch, delivery{id: id, ev: ev})
	}
	clear(w.pending)
	w.mu.Unlock()
	slices.SortFunc(batch, func(a, b delivery) int {
		if c := a.ev.Time.Compare(b.ev.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return batch
}

// current reports whether d is still worth sending: a Gone event always
// is; a wake-up only while its trigger is still watched (not Removed while
// the batch waited for the consumer).
func (w *Watcher) current(d delivery) bool {
	if d.ev.Gone {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.ids[d.id]
	return ok
}

// wake interrupts epoll_wait through the eventfd.
func (w *Watcher) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.evfd >= 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(w.evfd, one[:]) // EAGAIN: the counter is already non-zero
	}
}

// Close releases every trigger and stops Run, waiting for it to return. It
// is idempotent.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if w.closed {
		running := w.running
		w.mu.Unlock()
		if running {
			<-w.runDone
		}
		return nil
	}
	w.closed = true
	if w.running {
		w.mu.Unlock()
		w.wake()
		<-w.runDone
		return nil
	}
	err := w.releaseLocked()
	w.mu.Unlock()
	w.closers.Wait()
	close(w.out)
	return err
}

// releaseLocked closes every trigger (in the background: the caller waits
// for closers), the eventfd and the epoll instance.
func (w *Watcher) releaseLocked() error {
	var errs []error
	for _, t := range w.keys {
		w.closeLater(t.fd)
	}
	clear(w.keys)
	clear(w.ids)
	clear(w.pending)
	for _, fd := range []*int{&w.evfd, &w.epfd} {
		if *fd >= 0 {
			if err := unix.Close(*fd); err != nil {
				errs = append(errs, err)
			}
			*fd = -1
		}
	}
	return errors.Join(errs...)
}

// setID and getID keep a 64-bit id in epoll's data (the Fd and Pad fields
// of x/sys's EpollEvent): ids are never reused, fds are, so an event read
// before a Remove cannot be credited to a trigger added after it.
func setID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func getID(ev unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}
