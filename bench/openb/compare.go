package openb

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/understory/understory/scheduler-extender/placement"
)

// ReadTable reads a table RunTable wrote as JSON (bench/out/openb.json).
func ReadTable(path string) (*Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, ErrBadConfig, err)
	}
	return &t, nil
}

// seedMean is the mean of c's replays over seeds (ok false if one is missing).
func (c *Cell) seedMean(seeds []int64) (m [2]float64, ok bool) {
	for _, s := range seeds {
		found := false
		for _, r := range c.Seeds {
			if r.Seed == s {
				m[0] += r.AllocAt100
				m[1] += r.AllocAt130
				found = true
				break
			}
		}
		if !found {
			return m, false
		}
	}
	n := float64(len(seeds))
	return [2]float64{m[0] / n, m[1] / n}, len(seeds) > 0
}

// CompareMarkdown renders t against base (an earlier table, e.g. the plain run a
// probe is measured against) over t's seeds: each policy's allocation in both,
// the difference, the difference of t to base's fgd, and what the probe did (the
// lookahead's decisions and changes, or the search's window and deviations).
// Workloads or policies base lacks for those seeds are left out.
func (t *Table) CompareMarkdown(base *Table) string {
	var b strings.Builder
	b.WriteString("| workload | policy | base 100 / 130 | this 100 / 130 | Δ 100 / 130 | this vs base fgd 100 / 130 | probe decisions / changed |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	cells := map[string]map[string]*Cell{}
	for _, row := range base.Rows {
		cells[row.Workload] = row.Policies
	}
	type sum struct {
		d, fgd [2]float64
		n, nf  int
	}
	sums := map[string]*sum{}
	for _, row := range t.Rows {
		for _, p := range t.Policies {
			c := row.Policies[p]
			bc := cells[row.Workload][p]
			if c == nil || bc == nil {
				continue
			}
			now, ok1 := c.seedMean(t.Seeds)
			was, ok2 := bc.seedMean(t.Seeds)
			if !ok1 || !ok2 {
				continue
			}
			s := sums[p]
			if s == nil {
				s = &sum{}
				sums[p] = s
			}
			d := [2]float64{now[0] - was[0], now[1] - was[1]}
			s.d[0] += d[0]
			s.d[1] += d[1]
			s.n++
			vsFGD := "-"
			if fc := cells[row.Workload][placement.PolicyFGD]; fc != nil {
				if f, ok := fc.seedMean(t.Seeds); ok {
					vsFGD = fmt.Sprintf("%+.2f / %+.2f", now[0]-f[0], now[1]-f[1])
					s.fgd[0] += now[0] - f[0]
					s.fgd[1] += now[1] - f[1]
					s.nf++
				}
			}
			var dec, chg int
			for _, r := range c.Seeds {
				if r.Lookahead != nil {
					dec += r.Lookahead.Decisions
					chg += r.Lookahead.Changed
				}
				if r.Search != nil {
					dec += r.Search.Window
					chg += r.Search.Deviations
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f / %.2f | %.2f / %.2f | %+.2f / %+.2f | %s | %d / %d |\n",
				strings.TrimPrefix(row.Workload, "openb_pod_list_"), p, was[0], was[1], now[0], now[1], d[0], d[1], vsFGD, dec, chg)
		}
	}
	for _, p := range t.Policies {
		s := sums[p]
		if s == nil {
			continue
		}
		vsFGD := "-"
		if s.nf > 0 {
			vsFGD = fmt.Sprintf("%+.2f / %+.2f", s.fgd[0]/float64(s.nf), s.fgd[1]/float64(s.nf))
		}
		fmt.Fprintf(&b, "| **mean** | %s | | | %+.2f / %+.2f | %s | |\n", p, s.d[0]/float64(s.n), s.d[1]/float64(s.n), vsFGD)
	}
	return b.String()
}
