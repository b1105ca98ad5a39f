package grafana

import (
	"errors"
	"fmt"
	"slices"
)

// Exemption lets panels, targets or a variable lack data where a check runs, for a
// stated reason: a node without GPUs has no GPU series, a cluster without gangs no
// gang states. Check still runs what it names (a broken query fails all the same),
// but reports a lack of data there apart (Report.Exempted, ExemptedVariables)
// instead of as a failure.
//
// It names, in the dashboard of uid Dashboard, one of:
//   - a query variable (Variable);
//   - the query panels titled Panel (as in the JSON, variables unexpanded), all
//     their targets or only those of Targets (refIds);
//   - every query panel of the dashboard (neither Panel nor Variable), not its
//     variables.
type Exemption struct {
	Dashboard string
	Panel     string
	Targets   []string
	Variable  string
	// Reason says why the data is missing there; required, and shown in reports.
	Reason string
}

// ErrExemption marks an exemption that is incomplete, ambiguous or names a
// dashboard, panel, target or variable that does not exist.
var ErrExemption = errors.New("invalid exemption")

func (e Exemption) String() string {
	switch {
	case e.Variable != "":
		return fmt.Sprintf("%s variable %s", e.Dashboard, e.Variable)
	case e.Panel == "":
		return fmt.Sprintf("%s every panel", e.Dashboard)
	case len(e.Targets) > 0:
		return fmt.Sprintf("%s panel %q targets %v", e.Dashboard, e.Panel, e.Targets)
	}
	return fmt.Sprintf("%s panel %q", e.Dashboard, e.Panel)
}

// ValidateExemptions checks each exemption against ds (Check does, first):
// complete, unambiguous, naming what exists. A stale exemption would silently
// excuse nothing, and a renamed panel would lose its check without anyone deciding
// so. The error wraps ErrExemption and names every bad exemption.
func ValidateExemptions(ds []Dashboard, exempt []Exemption) error {
	var errs []error
	for _, e := range exempt {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("exemption %v: %s: %w", e, fmt.Sprintf(format, a...), ErrExemption))
		}
		switch {
		case e.Dashboard == "":
			bad("no dashboard uid")
			continue
		case e.Reason == "":
			bad("no reason")
			continue
		case e.Panel != "" && e.Variable != "":
			bad("names both a panel and a variable")
			continue
		case len(e.Targets) > 0 && e.Panel == "":
			bad("targets without a panel")
			continue
		}
		i := slices.IndexFunc(ds, func(d Dashboard) bool { return d.UID == e.Dashboard })
		if i < 0 {
			bad("no such dashboard")
			continue
		}
		d := ds[i]
		switch {
		case e.Variable != "":
			if !slices.ContainsFunc(d.Templating.List, func(v Variable) bool {
				return v.Name == e.Variable && v.Type == "query"
			}) {
				bad("no such query variable")
			}
		case e.Panel != "":
			refs := map[string]bool{}
			found := false
			for _, p := range d.QueryPanels() {
				if p.Title != e.Panel {
					continue
				}
				found = true
				for _, t := range p.Targets {
					if !t.Hide {
						refs[t.RefID] = true
					}
				}
			}
			if !found {
				bad("no such query panel")
				continue
			}
			for _, ref := range e.Targets {
				if !refs[ref] {
					bad("the panel has no (visible) target %q", ref)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// targetExemption is the reason of the first exemption covering the target, or "".
func targetExemption(exempt []Exemption, uid, panel, refID string) string {
	for _, e := range exempt {
		if e.Dashboard != uid || e.Variable != "" || (e.Panel != "" && e.Panel != panel) {
			continue
		}
		if len(e.Targets) == 0 || slices.Contains(e.Targets, refID) {
			return e.Reason
		}
	}
	return ""
}

// variableExemption is the reason of the first exemption naming the variable, or "".
func variableExemption(exempt []Exemption, uid, name string) string {
	for _, e := range exempt {
		if e.Dashboard == uid && e.Variable == name {
			return e.Reason
		}
	}
	return ""
}
