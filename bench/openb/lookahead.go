package openb

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/understory/understory/scheduler-extender/placement"
)

// Lookahead makes a replay clairvoyant, to measure how much any placement rule
// could still gain over a policy: for each GPU pod from arrival level From on, the
// replay takes the policy's best Candidates nodes of distinct state, rolls each
// out over the next Horizon pods of the real arrival order (placed by the policy
// itself), and keeps the candidate whose rollout allocates the most GPU (the
// policy's own choice on ties). It reads the future, so it is an upper-bound probe
// for the benchmark, never a policy the extender could serve.
type Lookahead struct {
	Candidates int     `json:"candidates"`
	Horizon    int     `json:"horizon"`
	From       float64 `json:"from"` // arrived GPU demand, as a fraction of capacity
}

// LookaheadResult is what the probe did in one replay.
type LookaheadResult struct {
	Lookahead
	// Decisions counts the pods the probe rolled out candidates for.
	Decisions int `json:"decisions"`
	// Changed counts the pods it placed elsewhere than the policy would have.
	Changed int `json:"changed"`
}

// Enabled reports whether l asks for any lookahead.
func (l Lookahead) Enabled() bool { return l.Candidates > 0 || l.Horizon > 0 }

// Validate rejects a lookahead that cannot run; the zero value (off) is valid.
func (l Lookahead) Validate() error {
	switch {
	case !l.Enabled():
		return nil
	case l.Candidates < 2:
		return fmt.Errorf("lookahead: %d candidates, want >= 2: %w", l.Candidates, ErrBadConfig)
	case l.Horizon < 1:
		return fmt.Errorf("lookahead: horizon %d, want >= 1: %w", l.Horizon, ErrBadConfig)
	case math.IsNaN(l.From) || l.From < 0:
		return fmt.Errorf("lookahead: from %v, want >= 0: %w", l.From, ErrBadConfig)
	}
	return nil
}

// ParseLookahead reads "CANDIDATES,HORIZON,FROM" (e.g. "4,500,0.8"); "" is off.
func ParseLookahead(s string) (Lookahead, error) {
	if strings.TrimSpace(s) == "" {
		return Lookahead{}, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return Lookahead{}, fmt.Errorf("lookahead %q: want CANDIDATES,HORIZON,FROM: %w", s, ErrBadConfig)
	}
	k, err1 := strconv.Atoi(strings.TrimSpace(parts[0]))
	h, err2 := strconv.Atoi(strings.TrimSpace(parts[1]))
	from, err3 := strconv.ParseFloat(strings.TrimSpace(parts[2]), 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return Lookahead{}, fmt.Errorf("lookahead %q: want two integers and a fraction: %w", s, ErrBadConfig)
	}
	l := Lookahead{Candidates: k, Horizon: h, From: from}
	if !l.Enabled() {
		return Lookahead{}, fmt.Errorf("lookahead %q: zero candidates and horizon: %w", s, ErrBadConfig)
	}
	return l, l.Validate()
}

// candidate is one node a pod could go to, with the devices the policy chose there.
type candidate struct {
	n     *placement.Node
	score float64
	devs  []int
}

var _ chooser = (*lookahead)(nil)

// lookahead is the probe's state within one replay.
type lookahead struct {
	cfg    Lookahead
	policy placement.Policy
	nodes  []*placement.Node // in the replay's tie-breaking order
	res    LookaheadResult
	cands  []candidate
	undo   []placed
}

// placed is one placement a rollout made, to be taken back.
type placed struct {
	n    *placement.Node
	r    placement.Request
	devs []int
}

// place puts pod i of order on a node and returns it and the devices, or an
// error as placement.Select does (ErrInvalidRequest, ErrNoFit). Before arrival
// level From it is Select. The policy's choice is the first candidate: the
// highest score, the earliest node in the order on ties, as placement.Select picks.
func (l *lookahead) place(order []Pod, i int, arrived, capacity int64) (*placement.Node, []int, error) {
	r := order[i].Request
	if float64(arrived) < l.cfg.From*float64(capacity) {
		return placement.Select(l.policy, l.nodes, r, nil)
	}
	distinct, err := rankCandidates(l.policy, l.nodes, r, l.cfg.Candidates, &l.cands)
	if err != nil {
		return nil, nil, err
	}
	if len(distinct) == 1 {
		return distinct[0].n, distinct[0].devs, nil
	}
	l.res.Decisions++
	future := order[i+1 : min(len(order), i+1+l.cfg.Horizon)]
	best, bestGain := 0, int64(-1)
	for ci, c := range distinct {
		if err := c.n.Place(r, c.devs); err != nil {
			return nil, nil, fmt.Errorf("lookahead: placing what %s chose: %w", l.policy.Name(), err)
		}
		gain, err := l.rollout(future)
		c.n.Discharge(r, c.devs)
		if err != nil {
			return nil, nil, err
		}
		if gain > bestGain {
			best, bestGain = ci, gain
		}
	}
	if best != 0 {
		l.res.Changed++
	}
	return distinct[best].n, distinct[best].devs, nil
}

// rankCandidates returns the policy's best k nodes for r whose states differ
// (sameState), best first; the first is the node placement.Select picks (the
// highest score, the earliest in the order on ties). buf is reused between calls.
// Errors are placement.Select's: ErrInvalidRequest, ErrNoFit.
func rankCandidates(policy placement.Policy, nodes []*placement.Node, r placement.Request, k int, buf *[]candidate) ([]candidate, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	cands := (*buf)[:0]
	for _, n := range nodes {
		if s, devs, ok := policy.Score(n, r); ok {
			cands = append(cands, candidate{n: n, score: s, devs: devs})
		}
	}
	*buf = cands
	if len(cands) == 0 {
		return nil, fmt.Errorf("%d nodes for %dx%d milli gpu: %w", len(nodes), r.NumGPU, r.GPUMilli, placement.ErrNoFit)
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.score, a.score) })
	distinct := cands[:1]
	for _, c := range cands[1:] {
		if len(distinct) == k {
			break
		}
		if !slices.ContainsFunc(distinct, func(d candidate) bool { return sameState(d, c) }) {
			distinct = append(distinct, c)
		}
	}
	return distinct, nil
}

// rollout places future with the policy, returns the GPU milli it allocated, and
// takes every placement back.
func (l *lookahead) rollout(future []Pod) (int64, error) {
	l.undo = l.undo[:0]
	defer func() {
		for i := len(l.undo) - 1; i >= 0; i-- {
			u := l.undo[i]
			u.n.Discharge(u.r, u.devs)
		}
	}()
	var gain int64
	for _, p := range future {
		n, devs, err := placement.Select(l.policy, l.nodes, p.Request, nil)
		if err != nil {
			continue // ErrNoFit: the pod fails; the replay validated every request
		}
		if err := n.Place(p.Request, devs); err != nil {
			return 0, fmt.Errorf("lookahead rollout: %w", err)
		}
		l.undo = append(l.undo, placed{n, p.Request, devs})
		gain += p.Request.GPUTotalMilli()
	}
	return gain, nil
}

// sameState reports whether placing on a or on b leaves indistinguishable nodes:
// the same model, free CPU, memory and pod room, the same multiset of free GPU,
// and the same free milli on the chosen devices. Nodes with live usage are never
// the same (the replay has none).
func sameState(a, b candidate) bool {
	x, y := a.n, b.n
	if x.Model != y.Model || x.FreeCPUMilli() != y.FreeCPUMilli() ||
		x.MemoryMiB-x.UsedMemoryMiB != y.MemoryMiB-y.UsedMemoryMiB ||
		x.MaxPods-x.Pods != y.MaxPods-y.Pods || x.Usage != nil || y.Usage != nil {
		return false
	}
	return sameMultiset(x.GPUFree, y.GPUFree) && sameMultiset(freeOn(x, a.devs), freeOn(y, b.devs))
}

// freeOn is the free milli of n's devices devs.
func freeOn(n *placement.Node, devs []int) []int {
	out := make([]int, len(devs))
	for i, d := range devs {
		out[i] = n.GPUFree[d]
	}
	return out
}

func sameMultiset(a, b []int) bool {
	return len(a) == len(b) && slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
