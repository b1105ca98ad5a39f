package extender

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// reservations holds capacity for a pod between its filter and the informer
// showing it bound: a filter reserves the best node (Filter), a bind assumes it
// (beginBind, finishBind), a Binding whose outcome is unknown keeps it held
// (holdUnconfirmed), and reservations no bind came for expire (expire). Gang
// members are handed to Gangs, which plans them, and to gangBinds, which binds
// them together. The capacity itself is the ledger's (ledger.place,
// ledger.release), the scores scoring's (evaluateNames, recheck).
//
// It has no fields to guard: it takes the index's lock (filters score under
// the read lock and commit under the write lock, re-checking the node's
// generation) and its lower-case methods are called with it held.
type reservations struct {
	cfg   Config
	now   func() time.Time
	ix    *State
	led   *ledger  // the index's
	sc    *scoring // the index's
	gangs *Gangs
	binds *gangBinds
}

// maxCommitRetries bounds optimistic commits before a filter evaluates under the write lock.
const maxCommitRetries = 3

// Filter decides which of names pod may go to and reserves the best one for it.
// For a pod the extender places (every pod it is asked about), the verdict passes
// exactly one node: the one it reserved, so two quick filters can never book the
// same capacity. Gang members follow the gang's plan (Gangs.filter). learned holds
// full Node objects from a nodeCacheCapable=false call; unless
// Config.NodeCacheCapable is set they teach the index nodes it does not know
// (and such nodes expire when calls stop carrying them). raw is the NodeNames JSON (nil if unknown), a cache key.
// out's slices are reused (truncated) and the filled outcome is returned.
func (r *reservations) Filter(pod *corev1.Pod, names [][]byte, raw []byte, learned []*corev1.Node, out filterOutcome) filterOutcome {
	out.reset()
	ix := r.ix
	ix.lock()
	if !r.cfg.NodeCacheCapable {
		ix.learnNodes(learned)
	}
	p := ix.podFromArgs(pod)
	if p == nil {
		ix.unlock()
		out.failAll(names, "pod has terminated", true)
		return out
	}
	if p.reqErr != nil {
		ix.unlock()
		out.failAll(names, fmt.Sprintf("pod %s: %v", p.key(), p.reqErr), true)
		return out
	}
	if p.hasGang {
		var done bool
		out, done = r.gangs.filter(p, names, out)
		if done {
			ix.unlock()
			return out
		}
	}
	switch {
	case p.phase == phaseReserved && !p.unconfirmed:
		r.led.release(p)
	case p.phase == phasePending:
	default:
		node, reason := p.node, fmt.Sprintf("pod is %s on node %s", p.phase, p.node)
		ix.unlock()
		for _, b := range names {
			if string(b) == node {
				out.passed = append(out.passed, node)
			} else {
				out.fail(b, reason, false)
			}
		}
		return out
	}
	sh := r.sc.shapes.of(p.req)
	ix.unlock()

	for attempt := 0; ; attempt++ {
		last := attempt >= maxCommitRetries
		out.reset()
		var best candidate
		var found bool
		if last {
			ix.lock()
			best, found = r.sc.evaluateNames(&sh, names, raw, &out)
		} else {
			ix.rlock()
			best, found = r.sc.evaluateNames(&sh, names, raw, &out)
			ix.runlock()
			ix.lock()
		}
		if !found {
			ix.unlock()
			return out
		}
		if ix.pod(p.uid) != p {
			ix.unlock()
			out.reset()
			out.failAll(names, "pod was deleted", false)
			return out
		}
		if e, devs, ok := r.sc.recheck(best, &sh); ok {
			if err := r.led.place(p, e, devs, phaseReserved); err == nil {
				p.expires = r.now().Add(r.cfg.AssumedTTL)
				ix.unlock()
				out.passed = append(out.passed[:0], e.n.Name)
				return out
			}
		}
		ix.unlock()
		if last {
			out.reset()
			out.failAll(names, reasonChangedRetry, false)
			return out
		}
	}
}

// beginBind moves a pod to phaseBinding on args.Node: from its reservation, from
// its gang plan (gangBinds.beginBindLocked), or by placing it now if it has neither
// (e.g. after a restart).
func (r *reservations) beginBind(args *extenderv1.ExtenderBindingArgs) (bindJob, error) {
	ix := r.ix
	ix.lock()
	defer ix.unlock()
	var job bindJob
	p := ix.pod(args.PodUID)
	if p == nil {
		return job, fmt.Errorf("pod %s/%s (uid %s): %w", args.PodNamespace, args.PodName, args.PodUID, ErrUnknownPod)
	}
	if p.namespace != args.PodNamespace || p.name != args.PodName {
		return job, fmt.Errorf("uid %s belongs to %s, not %s/%s: %w", args.PodUID, p.key(), args.PodNamespace, args.PodName, ErrUnknownPod)
	}
	if p.reqErr != nil {
		return job, fmt.Errorf("pod %s: %w", p.key(), p.reqErr)
	}
	switch p.phase {
	case phaseAssumed, phaseBound:
		if p.node == args.Node {
			job.done = true
			return job, nil
		}
		return job, fmt.Errorf("pod %s is already bound to %s", p.key(), p.node)
	case phaseBinding:
		if p.hasGang {
			break
		}
		return job, fmt.Errorf("pod %s: a bind is already in progress", p.key())
	}
	if p.hasGang {
		if job, err, gang := r.binds.beginBindLocked(p, args.Node); gang {
			return job, err
		}
	}
	// A reservation on a GPU that has since gone unhealthy (or off the agent's
	// list) is placed again: the bind must not book a share on a broken GPU.
	if !(p.charged && p.node == args.Node && p.phase == phaseReserved) || r.led.onUnavailableGPU(p) {
		e := r.led.node(args.Node)
		if e == nil {
			return job, fmt.Errorf("node %s unknown to the extender", args.Node)
		}
		r.led.release(p)
		if err := e.n.Fit(p.req); err != nil {
			return job, fmt.Errorf("pod %s does not fit now: %w", p.key(), err)
		}
		_, devs, ok := r.sc.servingPolicy().Score(e.n, p.req)
		if !ok {
			return job, fmt.Errorf("pod %s: no device placement on node %s", p.key(), args.Node)
		}
		if err := r.led.place(p, e, devs, phaseBinding); err != nil {
			return job, fmt.Errorf("pod %s: %w", p.key(), err)
		}
	}
	p.phase, p.unconfirmed = phaseBinding, false
	job.member = memberOf(p)
	return job, nil
}

// finishBind records the outcome of a single pod's bind.
func (r *reservations) finishBind(m bindMember, err error) {
	r.ix.lock()
	defer r.ix.unlock()
	p := r.ix.pod(m.uid)
	if p == nil || p.phase != phaseBinding {
		return // deleted, or the informer already showed it bound
	}
	r.settle(p, err)
}

// settle records the outcome err of p's Binding (p in phaseBinding): assumed,
// released, or held unconfirmed. Call with the index lock held for writing.
func (r *reservations) settle(p *podEntry, err error) {
	switch {
	case errors.Is(err, ErrBindUnconfirmed):
		holdUnconfirmed(p, r.now().Add(r.cfg.AssumedTTL))
	case err != nil:
		r.led.release(p)
	default:
		p.phase = phaseAssumed
	}
}

// holdUnconfirmed keeps p's capacity after a Binding whose outcome is unknown:
// as a reservation until expires (now + AssumedTTL), so it ends when the
// informer shows the pod bound (then it is bound) or not (then it expires).
// A filter of the pod meanwhile (kube-scheduler retries a failed bind) keeps
// the hold and passes its node only: releasing it could hand devices the
// API server has already given the pod to another pod. Call with the index
// lock held.
func holdUnconfirmed(p *podEntry, expires time.Time) {
	p.phase, p.expires, p.unconfirmed = phaseReserved, expires, true
}

// expire releases filter reservations (and unconfirmed holds) older than
// AssumedTTL and returns how many. Call with the index lock held for writing.
func (r *reservations) expire(now time.Time) int {
	n := 0
	r.ix.forEachPod(func(p *podEntry) {
		if p.phase == phaseReserved && now.After(p.expires) {
			r.led.release(p)
			n++
		}
	})
	return n
}
