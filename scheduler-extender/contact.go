package extender

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/watch"
)

// Informers whose staleness the extender reports. Binds depend on the node
// and pod informers (they tell which devices are held); the PodGroup ones
// only feed gangs' minMember.
const (
	InformerNodes            = "nodes"
	InformerPods             = "pods"
	InformerPodGroups        = "podgroups"
	InformerVolcanoPodGroups = "volcano-podgroups"
)

// ErrCacheStale means an informer binds depend on has not been in contact with
// the API server for longer than Config.MaxCacheStaleness: binds are refused
// (kube-scheduler retries the pod) rather than booked on a cache that may miss
// pods bound meanwhile.
var ErrCacheStale = errors.New("informer cache stale")

// bindInformers are the informers whose staleness refuses binds.
var bindInformers = []string{InformerNodes, InformerPods}

// informerContact is one informer's contact with the API server: its cache is
// current while a watch stream is open (client-go's HTTP/2 health checks end a
// dead stream within about 45 s); otherwise it is as old as the last sign of
// contact: a successful list, an event (bookmarks included) or the end of a
// stream. Safe for concurrent use.
type informerContact struct {
	name     string
	now      func() time.Time
	since    time.Time    // when the tracker was made: staleness before any contact
	last     atomic.Int64 // unix nanos of the last sign of contact; 0 before the first
	watching atomic.Int32 // watch streams open now
}

// Touch records a sign of contact.
func (c *informerContact) Touch() { c.last.Store(c.now().UnixNano()) }

// Staleness is how long the informer's cache may have missed changes: 0 while
// a watch stream is open, else the time since the last contact (or since the
// tracker was made, before any).
func (c *informerContact) Staleness() time.Duration {
	if c.watching.Load() > 0 {
		return 0
	}
	t := c.since
	if n := c.last.Load(); n != 0 {
		t = time.Unix(0, n)
	}
	return max(0, c.now().Sub(t))
}

// LastContact is the time of the last sign of contact (zero before any).
func (c *informerContact) LastContact() time.Time {
	if n := c.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// watchOpened wraps a watch that just opened: the stream counts as contact
// while open, every event but errors touches, and its end is the last contact.
func (c *informerContact) watchOpened(w watch.Interface) watch.Interface {
	c.watching.Add(1)
	c.Touch()
	cw := &contactWatch{in: w, out: make(chan watch.Event), stopped: make(chan struct{})}
	go func() {
		defer close(cw.out)
		defer func() {
			c.Touch()
			c.watching.Add(-1)
		}()
		for e := range w.ResultChan() {
			if e.Type != watch.Error {
				c.Touch()
			}
			select {
			case cw.out <- e:
			case <-cw.stopped:
				return
			}
		}
	}()
	return cw
}

// contactWatch forwards a watch's events (see informerContact.watchOpened).
type contactWatch struct {
	in      watch.Interface
	out     chan watch.Event
	once    sync.Once
	stopped chan struct{}
}

func (w *contactWatch) Stop() {
	w.once.Do(func() { close(w.stopped) })
	w.in.Stop()
}

func (w *contactWatch) ResultChan() <-chan watch.Event { return w.out }

// apiContact tracks every informer's contact (informerContact), by name.
// Informers are registered before they start; lookups never lock.
type apiContact struct {
	now func() time.Time
	mu  sync.Mutex
	by  atomic.Pointer[map[string]*informerContact]
}

func newAPIContact(now func() time.Time) *apiContact {
	c := &apiContact{now: now}
	c.by.Store(&map[string]*informerContact{})
	return c
}

// informer returns the tracker of informer name, making it on first use.
func (c *apiContact) informer(name string) *informerContact {
	if ic := (*c.by.Load())[name]; ic != nil {
		return ic
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.by.Load()
	if ic := old[name]; ic != nil {
		return ic
	}
	ic := &informerContact{name: name, now: c.now, since: c.now()}
	next := make(map[string]*informerContact, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = ic
	c.by.Store(&next)
	return ic
}

// Staleness is each registered informer's staleness, by name.
func (c *apiContact) Staleness() map[string]time.Duration {
	by := *c.by.Load()
	out := make(map[string]time.Duration, len(by))
	for name, ic := range by {
		out[name] = ic.Staleness()
	}
	return out
}

// InformerStatus is one informer in /status.
type InformerStatus struct {
	Name string `json:"name"`
	// Watching: a watch stream is open, the cache is current.
	Watching bool `json:"watching"`
	// LastContact is the last successful list, event or end of a stream.
	LastContact *time.Time `json:"lastContact,omitempty"`
	// StalenessSeconds is 0 while watching, else the time since LastContact.
	StalenessSeconds float64 `json:"stalenessSeconds"`
}

// status lists every registered informer, by name.
func (c *apiContact) status() []InformerStatus {
	by := *c.by.Load()
	out := make([]InformerStatus, 0, len(by))
	for _, name := range slices.Sorted(maps.Keys(by)) {
		ic := by[name]
		is := InformerStatus{Name: name, Watching: ic.watching.Load() > 0, StalenessSeconds: ic.Staleness().Seconds()}
		if t := ic.LastContact(); !t.IsZero() {
			is.LastContact = &t
		}
		out = append(out, is)
	}
	return out
}

// staleBeyond names the first informer binds depend on whose staleness
// exceeds limit, and that staleness.
func (c *apiContact) staleBeyond(limit time.Duration) (string, time.Duration, bool) {
	by := *c.by.Load()
	for _, name := range bindInformers {
		if ic := by[name]; ic != nil {
			if d := ic.Staleness(); d > limit {
				return name, d, true
			}
		}
	}
	return "", 0, false
}

// staleForBind is ErrCacheStale (with the informer and its staleness) when
// binds must be refused (an informer binds depend on is stale beyond limit,
// Config.MaxCacheStaleness), nil otherwise.
func (c *apiContact) staleForBind(limit time.Duration) error {
	if name, d, stale := c.staleBeyond(limit); stale {
		return fmt.Errorf("the %s informer has not heard from the API server for %s (limit %s, -max-cache-staleness); "+
			"retry later: %w", name, d.Round(time.Second), limit, ErrCacheStale)
	}
	return nil
}
