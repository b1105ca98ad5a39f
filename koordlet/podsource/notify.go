package podsource

import "errors"

// ErrAlreadyRunning is returned by a second call to Run on the same source.
var ErrAlreadyRunning = errors.New("pod source already running")

// newChanged returns the buffered(1) channel behind Changed.
func newChanged() chan struct{} { return make(chan struct{}, 1) }

// notify signals ch without blocking; pending signals coalesce.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
