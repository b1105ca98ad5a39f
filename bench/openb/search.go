package openb

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/scheduler-extender/placement"
)

// Search makes a replay a clairvoyant search over the policy's near choices, to
// measure how much slack a phase of the replay holds: the policy's own replay
// comes first; each of Tries more replays takes the best so far and changes the
// choice of a few GPU pods arriving between From and To (fractions of the
// cluster's GPU capacity) to another of the policy's best Candidates nodes of
// distinct state (or back to the policy's own); a try that allocates at least as
// much (alloc at 130 % plus alloc at 100 %, searchScore) becomes the best. It picks the best
// of many full replays after the fact, so, like Lookahead, it bounds what is left
// to win and never describes a policy the extender could serve.
type Search struct {
	Tries      int     `json:"tries"`
	Candidates int     `json:"candidates"`
	Changes    int     `json:"changes"` // choices a try changes
	From       float64 `json:"from"`
	To         float64 `json:"to"`
}

// SearchResult is what the search did in one replay.
type SearchResult struct {
	Search
	// Window counts the GPU pods that arrived between From and To.
	Window int `json:"window"`
	// Improved counts the tries that allocated more than the best before them.
	Improved int `json:"improved"`
	// Deviations counts the pods the best replay placed elsewhere than the policy
	// would have in that replay's state.
	Deviations int `json:"deviations"`
	// Policy100/130 are the policy's own replay's allocations, for comparison.
	Policy100 float64 `json:"policy_alloc_at_100"`
	Policy130 float64 `json:"policy_alloc_at_130"`
}

// Enabled reports whether s asks for any search.
func (s Search) Enabled() bool { return s.Tries > 0 }

// Validate rejects a search that cannot run; the zero value (off) is valid.
func (s Search) Validate() error {
	switch {
	case !s.Enabled():
		return nil
	case s.Candidates < 2 || s.Candidates > math.MaxUint8:
		return fmt.Errorf("search: %d candidates, want 2..%d: %w", s.Candidates, math.MaxUint8, ErrBadConfig)
	case s.Changes < 1:
		return fmt.Errorf("search: %d changes per try, want >= 1: %w", s.Changes, ErrBadConfig)
	case math.IsNaN(s.From) || math.IsNaN(s.To) || s.From < 0 || s.To <= s.From:
		return fmt.Errorf("search: window %v..%v, want 0 <= from < to: %w", s.From, s.To, ErrBadConfig)
	}
	return nil
}

// ParseSearch reads "TRIES,CANDIDATES,CHANGES,FROM,TO" (e.g. "200,4,20,0,0.6");
// "" is off.
func ParseSearch(str string) (Search, error) {
	if strings.TrimSpace(str) == "" {
		return Search{}, nil
	}
	parts := strings.Split(str, ",")
	if len(parts) != 5 {
		return Search{}, fmt.Errorf("search %q: want TRIES,CANDIDATES,CHANGES,FROM,TO: %w", str, ErrBadConfig)
	}
	var ints [3]int
	for i := range ints {
		v, err := strconv.Atoi(strings.TrimSpace(parts[i]))
		if err != nil {
			return Search{}, fmt.Errorf("search %q: field %d is not an integer: %w", str, i+1, ErrBadConfig)
		}
		ints[i] = v
	}
	from, err1 := strconv.ParseFloat(strings.TrimSpace(parts[3]), 64)
	to, err2 := strconv.ParseFloat(strings.TrimSpace(parts[4]), 64)
	if err1 != nil || err2 != nil {
		return Search{}, fmt.Errorf("search %q: FROM and TO must be fractions: %w", str, ErrBadConfig)
	}
	s := Search{Tries: ints[0], Candidates: ints[1], Changes: ints[2], From: from, To: to}
	if !s.Enabled() {
		return Search{}, fmt.Errorf("search %q: zero tries: %w", str, ErrBadConfig)
	}
	return s, s.Validate()
}

// deviation tells a replay where to leave the policy's choice. In the first
// replay (rank nil) it only records the window; afterwards rank[i] > 0 sends GPU
// pod i to the policy's rank[i]-th best distinct node (the last one when it has
// fewer). The replay sets policy and nodes.
type deviation struct {
	from, to   float64
	candidates int
	rank       []uint8 // by index in the replay's order
	window     []int   // indices of the GPU pods that arrived in [from, to)
	changed    int     // pods placed elsewhere than the policy's choice
	policy     placement.Policy
	nodes      []*placement.Node // in the replay's tie-breaking order
	cands      []candidate
}

var _ chooser = (*deviation)(nil)

func (d *deviation) place(order []Pod, i int, arrived, capacity int64) (*placement.Node, []int, error) {
	r := order[i].Request
	if d.rank == nil {
		if frac := float64(arrived) / float64(capacity); frac >= d.from && frac < d.to {
			d.window = append(d.window, i)
		}
		return placement.Select(d.policy, d.nodes, r, nil)
	}
	if d.rank[i] == 0 {
		return placement.Select(d.policy, d.nodes, r, nil)
	}
	distinct, err := rankCandidates(d.policy, d.nodes, r, d.candidates, &d.cands)
	if err != nil {
		return nil, nil, err
	}
	c := distinct[min(int(d.rank[i]), len(distinct)-1)]
	if c.n != distinct[0].n {
		d.changed++
	}
	return c.n, c.devs, nil
}

// search is Run with cfg.Search enabled (validated): the policy's own replay,
// then the search, and the best replay with Search filled in.
func search(ctx context.Context, nodes []*placement.Node, trace []Pod, cfg Config) (Result, error) {
	start := time.Now()
	s := cfg.Search
	d := &deviation{from: s.From, to: s.To, candidates: s.Candidates}
	best, err := replay(ctx, nodes, trace, cfg, d)
	if err != nil {
		return Result{}, err
	}
	sr := SearchResult{Search: s, Window: len(d.window), Policy100: best.AllocAt100, Policy130: best.AllocAt130}
	if len(d.window) == 0 {
		best.Search = &sr
		return best, nil
	}
	rng := rand.New(rand.NewSource(cfg.Seed))
	bestRank := make([]uint8, best.Pods)
	try := make([]uint8, best.Pods)
	for range s.Tries {
		copy(try, bestRank)
		for range s.Changes {
			// rank 0 puts a pod back where the policy would place it.
			try[d.window[rng.Intn(len(d.window))]] = uint8(rng.Intn(s.Candidates))
		}
		d.rank, d.changed = try, 0
		res, err := replay(ctx, nodes, trace, cfg, d)
		if err != nil {
			return Result{}, err
		}
		if searchScore(res) >= searchScore(best) {
			if searchScore(res) > searchScore(best) {
				sr.Improved++
			}
			best, sr.Deviations = res, d.changed
			bestRank, try = try, bestRank
		}
	}
	best.Search = &sr
	best.Elapsed = time.Since(start).Seconds()
	return best, nil
}

// searchScore is what the search maximises: alloc at 100 % plus alloc at 130 %,
// the final allocation standing in for a level the replay never reached.
func searchScore(r Result) float64 {
	var s float64
	for _, v := range []float64{r.AllocAt100, r.AllocAt130} {
		if math.IsNaN(v) {
			v = r.FinalAlloc
		}
		s += v
	}
	return s
}
