//go:build !linux

package podsource

import (
	"errors"
	"log/slog"
)

// watcher is unavailable off Linux; Static then relies on polling.
type watcher struct{ events chan struct{} }

func newWatcher(string, *slog.Logger) (*watcher, error) {
	return nil, errors.New("inotify is only available on linux")
}

func (*watcher) lost() bool     { return false }
func (*watcher) rewatch() error { return nil }
func (*watcher) close()         {}
