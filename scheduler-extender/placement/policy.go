package placement

import (
	"errors"
	"fmt"
	"math/rand"
)

// ErrUnknownPolicy means NewPolicy was given a name it does not know.
var ErrUnknownPolicy = errors.New("unknown placement policy")

// Policy names NewPolicy knows.
const (
	PolicyRandom     = "random"
	PolicyBestFit    = "bestfit"
	PolicyFGD        = "fgd"
	PolicyUnderstory = "understory"
)

// DefaultPolicy is the policy the extender serves unless told otherwise.
const DefaultPolicy = PolicyUnderstory

// PolicyNames lists the policies NewPolicy knows.
func PolicyNames() []string {
	return []string{PolicyRandom, PolicyBestFit, PolicyFGD, PolicyUnderstory}
}

// Policy ranks the nodes a request may go to.
type Policy interface {
	Name() string
	// Score ranks placing r on n (higher is better) and returns the devices it would
	// use; ok=false if r does not fit n.
	Score(n *Node, r Request) (score float64, devices []int, ok bool)
}

// scorer is the allocation-free form of Score that Select uses: r is valid, and
// the devices come back as a set.
type scorer interface {
	score(n *Node, r *Request) (float64, deviceSet, bool)
}

// PolicyCoverage is the coverage of the target workload the named policy is
// measured against when nobody sets one: FGD's 95 % (DefaultCoverage) for fgd,
// DefaultUnderstoryCoverage for understory. Whoever builds the workload for a
// policy (the extender's state, the openb replay) builds it at this coverage.
func PolicyCoverage(name string) float64 {
	if name == PolicyUnderstory {
		return DefaultUnderstoryCoverage
	}
	return DefaultCoverage
}

// NewPolicy returns the named policy. w is the target workload the
// fragmentation-aware policies (fgd, understory) need, used as given (build it
// at PolicyCoverage(name)); nil means an empty one, under which they only pack.
// rng (math/rand, v1: the openb replay shares one seeded stream with it) drives
// the random policy (nil: seed 1). No policy changes the nodes; every policy but
// random is safe for concurrent use (random draws from rng: callers serialise it,
// see Concurrent).
func NewPolicy(name string, w *Workload, rng *rand.Rand) (Policy, error) {
	if w == nil {
		w = NewWorkload(nil, DefaultCoverage)
	}
	switch name {
	case PolicyRandom:
		if rng == nil {
			rng = rand.New(rand.NewSource(1))
		}
		return &randomPolicy{rng: rng}, nil
	case PolicyBestFit:
		return bestFitPolicy{}, nil
	case PolicyFGD:
		return &fgdPolicy{w: w}, nil
	case PolicyUnderstory:
		return newUnderstory(w, DefaultUnderstoryParams()), nil
	}
	return nil, fmt.Errorf("policy %q (known: %v): %w", name, PolicyNames(), ErrUnknownPolicy)
}

// Concurrent reports whether p may score from several goroutines at once, and
// whether its scores are a function of node and request (so they may be cached):
// true for every policy but random.
func Concurrent(p Policy) bool {
	_, random := p.(*randomPolicy)
	return !random
}

// scoreVia implements Policy.Score on top of a scorer.
func scoreVia(s scorer, n *Node, r Request) (float64, []int, bool) {
	if r.Validate() != nil {
		return 0, nil, false
	}
	v, d, ok := s.score(n, &r)
	if !ok {
		return 0, nil, false
	}
	return v, d.slice(), true
}
