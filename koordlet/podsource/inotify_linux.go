//go:build linux

package podsource

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// watchMask: entries appearing, disappearing or finishing a write, plus the
// directory itself going away (after which the watch must be re-added).
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_CLOSE_WRITE |
	unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR

// watcher turns inotify events on one directory into coalesced kicks.
type watcher struct {
	dir    string
	logger *slog.Logger
	f      *os.File // non-blocking inotify fd, registered with the Go poller
	fd     int
	wd     atomic.Int32 // current watch descriptor, -1 when none
	events chan struct{}
	done   chan struct{}
}

func newWatcher(dir string, logger *slog.Logger) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	// A non-blocking fd makes os.NewFile use the poller, so Close unblocks
	// a pending Read.
	w := &watcher{
		dir:    dir,
		logger: logger,
		f:      os.NewFile(uintptr(fd), "inotify"),
		fd:     fd,
		events: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	w.wd.Store(-1)
	if err := w.rewatch(); err != nil {
		w.f.Close()
		return nil, err
	}
	go w.loop()
	return w, nil
}

// lost reports whether the directory watch is gone (directory deleted or
// moved away).
func (w *watcher) lost() bool { return w.wd.Load() < 0 }

// rewatch (re-)adds the watch on the directory path.
func (w *watcher) rewatch() error {
	wd, err := unix.InotifyAddWatch(w.fd, w.dir, watchMask)
	if err != nil {
		return fmt.Errorf("inotify_add_watch %s: %w", w.dir, err)
	}
	w.wd.Store(int32(wd))
	return nil
}

func (w *watcher) close() {
	w.f.Close()
	<-w.done
}

func (w *watcher) loop() {
	defer close(w.done)
	// Room for many events with maximal names.
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.logger.Warn("inotify read failed; relying on polling", "err", err)
				w.wd.Store(-1)
			}
			return
		}
		w.handle(buf[:n])
		notify(w.events)
	}
}

// handle tracks the watch's lifetime; every event triggers a rescan anyway.
func (w *watcher) handle(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		nameLen := binary.NativeEndian.Uint32(b[12:])
		cur := w.wd.Load()
		switch {
		case mask&unix.IN_MOVE_SELF != 0 && wd == cur:
			// The watch follows the inode, not the path: drop it and
			// re-add on the path later.
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			w.wd.CompareAndSwap(cur, -1)
		case mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF) != 0 && wd == cur:
			w.wd.CompareAndSwap(cur, -1)
		}
		adv := unix.SizeofInotifyEvent + int(nameLen)
		if adv > len(b) {
			return
		}
		b = b[adv:]
	}
}
