package openb

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"time"

	"github.com/understory/understory/contract"

	"github.com/understory/understory/scheduler-extender/placement"
)

// ErrBadConfig means a replay was asked for something it cannot do.
var ErrBadConfig = errors.New("bad replay config")

// PolicyFactory builds the policy a replay runs, from the trace's workload and the
// replay's random stream.
type PolicyFactory func(w *placement.Workload, rng *rand.Rand) (placement.Policy, error)

// Config is one replay.
type Config struct {
	// Policy is a name NewPolicy knows; with Factory set it only picks the
	// workload's default coverage.
	Policy string
	// Factory, if set, builds the policy instead of placement.NewPolicy(Policy, ...).
	Factory PolicyFactory
	Seed    int64
	// Tune is the arrived GPU demand to reach, as a multiple of the cluster's GPU
	// capacity (the FGD artifact's "tune"); <= 0 replays the trace as it is.
	Tune float64
	// Coverage of the target workload's classes; <= 0 means the policy's own,
	// placement.PolicyCoverage(Policy).
	Coverage float64
	// Workload names the trace in the result.
	Workload string
	// Lookahead, if enabled, makes the replay a clairvoyant upper-bound probe.
	Lookahead Lookahead
	// Search, if enabled, makes Run the clairvoyant search over whole replays.
	Search Search
}

// validateProbes rejects a probe that cannot run, and both probes at once.
func (c Config) validateProbes() error {
	if err := c.Lookahead.Validate(); err != nil {
		return err
	}
	if err := c.Search.Validate(); err != nil {
		return err
	}
	if c.Lookahead.Enabled() && c.Search.Enabled() {
		return fmt.Errorf("search and lookahead together: %w", ErrBadConfig)
	}
	return nil
}

// chooser places a GPU pod instead of placement.Select: the clairvoyant probes.
// i is the pod's index in order; arrived is the GPU milli arrived so far, this
// pod's included, of capacity.
type chooser interface {
	place(order []Pod, i int, arrived, capacity int64) (*placement.Node, []int, error)
}

// Result is what a replay measured. Allocation ratios are in % of the cluster's
// GPU milli; AllocAt100/130 are NaN when the replay never reached that level
// (they are written as null in JSON by the callers that marshal them).
type Result struct {
	Workload   string  `json:"workload"`
	Policy     string  `json:"policy"`
	Seed       int64   `json:"seed"`
	Tune       float64 `json:"tune"`
	Pods       int     `json:"pods"`
	Failed     int     `json:"failed"`
	AllocAt100 float64 `json:"alloc_at_100"`
	AllocAt130 float64 `json:"alloc_at_130"`
	FinalAlloc float64 `json:"final_alloc"`
	FinalArriv float64 `json:"final_arrived"`
	Classes    int     `json:"classes"`
	Elapsed    float64 `json:"elapsed"` // seconds
	// Leftover is where the GPU capacity that was not allocated sits at the end.
	Leftover Leftover `json:"leftover"`
	// Lookahead is what the clairvoyant probe did, when the replay ran it.
	Lookahead *LookaheadResult `json:"lookahead,omitempty"`
	// Search is what the clairvoyant search did, when the replay was one.
	Search *SearchResult `json:"search,omitempty"`
}

// Leftover breaks down the cluster's free GPU at the end of a replay, in GPUs.
// A node is stranded when it cannot take even the least demanding GPU pod of
// the replay any more, whatever its GPUs: CPU-stranded if its free CPU is below
// every GPU pod's CPU request, otherwise other-stranded if its memory or pod
// count is. The free GPU of the other nodes is split into whole free devices and
// partly used ones, the latter by 100-milli bucket of the device's free share.
type Leftover struct {
	CPUStranded   float64     `json:"cpu_stranded"`
	OtherStranded float64     `json:"other_stranded"`
	Whole         float64     `json:"whole"`
	Partial       [10]float64 `json:"partial_by_100_milli"`
	// ShareHoles is the free share a sharing pod left on a device it opened (a
	// whole free device: 1000 − milli), summed over those pods; HolesFilled is
	// the GPU that sharing pods took on devices already partly used.
	ShareHoles  float64 `json:"share_holes"`
	HolesFilled float64 `json:"holes_filled"`
}

// Total is the free GPU the breakdown covers.
func (l Leftover) Total() float64 {
	t := l.CPUStranded + l.OtherStranded + l.Whole
	for _, f := range l.Partial {
		t += f
	}
	return t
}

// meanLeftover averages breakdowns field by field (zero for none).
func meanLeftover(ls []Leftover) Leftover {
	var m Leftover
	if len(ls) == 0 {
		return m
	}
	k := float64(len(ls))
	for _, l := range ls {
		m.CPUStranded += l.CPUStranded / k
		m.OtherStranded += l.OtherStranded / k
		m.Whole += l.Whole / k
		for i := range m.Partial {
			m.Partial[i] += l.Partial[i] / k
		}
		m.ShareHoles += l.ShareHoles / k
		m.HolesFilled += l.HolesFilled / k
	}
	m.round()
	return m
}

func (l *Leftover) round() {
	l.CPUStranded, l.OtherStranded, l.Whole = round2(l.CPUStranded), round2(l.OtherStranded), round2(l.Whole)
	for i := range l.Partial {
		l.Partial[i] = round2(l.Partial[i])
	}
	l.ShareHoles, l.HolesFilled = round2(l.ShareHoles), round2(l.HolesFilled)
}

// measure fills the stranded and free buckets of l from the nodes at the end
// of a replay; minCPU, minMem are the smallest CPU and memory requests among the
// replay's GPU pods.
func (l *Leftover) measure(nodes []*placement.Node, minCPU, minMem int64) {
	for _, n := range nodes {
		g := float64(n.FreeGPUMilli()) / contract.MilliPerGPU
		if g == 0 {
			continue
		}
		switch {
		case n.FreeCPUMilli() < minCPU:
			l.CPUStranded += g
			continue
		case n.MemoryMiB-n.UsedMemoryMiB < minMem, n.MaxPods > 0 && n.Pods >= n.MaxPods:
			l.OtherStranded += g
			continue
		}
		for _, f := range n.GPUFree {
			switch {
			case f >= contract.MilliPerGPU:
				l.Whole++
			case f > 0:
				l.Partial[min(9, f/100)] += float64(f) / contract.MilliPerGPU
			}
		}
	}
	l.round()
}

// MarshalJSON writes a level the replay never reached as null.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	out := struct {
		plain
		AllocAt100 *float64 `json:"alloc_at_100"`
		AllocAt130 *float64 `json:"alloc_at_130"`
	}{plain: plain(r)}
	if !math.IsNaN(r.AllocAt100) {
		out.AllocAt100 = &r.AllocAt100
	}
	if !math.IsNaN(r.AllocAt130) {
		out.AllocAt130 = &r.AllocAt130
	}
	return json.Marshal(out)
}

// maxLevel bounds the arrival levels recorded (in % of GPU capacity).
const maxLevel = 400

// Run replays trace on fresh copies of nodes, following the FGD artifact's
// experiment: the pods sorted by name and shuffled with the seed, inflated to
// cfg.Tune of the GPU capacity by drawing trace pods with replacement, nodes
// ranked by a seeded permutation that breaks score ties, pods placed one at a time
// through placement.Select and never leaving. All randomness comes from one
// math/rand stream seeded with cfg.Seed, drawn in the artifact's order.
//
// With cfg.Search enabled, Run is the clairvoyant search (search.go) and
// returns the best of its replays.
func Run(ctx context.Context, nodes []*placement.Node, trace []Pod, cfg Config) (Result, error) {
	if err := cfg.validateProbes(); err != nil {
		return Result{}, err
	}
	if cfg.Search.Enabled() {
		return search(ctx, nodes, trace, cfg)
	}
	return replay(ctx, nodes, trace, cfg, nil)
}

// replay is one replay of Run; d, if set, overrides some of the policy's choices.
func replay(ctx context.Context, nodes []*placement.Node, trace []Pod, cfg Config, d *deviation) (Result, error) {
	start := time.Now()
	if len(nodes) == 0 || len(trace) == 0 {
		return Result{}, fmt.Errorf("%d nodes, %d pods: %w", len(nodes), len(trace), ErrBadConfig)
	}
	var capacity int64
	for _, n := range nodes {
		capacity += int64(len(n.GPUFree)) * contract.MilliPerGPU
	}
	if capacity == 0 {
		return Result{}, fmt.Errorf("nodes have no gpu: %w", ErrBadConfig)
	}
	sorted := slices.Clone(trace)
	slices.SortFunc(sorted, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
	reqs := make([]placement.Request, len(sorted))
	for i, p := range sorted {
		reqs[i] = p.Request
	}
	coverage := cfg.Coverage
	if coverage <= 0 {
		coverage = placement.PolicyCoverage(cfg.Policy)
	}
	w := placement.NewWorkload(reqs, coverage)

	rng := rand.New(rand.NewSource(cfg.Seed))
	rng.Int() // the artifact draws one number right after seeding
	order := Inflate(sorted, rng, cfg.Tune, capacity)

	cluster := make([]*placement.Node, len(nodes))
	for i, n := range nodes {
		cluster[i] = n.Clone()
	}
	slices.SortFunc(cluster, func(a, b *placement.Node) int { return cmp.Compare(a.Name, b.Name) })
	rank := rng.Perm(len(cluster))
	ranked := make([]*placement.Node, len(cluster))
	for i, r := range rank {
		ranked[r] = cluster[i]
	}

	var policy placement.Policy
	var err error
	if cfg.Factory != nil {
		policy, err = cfg.Factory(w, rng)
	} else {
		policy, err = placement.NewPolicy(cfg.Policy, w, rng)
	}
	if err != nil {
		return Result{}, fmt.Errorf("replay policy: %w", err)
	}

	res := Result{Workload: cfg.Workload, Policy: policy.Name(), Seed: cfg.Seed, Tune: cfg.Tune,
		Pods: len(order), Classes: w.Len()}
	var (
		look  *lookahead
		probe chooser
	)
	switch {
	case cfg.Lookahead.Enabled():
		look = &lookahead{cfg: cfg.Lookahead, policy: policy, nodes: ranked, res: LookaheadResult{Lookahead: cfg.Lookahead}}
		probe = look
	case d != nil:
		d.policy, d.nodes = policy, ranked
		probe = d
	}
	var m levelMeans
	var arrived, used int64
	minCPU, minMem := int64(math.MaxInt64), int64(math.MaxInt64)
	for i, p := range order {
		if i%256 == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		r := p.Request
		arrived += r.GPUTotalMilli()
		if r.GPUMilli > 0 {
			minCPU, minMem = min(minCPU, r.CPUMilli), min(minMem, r.MemoryMiB)
		}
		var (
			n    *placement.Node
			devs []int
		)
		if probe != nil && r.GPUMilli > 0 {
			n, devs, err = probe.place(order, i, arrived, capacity)
		} else {
			n, devs, err = placement.Select(policy, ranked, r, nil)
		}
		switch {
		case errors.Is(err, placement.ErrNoFit):
			res.Failed++
		case err != nil:
			return Result{}, fmt.Errorf("pod %s: %w", p.Name, err)
		default:
			if r.Sharing() {
				if f := n.GPUFree[devs[0]]; f >= contract.MilliPerGPU {
					res.Leftover.ShareHoles += float64(f-r.GPUMilli) / contract.MilliPerGPU
				} else {
					res.Leftover.HolesFilled += float64(r.GPUMilli) / contract.MilliPerGPU
				}
			}
			if err := n.Place(r, devs); err != nil {
				return Result{}, fmt.Errorf("pod %s: placing what %s chose: %w", p.Name, policy.Name(), err)
			}
			used += r.GPUTotalMilli()
		}
		m.add(float64(arrived)/float64(capacity)*100, float64(used)/float64(capacity)*100)
	}
	res.Leftover.measure(cluster, minCPU, minMem)
	if look != nil {
		res.Lookahead = &look.res
	}
	res.AllocAt100 = m.at(100)
	res.AllocAt130 = m.at(130)
	res.FinalAlloc = round2(float64(used) / float64(capacity) * 100)
	res.FinalArriv = round2(float64(arrived) / float64(capacity) * 100)
	res.Elapsed = time.Since(start).Seconds()
	return res, nil
}

// Inflate returns the order pods are tried in: sorted (the trace by name)
// shuffled with rng, then, if the trace asks for less GPU than tune × capacity,
// pods drawn from sorted with replacement and appended until the next draw's
// per-GPU milli would pass the target (the artifact's rule), or, if it asks for
// more, pods removed at random until it no longer passes it. A trace without GPU
// pods is only shuffled.
func Inflate(sorted []Pod, rng *rand.Rand, tune float64, capacity int64) []Pod {
	order := slices.Clone(sorted)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	if tune <= 0 {
		return order
	}
	var total int64
	for _, p := range order {
		total += p.Request.GPUTotalMilli()
	}
	target := tune * float64(capacity)
	hasGPU := slices.ContainsFunc(sorted, func(p Pod) bool { return p.Request.GPUMilli > 0 })
	switch {
	case float64(total) < target && hasGPU: // without GPU pods no draw gets closer
		for {
			p := sorted[rng.Intn(len(sorted))]
			if float64(total+int64(p.Request.GPUMilli)) > target {
				break
			}
			total += p.Request.GPUTotalMilli()
			order = append(order, p)
		}
	case float64(total) > target:
		for float64(total) > target && len(order) > 0 {
			i := rng.Intn(len(order))
			total -= order[i].Request.GPUTotalMilli()
			order = slices.Delete(order, i, i+1)
		}
	}
	return order
}

// levelMeans averages the allocation ratio over the pods at each arrival level,
// the way the artifact's analysis does: levels are rounded arrival %, ratios are
// rounded to 2 decimals per pod.
type levelMeans struct {
	sum [maxLevel + 1]float64
	cnt [maxLevel + 1]int
}

func (m *levelMeans) add(arrivedPct, allocPct float64) {
	l := int(math.RoundToEven(arrivedPct))
	if l < 0 || l > maxLevel {
		return
	}
	m.sum[l] += round2(allocPct)
	m.cnt[l]++
}

// at is the mean at level l, or over l-1..l+1 when no pod landed on l, or NaN.
func (m *levelMeans) at(l int) float64 {
	if l < 0 || l > maxLevel {
		return math.NaN()
	}
	if m.cnt[l] > 0 {
		return round2(m.sum[l] / float64(m.cnt[l]))
	}
	var s float64
	var c int
	for i := max(0, l-1); i <= min(maxLevel, l+1); i++ {
		s += m.sum[i]
		c += m.cnt[i]
	}
	if c == 0 {
		return math.NaN()
	}
	return round2(s / float64(c))
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }
