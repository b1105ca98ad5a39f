package extender

import (
	"sync/atomic"
	"time"
)

// apiContact remembers when the extender last heard from the API server (every
// successful list and every watch event, bookmarks included); the time since is
// exported as cache staleness. Safe for concurrent use.
type apiContact struct {
	now  func() time.Time
	last atomic.Int64 // unix nanos; 0 before the first contact
}

// Touch records a successful contact.
func (c *apiContact) Touch() { c.last.Store(c.now().UnixNano()) }

// Staleness is the time since the last contact (0 before the first).
func (c *apiContact) Staleness() time.Duration {
	t := c.last.Load()
	if t == 0 {
		return 0
	}
	return c.now().Sub(time.Unix(0, t))
}
