package extender

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/scheduler-extender/gang"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

// reservations answers filter and prioritize and holds capacity for a pod
// from its filter until the informer shows it bound: a filter reserves the
// best node (Filter), Prioritize scores the candidates (the held node first),
// a bind assumes the reservation (beginBind, finishBind: bind.go), a Binding
// whose outcome is unknown keeps it held (holdUnconfirmed), and reservations
// no bind came for expire (expire). Gang members are handed to gang.Gangs,
// which plans them, and to gang.Binds, which binds them together. The
// capacity itself is the ledger's (ledger.place, ledger.release), the scores
// scoring's (evaluateNames, recheck).
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
	gangs *gang.Gangs
	binds *gang.Binds
}

// maxCommitRetries bounds optimistic commits before a filter evaluates under the write lock.
const maxCommitRetries = 3

// Filter decides which of names pod may go to and reserves the best one for
// it. For a pod the extender places (every pod it is asked about), the verdict
// passes exactly one node: the one it reserved, so two quick filters can never
// book the same capacity. Gang members follow the gang's plan (gang.Gangs.Filter).
// learned holds full Node objects from a nodeCacheCapable=false call; unless
// Config.NodeCacheCapable is set they teach the index nodes it does not know
// (they expire when calls stop carrying them). list is the names' entry in the
// list cache (nil if none). out's slices are reused and it is returned filled.
func (r *reservations) Filter(pod *corev1.Pod, names [][]byte, list *wire.List, learned []*corev1.Node, out wire.Outcome) wire.Outcome {
	out.Reset()
	ix := r.ix
	ix.lock()
	if !r.cfg.NodeCacheCapable {
		ix.learnNodes(learned)
	}
	p := ix.podFromArgs(pod)
	if p == nil {
		ix.unlock()
		out.FailAll(names, "pod has terminated", true)
		return out
	}
	if p.reqErr != nil {
		ix.unlock()
		out.FailAll(names, fmt.Sprintf("pod %s: %v", p.key(), p.reqErr), true)
		return out
	}
	if p.inGang() {
		var done bool
		out, done = r.gangs.Filter(p, names, out)
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
				out.Passed = append(out.Passed, node)
			} else {
				out.Fail(b, reason, false)
			}
		}
		return out
	}
	sh := r.sc.shapes.of(p.req)
	ix.unlock()

	for attempt := 0; ; attempt++ {
		last := attempt >= maxCommitRetries
		out.Reset()
		var best candidate
		var found bool
		if last {
			ix.lock()
			best, found = r.sc.evaluateNames(&sh, names, list, &out)
		} else {
			ix.rlock()
			best, found = r.sc.evaluateNames(&sh, names, list, &out)
			ix.runlock()
			ix.lock()
		}
		if !found {
			ix.unlock()
			return out
		}
		if ix.pod(p.uid) != p {
			ix.unlock()
			out.Reset()
			out.FailAll(names, "pod was deleted", false)
			return out
		}
		if e, devs, ok := r.sc.recheck(best, &sh); ok {
			if err := r.led.place(p, e, devs, phaseReserved); err == nil {
				p.expires = r.now().Add(r.cfg.AssumedTTL)
				ix.unlock()
				out.Passed = append(out.Passed[:0], e.n.Name)
				return out
			}
		}
		ix.unlock()
		if last {
			out.Reset()
			out.FailAll(names, wire.ReasonChangedRetry, false)
			return out
		}
	}
}

// Prioritize scores names for pod in [MinExtenderPriority, MaxExtenderPriority]: the
// node holding the pod's reservation or plan gets the maximum, others the
// policy's score mapped linearly from [min, max] over the nodes that fit.
// scores and raws are reused buffers; both are returned grown.
func (r *reservations) Prioritize(pod *corev1.Pod, names [][]byte, list *wire.List, scores []int64, raws []float64) ([]int64, []float64) {
	scores = scores[:0]
	r.ix.rlock()
	defer r.ix.runlock()
	var (
		req   placement.Request
		held  string
		valid bool
	)
	if p := r.ix.pod(pod.UID); p != nil && p.reqErr == nil {
		req, valid = p.req, true
		if p.phase.holds() {
			held = p.node
		}
	} else if p == nil {
		if pr, err := wire.PodRequest(pod); err == nil {
			req, valid = pr, true
		}
	}
	if !valid {
		for range names {
			scores = append(scores, extenderv1.MinExtenderPriority)
		}
		return scores, raws
	}
	entries := r.sc.resolve(names, list)
	sh := r.sc.shapes.of(req)
	raws = raws[:0]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, e := range entries {
		v := math.NaN()
		if e != nil {
			if c := r.sc.judge(e, &sh); c.reason == "" && c.ok {
				v = c.score
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		raws = append(raws, v)
	}
	span := float64(extenderv1.MaxExtenderPriority - extenderv1.MinExtenderPriority)
	for i, b := range names {
		var sc int64
		switch {
		case held != "" && string(b) == held:
			sc = extenderv1.MaxExtenderPriority
		case math.IsNaN(raws[i]):
			sc = extenderv1.MinExtenderPriority
		case hi == lo:
			sc = extenderv1.MaxExtenderPriority
		default:
			sc = extenderv1.MinExtenderPriority + int64(math.Round(span*(raws[i]-lo)/(hi-lo)))
		}
		scores = append(scores, sc)
	}
	return scores, raws
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

// readArgs reads and decodes an ExtenderArgs body, answering the error itself.
func (s *Server) readArgs(w http.ResponseWriter, r *http.Request, sc *scratch, refuse func(http.ResponseWriter, int, error)) (wire.Args, *bytes.Buffer, bool) {
	buf, code, err := s.readBody(w, r)
	if err != nil {
		refuse(w, code, err)
		return wire.Args{}, nil, false
	}
	args, err := s.dec.Args(buf.Bytes(), sc.names)
	if err != nil {
		s.release(buf)
		refuse(w, http.StatusBadRequest, err)
		return wire.Args{}, nil, false
	}
	if !args.Cached {
		sc.names = args.Names[:0] // keep the grown buffer; cached lists are not ours to clear
	}
	return args, buf, true
}

// refuseFilter answers a filter call with err (in ExtenderFilterResult's error field).
func refuseFilter(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, wire.FilterError(err.Error()))
}

// refusePrioritize answers a prioritize call with err, as text (HostPriorityList has no error field).
func refusePrioritize(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, err.Error()+"\n")
}

func (s *Server) handleFilter(w http.ResponseWriter, r *http.Request) {
	sc := s.scratch()
	defer s.putScratch(sc)
	args, buf, ok := s.readArgs(w, r, sc, refuseFilter)
	if !ok {
		return
	}
	defer s.release(buf)
	var learned []*corev1.Node
	if args.Nodes != nil {
		learned = make([]*corev1.Node, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			learned[i] = &args.Nodes.Items[i]
		}
	}
	out := s.res.Filter(args.Pod, args.Names, args.List, learned, sc.out)
	sc.out = out
	s.met.FilterNodes.WithLabelValues("passed").Add(float64(len(out.Passed)))
	s.met.FilterNodes.WithLabelValues("failed").Add(float64(len(out.Failed)))
	s.met.FilterNodes.WithLabelValues("unresolvable").Add(float64(len(out.Unresolvable)))
	if args.Nodes != nil {
		body, err := wire.FilterResultNodes(&out, args.Nodes)
		if err != nil {
			refuseFilter(w, http.StatusInternalServerError, fmt.Errorf("encoding result: %w", err))
			return
		}
		writeJSON(w, http.StatusOK, body)
	} else {
		bp := s.outBuf()
		*bp = wire.AppendFilterResult((*bp)[:0], &out, "")
		writeJSON(w, http.StatusOK, *bp)
		s.putOut(bp)
	}
	s.out.flush()
}

func (s *Server) handlePrioritize(w http.ResponseWriter, r *http.Request) {
	sc := s.scratch()
	defer s.putScratch(sc)
	args, buf, ok := s.readArgs(w, r, sc, refusePrioritize)
	if !ok {
		return
	}
	defer s.release(buf)
	sc.scores, sc.raws = s.res.Prioritize(args.Pod, args.Names, args.List, sc.scores, sc.raws)
	bp := s.outBuf()
	*bp = wire.AppendHostPriorities((*bp)[:0], args.Names, sc.scores, args.Plain)
	writeJSON(w, http.StatusOK, *bp)
	s.putOut(bp)
}

// scratch is per-request working memory, pooled.
type scratch struct {
	names  [][]byte     // aliases a request body while in use
	out    wire.Outcome // its verdict names alias it too
	scores []int64
	raws   []float64
}

func (s *Server) putScratch(sc *scratch) {
	clear(sc.names[:cap(sc.names)]) // drop references to the body
	sc.names = sc.names[:0]
	clear(sc.out.Failed[:cap(sc.out.Failed)])
	clear(sc.out.Unresolvable[:cap(sc.out.Unresolvable)])
	sc.out.Reset()
	s.scratches.Put(sc)
}

func (s *Server) scratch() *scratch {
	if sc, ok := s.scratches.Get().(*scratch); ok {
		return sc
	}
	return &scratch{}
}

func (s *Server) outBuf() *[]byte {
	if bp, ok := s.outs.Get().(*[]byte); ok {
		return bp
	}
	return new([]byte)
}

func (s *Server) putOut(bp *[]byte) {
	if cap(*bp) <= maxPooledBuffer {
		s.outs.Put(bp)
	}
}
