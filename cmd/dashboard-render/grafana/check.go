package grafana

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// API is the part of Prometheus' HTTP API (client_golang's v1.API) the checker and
// the renderer use.
type API interface {
	FormatQuery(ctx context.Context, query string) (string, error)
	Query(ctx context.Context, query string, ts time.Time, opts ...v1.Option) (model.Value, v1.Warnings, v1.Infos, error)
	QueryRange(ctx context.Context, query string, r v1.Range, opts ...v1.Option) (model.Value, v1.Warnings,
		v1.Infos, error)
	LabelValues(ctx context.Context, label string, matches []string, startTime, endTime time.Time,
		opts ...v1.Option) (model.LabelValues, v1.Warnings, v1.Infos, error)
}

var _ API = v1.API(nil)

// Window is the time range a dashboard is looked at over, and how the Grafana
// built-in variables expand in it.
type Window struct {
	// Start and End are the dashboard's time range: range targets run over it,
	// instant ones at End; $__range is End − Start.
	Start, End time.Time
	// Step is the range queries' resolution ($__interval); default (End−Start)/200,
	// at least 1 s.
	Step time.Duration
	// RateInterval is $__rate_interval; Grafana makes it 4 scrape intervals at
	// least, so default 1m (a 15 s scrape).
	RateInterval time.Duration
	// Values are template variable values by name (no $): see VariableValues, which
	// is used for those not given.
	Values map[string]string
}

func (w Window) withDefaults() (Window, error) {
	if w.Start.IsZero() || !w.End.After(w.Start) {
		return w, fmt.Errorf("window %v..%v: %w", w.Start, w.End, ErrWindow)
	}
	if w.Step <= 0 {
		w.Step = max(time.Second, w.End.Sub(w.Start)/200).Round(time.Second)
	}
	if w.RateInterval <= 0 {
		w.RateInterval = time.Minute
	}
	return w, nil
}

// ErrWindow marks a time range that is empty or inverted.
var ErrWindow = errors.New("invalid time range")

// PromDuration writes d as a Prometheus duration ("90s", "250ms"), as Grafana's built-in
// variables and a Prometheus configuration want it.
func PromDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// values returns every variable's value for d in w: Grafana's built-ins, then the
// dashboard's variables (w.Values first).
func (w Window) values(d Dashboard) map[string]string {
	vals := d.VariableValues(w.Values)
	rng := w.End.Sub(w.Start).Round(time.Second)
	vals["__rate_interval"] = PromDuration(w.RateInterval)
	vals["__interval"] = PromDuration(w.Step)
	vals["__interval_ms"] = strconv.FormatInt(w.Step.Milliseconds(), 10)
	vals["__range"] = PromDuration(rng)
	vals["__range_s"] = strconv.FormatInt(int64(rng/time.Second), 10)
	vals["__range_ms"] = strconv.FormatInt(rng.Milliseconds(), 10)
	return vals
}

// ErrNoData means a query ran but returned no series, or only NaN and infinite
// values: Grafana would show "No data".
var ErrNoData = errors.New("no data")

// ErrBadQuery means Prometheus refused the expression (a parse or type error).
var ErrBadQuery = errors.New("query refused by Prometheus")

// TargetResult is one target's check.
type TargetResult struct {
	RefID string
	// Expr is the expression as sent, variables expanded.
	Expr string
	// Series is how many series had at least one finite value; Points how many
	// finite values they had together.
	Series, Points int
	// Err is nil when the target returned data; else it wraps ErrNoData,
	// ErrBadQuery or ErrUnknownVariable, or is the transport's error.
	Err error
	// Exempt is the reason this target may lack data (an Exemption), or "".
	Exempt string
}

// excused reports whether the target failed only by lacking data, which its
// exemption allows.
func (t TargetResult) excused() bool {
	return t.Err != nil && t.Exempt != "" && errors.Is(t.Err, ErrNoData)
}

// PanelResult is one panel's check.
type PanelResult struct {
	Dashboard string // the dashboard's uid
	ID        int
	Title     string
	Targets   []TargetResult
	// Err is set for a panel that is broken as a whole (a query panel without a
	// query).
	Err error
}

// Excused reports whether the panel lacks data only where exemptions allow it: it
// is not OK, and every target that failed lacks data (no broken query) and is exempt.
func (p PanelResult) Excused() bool {
	if p.Err != nil || p.OK() {
		return false
	}
	for _, t := range p.Targets {
		if t.Err != nil && !t.excused() {
			return false
		}
	}
	return true
}

// Exempt returns the reasons of the panel's exempt targets, each once.
func (p PanelResult) Exempt() []string {
	var out []string
	for _, t := range p.Targets {
		if t.Exempt != "" && !slices.Contains(out, t.Exempt) {
			out = append(out, t.Exempt)
		}
	}
	return out
}

// OK reports whether the panel and every one of its targets returned data.
func (p PanelResult) OK() bool {
	if p.Err != nil {
		return false
	}
	for _, t := range p.Targets {
		if t.Err != nil {
			return false
		}
	}
	return true
}

// String names the panel and what failed.
func (p PanelResult) String() string {
	s := fmt.Sprintf("%s panel %d %q", p.Dashboard, p.ID, p.Title)
	if p.Err != nil {
		return s + ": " + p.Err.Error()
	}
	for _, t := range p.Targets {
		switch {
		case t.excused():
			s += fmt.Sprintf("\n\t%s: %v (exempt: %s)\n\t\t%s", t.RefID, t.Err, t.Exempt, t.Expr)
		case t.Err != nil:
			s += fmt.Sprintf("\n\t%s: %v\n\t\t%s", t.RefID, t.Err, t.Expr)
		}
	}
	return s
}

// VariableResult is the check of one query variable: its label_values(...) query
// must list at least one value, or the dashboard's drop-down is empty.
type VariableResult struct {
	Dashboard, Name string
	Values          []string
	Err             error
	// Exempt is the reason the variable may list nothing (an Exemption), or "".
	Exempt string
}

// excused reports whether the variable listed nothing, which its exemption allows.
func (v VariableResult) excused() bool {
	return v.Err != nil && v.Exempt != "" && errors.Is(v.Err, ErrNoData)
}

// Report is the check of a set of dashboards.
type Report struct {
	Panels    []PanelResult
	Variables []VariableResult
}

// Failed returns the panels without data (or with a broken query), but for those
// an exemption excuses (Exempted).
func (r Report) Failed() []PanelResult {
	var out []PanelResult
	for _, p := range r.Panels {
		if !p.OK() && !p.Excused() {
			out = append(out, p)
		}
	}
	return out
}

// Exempted returns the panels that lack data only where an exemption allows it.
func (r Report) Exempted() []PanelResult {
	var out []PanelResult
	for _, p := range r.Panels {
		if p.Excused() {
			out = append(out, p)
		}
	}
	return out
}

// FailedVariables returns the query variables that list no value (or whose query
// is broken), but for those an exemption excuses (ExemptedVariables).
func (r Report) FailedVariables() []VariableResult {
	var out []VariableResult
	for _, v := range r.Variables {
		if v.Err != nil && !v.excused() {
			out = append(out, v)
		}
	}
	return out
}

// ExemptedVariables returns the query variables that list nothing, as an exemption
// allows.
func (r Report) ExemptedVariables() []VariableResult {
	var out []VariableResult
	for _, v := range r.Variables {
		if v.excused() {
			out = append(out, v)
		}
	}
	return out
}

// ErrNoQuery is a query panel without any (visible) target.
var ErrNoQuery = errors.New("panel has no query")

// Check runs every target of every query panel of ds against Prometheus over w, as
// Grafana would show the dashboards, and every label_values(...) variable. Each
// expression, variables expanded, is first parsed by Prometheus (format_query);
// then a range query over the window (an instant query at its end for instant
// targets) must return a series with a finite value. Only a failing transport or
// context aborts the check; everything else is reported per panel.
//
// exempt names the panels, targets and variables that may lack data where the
// check runs (a node without GPUs); they are still run, and a broken query still
// fails. An exemption that names nothing in ds is an error (ErrExemption): the
// dashboards changed under it.
func Check(ctx context.Context, api API, ds []Dashboard, w Window, exempt ...Exemption) (Report, error) {
	w, err := w.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if err := ValidateExemptions(ds, exempt); err != nil {
		return Report{}, err
	}
	var r Report
	for _, d := range ds {
		vals := w.values(d)
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			vr, err := checkVariable(ctx, api, d, v, vals, w)
			if err != nil {
				return r, err
			}
			vr.Exempt = variableExemption(exempt, d.UID, v.Name)
			r.Variables = append(r.Variables, vr)
		}
		for _, p := range d.QueryPanels() {
			pr := PanelResult{Dashboard: d.UID, ID: p.ID, Title: p.Title}
			for _, t := range p.Targets {
				if t.Hide {
					continue
				}
				tr, err := checkTarget(ctx, api, t, vals, w)
				if err != nil {
					return r, err
				}
				tr.Exempt = targetExemption(exempt, d.UID, p.Title, t.RefID)
				pr.Targets = append(pr.Targets, tr)
			}
			if len(pr.Targets) == 0 {
				pr.Err = ErrNoQuery
			}
			r.Panels = append(r.Panels, pr)
		}
	}
	return r, nil
}

// apiError returns the Prometheus API error in err, if any.
func apiError(err error) (*v1.Error, bool) {
	var e *v1.Error
	return e, errors.As(err, &e)
}

// checkTarget runs one target. The returned error aborts the check (transport,
// context); query problems are in the result.
func checkTarget(ctx context.Context, api API, t Target, vals map[string]string, w Window) (TargetResult, error) {
	tr := TargetResult{RefID: t.RefID}
	expr, err := Expand(t.Expr, vals)
	if err != nil {
		tr.Err = err
		return tr, nil
	}
	tr.Expr = expr
	if expr == "" {
		tr.Err = fmt.Errorf("empty expression: %w", ErrBadQuery)
		return tr, nil
	}
	if _, err := api.FormatQuery(ctx, expr); err != nil {
		if e, ok := apiError(err); ok && e.Type == v1.ErrBadData {
			tr.Err = fmt.Errorf("%w: %s", ErrBadQuery, e.Msg)
			return tr, nil
		}
		return tr, fmt.Errorf("parsing %q: %w", expr, err)
	}
	var val model.Value
	if t.IsInstant() {
		val, _, _, err = api.Query(ctx, expr, w.End)
	} else {
		val, _, _, err = api.QueryRange(ctx, expr, v1.Range{Start: w.Start, End: w.End, Step: w.Step})
	}
	if err != nil {
		if e, ok := apiError(err); ok && (e.Type == v1.ErrBadData || e.Type == v1.ErrExec) {
			tr.Err = fmt.Errorf("%w: %s", ErrBadQuery, e.Msg)
			return tr, nil
		}
		return tr, fmt.Errorf("querying %q: %w", expr, err)
	}
	tr.Series, tr.Points = countFinite(val)
	if tr.Series == 0 {
		tr.Err = ErrNoData
	}
	return tr, nil
}

// countFinite counts the series with a finite value, and those values.
func countFinite(v model.Value) (series, points int) {
	finite := func(f model.SampleValue) bool {
		return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0)
	}
	switch v := v.(type) {
	case model.Vector:
		for _, s := range v {
			if finite(s.Value) {
				series++
				points++
			}
		}
	case model.Matrix:
		for _, s := range v {
			n := 0
			for _, p := range s.Values {
				if finite(p.Value) {
					n++
				}
			}
			if n > 0 {
				series++
				points += n
			}
		}
	case *model.Scalar:
		if finite(v.Value) {
			return 1, 1
		}
	}
	return series, points
}

// checkVariable lists a label_values(...) variable's values over the window.
func checkVariable(ctx context.Context, api API, d Dashboard, v Variable, vals map[string]string,
	w Window) (VariableResult, error) {
	vr := VariableResult{Dashboard: d.UID, Name: v.Name}
	q := v.QueryString()
	sel, label, ok := LabelValuesQuery(q)
	if !ok {
		vr.Err = fmt.Errorf("query %q: only label_values(...) is checked: %w", q, ErrBadQuery)
		return vr, nil
	}
	var matches []string
	if sel != "" {
		s, err := Expand(sel, vals)
		if err != nil {
			vr.Err = err
			return vr, nil
		}
		matches = []string{s}
	}
	lv, _, _, err := api.LabelValues(ctx, label, matches, w.Start, w.End)
	if err != nil {
		if e, ok := apiError(err); ok && e.Type == v1.ErrBadData {
			vr.Err = fmt.Errorf("%w: %s", ErrBadQuery, e.Msg)
			return vr, nil
		}
		return vr, fmt.Errorf("label values of %s: %w", v.Name, err)
	}
	for _, x := range lv {
		vr.Values = append(vr.Values, string(x))
	}
	if len(vr.Values) == 0 {
		vr.Err = fmt.Errorf("label_values(%s, %s): %w", sel, label, ErrNoData)
	}
	return vr, nil
}
