package grafana

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Dashboard is the part of a Grafana dashboard JSON model the checker and the
// renderer read.
type Dashboard struct {
	UID           string     `json:"uid"`
	Title         string     `json:"title"`
	SchemaVersion int        `json:"schemaVersion"`
	Tags          []string   `json:"tags"`
	Panels        []Panel    `json:"panels"`
	Templating    Templating `json:"templating"`
	// File is where the dashboard was loaded from (not part of the JSON).
	File string `json:"-"`
}

// Templating holds the dashboard's template variables.
type Templating struct {
	List []Variable `json:"list"`
}

// Variable is a template variable ($node, $gpu, $datasource).
type Variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"` // query, datasource, custom, constant, interval, ...
	IncludeAll bool   `json:"includeAll"`
	Multi      bool   `json:"multi"`
	// AllValue is what "All" stands for in a query (a regex such as ".*"); empty:
	// Grafana joins every option into a regex.
	AllValue string `json:"allValue"`
	// Query is a string or, since Grafana 10, {"query": "...", "qryType": ...}; for a
	// datasource variable it is the plugin type ("prometheus").
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *DatasourceRef  `json:"datasource"`
}

// DatasourceRef names a data source, usually "${datasource}".
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Panel is one panel; a row panel holds its collapsed panels in Panels.
type Panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Datasource  *DatasourceRef `json:"datasource"`
	GridPos     GridPos        `json:"gridPos"`
	Targets     []Target       `json:"targets"`
	FieldConfig FieldConfig    `json:"fieldConfig"`
	Repeat      string         `json:"repeat"`
	Panels      []Panel        `json:"panels"`
	Options     PanelOptions   `json:"options"`
}

// GridPos is a panel's place on the dashboard's 24-column grid.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string         `json:"refId"`
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat"`
	Instant      bool           `json:"instant"`
	Range        bool           `json:"range"`
	Hide         bool           `json:"hide"`
	Datasource   *DatasourceRef `json:"datasource"`
}

// IsInstant reports whether Grafana runs the target as an instant query (at the end
// of the time range) rather than a range query.
func (t Target) IsInstant() bool { return t.Instant && !t.Range }

// FieldConfig is the part of a panel's field configuration the renderer uses.
type FieldConfig struct {
	Defaults  FieldDefaults   `json:"defaults"`
	Overrides []FieldOverride `json:"overrides"`
}

// FieldDefaults are the panel-wide field settings.
type FieldDefaults struct {
	Unit     string      `json:"unit"`
	Min      *float64    `json:"min"`
	Max      *float64    `json:"max"`
	Decimals *int        `json:"decimals"`
	Custom   FieldCustom `json:"custom"`
	// Color and Thresholds colour a stat's value; a time series with a
	// Custom.ThresholdsStyle draws the thresholds as lines.
	Color      FieldColor `json:"color"`
	Thresholds Thresholds `json:"thresholds"`
}

// FieldCustom are the time-series panel's drawing settings.
type FieldCustom struct {
	AxisLabel       string          `json:"axisLabel"`
	Stacking        Stacking        `json:"stacking"`
	ThresholdsStyle ThresholdsStyle `json:"thresholdsStyle"`
}

// Stacking is a series' stacking mode ("none", "normal", "percent").
type Stacking struct {
	Mode string `json:"mode"`
}

// FieldOverride changes properties of the series a matcher selects.
type FieldOverride struct {
	Matcher struct {
		ID      string `json:"id"` // byName, byRegexp, ...
		Options any    `json:"options"`
	} `json:"matcher"`
	Properties []struct {
		ID    string          `json:"id"`
		Value json.RawMessage `json:"value"`
	} `json:"properties"`
}

// ErrDashboard marks a dashboard file that cannot be used.
var ErrDashboard = errors.New("invalid dashboard")

// Parse decodes one dashboard JSON model. It checks only what the checker needs: a
// uid, a title, and panels that are not nested beyond rows.
func Parse(data []byte) (Dashboard, error) {
	var d Dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return Dashboard{}, fmt.Errorf("%w: %w", ErrDashboard, err)
	}
	if d.UID == "" || d.Title == "" {
		return Dashboard{}, fmt.Errorf("%w: no uid or title", ErrDashboard)
	}
	for _, p := range d.Panels {
		for _, c := range p.Panels {
			if len(c.Panels) > 0 {
				return Dashboard{}, fmt.Errorf("%w: panel %q nests panels below a row", ErrDashboard, c.Title)
			}
		}
	}
	return d, nil
}

// Load reads every *.json file of dir as a dashboard, sorted by file name.
func Load(dir string) ([]Dashboard, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no dashboard JSON in %s: %w", dir, os.ErrNotExist)
	}
	slices.Sort(files)
	out := make([]Dashboard, 0, len(files))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		d.File = f
		out = append(out, d)
	}
	return out, nil
}

// AllPanels returns the dashboard's panels with those inside rows flattened, rows
// included, in file order.
func (d Dashboard) AllPanels() []Panel {
	var out []Panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// QueryPanels returns the panels that run queries (every panel but rows and text).
func (d Dashboard) QueryPanels() []Panel {
	var out []Panel
	for _, p := range d.AllPanels() {
		if p.Type != "row" && p.Type != "text" {
			out = append(out, p)
		}
	}
	return out
}

// QueryString returns the variable's query text: the string itself, or the "query"
// field of Grafana 10's object form.
func (v Variable) QueryString() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &o) == nil && o.Query != "" {
		return o.Query
	}
	return v.Definition
}

// labelValuesRE matches Grafana's label_values(selector, label) and label_values(label).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*?)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// LabelValuesQuery splits a label_values(...) variable query into its series
// selector (may be empty) and label; ok is false for any other query.
func LabelValuesQuery(q string) (selector, label string, ok bool) {
	m := labelValuesRE.FindStringSubmatch(q)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// ErrUnknownVariable is wrapped by Expand for a variable it has no value for.
var ErrUnknownVariable = errors.New("unknown template variable")

// variableRE matches Grafana's variable syntaxes: ${name}, ${name:format},
// [[name]], [[name:format]] and $name.
var variableRE = regexp.MustCompile(`\$\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[^}]*)?\}|\[\[([a-zA-Z_][a-zA-Z0-9_]*)(?::[^\]]*)?\]\]|\$([a-zA-Z_][a-zA-Z0-9_]*)`)

// Expand substitutes every template variable of expr with its value in vals (names
// without the $, e.g. "node", "__rate_interval"). A variable without a value is an
// error wrapping ErrUnknownVariable, so no `$` ever reaches Prometheus unexpanded.
func Expand(expr string, vals map[string]string) (string, error) {
	var missing []string
	out := variableRE.ReplaceAllStringFunc(expr, func(m string) string {
		sub := variableRE.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		v, ok := vals[name]
		if !ok {
			missing = append(missing, "$"+name)
			return m
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%w: %s in %q", ErrUnknownVariable, strings.Join(missing, ", "), expr)
	}
	return out, nil
}

// VariableValues returns the value each of the dashboard's template variables
// stands for in a check: overrides[name] when given, else the variable's "All"
// value when it has one, else ".+" (any non-empty label value). Data source
// variables are left out (they never appear in an expression).
func (d Dashboard) VariableValues(overrides map[string]string) map[string]string {
	vals := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			continue
		}
		switch {
		case overrides[v.Name] != "":
			vals[v.Name] = overrides[v.Name]
		case v.IncludeAll && v.AllValue != "":
			vals[v.Name] = v.AllValue
		default:
			vals[v.Name] = ".+"
		}
	}
	return vals
}
