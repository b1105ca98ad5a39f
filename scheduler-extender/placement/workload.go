package placement

import (
	"cmp"
	"slices"
	"strings"

	"github.com/understory/understory/contract"
)

// DefaultCoverage is the share of pods the target workload's classes cover (FGD paper: 95 %).
const DefaultCoverage = 0.95

// Class is one task class of a target workload: the pods with the same scoring CPU,
// per-GPU milli, GPU count and accepted models (memory is ignored).
type Class struct {
	CPUMilli int64 // scoring CPU: 0 counts as DefaultScoreCPUMilli
	GPUMilli int   // per GPU; 0 for a CPU-only class
	NumGPU   int
	Models   []string // accepted models; empty means any
	Count    int      // pods of the class seen
	Share    float64  // p_m: Count over the pods the kept classes cover
}

// NeedsGPU reports whether the class asks for any GPU.
func (c Class) NeedsGPU() bool { return c.NumGPU > 0 && c.GPUMilli > 0 }

func (c Class) accepts(model string) bool {
	return len(c.Models) == 0 || slices.Contains(c.Models, model)
}

// Workload is the target workload distribution the fragmentation-aware policies
// measure nodes against: the most frequent classes covering a share of the pods
// seen, with renormalised shares. It is immutable once built and safe for
// concurrent use.
type Workload struct {
	classes  []Class
	pods     int     // requests it was built from
	coverage float64 // what it was built to cover
	// Per GPU model, the precomputed view fragmentation needs.
	byModel map[string]*modelTable
	other   *modelTable // models no class names
}

// fragClass is a GPU class as fragmentation sees it on one GPU model.
type fragClass struct {
	cpu   int64
	milli int
	num   int
	p     float64
	group int // index of milli in modelTable.milli
}

// maxFragGroups bounds the distinct per-GPU milli values frag tracks on the stack.
const maxFragGroups = 32

// modelTable is the workload as seen from a node of one GPU model: the share of
// classes for which every free GPU is a fragment whatever the node's state
// (CPU-only classes and classes that refuse the model), and the other classes
// sorted by per-GPU milli.
type modelTable struct {
	always  float64
	classes []fragClass
	milli   []int    // distinct per-GPU milli of classes, ascending
	inv     []uint64 // ⌈2^32/milli⌉ per group: x·inv >> 32 = ⌊x/milli⌋ for x ≤ contract.MilliPerGPU
}

// NewWorkload groups reqs into classes, keeps the most frequent ones until they
// cover at least coverage of the requests (coverage outside (0,1] means
// DefaultCoverage) and renormalises their shares. Requests that fail Validate are
// skipped. Ties in frequency keep the larger request first (CPU, then GPU milli,
// GPU count, models), as the FGD artifact does.
func NewWorkload(reqs []Request, coverage float64) *Workload {
	if coverage <= 0 || coverage > 1 {
		coverage = DefaultCoverage
	}
	type key struct {
		cpu    int64
		milli  int
		num    int
		models string
	}
	counts := map[key]*Class{}
	valid := 0
	for _, r := range reqs {
		if r.Validate() != nil {
			continue
		}
		valid++
		k := key{cpu: r.ScoreCPUMilli(), milli: r.GPUMilli, num: r.NumGPU, models: strings.Join(r.Models, "|")}
		if c, ok := counts[k]; ok {
			c.Count++
			continue
		}
		counts[k] = &Class{CPUMilli: k.cpu, GPUMilli: k.milli, NumGPU: k.num, Models: slices.Clone(r.Models), Count: 1}
	}
	all := make([]Class, 0, len(counts))
	for _, c := range counts {
		all = append(all, *c)
	}
	slices.SortFunc(all, func(a, b Class) int {
		return cmp.Or(
			cmp.Compare(b.Count, a.Count),
			cmp.Compare(b.CPUMilli, a.CPUMilli),
			cmp.Compare(b.GPUMilli, a.GPUMilli),
			cmp.Compare(b.NumGPU, a.NumGPU),
			strings.Compare(strings.Join(b.Models, "|"), strings.Join(a.Models, "|")),
		)
	})
	return cover(all, valid, coverage)
}

// cover builds the workload of the most frequent classes of all (sorted, most
// frequent first) that cover coverage of the pods.
func cover(all []Class, pods int, coverage float64) *Workload {
	need := coverage * float64(pods)
	covered := 0
	kept := 0
	for kept < len(all) && float64(covered) < need {
		covered += all[kept].Count
		kept++
	}
	w := &Workload{classes: all[:kept:kept], pods: pods, coverage: coverage}
	for i := range w.classes {
		w.classes[i].Share = float64(w.classes[i].Count) / float64(covered)
	}
	w.prepare()
	return w
}

// prepare builds the per-model tables from the classes and their shares.
func (w *Workload) prepare() {
	w.byModel = map[string]*modelTable{}
	w.other = w.buildTable("")
	for _, c := range w.classes {
		for _, m := range c.Models {
			if _, ok := w.byModel[m]; !ok {
				w.byModel[m] = w.buildTable(m)
			}
		}
	}
}

// buildTable precomputes the view from a node of the given model ("" = a model
// no class names).
func (w *Workload) buildTable(model string) *modelTable {
	t := &modelTable{}
	for _, c := range w.classes {
		if !c.NeedsGPU() || (len(c.Models) > 0 && (model == "" || !c.accepts(model))) {
			t.always += c.Share
			continue
		}
		t.classes = append(t.classes, fragClass{cpu: c.CPUMilli, milli: c.GPUMilli, num: c.NumGPU, p: c.Share})
	}
	slices.SortStableFunc(t.classes, func(a, b fragClass) int { return cmp.Compare(a.milli, b.milli) })
	for i := range t.classes {
		if len(t.milli) == 0 || t.milli[len(t.milli)-1] != t.classes[i].milli {
			t.milli = append(t.milli, t.classes[i].milli)
		}
		t.classes[i].group = len(t.milli) - 1
	}
	for _, m := range t.milli {
		t.inv = append(t.inv, (1<<32+uint64(m)-1)/uint64(m))
	}
	return t
}

// Len is the number of classes kept (0 for a nil workload).
func (w *Workload) Len() int {
	if w == nil {
		return 0
	}
	return len(w.classes)
}

// Pods is the number of valid requests the workload was built from.
func (w *Workload) Pods() int { return w.pods }

func (w *Workload) table(model string) *modelTable {
	if t, ok := w.byModel[model]; ok {
		return t
	}
	return w.other
}

// frag is F(n) = Σ_m p_m·f(n,m) for a node of this table's model with cpuLeft
// scoring CPU free and the given free milli per device: f(n,m) is all the free
// GPU milli G when m needs no GPU, refuses the model, or the node lacks m's CPU or
// its GPU count; otherwise the free milli on devices with less than m's per-GPU
// need.
func (t *modelTable) frag(cpuLeft int64, free []int) float64 {
	if len(free) > contract.MaxGPUsPerNode || len(t.milli) > maxFragGroups {
		return t.fragSlow(cpuLeft, free)
	}
	// Sort the free milli (insertion sort: a node has a handful of devices).
	var sorted [contract.MaxGPUsPerNode]int
	var g int64
	for i, f := range free {
		g += int64(f)
		j := i
		for ; j > 0 && sorted[j-1] > f; j-- {
			sorted[j] = sorted[j-1]
		}
		sorted[j] = f
	}
	if g == 0 {
		return 0
	}
	// Per distinct class milli m: devices holding m, and the milli on those that do not.
	var cnt [maxFragGroups]int
	var lt [maxFragGroups]int64
	k := 0
	var below int64
	for gi, m := range t.milli {
		for k < len(free) && sorted[k] < m {
			below += int64(sorted[k])
			k++
		}
		cnt[gi], lt[gi] = len(free)-k, below
	}
	fg := float64(g)
	out := t.always * fg
	for i := range t.classes {
		c := &t.classes[i]
		if cpuLeft < c.cpu || cnt[c.group] < c.num {
			out += c.p * fg
		} else {
			out += c.p * float64(lt[c.group])
		}
	}
	return out
}

// fragSlow is frag without stack bounds.
func (t *modelTable) fragSlow(cpuLeft int64, free []int) float64 {
	var g int64
	for _, f := range free {
		g += int64(f)
	}
	if g == 0 {
		return 0
	}
	fg := float64(g)
	out := t.always * fg
	for i := range t.classes {
		c := &t.classes[i]
		cnt := 0
		var lt int64
		for _, f := range free {
			if f >= c.milli {
				cnt++
			} else {
				lt += int64(f)
			}
		}
		if cpuLeft < c.cpu || cnt < c.num {
			out += c.p * fg
		} else {
			out += c.p * float64(lt)
		}
	}
	return out
}

// Frag is F(n) for n as it stands (0 for a nil workload).
func (w *Workload) Frag(n *Node) float64 {
	if w == nil {
		return 0
	}
	return w.table(n.Model).frag(n.FreeCPUMilli(), n.GPUFree)
}

// fillFrag is F with a multi-pod view of each class m: the free GPU milli that m's
// pods could not use if only m-pods came, limited both by the devices (a device
// with x free holds ⌊x/milli⌋ shares; whole-GPU pods need num fully free devices
// each) and by the CPU left (⌊cpuLeft/cpu⌋ pods):
// f(n,m) = G − min(gpuPods, cpuPods)·num·milli.
func (t *modelTable) fillFrag(cpuLeft int64, free []int) float64 {
	var g int64
	for _, f := range free {
		g += int64(f)
	}
	if g == 0 {
		return 0
	}
	fg := float64(g)
	out := t.always * fg
	lastMilli := -1
	var slots int64 // shares of lastMilli the devices hold
	for i := range t.classes {
		c := &t.classes[i]
		if c.milli != lastMilli {
			lastMilli, slots = c.milli, 0
			for _, f := range free {
				slots += int64(f / c.milli)
			}
		}
		pods := slots / int64(c.num)
		if c.cpu > 0 {
			pods = min(pods, max(0, cpuLeft)/c.cpu)
		}
		out += c.p * float64(g-pods*int64(c.num*c.milli))
	}
	return out
}

// fragStats summarises a node's free devices per distinct class milli m: how many
// hold m, the milli on those that do not, and how many m-shares they hold. It
// lets scoring re-evaluate F after one device changes in O(groups), without
// divisions or allocation.
type fragStats struct {
	g     int64
	cnt   [maxFragGroups]int32
	slots [maxFragGroups]int32
	lt    [maxFragGroups]int64
}

// stats fills st for free; false when free or the table is too large for the
// fixed arrays (callers then use frag and fillFrag).
func (t *modelTable) stats(free []int, st *fragStats) bool {
	if len(free) > contract.MaxGPUsPerNode || len(t.milli) > maxFragGroups {
		return false
	}
	for _, x := range free {
		if x < 0 || x > contract.MilliPerGPU {
			return false
		}
		t.add(st, x, 1)
	}
	return true
}

// add counts a device with x free into st (sign 1) or out of it (sign -1).
func (t *modelTable) add(st *fragStats, x int, sign int32) {
	st.g += int64(sign) * int64(x)
	for j, m := range t.milli {
		if x >= m {
			st.cnt[j] += sign
			st.slots[j] += sign * int32((uint64(x)*t.inv[j])>>32)
		} else {
			st.lt[j] += int64(sign) * int64(x)
		}
	}
}

// eval is (1−blend)·frag + blend·fillFrag for the node st describes.
func (t *modelTable) eval(st *fragStats, cpuLeft int64, blend float64) float64 {
	if st.g == 0 {
		return 0
	}
	fg := float64(st.g)
	one, fill := t.always*fg, t.always*fg
	cpu := max(0, cpuLeft)
	for i := range t.classes {
		c := &t.classes[i]
		j := c.group
		if cpuLeft < c.cpu || int(st.cnt[j]) < c.num {
			one += c.p * fg
		} else {
			one += c.p * float64(st.lt[j])
		}
		if blend == 0 {
			continue
		}
		pods := int64(st.slots[j])
		if c.num > 1 {
			pods /= int64(c.num)
		}
		if c.cpu > 0 && pods*c.cpu > cpu {
			pods = cpu / c.cpu
		}
		fill += c.p * (fg - float64(pods*int64(c.num*c.milli)))
	}
	return (1-blend)*one + blend*fill
}
