package wire

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
)

// minCachedList is the shortest NodeNames list a Decoder remembers.
const minCachedList = 64

// listCacheSize is how many NodeNames lists Lists keeps.
const listCacheSize = 4

// Lists is the candidate-list cache: it remembers NodeNames arrays as sent,
// keyed by their raw bytes. kube-scheduler sends the same candidate list call
// after call: comparing it with memcmp is much cheaper than scanning it, and
// what the index resolved the list to (its node entries) is kept with it
// (List.Resolve), so that neither is done again. Cached names alias the
// cache's own copy, never a body. Safe for concurrent use.
type Lists struct {
	min     int // shortest list worth remembering
	mu      sync.Mutex
	entries [listCacheSize]*List
	next    int
}

// List is one remembered NodeNames array: its JSON as sent, its names (slices
// of that copy) and what the index last resolved it to.
type List struct {
	raw      []byte
	names    [][]byte
	resolved atomic.Pointer[resolution]
}

// resolution is what the index resolved a list to at one generation.
type resolution struct {
	gen uint64
	v   any
}

// Resolved is what Resolve last stored for generation gen; nil when nothing
// was, or for another generation, or l is nil.
func (l *List) Resolved(gen uint64) any {
	if l == nil {
		return nil
	}
	if r := l.resolved.Load(); r != nil && r.gen == gen {
		return r.v
	}
	return nil
}

// Resolve stores what the list resolves to at generation gen (the caller's:
// the index keeps its node set's generation). A nil l stores nothing.
func (l *List) Resolve(gen uint64, v any) {
	if l != nil {
		l.resolved.Store(&resolution{gen: gen, v: v})
	}
}

// match returns the cached list rest starts with, nil when none; a JSON array
// is self-delimiting, so equal leading bytes mean the same array.
func (c *Lists) match(rest []byte) *List {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e != nil && bytes.HasPrefix(rest, e.raw) {
			return e
		}
	}
	return nil
}

// add remembers the array raw and its names (slices of raw) when it is long
// enough, and returns its entry (nil when not remembered).
func (c *Lists) add(raw []byte, names [][]byte) *List {
	if c == nil || names == nil || len(names) < c.min {
		return nil
	}
	own := bytes.Clone(raw)
	out := make([][]byte, len(names))
	for i, n := range names {
		off := cap(raw) - cap(n) // n aliases raw: same backing array
		out[i] = own[off : off+len(n) : off+len(n)]
	}
	l := &List{raw: own, names: out}
	c.mu.Lock()
	c.entries[c.next] = l
	c.next = (c.next + 1) % listCacheSize
	c.mu.Unlock()
	return l
}

// Match returns the raw array and the names of the cached list rest starts
// with and its entry (all nil when none): for decoders built on another JSON
// library.
func (c *Lists) Match(rest []byte) (raw []byte, names [][]byte, l *List) {
	if l = c.match(rest); l == nil {
		return nil, nil, nil
	}
	return l.raw, l.names, l
}

// PodCache remembers decoded pods by their exact JSON: kube-scheduler sends the
// same pod to filter and prioritize (and again on every retry), and decoding a
// pod costs more than the rest of a call. Cached pods are shared: never modify them.
//
// It is bounded in count and in bytes: a pod can carry up to 256 KiB of
// annotations and more in its spec, so a count alone let 160 cached requests
// retain 160 MiB. An entry costs podCacheCost(raw): the kept copy of the JSON
// plus an estimate of the decoded pod (its strings are copies of the JSON's).
// A pod costing more than an eighth of the budget is decoded but not kept.
type PodCache struct {
	mu       sync.Mutex
	seed     maphash.Seed
	m        map[uint64]podCacheEntry
	max      int
	maxBytes int64
	bytes    int64 // sum of the entries' costs
}

type podCacheEntry struct {
	raw []byte
	pod *corev1.Pod
}

// podCacheOverhead is the fixed part of an entry's cost: the map slot, the Pod
// struct and its nested structs.
const podCacheOverhead = 2 << 10

// podCacheCost is what keeping raw and its decoded pod costs, estimated.
func podCacheCost(raw []byte) int64 { return 2*int64(len(raw)) + podCacheOverhead }

// NewPodCache returns a cache of up to size pods costing up to maxBytes.
func NewPodCache(size int, maxBytes int64) *PodCache {
	return &PodCache{seed: maphash.MakeSeed(), m: make(map[uint64]podCacheEntry, min(size, 1024)), max: size, maxBytes: maxBytes}
}

func (c *PodCache) Decode(raw []byte) (*corev1.Pod, error) {
	h := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	e, ok := c.m[h]
	c.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.pod, nil
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		return nil, err
	}
	cost := podCacheCost(raw)
	if cost > c.maxBytes/8 {
		return pod, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[h]; ok { // a hash collision or a concurrent decode of the same body
		c.bytes -= podCacheCost(old.raw)
		delete(c.m, h)
	}
	for k, old := range c.m { // evict arbitrary entries until the new one fits
		if len(c.m) < c.max && c.bytes+cost <= c.maxBytes {
			break
		}
		c.bytes -= podCacheCost(old.raw)
		delete(c.m, k)
	}
	c.m[h] = podCacheEntry{raw: bytes.Clone(raw), pod: pod}
	c.bytes += cost
	return pod, nil
}

// Size is the entries and their cost in bytes.
func (c *PodCache) Size() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m), c.bytes
}
