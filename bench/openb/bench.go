package openb

import (
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// NodeFile is the node list the paper's experiments use, inside a trace directory.
const NodeFile = "openb_node_list_gpu_node.csv"

// PaperFile is the paper's per-seed results, inside a trace directory.
const PaperFile = "paper-results/analysis_allo_discrete.csv"

// paperPolicy maps our policy names to the artifact's.
var paperPolicy = map[string]string{
	"random":  "01-Random",
	"bestfit": "05-BestFit",
	"fgd":     "06-FGD",
}

// Paper holds the paper's allocation ratios: workload → artifact policy → seed → [at100, at130].
type Paper map[string]map[string]map[int64][2]float64

// ReadPaper reads analysis_allo_discrete.csv (rows of workload, sc_policy, tune,
// seed, total_gpus, then one column per arrival level).
func ReadPaper(path string) (Paper, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading paper results: %w", err)
	}
	defer f.Close()
	return ParsePaper(f, path)
}

// ParsePaper parses the paper's results; name is used in errors.
func ParsePaper(r io.Reader, name string) (Paper, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s:1: header: %v: %w", name, err, ErrBadCSV)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, c := range []string{"workload", "sc_policy", "seed", "100", "130"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("%s:1: column %s missing from header: %w", name, c, ErrBadCSV)
		}
	}
	p := Paper{}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return p, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v: %w", name, err, ErrBadCSV)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(head) {
			return nil, fmt.Errorf("%s:%d: %d fields, header has %d: %w", name, line, len(rec), len(head), ErrBadCSV)
		}
		seed, err := strconv.ParseInt(rec[col["seed"]], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: column seed: %q: %w", name, line, rec[col["seed"]], ErrBadCSV)
		}
		var v [2]float64
		for i, c := range []string{"100", "130"} {
			if v[i], err = strconv.ParseFloat(rec[col[c]], 64); err != nil {
				return nil, fmt.Errorf("%s:%d: column %s: %q: %w", name, line, c, rec[col[c]], ErrBadCSV)
			}
		}
		w, pol := rec[col["workload"]], rec[col["sc_policy"]]
		if p[w] == nil {
			p[w] = map[string]map[int64][2]float64{}
		}
		if p[w][pol] == nil {
			p[w][pol] = map[int64][2]float64{}
		}
		p[w][pol][seed] = v
	}
}

// Workloads lists the workloads the paper reports, sorted.
func (p Paper) Workloads() []string {
	out := make([]string, 0, len(p))
	for w := range p {
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

// mean is the paper's seed-mean for our policy name over seeds, ok=false if it
// lacks any of them.
func (p Paper) mean(workload, policy string, seeds []int64) (m [2]float64, ok bool) {
	byseed := p[workload][paperPolicy[policy]]
	if len(byseed) == 0 {
		return m, false
	}
	for _, s := range seeds {
		v, found := byseed[s]
		if !found {
			return m, false
		}
		m[0] += v[0]
		m[1] += v[1]
	}
	m[0] /= float64(len(seeds))
	m[1] /= float64(len(seeds))
	return m, true
}

// TableConfig is a run of the whole table.
type TableConfig struct {
	Dir       string   // the trace directory (nodes, pod lists, paper-results)
	Workloads []string // pod list names without .csv; empty: every workload the paper reports
	Policies  []string
	Seeds     []int64
	Tune      float64
	Workers   int // parallel replays; <= 0 means 1
	// Factories overrides how a named policy is built (for tuning experiments).
	Factories map[string]PolicyFactory
	// Coverages overrides a named policy's target-workload coverage (see
	// Config.Coverage; for tuning experiments).
	Coverages map[string]float64
	// Progress, if set, gets one line per finished replay.
	Progress io.Writer
	// Lookahead, if enabled, runs every replay as the clairvoyant probe.
	Lookahead Lookahead
	// Search, if enabled, runs every replay as the clairvoyant search.
	Search Search
}

// Cell is one workload × policy of the table.
type Cell struct {
	AllocAt100 float64  `json:"alloc_at_100"`
	AllocAt130 float64  `json:"alloc_at_130"`
	Paper100   *float64 `json:"paper_100,omitempty"`
	Paper130   *float64 `json:"paper_130,omitempty"`
	Delta100   *float64 `json:"delta_100,omitempty"`
	Delta130   *float64 `json:"delta_130,omitempty"`
	// For policies the paper does not have: the difference to our fgd.
	VsFGD100 *float64 `json:"vs_fgd_100,omitempty"`
	VsFGD130 *float64 `json:"vs_fgd_130,omitempty"`
	Seeds    []Result `json:"seeds"`
	Elapsed  float64  `json:"elapsed"` // seconds over all seeds
	// Leftover is the seed-mean of the replays' leftover breakdowns.
	Leftover Leftover `json:"leftover"`
}

// Row is one workload of the table.
type Row struct {
	Workload string           `json:"workload"`
	Policies map[string]*Cell `json:"policies"`
}

// Table is the result of RunTable.
type Table struct {
	Tune     float64  `json:"tune"`
	Seeds    []int64  `json:"seeds"`
	Policies []string `json:"policies"`
	// Lookahead is the clairvoyant probe every replay ran, if any.
	Lookahead *Lookahead `json:"lookahead,omitempty"`
	// Search is the clairvoyant search every replay ran, if any.
	Search *Search `json:"search,omitempty"`
	Rows   []Row   `json:"rows"`
	// Mean over workloads of each policy's seed-means.
	Mean map[string][2]float64 `json:"mean"`
}

// RunTable replays every workload × policy × seed, Workers at a time, and
// aggregates seed-means with the paper's values beside them.
func RunTable(ctx context.Context, cfg TableConfig) (*Table, error) {
	paper, err := ReadPaper(filepath.Join(cfg.Dir, PaperFile))
	if err != nil {
		return nil, err
	}
	if len(cfg.Workloads) == 0 {
		cfg.Workloads = paper.Workloads()
	}
	if len(cfg.Policies) == 0 || len(cfg.Seeds) == 0 {
		return nil, fmt.Errorf("%d policies, %d seeds: %w", len(cfg.Policies), len(cfg.Seeds), ErrBadConfig)
	}
	if err := (Config{Lookahead: cfg.Lookahead, Search: cfg.Search}).validateProbes(); err != nil {
		return nil, err
	}
	nodes, err := ReadNodes(filepath.Join(cfg.Dir, NodeFile), DefaultMaxPods)
	if err != nil {
		return nil, err
	}
	traces := map[string][]Pod{}
	for _, w := range cfg.Workloads {
		if traces[w], err = ReadPods(filepath.Join(cfg.Dir, w+".csv")); err != nil {
			return nil, err
		}
	}

	type job struct {
		w, p string
		seed int64
	}
	var jobs []job
	for _, w := range cfg.Workloads {
		for _, s := range cfg.Seeds {
			for _, p := range cfg.Policies {
				jobs = append(jobs, job{w, p, s})
			}
		}
	}
	results := make([]Result, len(jobs))
	workers := max(1, cfg.Workers)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				rc := Config{Policy: j.p, Seed: j.seed, Tune: cfg.Tune, Workload: j.w, Factory: cfg.Factories[j.p],
					Coverage: cfg.Coverages[j.p], Lookahead: cfg.Lookahead, Search: cfg.Search}
				res, err := Run(ctx, nodes, traces[j.w], rc)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s %s seed %d: %w", j.w, j.p, j.seed, err)
					cancel()
				}
				if err == nil && cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "%-28s %-10s seed %d: %6.2f %6.2f (%d failed, %.1fs)\n",
						j.w, j.p, j.seed, res.AllocAt100, res.AllocAt130, res.Failed, res.Elapsed)
				}
				mu.Unlock()
				res.Policy = j.p
				results[i] = res
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	t := &Table{Tune: cfg.Tune, Seeds: cfg.Seeds, Policies: cfg.Policies, Mean: map[string][2]float64{}}
	if cfg.Lookahead.Enabled() {
		l := cfg.Lookahead
		t.Lookahead = &l
	}
	if cfg.Search.Enabled() {
		sc := cfg.Search
		t.Search = &sc
	}
	byKey := map[[2]string]*Cell{}
	for _, w := range cfg.Workloads {
		row := Row{Workload: w, Policies: map[string]*Cell{}}
		for _, p := range cfg.Policies {
			c := &Cell{}
			row.Policies[p] = c
			byKey[[2]string{w, p}] = c
		}
		t.Rows = append(t.Rows, row)
	}
	for i, j := range jobs {
		c := byKey[[2]string{j.w, j.p}]
		c.Seeds = append(c.Seeds, results[i])
	}
	for _, row := range t.Rows {
		for p, c := range row.Policies {
			slices.SortFunc(c.Seeds, func(a, b Result) int { return cmp.Compare(a.Seed, b.Seed) })
			var ls []Leftover
			for _, r := range c.Seeds {
				c.AllocAt100 += r.AllocAt100
				c.AllocAt130 += r.AllocAt130
				c.Elapsed += r.Elapsed
				ls = append(ls, r.Leftover)
			}
			c.Leftover = meanLeftover(ls)
			c.AllocAt100 = round2(c.AllocAt100 / float64(len(c.Seeds)))
			c.AllocAt130 = round2(c.AllocAt130 / float64(len(c.Seeds)))
			if m, ok := paper.mean(row.Workload, p, cfg.Seeds); ok {
				c.Paper100, c.Paper130 = ptr(round2(m[0])), ptr(round2(m[1]))
				c.Delta100, c.Delta130 = ptr(round2(c.AllocAt100-m[0])), ptr(round2(c.AllocAt130-m[1]))
			}
		}
		if f, ok := row.Policies["fgd"]; ok {
			for p, c := range row.Policies {
				if p != "fgd" && paperPolicy[p] == "" {
					c.VsFGD100, c.VsFGD130 = ptr(round2(c.AllocAt100-f.AllocAt100)), ptr(round2(c.AllocAt130-f.AllocAt130))
				}
			}
		}
	}
	for _, p := range cfg.Policies {
		var m [2]float64
		for _, row := range t.Rows {
			m[0] += row.Policies[p].AllocAt100
			m[1] += row.Policies[p].AllocAt130
		}
		t.Mean[p] = [2]float64{round2(m[0] / float64(len(t.Rows))), round2(m[1] / float64(len(t.Rows)))}
	}
	return t, nil
}

func ptr(f float64) *float64 { return &f }

// ParseSeeds parses "42", "42-51" or "42,45,50".
func ParseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("seeds %q: %q: %w", s, part, ErrBadConfig)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a || b-a > 10000 {
				return nil, fmt.Errorf("seeds %q: range %q: %w", s, part, ErrBadConfig)
			}
		}
		for v := a; v <= b; v++ {
			out = append(out, v)
		}
	}
	return out, nil
}

// Markdown renders the table as a GitHub table (seed-means, paper and delta).
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| workload |")
	for _, p := range t.Policies {
		fmt.Fprintf(&b, " %s 100 / 130 |", p)
	}
	b.WriteString("\n|---|")
	for range t.Policies {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range t.Rows {
		fmt.Fprintf(&b, "| %s |", strings.TrimPrefix(row.Workload, "openb_pod_list_"))
		for _, p := range t.Policies {
			c := row.Policies[p]
			fmt.Fprintf(&b, " %.2f / %.2f", c.AllocAt100, c.AllocAt130)
			switch {
			case c.Paper100 != nil:
				fmt.Fprintf(&b, " (paper %.2f / %.2f, Δ %+.2f / %+.2f)", *c.Paper100, *c.Paper130, *c.Delta100, *c.Delta130)
			case c.VsFGD100 != nil:
				fmt.Fprintf(&b, " (vs fgd %+.2f / %+.2f)", *c.VsFGD100, *c.VsFGD130)
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	b.WriteString("| **mean** |")
	for _, p := range t.Policies {
		fmt.Fprintf(&b, " %.2f / %.2f |", t.Mean[p][0], t.Mean[p][1])
	}
	b.WriteString("\n")
	return b.String()
}

// LeftoverMarkdown renders where each policy left the unallocated GPU at the end
// of the replays (seed-means, in GPUs) as a GitHub table.
func (t *Table) LeftoverMarkdown() string {
	var b strings.Builder
	b.WriteString("| workload | policy | stranded (CPU / memory, pods) | whole free | partial 0-99 milli | partial 100-199 | partial 200-999 | total | share holes opened | filled |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range t.Rows {
		for i, p := range t.Policies {
			l := row.Policies[p].Leftover
			w := ""
			if i == 0 {
				w = strings.TrimPrefix(row.Workload, "openb_pod_list_")
			}
			var rest float64
			for _, f := range l.Partial[2:] {
				rest += f
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f / %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", w, p,
				l.CPUStranded, l.OtherStranded, l.Whole, l.Partial[0], l.Partial[1], rest, l.Total(), l.ShareHoles, l.HolesFilled)
		}
	}
	return b.String()
}

// ErrNaN is reported when a replay never reached an arrival level.
var ErrNaN = errors.New("arrival level not reached")

// CheckLevels returns ErrNaN if any replay of t missed level 100 or 130.
func (t *Table) CheckLevels() error {
	for _, row := range t.Rows {
		for p, c := range row.Policies {
			for _, r := range c.Seeds {
				if math.IsNaN(r.AllocAt100) || math.IsNaN(r.AllocAt130) {
					return fmt.Errorf("%s %s seed %d: %w", row.Workload, p, r.Seed, ErrNaN)
				}
			}
		}
	}
	return nil
}
