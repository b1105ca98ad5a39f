package realnode

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchedFiles are the cpu controller files whose writes are recorded.
var watchedFiles = []string{"cpu.shares", "cpu.idle", "cpu.cfs_quota_us", "cpu.cfs_period_us"}

// writeEvent is one successful write to a watched cgroup file.
type writeEvent struct {
	At    time.Duration // since the watch started
	File  string        // relative to the cpu hierarchy, e.g. kubepods/besteffort/cpu.shares
	Value string        // the file's content just after the write
	Phase string        // what the test was doing
}

func (e writeEvent) String() string {
	return fmt.Sprintf("+%6.1fs %-22s %s = %s", e.At.Seconds(), "["+e.Phase+"]", e.File, e.Value)
}

// writeWatch records every write to the watched files of the cgroups it was given
// (inotify IN_MODIFY, which fires for each successful write, even of the same value),
// tagged with the test phase in force. Its goroutine ends at test cleanup.
type writeWatch struct {
	fd    int
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu     sync.Mutex
	wds    map[int]string
	phase  string
	events []writeEvent
}

func newWriteWatch(t *testing.T) *writeWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	w := &writeWatch{fd: fd, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{}),
		wds: map[int]string{}, phase: "start"}
	go w.run()
	t.Cleanup(func() {
		close(w.stop)
		<-w.done
		_ = unix.Close(fd)
	})
	return w
}

// add watches the cpu files of the relative cgroup (which must exist).
func (w *writeWatch) add(rel string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range watchedFiles {
		p := filepath.Join(cgroupRoot, "cpu", rel, f)
		wd, err := unix.InotifyAddWatch(w.fd, p, unix.IN_MODIFY)
		if err != nil {
			return fmt.Errorf("watching %s: %w", p, err)
		}
		w.wds[wd] = filepath.Join(rel, f)
	}
	return nil
}

// setPhase tags the events from now on.
func (w *writeWatch) setPhase(p string) {
	w.mu.Lock()
	w.phase = p
	w.mu.Unlock()
}

// snapshot returns the events so far, optionally only those of files under prefix.
func (w *writeWatch) snapshot(prefix string) []writeEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []writeEvent
	for _, e := range w.events {
		if strings.HasPrefix(e.File, prefix) {
			out = append(out, e)
		}
	}
	return out
}

func (w *writeWatch) run() {
	defer close(w.done)
	buf := make([]byte, 64*1024)
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		if n, err := unix.Poll(fds, 200); err != nil || n == 0 {
			continue
		}
		n, err := unix.Read(w.fd, buf)
		if err != nil || n <= 0 {
			continue
		}
		now := time.Since(w.start)
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_MODIFY == 0 {
				continue
			}
			w.mu.Lock()
			file, ok := w.wds[int(ev.Wd)]
			phase := w.phase
			w.mu.Unlock()
			if !ok {
				continue
			}
			v, _ := cpuFile(filepath.Dir(file), filepath.Base(file))
			w.mu.Lock()
			w.events = append(w.events, writeEvent{At: now, File: file, Value: v, Phase: phase})
			w.mu.Unlock()
		}
	}
}
