package openb

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/understory/understory/scheduler-extender/placement"
)

// traceDir finds the openb trace: $OPENB_DIR, shared/ beside the repository, or
// the workplace's copy.
func traceDir(t *testing.T) string {
	t.Helper()
	for _, d := range []string{os.Getenv("OPENB_DIR"), "../../../shared/traces/openb", "/work/shared/traces/openb"} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, NodeFile)); err == nil {
			return d
		}
	}
	t.Skip("openb trace not found (set OPENB_DIR)")
	return ""
}

// defaultSlice reads the first n nodes and p pods of the real trace's default
// workload (skipping without the trace).
func defaultSlice(t *testing.T, n, p int) ([]*placement.Node, []Pod) {
	t.Helper()
	dir := traceDir(t)
	nodes, err := ReadNodes(filepath.Join(dir, NodeFile), 0)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := ReadPods(filepath.Join(dir, "openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return nodes[:n], pods[:p]
}

// TestReplaySlice replays a slice of the real trace (the first 80 nodes and 700
// pods of default) with every policy.
func TestReplaySlice(t *testing.T) {
	t.Parallel()
	nodes, pods := defaultSlice(t, 80, 700)
	orig := nodes[0].Clone()
	res := map[string]Result{}
	for _, p := range placement.PolicyNames() {
		r, err := Run(context.Background(), nodes, pods, Config{Policy: p, Seed: 42, Tune: 1.3, Workload: "slice"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Policy != p || r.Workload != "slice" || r.Pods <= len(pods) || r.Failed == 0 ||
			r.FinalArriv < 129 || r.FinalArriv > 131 || r.AllocAt130 < 60 || r.AllocAt130 > 100 ||
			r.AllocAt100 > r.AllocAt130+0.5 || math.IsNaN(r.AllocAt100) {
			t.Fatalf("%s: %+v", p, r)
		}
		var capacity float64
		for _, n := range nodes {
			capacity += float64(len(n.GPUFree))
		}
		l := r.Leftover
		free := l.Total()
		if used := capacity * r.FinalAlloc / 100; math.Abs(used+free-capacity) > 0.1 {
			t.Fatalf("%s: leftover %+v adds up to %.2f free GPUs, %.2f used of %.0f", p, l, free, used, capacity)
		}
		if l.ShareHoles <= 0 {
			t.Fatalf("%s: no share opened a device: %+v", p, l)
		}
		res[p] = r
	}
	if res["fgd"].AllocAt130 <= res["random"].AllocAt130 || res["understory"].AllocAt130 <= res["random"].AllocAt130 {
		t.Fatalf("fragmentation-aware policies no better than random: %+v", res)
	}
	again, err := Run(context.Background(), nodes, pods, Config{Policy: "fgd", Seed: 42, Tune: 1.3, Workload: "slice"})
	if err != nil {
		t.Fatal(err)
	}
	again.Elapsed = res["fgd"].Elapsed
	if again != res["fgd"] {
		t.Fatalf("same seed, different result: %+v vs %+v", again, res["fgd"])
	}
	if !slices.Equal(nodes[0].GPUFree, orig.GPUFree) || nodes[0].Pods != 0 {
		t.Fatal("Run changed the caller's nodes")
	}
}

func TestLeftoverMeasure(t *testing.T) {
	t.Parallel()
	nodes := []*placement.Node{
		// CPU-stranded: 500 m left, every GPU pod asks for more.
		{Name: "cpu", CPUMilli: 8000, UsedCPUMilli: 7500, MemoryMiB: 1 << 20, GPUFree: []int{1000, 190}},
		// Pod slots used up.
		{Name: "pods", CPUMilli: 8000, MemoryMiB: 1 << 20, MaxPods: 2, Pods: 2, GPUFree: []int{1000, 0}},
		// Memory used up.
		{Name: "mem", CPUMilli: 8000, MemoryMiB: 1000, UsedMemoryMiB: 900, GPUFree: []int{530}},
		// Open: one whole device, residues in the 100 and 900 buckets.
		{Name: "open", CPUMilli: 8000, MemoryMiB: 1 << 20, GPUFree: []int{1000, 150, 999, 0}},
	}
	var l Leftover
	l.ShareHoles, l.HolesFilled = 0.123456, 0.5
	l.measure(nodes, 1000, 512)
	want := Leftover{CPUStranded: 1.19, OtherStranded: 1.53, Whole: 1, ShareHoles: 0.12, HolesFilled: 0.5}
	want.Partial[1] = 0.15
	want.Partial[9] = 1
	if l != want {
		t.Fatalf("leftover = %+v, want %+v", l, want)
	}
}

func TestMeanLeftover(t *testing.T) {
	t.Parallel()
	a := Leftover{CPUStranded: 1, OtherStranded: 2, Whole: 3, ShareHoles: 4, HolesFilled: 5}
	a.Partial[1] = 6
	b := Leftover{CPUStranded: 2, Whole: 1, ShareHoles: 1}
	b.Partial[1], b.Partial[9] = 1, 0.333
	want := Leftover{CPUStranded: 1.5, OtherStranded: 1, Whole: 2, ShareHoles: 2.5, HolesFilled: 2.5}
	want.Partial[1], want.Partial[9] = 3.5, 0.17
	if got := meanLeftover([]Leftover{a, b}); got != want {
		t.Fatalf("mean = %+v, want %+v", got, want)
	}
	if got := meanLeftover(nil); got != (Leftover{}) {
		t.Fatalf("mean of none = %+v", got)
	}
	if got := want.Total(); math.Abs(got-(1.5+1+2+3.5+0.17)) > 1e-9 {
		t.Fatalf("total = %v", got)
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	n := &placement.Node{Name: "n", CPUMilli: 1000, MemoryMiB: 1, GPUFree: []int{1000}}
	pods := []Pod{{Name: "p", Request: placement.Request{CPUMilli: 1}}}
	tests := []struct {
		name  string
		nodes []*placement.Node
		pods  []Pod
		cfg   Config
		want  error
	}{
		{"no pods", []*placement.Node{n}, nil, Config{Policy: "fgd"}, ErrBadConfig},
		{"no gpus", []*placement.Node{{Name: "c", CPUMilli: 1}}, pods, Config{Policy: "fgd"}, ErrBadConfig},
		{"unknown policy", []*placement.Node{n}, pods, Config{Policy: "tetris"}, placement.ErrUnknownPolicy},
		{"one-candidate lookahead", []*placement.Node{n}, pods, Config{Policy: "fgd", Lookahead: Lookahead{Candidates: 1, Horizon: 5}}, ErrBadConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Run(context.Background(), tc.nodes, tc.pods, tc.cfg); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, []*placement.Node{n}, pods, Config{Policy: "fgd", Tune: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
}

func TestInflate(t *testing.T) {
	t.Parallel()
	mk := func(name string, num, milli int) Pod {
		return Pod{Name: name, Request: placement.Request{NumGPU: num, GPUMilli: milli}}
	}
	sorted := []Pod{mk("a", 8, 1000), mk("b", 1, 500), mk("c", 0, 0)}
	total := func(ps []Pod) (s int64) {
		for _, p := range ps {
			s += p.Request.GPUTotalMilli()
		}
		return s
	}
	tests := []struct {
		name  string
		tune  float64
		check func(t *testing.T, out []Pod)
	}{
		{"no tune keeps the trace", 0, func(t *testing.T, out []Pod) {
			if len(out) != 3 {
				t.Fatalf("%d pods", len(out))
			}
		}},
		{"up to the target by per-GPU milli", 1, func(t *testing.T, out []Pod) {
			// Capacity 20000: the stop rule looks at per-GPU milli, so an 8-GPU pod may pass the target.
			if s := total(out); s < 19000 || s > 20000+7000 {
				t.Fatalf("total %d", s)
			}
		}},
		{"down to the target", 0.2, func(t *testing.T, out []Pod) {
			if s := total(out); s > 4000 {
				t.Fatalf("total %d", s)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := Inflate(sorted, rand.New(rand.NewSource(1)), tc.tune, 20000)
			tc.check(t, out)
			again := Inflate(sorted, rand.New(rand.NewSource(1)), tc.tune, 20000)
			if len(again) != len(out) {
				t.Fatal("same seed, different inflation")
			}
		})
	}
}

func TestLevelMeans(t *testing.T) {
	t.Parallel()
	var m levelMeans
	m.add(99.6, 90)      // level 100
	m.add(100.4, 91)     // level 100
	m.add(101.2, 95.555) // level 101
	m.add(129.4, 93)     // level 129
	if got := m.at(100); got != 90.5 {
		t.Fatalf("at(100) = %v", got)
	}
	if got := m.at(130); got != 93 { // no pod at 130: 129..131
		t.Fatalf("at(130) = %v", got)
	}
	if got := m.at(101); got != 95.56 {
		t.Fatalf("at(101) = %v", got)
	}
	if !math.IsNaN(m.at(200)) || !math.IsNaN(m.at(-1)) {
		t.Fatal("unreached level not NaN")
	}
}

func TestParseSeeds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []int64
		err  bool
	}{
		{"42", []int64{42}, false},
		{"42-45", []int64{42, 43, 44, 45}, false},
		{"1,5-6", []int64{1, 5, 6}, false},
		{"x", nil, true},
		{"5-1", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseSeeds(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Fatalf("ParseSeeds(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestRunTable runs the table driver on a tiny made-up trace directory.
func TestRunTable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(NodeFile, "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,100000,8,T4\nn2,64000,100000,8,T4\nn3,64000,100000,8,P100\n")
	var pods strings.Builder
	pods.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n")
	for i, r := range []string{"4000,10,1,300,", "2000,10,1,500,", "1000,10,1,250,T4", "1000,10,1,100,", "1000,10,0,0,"} {
		pods.WriteString("p" + string(rune('a'+i)) + "," + r + "\n")
	}
	write("tiny.csv", pods.String())
	var paper strings.Builder
	paper.WriteString("workload,sc_policy,tune,seed,total_gpus,100,130\n")
	for _, s := range []string{"1", "2"} {
		paper.WriteString("tiny,06-FGD,1.3," + s + ",24,90.0,91.0\n")
	}
	write(PaperFile, paper.String())

	tab, err := RunTable(context.Background(), TableConfig{Dir: dir, Policies: []string{"fgd", "understory"}, Seeds: []int64{1, 2}, Tune: 1.4, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.Rows) != 1 || tab.Rows[0].Workload != "tiny" {
		t.Fatalf("rows %+v", tab.Rows)
	}
	fgd, u := tab.Rows[0].Policies["fgd"], tab.Rows[0].Policies["understory"]
	if len(fgd.Seeds) != 2 || fgd.Paper130 == nil || *fgd.Paper130 != 91 || *fgd.Delta130 != round2(fgd.AllocAt130-91) {
		t.Fatalf("fgd cell %+v", fgd)
	}
	if u.Paper130 != nil || u.VsFGD130 == nil || *u.VsFGD130 != round2(u.AllocAt130-fgd.AllocAt130) {
		t.Fatalf("understory cell %+v", u)
	}
	if md := tab.Markdown(); !strings.Contains(md, "| tiny |") || !strings.Contains(md, "paper 90.00 / 91.00") {
		t.Fatalf("markdown:\n%s", md)
	}
	// The cell's leftover is the seed-mean of the replays'.
	if want := meanLeftover([]Leftover{fgd.Seeds[0].Leftover, fgd.Seeds[1].Leftover}); fgd.Leftover != want || fgd.Leftover.Total() <= 0 {
		t.Fatalf("fgd leftover %+v, want %+v", fgd.Leftover, want)
	}
	if md := tab.LeftoverMarkdown(); !strings.Contains(md, "| tiny | fgd |") || !strings.Contains(md, "|  | understory |") {
		t.Fatalf("leftover markdown:\n%s", md)
	}
	if _, err := RunTable(context.Background(), TableConfig{Dir: dir, Policies: []string{"fgd"}, Seeds: nil}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("no seeds: %v", err)
	}
	if tab.Lookahead != nil {
		t.Fatalf("plain table reports a lookahead: %+v", tab.Lookahead)
	}
	look := Lookahead{Candidates: 2, Horizon: 3, From: 0.5}
	lt, err := RunTable(context.Background(), TableConfig{Dir: dir, Policies: []string{"fgd"}, Seeds: []int64{1}, Tune: 1.4, Lookahead: look})
	if err != nil {
		t.Fatal(err)
	}
	if lt.Lookahead == nil || *lt.Lookahead != look || lt.Rows[0].Policies["fgd"].Seeds[0].Lookahead == nil {
		t.Fatalf("lookahead table: %+v", lt)
	}
	if _, err := RunTable(context.Background(), TableConfig{Dir: dir, Policies: []string{"fgd"}, Seeds: []int64{1}, Lookahead: Lookahead{Horizon: 3}}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("lookahead without candidates: %v", err)
	}
	if tab.Search != nil {
		t.Fatalf("plain table reports a search: %+v", tab.Search)
	}
	srch := Search{Tries: 2, Candidates: 2, Changes: 1, To: 1.4}
	st, err := RunTable(context.Background(), TableConfig{Dir: dir, Policies: []string{"fgd"}, Seeds: []int64{1}, Tune: 1.4, Search: srch})
	if err != nil {
		t.Fatal(err)
	}
	if sr := st.Rows[0].Policies["fgd"].Seeds[0].Search; st.Search == nil || *st.Search != srch || sr == nil || sr.Search != srch {
		t.Fatalf("search table: %+v", st)
	}
	for name, tc := range map[string]TableConfig{
		"search without changes": {Dir: dir, Policies: []string{"fgd"}, Seeds: []int64{1}, Search: Search{Tries: 2, Candidates: 2, To: 1}},
		"search and lookahead":   {Dir: dir, Policies: []string{"fgd"}, Seeds: []int64{1}, Search: srch, Lookahead: look},
	} {
		if _, err := RunTable(context.Background(), tc); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func TestParsePaperErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"workload,sc_policy\n", "workload,sc_policy,seed,100,130\nw,p,x,1,2\n", "workload,sc_policy,seed,100,130\nw,p,1,1\n"} {
		if _, err := ParsePaper(strings.NewReader(in), "paper.csv"); !errors.Is(err, ErrBadCSV) {
			t.Fatalf("ParsePaper(%q) = %v", in, err)
		}
	}
}

func FuzzParsePaper(f *testing.F) {
	f.Add("workload,sc_policy,tune,seed,total_gpus,100,130\nw,06-FGD,1.3,42,6212,95.1,95.3\n")
	f.Add("workload,sc_policy,seed,100,130\nw,p,\"1\n")
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParsePaper(strings.NewReader(in), "fuzz.csv")
		if err != nil {
			if !errors.Is(err, ErrBadCSV) {
				t.Fatalf("error %v does not wrap ErrBadCSV", err)
			}
			return
		}
		for _, w := range p.Workloads() {
			if p[w] == nil {
				t.Fatalf("workload %q listed without results", w)
			}
		}
	})
}
