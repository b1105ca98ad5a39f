package placement

import (
	"errors"
	"math/rand"
	"testing"
)

// constPolicy scores every fitting node the same; it has no fast path.
type constPolicy struct{}

func (constPolicy) Name() string { return "const" }
func (constPolicy) Score(n *Node, r Request) (float64, []int, bool) {
	if n.Fit(r) != nil {
		return 0, nil, false
	}
	return 1, nil, true
}

func TestSelectTies(t *testing.T) {
	t.Parallel()
	var nodes []*Node
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		nodes = append(nodes, placeNode(name, "", 4000, 0))
	}
	r := Request{CPUMilli: 100}
	pick := func(seed int64) []string {
		rng := rand.New(rand.NewSource(seed))
		var out []string
		for range 20 {
			n, _, err := Select(constPolicy{}, nodes, r, rng)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, n.Name)
		}
		return out
	}
	a, b, c := pick(1), pick(1), pick(2)
	seen := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different picks: %v vs %v", a, b)
		}
		seen[a[i]] = true
	}
	if len(seen) < 3 {
		t.Fatalf("ties not spread: %v", a)
	}
	same := true
	for i := range a {
		same = same && a[i] == c[i]
	}
	if same {
		t.Fatalf("seeds 1 and 2 picked the same sequence %v", a)
	}
	// No rng: the earliest tied node.
	if n, _, _ := Select(constPolicy{}, nodes, r, nil); n.Name != "a" {
		t.Fatalf("nil rng picked %s", n.Name)
	}
}

func TestSelectErrors(t *testing.T) {
	t.Parallel()
	p, _ := NewPolicy(PolicyFGD, nil, nil)
	nodes := []*Node{placeNode("a", "T4", 1000, 1)}
	tests := []struct {
		name  string
		nodes []*Node
		req   Request
		want  error
	}{
		{"nothing fits", nodes, Request{NumGPU: 2, GPUMilli: 1000}, ErrNoFit},
		{"no nodes", nil, Request{}, ErrNoFit},
		{"invalid request", nodes, Request{NumGPU: 1}, ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, _, err := Select(p, tc.nodes, tc.req, nil); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
