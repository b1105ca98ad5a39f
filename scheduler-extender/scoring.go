package extender

import (
	"fmt"
	"math"
	"sync"

	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// scoring scores requests on the index's nodes with the serving policy: the
// policy and its target workload (setPolicy), the request shapes that key
// its caches (shapeTable), the candidate lists resolved to nodes (resolve,
// kept with the list cache's entries), and the verdicts cached
// per node (judge), which filters (evaluate, recheck) and Prioritize read. It
// reads the ledger's nodes and changes none. Call every method with the index
// lock held (read suffices, but for setPolicy: write).
type scoring struct {
	policyName string // Config.Policy
	led        *ledger
	policy     placement.Policy
	workload   *placement.Workload // the policy's target workload (nil: none yet)
	epoch      uint64              // bumped when policy changes
	cacheable  bool                // the policy is deterministic: verdicts may be cached
	shapes     shapeTable          // request shapes: verdict cache keys
}

// setPolicy rebuilds the policy for workload w. Call with the index lock held
// for writing (or before the index is shared).
func (sc *scoring) setPolicy(w *placement.Workload) error {
	p, err := placement.NewPolicy(sc.policyName, w, nil)
	if err != nil {
		return fmt.Errorf("building policy: %w", err)
	}
	sc.cacheable = placement.Concurrent(p)
	if !sc.cacheable {
		p = &lockedPolicy{p: p}
	}
	sc.policy, sc.workload = p, w
	sc.epoch++
	return nil
}

// servingPolicy is the policy filters score with. Call with the index lock held.
func (sc *scoring) servingPolicy() placement.Policy { return sc.policy }

// judge is fitReason plus the policy's score of sh on e, cached per node
// generation and policy epoch (kube-scheduler asks filter and prioritize about
// the same pod, and a job's pods share a shape). Call with the index lock held.
func (sc *scoring) judge(e *nodeEntry, sh *shape) *scored {
	if sc.cacheable {
		for i := range e.cache {
			if c := e.cache[i].Load(); c != nil && c.gen == e.gen && c.epoch == sc.epoch && c.shape == sh.id {
				return c
			}
		}
	}
	c := &scored{shape: sh.id, gen: e.gen, epoch: sc.epoch}
	c.reason, c.never = fitReason(e.n, &sh.r)
	if c.reason == "" {
		c.score, c.devs, c.ok = sc.policy.Score(e.n, sh.r)
		if c.ok && (math.IsNaN(c.score) || math.IsInf(c.score, 0)) {
			c.ok = false
		}
	}
	if sc.cacheable {
		e.cache[e.nextSlot.Add(1)%scoreSlots].Store(c)
	}
	return c
}

// evaluate fits and scores a valid request on every node, recording refusals in
// out (when non-nil) and returning the best-scoring node. Ties keep the first.
// Call with the index lock held.
func (sc *scoring) evaluate(sh *shape, names [][]byte, entries []*nodeEntry, out *wire.Outcome) (candidate, bool) {
	var best candidate
	found := false
	for i, e := range entries {
		if e == nil {
			if out != nil {
				out.Fail(names[i], reasonUnknownNode, false)
			}
			continue
		}
		c := sc.judge(e, sh)
		switch {
		case c.reason != "":
			if out != nil {
				out.Fail(names[i], c.reason, c.never)
			}
		case !c.ok:
			if out != nil {
				out.Fail(names[i], reasonNoDevice, false)
			}
		case !found || c.score > best.score:
			best, found = candidate{e: e, gen: e.gen, score: c.score, devs: c.devs}, true
		}
	}
	return best, found
}

// evaluateNames is evaluate over the candidate list names (list: its entry
// in the list cache, nil if none) resolved to the index's nodes. Call with
// the index lock held.
func (sc *scoring) evaluateNames(sh *shape, names [][]byte, list *wire.List, out *wire.Outcome) (candidate, bool) {
	return sc.evaluate(sh, names, sc.resolve(names, list), out)
}

// resolve maps names to the entries of their nodes (nil for unknown nodes).
// A cached list (non-nil) keeps its resolution until capGen, the generation
// of the node set, moves. Call with the index lock held (nodes is read).
func (sc *scoring) resolve(names [][]byte, list *wire.List) []*nodeEntry {
	if entries, ok := list.Resolved(sc.led.capGen).([]*nodeEntry); ok {
		return entries
	}
	entries := make([]*nodeEntry, len(names))
	for i, b := range names {
		entries[i] = sc.led.nodes[string(b)]
	}
	list.Resolve(sc.led.capGen, entries)
	return entries
}

// recheck returns c's node and devices if the node is still the index's and,
// when it changed since c was scored (its generation moved), sh still fits it
// with a device placement (scored again). Call with the index lock held for writing.
func (sc *scoring) recheck(c candidate, sh *shape) (*nodeEntry, []int, bool) {
	e, ok := sc.led.nodes[c.e.n.Name]
	if !ok || e != c.e {
		return nil, nil, false
	}
	devs := c.devs
	if e.gen != c.gen {
		v := sc.judge(e, sh)
		if v.reason != "" || !v.ok {
			return nil, nil, false
		}
		devs = v.devs
	}
	return e, devs, true
}

// Generic reasons for capacity that can never suffice.
const (
	reasonNoGPU       = "node has no gpu"
	reasonFewGPUs     = "node has fewer gpus than requested"
	reasonSmallNode   = "node's allocatable cpu or memory is below the request"
	reasonUnknownNode = "node unknown to the extender (cache not synced yet?)"
	reasonNoDevice    = "no device placement for this request"
)

// fitReason is why r does not fit n now ("" if it fits) and whether it never
// can. r must be valid. It does not allocate.
func fitReason(n *placement.Node, r *placement.Request) (string, bool) {
	err := n.Check(r)
	switch {
	case err == nil:
		return "", false
	case err == placement.ErrGPUModel:
		return err.Error(), true
	case r.NumGPU > 0 && len(n.GPUFree) == 0:
		return reasonNoGPU, true
	case r.NumGPU > len(n.GPUFree):
		return reasonFewGPUs, true
	case r.CPUMilli > n.CPUMilli || r.MemoryMiB > n.MemoryMiB:
		return reasonSmallNode, true
	}
	return err.Error(), false
}

// candidate is the best node an evaluation found.
type candidate struct {
	e     *nodeEntry
	gen   uint64
	score float64
	devs  []int
}

// scoreSlots is how many request shapes each node remembers a verdict for.
const scoreSlots = 8

// scored is a node's cached verdict on one request shape at one node
// generation and policy epoch. Immutable once published.
type scored struct {
	shape      uint64 // interned shape id
	gen, epoch uint64
	reason     string // "" when r fits
	never      bool
	score      float64
	devs       []int // shared: never modify
	ok         bool  // the policy found a placement
}

// lockedPolicy serialises a policy that is not safe for concurrent use (random:
// it draws from one rng), since filters score under the read lock.
type lockedPolicy struct {
	mu sync.Mutex
	p  placement.Policy
}

var _ placement.Policy = (*lockedPolicy)(nil)

func (l *lockedPolicy) Name() string { return l.p.Name() }

func (l *lockedPolicy) Score(n *placement.Node, r placement.Request) (float64, []int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p.Score(n, r)
}

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
	ids map[wire.RequestKey]uint64
	seq uint64
}

func (t *shapeTable) of(r placement.Request) shape {
	k := wire.KeyOf(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.ids[k]
	if !ok {
		if t.ids == nil || len(t.ids) >= maxShapes {
			t.ids = map[wire.RequestKey]uint64{}
		}
		t.seq++
		id = t.seq
		t.ids[k] = id
	}
	return shape{r: r, id: id}
}
