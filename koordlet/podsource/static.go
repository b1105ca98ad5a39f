package podsource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DefaultPollInterval is how often Static re-reads its directory even when
// inotify reports nothing.
const DefaultPollInterval = time.Second

// ErrNotDirectory is returned by Static.Run when the manifest path is not a
// directory.
var ErrNotDirectory = errors.New("not a directory")

// StaticOption configures a Static source.
type StaticOption func(*Static)

// WithPollInterval sets how often the directory is re-read regardless of
// inotify (default DefaultPollInterval). Non-positive values are ignored.
func WithPollInterval(d time.Duration) StaticOption {
	return func(s *Static) {
		if d > 0 {
			s.poll = d
		}
	}
}

// withoutInotify makes the source rely on polling only (tests).
func withoutInotify() StaticOption {
	return func(s *Static) { s.noInotify = true }
}

// Static serves the pods described by manifest files in one directory.
// List, HasSynced, Changed and Errors are safe for concurrent use with Run.
type Static struct {
	dir       string
	logger    *slog.Logger
	poll      time.Duration
	noInotify bool

	changed chan struct{}
	synced  atomic.Bool
	running atomic.Bool
	snap    atomic.Pointer[staticSnapshot]
	errors  atomic.Uint64

	// Owned by the goroutine calling scan (Run).
	files map[string]*manifestFile
}

// staticSnapshot is published atomically after each scan; never mutated.
type staticSnapshot struct {
	pods []*corev1.Pod
	errs map[string]error
}

// manifestFile is what Static remembers about one file.
type manifestFile struct {
	raw    []byte      // content last read; nil after a read error
	parsed *corev1.Pod // pod decoded from raw; nil if raw is invalid
	err    error       // read or parse error for raw
	good   *corev1.Pod // last pod from this file that was served
}

// safetyScanEvery is how many poll intervals pass between full re-reads while
// inotify reports changes.
const safetyScanEvery = 10

// NewStatic returns a source for the manifests in dir. It does no IO until
// Run. A nil logger discards logs.
func NewStatic(dir string, logger *slog.Logger, opts ...StaticOption) *Static {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Static{
		dir:     filepath.Clean(dir),
		logger:  logger.With("source", "static", "dir", dir),
		poll:    DefaultPollInterval,
		changed: newChanged(),
		files:   map[string]*manifestFile{},
	}
	for _, o := range opts {
		o(s)
	}
	s.snap.Store(&staticSnapshot{})
	return s
}

// Run watches the directory until ctx is done. It fails at once if the
// directory does not exist or is not a directory; later read failures keep
// the last known pods and show up in Errors.
func (s *Static) Run(ctx context.Context) error {
	fi, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("static pod source: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("static pod source %s: %w", s.dir, ErrNotDirectory)
	}
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer s.running.Store(false)

	var events <-chan struct{}
	var w *watcher
	if !s.noInotify {
		// Watch before the first scan so that no change falls in between.
		w, err = newWatcher(s.dir, s.logger)
		if err != nil {
			s.logger.Warn("inotify unavailable, relying on polling", "poll", s.poll, "err", err)
		} else {
			defer w.close()
			events = w.events
		}
	}

	s.scan()
	s.synced.Store(true)
	notify(s.changed)

	tick := time.NewTicker(s.poll)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			s.scan()
		case <-tick.C:
			lost := w != nil && w.lost()
			if lost {
				if err := w.rewatch(); err == nil {
					s.logger.Info("inotify watch re-established")
				}
			}
			// While inotify works the poll is only a safety net: a full re-read of every
			// manifest each poll interval is most of an idle agent's work with 100 pods.
			if w == nil || lost || n%safetyScanEvery == 0 {
				s.scan()
			}
		}
	}
}

// HasSynced reports whether the first full directory scan is done.
func (s *Static) HasSynced() bool { return s.synced.Load() }

// List returns the current pods ordered by file name. The slice and pods are
// shared: do not modify them.
func (s *Static) List() []*corev1.Pod { return s.snap.Load().pods }

// Changed receives after the pod set changed (coalesced, buffered 1).
func (s *Static) Changed() <-chan struct{} { return s.changed }

// ErrorCount is how many manifest problems (a file that newly failed to read or parse,
// or failed differently) were seen so far: a persistently broken file counts once.
func (s *Static) ErrorCount() uint64 { return s.errors.Load() }

// Errors returns the current problems keyed by file path (the directory path
// for directory-level errors). The map is a copy.
func (s *Static) Errors() map[string]error { return maps.Clone(s.snap.Load().errs) }

// isManifestName reports whether a directory entry name is a manifest.
func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// errSkip marks entries that are silently ignored (sub-directories).
var errSkip = errors.New("skip")

// readManifest reads one file without ever blocking on special files.
func readManifest(path string, entry fs.DirEntry) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO for reading would otherwise block until a
	// writer shows up. It has no effect on regular files.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && entry.Type()&fs.ModeSymlink != 0 {
			return nil, fmt.Errorf("pod manifest %s: dangling symlink: %w", path, err)
		}
		return nil, fmt.Errorf("pod manifest %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("pod manifest %s: %w", path, err)
	}
	if fi.IsDir() {
		return nil, errSkip
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("pod manifest %s: mode %v: %w", path, fi.Mode().Type(), ErrNotRegular)
	}
	if fi.Size() > MaxManifestSize {
		return nil, fmt.Errorf("pod manifest %s: %d bytes, limit %d: %w", path, fi.Size(), MaxManifestSize, ErrManifestTooLarge)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("pod manifest %s: %w", path, err)
	}
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("pod manifest %s: more than %d bytes: %w", path, MaxManifestSize, ErrManifestTooLarge)
	}
	return data, nil
}

// scan re-reads the directory, re-parses files whose bytes changed and
// publishes a new snapshot; it signals Changed if the pod set changed.
func (s *Static) scan() {
	prev := s.snap.Load()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		// Keep every pod: an unreadable directory is not a deletion.
		errs := maps.Clone(prev.errs)
		if errs == nil {
			errs = map[string]error{}
		}
		errs[s.dir] = fmt.Errorf("reading static pod directory: %w", err)
		s.logErrors(prev.errs, errs)
		s.snap.Store(&staticSnapshot{pods: prev.pods, errs: errs})
		return
	}

	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		name := e.Name()
		if !isManifestName(name) {
			continue
		}
		path := filepath.Join(s.dir, name)
		data, err := readManifest(path, e)
		if errors.Is(err, errSkip) {
			continue
		}
		if errors.Is(err, fs.ErrNotExist) && e.Type()&fs.ModeSymlink == 0 {
			continue // removed since ReadDir: same as deleted
		}
		seen[name] = true
		f := s.files[name]
		if f == nil {
			f = &manifestFile{}
			s.files[name] = f
		}
		if err != nil {
			f.raw, f.parsed, f.err = nil, nil, err
			continue
		}
		if f.raw != nil && bytes.Equal(f.raw, data) {
			continue
		}
		f.raw = data
		f.parsed, f.err = ParseManifest(path, data)
	}
	for name := range s.files {
		if !seen[name] {
			delete(s.files, name)
		}
	}

	names := slices.Sorted(maps.Keys(s.files))
	pods := make([]*corev1.Pod, 0, len(names))
	errs := map[string]error{}
	owner := make(map[types.UID]string, len(names))
	for _, name := range names {
		f := s.files[name]
		path := filepath.Join(s.dir, name)
		ferr := f.err
		var pod *corev1.Pod
		if f.parsed != nil {
			if other, dup := owner[f.parsed.UID]; dup {
				ferr = fmt.Errorf("pod manifest %s: metadata.uid %q is already used by %s: %w", path, f.parsed.UID, other, ErrDuplicateUID)
			} else {
				pod = f.parsed
				f.good = pod
			}
		}
		if pod == nil && f.good != nil {
			if _, dup := owner[f.good.UID]; !dup {
				pod = f.good // loses nothing: serve the last good version
			}
		}
		if pod != nil {
			owner[pod.UID] = path
			pods = append(pods, pod)
		}
		if ferr != nil {
			errs[path] = ferr
		}
	}

	s.logErrors(prev.errs, errs)
	changed := !slices.Equal(pods, prev.pods)
	if !changed {
		pods = prev.pods
	} else {
		pods = slices.Clip(pods)
	}
	s.snap.Store(&staticSnapshot{pods: pods, errs: errs})
	if changed {
		s.logger.Debug("static pods changed", "pods", len(pods))
		notify(s.changed)
	}
}

// logErrors logs errors that are new or changed and those that cleared, so
// that a persistently broken file is logged once, not every poll.
func (s *Static) logErrors(prev, cur map[string]error) {
	for path, err := range cur {
		if p, ok := prev[path]; !ok || p.Error() != err.Error() {
			s.errors.Add(1)
			s.logger.Warn("static pod manifest problem; keeping last good pod if any", "file", path, "err", err)
		}
	}
	for path := range prev {
		if _, ok := cur[path]; !ok {
			s.logger.Info("static pod manifest problem resolved", "file", path)
		}
	}
}
