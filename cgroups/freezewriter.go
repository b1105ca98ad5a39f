package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// FreezeWriter makes FreezeNoWait and ThawNoWait writes from a freezer file it keeps
// open (v1 freezer.state, v2 cgroup.freeze): one pwrite each instead of an open, a
// write and a close. For groups a duty cycle freezes and thaws many times a second,
// where the open and close were half the cost of a write. Safe for concurrent use;
// Close it when done.
type FreezeWriter struct {
	mu   sync.Mutex
	f    *os.File
	v1   bool
	dir  string
	name string
}

// FreezeWriter opens the group's freezer file for writing. A missing group wraps
// ErrNotExist, no freezer ErrUnsupported.
func (g *Group) FreezeWriter() (*FreezeWriter, error) {
	w := &FreezeWriter{v1: g.useV1Freezer()}
	if w.v1 {
		w.dir, w.name = g.freezerDir(), fileFreezerState
	} else {
		dir, err := g.v2FreezerDir()
		if err != nil {
			return nil, err
		}
		w.dir, w.name = dir, fileFreeze
	}
	f, err := os.OpenFile(filepath.Join(w.dir, w.name), os.O_WRONLY, 0)
	if err != nil {
		return nil, classify("opening", w.dir, w.name, err)
	}
	w.f = f
	return w, nil
}

// Request writes the freezer state once (see FreezeNoWait and ThawNoWait). A removed
// group wraps ErrNotExist.
func (w *FreezeWriter) Request(frozen bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return fmt.Errorf("writing %s/%s: %w", w.dir, w.name, os.ErrClosed)
	}
	value := v2Freeze(frozen)
	if w.v1 {
		value = v1State(frozen)
	}
	var err error
	for {
		_, err = unix.Pwrite(int(w.f.Fd()), []byte(value), 0)
		runtime.KeepAlive(w.f)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			err = unix.ENOENT // the group was removed under the open file
		}
		return classify("writing "+value+" to", w.dir, w.name,
			&fs.PathError{Op: "write", Path: filepath.Join(w.dir, w.name), Err: err})
	}
	return nil
}

// Close releases the open file. Request after Close fails with os.ErrClosed.
func (w *FreezeWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}
