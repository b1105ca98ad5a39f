package quota

import (
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecideQueueQuotas(t *testing.T) {
	t.Parallel()
	const cpu, gpu = "understory.io/batch-cpu", "nvidia.com/gpu"
	p := DefaultParams()
	tests := []struct {
		name      string
		published map[string]int64
		tenants   []Tenant
		params    Params
		want      map[string]map[string]int64 // tenant -> quota
		changed   map[string]bool
	}{
		{
			name:      "equal weights split evenly; a quota above its target falls at once",
			published: map[string]int64{cpu: 10000},
			tenants: []Tenant{
				{Name: "a", Weight: 1, Current: map[string]int64{cpu: 9000}},
				{Name: "b", Weight: 1, Current: map[string]int64{cpu: 5000}},
			},
			params:  p,
			want:    map[string]map[string]int64{"a": {cpu: 5000}, "b": {cpu: 5000}},
			changed: map[string]bool{"a": true, "b": false},
		},
		{
			name:      "a rise closes half the gap",
			published: map[string]int64{cpu: 20000},
			tenants:   []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{cpu: 10000}}},
			params:    p,
			want:      map[string]map[string]int64{"a": {cpu: 15000}},
			changed:   map[string]bool{"a": true},
		},
		{
			name:      "a gap inside the deadband is not written",
			published: map[string]int64{cpu: 10000},
			tenants:   []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{cpu: 9600}}},
			params:    p,
			want:      map[string]map[string]int64{"a": {cpu: 9600}},
			changed:   map[string]bool{"a": false},
		},
		{
			name:      "a rise that would leave a gap inside the deadband goes to the target",
			published: map[string]int64{cpu: 10000},
			tenants:   []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{cpu: 9200}}},
			params:    p,
			want:      map[string]map[string]int64{"a": {cpu: 10000}},
			changed:   map[string]bool{"a": true},
		},
		{
			name:      "a fall inside the deadband is still made (never above published)",
			published: map[string]int64{cpu: 10000},
			tenants:   []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{cpu: 10100}}},
			params:    p,
			want:      map[string]map[string]int64{"a": {cpu: 10000}},
			changed:   map[string]bool{"a": true},
		},
		{
			name:      "weights 3:1; one GPU goes to the largest remainder",
			published: map[string]int64{cpu: 8000, gpu: 1},
			tenants: []Tenant{
				{Name: "a", Weight: 3, Current: map[string]int64{cpu: 6000, gpu: 1}},
				{Name: "b", Weight: 1, Current: map[string]int64{cpu: 2000}},
			},
			params:  p,
			want:    map[string]map[string]int64{"a": {cpu: 6000, gpu: 1}, "b": {cpu: 2000, gpu: 0}},
			changed: map[string]bool{"a": false, "b": false},
		},
		{
			name:      "equal remainders: the earlier tenant gets the unit",
			published: map[string]int64{gpu: 3},
			tenants: []Tenant{
				{Name: "a", Weight: 1, Current: map[string]int64{gpu: 2}},
				{Name: "b", Weight: 1, Current: map[string]int64{gpu: 2}},
			},
			params:  p,
			want:    map[string]map[string]int64{"a": {gpu: 2}, "b": {gpu: 1}},
			changed: map[string]bool{"a": false, "b": true},
		},
		{
			name:      "weight 0 gets nothing",
			published: map[string]int64{cpu: 1000},
			tenants: []Tenant{
				{Name: "a", Weight: 0, Current: map[string]int64{cpu: 500}},
				{Name: "b", Weight: 2, Current: map[string]int64{cpu: 1000}},
			},
			params:  p,
			want:    map[string]map[string]int64{"a": {cpu: 0}, "b": {cpu: 1000}},
			changed: map[string]bool{"a": true, "b": false},
		},
		{
			name:      "nothing published: every quota falls to 0",
			published: map[string]int64{cpu: 0},
			tenants:   []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{cpu: 4000}}},
			params:    p,
			want:      map[string]map[string]int64{"a": {cpu: 0}},
			changed:   map[string]bool{"a": true},
		},
		{
			name:      "rise fraction 1 jumps to the target",
			published: map[string]int64{cpu: 1000},
			tenants:   []Tenant{{Name: "a", Weight: 1}},
			params:    Params{RiseFraction: 1},
			want:      map[string]map[string]int64{"a": {cpu: 1000}},
			changed:   map[string]bool{"a": true},
		},
		{
			name:      "a tiny gap still moves by at least one unit",
			published: map[string]int64{gpu: 1},
			tenants:   []Tenant{{Name: "a", Weight: 1}},
			params:    Params{RiseFraction: 0.1},
			want:      map[string]map[string]int64{"a": {gpu: 1}},
			changed:   map[string]bool{"a": true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decide(tc.published, tc.tenants, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			gotQ := map[string]map[string]int64{}
			gotC := map[string]bool{}
			for _, q := range got {
				gotQ[q.Name] = q.Quota
				gotC[q.Name] = q.Changed
			}
			if d := cmp.Diff(tc.want, gotQ); d != "" {
				t.Errorf("quotas (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.changed, gotC); d != "" {
				t.Errorf("changed (-want +got):\n%s", d)
			}
			checkQuotaInvariants(t, tc.published, got)
		})
	}
}

// checkQuotaInvariants: no quota above its target, targets sum to published (when any
// weight is positive) and quotas never sum above it.
func checkQuotaInvariants(t *testing.T, published map[string]int64, got []Decision) {
	t.Helper()
	for r, total := range published {
		var sumQ, sumT int64
		for _, q := range got {
			if q.Quota[r] > q.Target[r] {
				t.Errorf("%s %s: quota %d above target %d", q.Name, r, q.Quota[r], q.Target[r])
			}
			sumQ += q.Quota[r]
			sumT += q.Target[r]
		}
		if sumQ > total {
			t.Errorf("%s: quotas sum to %d, above published %d", r, sumQ, total)
		}
		if sumT != total && sumT != 0 {
			t.Errorf("%s: targets sum to %d, want %d", r, sumT, total)
		}
	}
}

// TestDecideQueueQuotasConverges follows a capacity trace: falls are at once, rises
// reach the target within a few decisions, and a steady capacity causes no writes.
func TestDecideQueueQuotasConverges(t *testing.T) {
	t.Parallel()
	const cpu = "understory.io/batch-cpu"
	tenants := []Tenant{{Name: "a", Weight: 1}, {Name: "b", Weight: 3}}
	steps := []struct {
		published    int64
		wantA, wantB int64 // after this step
		changes      int
	}{
		{40000, 5000, 15000, 2}, // from 0, targets 10000 and 30000: half the gap
		{40000, 7500, 22500, 2},
		{40000, 8750, 26250, 2},
		{40000, 9375, 28125, 2},
		{40000, 10000, 30000, 2}, // what would be left is inside the 5 % band: to the target
		{40000, 10000, 30000, 0}, // steady: nothing written
		{20000, 5000, 15000, 2},  // LS takes half back: both fall at once
		{20400, 5000, 15000, 0},  // +2 %: inside the deadband, nothing written
	}
	p := DefaultParams()
	for i, s := range steps {
		got, err := Decide(map[string]int64{cpu: s.published}, tenants, p)
		if err != nil {
			t.Fatal(err)
		}
		changes := 0
		for j, q := range got {
			if q.Changed {
				changes++
			}
			tenants[j].Current = q.Quota
		}
		checkQuotaInvariants(t, map[string]int64{cpu: s.published}, got)
		if a, b := tenants[0].Current[cpu], tenants[1].Current[cpu]; a != s.wantA || b != s.wantB || changes != s.changes {
			t.Errorf("step %d (published %d): a=%d b=%d, %d changed; want a=%d b=%d, %d changed",
				i, s.published, a, b, changes, s.wantA, s.wantB, s.changes)
		}
	}
}

func TestDecideQueueQuotasRefusesBadInput(t *testing.T) {
	t.Parallel()
	ok := []Tenant{{Name: "a", Weight: 1}}
	tests := []struct {
		name      string
		published map[string]int64
		tenants   []Tenant
		params    Params
	}{
		{"rise fraction 0", nil, ok, Params{RiseFraction: 0}},
		{"rise fraction above 1", nil, ok, Params{RiseFraction: 1.5}},
		{"rise fraction NaN", nil, ok, Params{RiseFraction: math.NaN()}},
		{"deadband 1", nil, ok, Params{RiseFraction: 0.5, Deadband: 1}},
		{"evict tolerance 1", nil, ok, Params{RiseFraction: 0.5, EvictTolerance: 1}},
		{"evict tolerance negative", nil, ok, Params{RiseFraction: 0.5, EvictTolerance: -0.1}},
		{"negative weight", nil, []Tenant{{Name: "a", Weight: -1}}, DefaultParams()},
		{"infinite weight", nil, []Tenant{{Name: "a", Weight: math.Inf(1)}}, DefaultParams()},
		{"no name", nil, []Tenant{{Weight: 1}}, DefaultParams()},
		{"duplicate", nil, []Tenant{{Name: "a", Weight: 1}, {Name: "a", Weight: 1}}, DefaultParams()},
		{"negative published", map[string]int64{"x": -1}, ok, DefaultParams()},
		{"negative current", nil, []Tenant{{Name: "a", Weight: 1, Current: map[string]int64{"x": -1}}}, DefaultParams()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Decide(tc.published, tc.tenants, tc.params); !errors.Is(err, ErrQueueQuotaInput) {
				t.Fatalf("err = %v, want ErrQueueQuotaInput", err)
			}
		})
	}
}

func FuzzDecideQueueQuotas(f *testing.F) {
	f.Add(int64(10000), 1.0, 3.0, int64(9000), int64(0), 0.5, 0.05)
	f.Add(int64(1), 1.0, 1.0, int64(1), int64(1), 1.0, 0.0)
	f.Fuzz(func(t *testing.T, total int64, wa, wb float64, ca, cb int64, rise, band float64) {
		const r = "r"
		got, err := Decide(map[string]int64{r: total},
			[]Tenant{{Name: "a", Weight: wa, Current: map[string]int64{r: ca}}, {Name: "b", Weight: wb, Current: map[string]int64{r: cb}}},
			Params{RiseFraction: rise, Deadband: band})
		if err != nil {
			if !errors.Is(err, ErrQueueQuotaInput) {
				t.Fatalf("error %v does not wrap ErrQueueQuotaInput", err)
			}
			return
		}
		if wa+wb > 0 && !math.IsInf(wa+wb, 0) {
			checkQuotaInvariants(t, map[string]int64{r: total}, got)
		}
	})
}

func TestSelectQuotaEvictions(t *testing.T) {
	t.Parallel()
	const cpu, mem = "cpu", "mem"
	tests := []struct {
		name      string
		queues    []Usage
		workloads []Workload
		tolerance float64
		want      []string
		// stuck: over, though no Workload can help (Over true, no evictions).
		stuck bool
	}{
		{
			name: "within quota: nothing",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 4}, Used: map[string]int64{cpu: 4}},
				{Name: "b", Nominal: map[string]int64{cpu: 4}, Used: map[string]int64{cpu: 2}},
			},
			workloads: []Workload{{Name: "a1", Queue: "a", Usage: map[string]int64{cpu: 4}}},
		},
		{
			name: "quotas fell: the borrowing queue gives up its lowest priority, then latest",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 2}, Used: map[string]int64{cpu: 6}},
				{Name: "b", Nominal: map[string]int64{cpu: 2}, Used: map[string]int64{cpu: 1}},
			},
			workloads: []Workload{
				{Name: "a-old-low", Queue: "a", Priority: 0, Admitted: 1, Usage: map[string]int64{cpu: 1}},
				{Name: "a-new-low", Queue: "a", Priority: 0, Admitted: 2, Usage: map[string]int64{cpu: 1}},
				{Name: "a-high", Queue: "a", Priority: 10, Admitted: 3, Usage: map[string]int64{cpu: 4}},
				{Name: "b1", Queue: "b", Priority: -5, Admitted: 1, Usage: map[string]int64{cpu: 1}},
			},
			// excess 7-4 = 3: a-new-low (1), a-old-low (1), then a-high (4): a is
			// still 4-2=2 over while b is under its nominal.
			want: []string{"a-new-low", "a-old-low", "a-high"},
		},
		{
			name: "the queue furthest over goes first",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 1}, Used: map[string]int64{cpu: 3}},
				{Name: "b", Nominal: map[string]int64{cpu: 1}, Used: map[string]int64{cpu: 2}},
			},
			workloads: []Workload{
				{Name: "a1", Queue: "a", Usage: map[string]int64{cpu: 1}, Admitted: 1},
				{Name: "a2", Queue: "a", Usage: map[string]int64{cpu: 2}, Admitted: 2},
				{Name: "b1", Queue: "b", Usage: map[string]int64{cpu: 2}, Admitted: 3},
			},
			// excess 3: a (2 over) gives a2; then a is 0 over, b 1 over: b1.
			want: []string{"a2", "b1"},
		},
		{
			name: "a second resource is brought back too",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 10, mem: 1}, Used: map[string]int64{cpu: 2, mem: 3}},
			},
			workloads: []Workload{
				{Name: "a1", Queue: "a", Usage: map[string]int64{cpu: 1, mem: 2}, Admitted: 1},
				{Name: "a2", Queue: "a", Usage: map[string]int64{cpu: 1, mem: 1}, Admitted: 2},
			},
			want: []string{"a2", "a1"},
		},
		{
			name: "over by no more than the tolerance: nothing",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 50}, Used: map[string]int64{cpu: 54}},
				{Name: "b", Nominal: map[string]int64{cpu: 50}, Used: map[string]int64{cpu: 51}},
			},
			workloads: []Workload{
				{Name: "a1", Queue: "a", Usage: map[string]int64{cpu: 54}, Admitted: 1},
				{Name: "b1", Queue: "b", Usage: map[string]int64{cpu: 51}, Admitted: 2},
			},
			// 105 reserved against 100 + 5 % of 100.
			tolerance: 0.05,
		},
		{
			name: "over beyond the tolerance: back within it, not down to the quotas",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 50}, Used: map[string]int64{cpu: 60}},
				{Name: "b", Nominal: map[string]int64{cpu: 50}, Used: map[string]int64{cpu: 50}},
			},
			workloads: []Workload{
				{Name: "a-old", Queue: "a", Usage: map[string]int64{cpu: 52}, Admitted: 1},
				{Name: "a-mid", Queue: "a", Usage: map[string]int64{cpu: 4}, Admitted: 2},
				{Name: "a-new", Queue: "a", Usage: map[string]int64{cpu: 4}, Admitted: 3},
				{Name: "b1", Queue: "b", Usage: map[string]int64{cpu: 50}, Admitted: 1},
			},
			// 110 against 105 allowed: a-new (4) leaves 106, a-mid (4) 102; with no
			// tolerance a-old would go too.
			tolerance: 0.05,
			want:      []string{"a-new", "a-mid"},
		},
		{
			name: "a tolerance out of range counts as none",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 10}, Used: map[string]int64{cpu: 11}},
			},
			workloads: []Workload{{Name: "a1", Queue: "a", Usage: map[string]int64{cpu: 11}}},
			tolerance: math.NaN(),
			want:      []string{"a1"},
		},
		{
			name: "no Workload uses the over resource: nothing to do",
			queues: []Usage{
				{Name: "a", Nominal: map[string]int64{cpu: 0}, Used: map[string]int64{cpu: 2}},
			},
			workloads: []Workload{{Name: "a1", Queue: "a", Usage: map[string]int64{mem: 1}}},
			stuck:     true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := SelectEvictions(tc.queues, tc.workloads, tc.tolerance)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("evictions (-want +got):\n%s", d)
			}
			if over, want := Over(tc.queues, tc.tolerance), len(tc.want) > 0 || tc.stuck; over != want {
				t.Errorf("Over = %v, want %v", over, want)
			}
		})
	}
}
