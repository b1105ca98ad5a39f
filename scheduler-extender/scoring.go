package extender

import (
	"fmt"
	"math"

	"github.com/understory/understory/scheduler-extender/placement"
)

// scoring scores requests on the index's nodes with the serving policy: the
// policy and its target workload (setPolicy), the request shapes and resolved
// candidate lists that key its caches (verdicts.go), and the verdicts cached
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
	lists      resolvedLists       // NodeNames lists resolved to entries
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
func (sc *scoring) evaluate(sh *shape, names [][]byte, entries []*nodeEntry, out *filterOutcome) (candidate, bool) {
	var best candidate
	found := false
	for i, e := range entries {
		if e == nil {
			if out != nil {
				out.fail(names[i], reasonUnknownNode, false)
			}
			continue
		}
		c := sc.judge(e, sh)
		switch {
		case c.reason != "":
			if out != nil {
				out.fail(names[i], c.reason, c.never)
			}
		case !c.ok:
			if out != nil {
				out.fail(names[i], reasonNoDevice, false)
			}
		case !found || c.score > best.score:
			best, found = candidate{e: e, gen: e.gen, score: c.score, devs: c.devs}, true
		}
	}
	return best, found
}

// evaluateNames is evaluate over the candidate list names (raw: its JSON, a
// cache key, nil if unknown) resolved to the index's nodes. Call with the index lock held.
func (sc *scoring) evaluateNames(sh *shape, names [][]byte, raw []byte, out *filterOutcome) (candidate, bool) {
	return sc.evaluate(sh, names, sc.lists.resolve(names, raw, sc.led.capGen, sc.led.nodes), out)
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
