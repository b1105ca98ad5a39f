package placement

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// plainPolicy hides a policy's allocation-free scorer.
type plainPolicy struct{ Policy }

// nanPolicy scores NaN on the nodes whose name ends in 3 (Select's comparison
// is order-dependent around a NaN: Ranking must follow it there too).
type nanPolicy struct{ Policy }

func (p nanPolicy) Score(n *Node, r Request) (float64, []int, bool) {
	v, d, ok := p.Policy.Score(n, r)
	if ok && strings.HasSuffix(n.Name, "3") {
		v = math.NaN()
	}
	return v, d, ok
}

// TestRankingMatchesSelect: while nodes are placed on one at a time, a
// Ranking told of each change selects what Select selects over the same
// nodes, devices included, for every deterministic policy (the fast scorer
// path, a plain Policy, and one scoring NaN), every request shape, and
// requests nothing fits.
func TestRankingMatchesSelect(t *testing.T) {
	t.Parallel()
	base, w := benchCluster()
	base = base[:300]
	for i, n := range base {
		n.Name = fmt.Sprintf("n%d", i)
		if i%4 == 0 {
			n.Usage = &Usage{CPUCapacity: n.CPUMilli, CPUUsed: int64(i) * 97 % n.CPUMilli, MemoryCapacity: 1 << 20}
		}
	}
	policies := map[string]func() Policy{
		PolicyBestFit:    func() Policy { p, _ := NewPolicy(PolicyBestFit, w, nil); return p },
		PolicyFGD:        func() Policy { p, _ := NewPolicy(PolicyFGD, w, nil); return p },
		PolicyUnderstory: func() Policy { p, _ := NewPolicy(PolicyUnderstory, w, nil); return p },
		// Without the fast path: Select and Ranking call Policy.Score.
		"plain": func() Policy { p, _ := NewPolicy(PolicyUnderstory, w, nil); return plainPolicy{p} },
		"nan":   func() Policy { p, _ := NewPolicy(PolicyBestFit, w, nil); return nanPolicy{p} },
	}
	requests := []Request{
		{CPUMilli: 4000, NumGPU: 1, GPUMilli: 470},
		{CPUMilli: 8000, NumGPU: 2, GPUMilli: 1000},
		{CPUMilli: 8000, NumGPU: 1, GPUMilli: 1000, Models: []string{"T4"}},
		{CPUMilli: 2000},
		{CPUMilli: 1 << 40},                     // fits nowhere
		{CPUMilli: 1, NumGPU: 2, GPUMilli: 500}, // invalid
	}
	for name, mk := range policies {
		for _, r := range requests {
			t.Run(fmt.Sprintf("%s/%+v", name, r), func(t *testing.T) {
				t.Parallel()
				nodes := make([]*Node, len(base))
				for i, n := range base {
					nodes[i] = n.Clone()
				}
				p := mk()
				k := NewRanking(p, nodes, r)
				for step := range 200 {
					want, wantDevs, wantErr := Select(p, nodes, r, nil)
					got, gotDevs, gotErr := k.Select()
					if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() {
						t.Fatalf("step %d: error %v, Select's %v", step, gotErr, wantErr)
					}
					if wantErr != nil {
						if !errors.Is(gotErr, ErrNoFit) && !errors.Is(gotErr, ErrInvalidRequest) {
							t.Fatalf("step %d: error %v wraps neither sentinel", step, gotErr)
						}
						return
					}
					if got != want || !slices.Equal(gotDevs, wantDevs) {
						t.Fatalf("step %d: %s %v, Select's %s %v", step, got.Name, gotDevs, want.Name, wantDevs)
					}
					// Place on a copy of the chosen node, as a gang plan does.
					i := slices.Index(nodes, want)
					c := want.Clone()
					if err := c.Place(r, wantDevs); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					nodes[i] = c
					k.Update(i, c)
				}
			})
		}
	}
}
