package extender

import (
	"bytes"
	"hash/maphash"
	"sync"

	"github.com/understory/understory/scheduler-extender/placement"
)

// shape is a request with its interned shape id, computed once per call.
type shape struct {
	r  placement.Request
	id uint64
}

// maxShapes bounds the intern table; when full it starts over (new ids never
// collide with cached ones: ids only grow).
const maxShapes = 1 << 16

// shapeTable interns request shapes: a node's cached verdicts are keyed by the
// id, so a job's pods (one shape) share them. Safe for concurrent use (filters
// intern under the index's read lock).
type shapeTable struct {
	mu  sync.Mutex
	ids map[reqKey]uint64
	seq uint64
}

func (t *shapeTable) of(r placement.Request) shape {
	k := keyOf(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.ids[k]
	if !ok {
		if t.ids == nil || len(t.ids) >= maxShapes {
			t.ids = map[reqKey]uint64{}
		}
		t.seq++
		id = t.seq
		t.ids[k] = id
	}
	return shape{r: r, id: id}
}

// nameList is a NodeNames array as sent (raw JSON bytes) and its nodes.
type nameList struct {
	hash    uint64
	raw     []byte
	capGen  uint64
	entries []*nodeEntry
}

// resolveCacheSize is how many NodeNames lists resolvedLists remembers.
const resolveCacheSize = 4

// resolvedLists remembers candidate lists resolved to node entries:
// kube-scheduler sends the same list again and again. Safe for concurrent use
// (filters resolve under the index's read lock).
type resolvedLists struct {
	mu    sync.Mutex
	seed  maphash.Seed
	lists [resolveCacheSize]*nameList
	next  int
}

// resolve maps names to entries of nodes (nil for unknown nodes). A list is
// remembered by its raw JSON (raw may be nil: no caching) until capGen, the
// generation of the node set, moves. Call with the index lock held (nodes is read).
func (c *resolvedLists) resolve(names [][]byte, raw []byte, capGen uint64, nodes map[string]*nodeEntry) []*nodeEntry {
	var h uint64
	if raw != nil {
		h = maphash.Bytes(c.seed, raw)
		c.mu.Lock()
		for _, l := range c.lists {
			if l != nil && l.hash == h && l.capGen == capGen && bytes.Equal(l.raw, raw) {
				c.mu.Unlock()
				return l.entries
			}
		}
		c.mu.Unlock()
	}
	entries := make([]*nodeEntry, len(names))
	for i, b := range names {
		entries[i] = nodes[string(b)]
	}
	if raw != nil {
		c.mu.Lock()
		c.lists[c.next] = &nameList{hash: h, raw: bytes.Clone(raw), capGen: capGen, entries: entries}
		c.next = (c.next + 1) % resolveCacheSize
		c.mu.Unlock()
	}
	return entries
}
