package extender

import (
	"math"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/scheduler-extender/placement"
)

// verdict is why one node was refused. name may alias the request body.
type verdict struct {
	name   []byte
	reason string
}

// filterOutcome is the extender's verdict on the nodes of one filter call.
// Reasons are generic (never node-specific) so kube-scheduler's summary
// ("0/N nodes are available: ...") groups them.
type filterOutcome struct {
	passed       []string
	failed       []verdict
	unresolvable []verdict
}

func (o *filterOutcome) reset() {
	o.passed, o.failed, o.unresolvable = o.passed[:0], o.failed[:0], o.unresolvable[:0]
}

func (o *filterOutcome) fail(name []byte, reason string, unresolvable bool) {
	if unresolvable {
		o.unresolvable = append(o.unresolvable, verdict{name, reason})
	} else {
		o.failed = append(o.failed, verdict{name, reason})
	}
}

func (o *filterOutcome) failAll(names [][]byte, reason string, unresolvable bool) {
	for _, b := range names {
		o.fail(b, reason, unresolvable)
	}
}

// failOthers refuses every node but keep.
func (o *filterOutcome) failOthers(names [][]byte, keep, reason string) {
	for _, b := range names {
		if string(b) != keep {
			o.fail(b, reason, false)
		}
	}
}

// maps renders the verdicts as extenderv1.FailedNodesMap (for the Nodes form).
func (o *filterOutcome) maps() (failed, unresolvable extenderv1.FailedNodesMap) {
	conv := func(vs []verdict) extenderv1.FailedNodesMap {
		if len(vs) == 0 {
			return nil
		}
		m := make(extenderv1.FailedNodesMap, len(vs))
		for _, v := range vs {
			m[string(v.name)] = v.reason
		}
		return m
	}
	return conv(o.failed), conv(o.unresolvable)
}

// Generic reasons for capacity that can never suffice.
const (
	reasonNoGPU        = "node has no gpu"
	reasonFewGPUs      = "node has fewer gpus than requested"
	reasonSmallNode    = "node's allocatable cpu or memory is below the request"
	reasonUnknownNode  = "node unknown to the extender (cache not synced yet?)"
	reasonNoDevice     = "no device placement for this request"
	reasonChangedRetry = "capacity changed during evaluation; retry"
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

// Prioritize scores names for pod in [MinExtenderPriority, MaxExtenderPriority]: the
// node holding the pod's reservation or plan gets the maximum, others the
// policy's score mapped linearly from [min, max] over the nodes that fit.
// scores and raws are reused buffers; both are returned grown.
func (s *State) Prioritize(pod *corev1.Pod, names [][]byte, raw []byte, scores []int64, raws []float64) ([]int64, []float64) {
	scores = scores[:0]
	s.mu.RLock()
	defer s.mu.RUnlock()
	var (
		r     placement.Request
		held  string
		valid bool
	)
	if p := s.pods[pod.UID]; p != nil && p.reqErr == nil {
		r, valid = p.req, true
		if p.phase.holds() {
			held = p.node
		}
	} else if p == nil {
		if req, err := PodRequest(pod); err == nil {
			r, valid = req, true
		}
	}
	if !valid {
		for range names {
			scores = append(scores, extenderv1.MinExtenderPriority)
		}
		return scores, raws
	}
	entries := s.sc.lists.resolve(names, raw, s.led.capGen, s.led.nodes)
	sh := s.sc.shapes.of(r)
	raws = raws[:0]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, e := range entries {
		v := math.NaN()
		if e != nil {
			if c := s.sc.judge(e, &sh); c.reason == "" && c.ok {
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
