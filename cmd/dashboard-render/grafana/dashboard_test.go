package grafana

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// shippedDir is manifests/grafana, where the dashboards are shipped (tests run in
// this package's folder).
func shippedDir(t *testing.T) string {
	t.Helper()
	return filepath.Join("..", "..", "..", "manifests", "grafana")
}

// TestShippedDashboards checks what Grafana and the sidecar need of every shipped
// dashboard without a Prometheus: the four dashboards, schemaVersion >= 39, uid and
// title prefixed "understory", a prometheus data source variable that every panel
// and target uses, unique panel ids, panels within the 24-column grid, a query per
// query panel, and no variable a query uses that the dashboard does not define.
func TestShippedDashboards(t *testing.T) {
	t.Parallel()
	ds, err := Load(shippedDir(t))
	if err != nil {
		t.Fatal(err)
	}
	wantUIDs := map[string]bool{"understory-node": false, "understory-ls-harm": false, "understory-gpu": false,
		"understory-scheduler": false}
	for _, d := range ds {
		t.Run(d.UID, func(t *testing.T) {
			t.Parallel()
			if _, ok := wantUIDs[d.UID]; !ok {
				t.Errorf("unexpected dashboard uid %q (file %s)", d.UID, d.File)
			}
			if !strings.HasPrefix(d.UID, "understory") || !strings.HasPrefix(strings.ToLower(d.Title), "understory") {
				t.Errorf("uid %q, title %q: both must start with understory", d.UID, d.Title)
			}
			if d.SchemaVersion < 39 {
				t.Errorf("schemaVersion %d, want >= 39", d.SchemaVersion)
			}
			var dsVar bool
			defined := map[string]bool{}
			for _, v := range d.Templating.List {
				defined[v.Name] = true
				if v.Type == "datasource" && v.Name == "datasource" && v.QueryString() == "prometheus" {
					dsVar = true
				}
				if v.Type == "query" {
					if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
						t.Errorf("variable %s does not use ${datasource}", v.Name)
					}
					if _, _, ok := LabelValuesQuery(v.QueryString()); !ok {
						t.Errorf("variable %s: query %q is not label_values(...)", v.Name, v.QueryString())
					}
				}
			}
			if !dsVar {
				t.Error("no datasource variable of type prometheus named datasource")
			}
			// Every variable a query may use: the dashboard's and Grafana's built-ins.
			vals := Window{}.values(d)
			for name := range defined {
				vals[name] = "x"
			}
			ids := map[int]bool{}
			for _, p := range d.AllPanels() {
				if ids[p.ID] {
					t.Errorf("panel id %d twice", p.ID)
				}
				ids[p.ID] = true
				if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
					t.Errorf("panel %d %q: gridPos %+v outside the 24-column grid", p.ID, p.Title, p.GridPos)
				}
				if p.Repeat != "" && !defined[p.Repeat] {
					t.Errorf("panel %d repeats over undefined variable %q", p.ID, p.Repeat)
				}
			}
			for _, p := range d.QueryPanels() {
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %d %q does not use ${datasource}", p.ID, p.Title)
				}
				if p.Description == "" {
					t.Errorf("panel %d %q has no description", p.ID, p.Title)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %d %q has no query", p.ID, p.Title)
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
						t.Errorf("panel %d target %s does not use ${datasource}", p.ID, tg.RefID)
					}
					if tg.RefID == "" || refs[tg.RefID] {
						t.Errorf("panel %d: refId %q empty or repeated", p.ID, tg.RefID)
					}
					refs[tg.RefID] = true
					if _, err := Expand(tg.Expr, vals); err != nil {
						t.Errorf("panel %d %q target %s: %v", p.ID, p.Title, tg.RefID, err)
					}
				}
			}
		})
	}
	t.Cleanup(func() {
		for _, d := range ds {
			wantUIDs[d.UID] = true
		}
		for uid, seen := range wantUIDs {
			if !seen {
				t.Errorf("dashboard %s missing from manifests/grafana", uid)
			}
		}
	})
}

// TestKustomizationListsEveryDashboard: every JSON file is in a ConfigMap of the
// kustomization, labelled for Grafana's sidecar, in understory-system.
func TestKustomizationListsEveryDashboard(t *testing.T) {
	t.Parallel()
	dir := shippedDir(t)
	k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.Contains(string(k), "files: ["+filepath.Base(f)+"]") {
			t.Errorf("%s is not in a configMapGenerator of kustomization.yaml", filepath.Base(f))
		}
	}
	for _, want := range []string{`grafana_dashboard: "1"`, "namespace: understory-system"} {
		if !strings.Contains(string(k), want) {
			t.Errorf("kustomization.yaml lacks %q", want)
		}
	}
}

func TestExpand(t *testing.T) {
	t.Parallel()
	vals := map[string]string{"node": ".*", "gpu": "0", "__rate_interval": "4s", "__range": "90s"}
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{in: `rate(x{node=~"$node"}[$__rate_interval])`, want: `rate(x{node=~".*"}[4s])`},
		{in: `x{gpu="${gpu}"}`, want: `x{gpu="0"}`},
		{in: `x{gpu="${gpu:regex}"}`, want: `x{gpu="0"}`},
		{in: `x{gpu="[[gpu]]"}`, want: `x{gpu="0"}`},
		{in: `increase(x[$__range]) / $__range`, want: `increase(x[90s]) / 90s`},
		{in: `x{a=~"b$"}`, want: `x{a=~"b$"}`}, // a regex anchor is no variable
		{in: `x{node=~"$nodes"}`, err: ErrUnknownVariable},
		{in: `x[$__interval]`, err: ErrUnknownVariable},
		{in: ``, want: ``},
	} {
		got, err := Expand(tc.in, vals)
		if !errors.Is(err, tc.err) || (tc.err == nil && got != tc.want) {
			t.Errorf("Expand(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestLabelValuesQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, sel, label string
		ok             bool
	}{
		{`label_values(up, node)`, "up", "node", true},
		{` label_values( understory_gpu_healthy{node=~"$node"} , gpu ) `, `understory_gpu_healthy{node=~"$node"}`, "gpu", true},
		{`label_values(node)`, "", "node", true},
		{`query_result(up)`, "", "", false},
		{`label_values(up, 1x)`, "", "", false},
	} {
		sel, label, ok := LabelValuesQuery(tc.in)
		if sel != tc.sel || label != tc.label || ok != tc.ok {
			t.Errorf("LabelValuesQuery(%q) = %q, %q, %v; want %q, %q, %v", tc.in, sel, label, ok, tc.sel, tc.label, tc.ok)
		}
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		``, `[]`, `{"uid": "x"}`, `{"title": "x"}`,
		`{"uid":"x","title":"y","panels":[{"type":"row","panels":[{"panels":[{}]}]}]}`,
		`{"uid":"x","title":"y","panels":"no"}`,
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrDashboard) {
			t.Errorf("Parse(%q) = %v, want ErrDashboard", in, err)
		}
	}
}

// FuzzParse: any input is a dashboard or an ErrDashboard, and a parsed dashboard's
// expressions expand or fail with ErrUnknownVariable, never panic.
func FuzzParse(f *testing.F) {
	// Small seeds in the shipped dashboards' shape (the shipped files themselves, 30 KB
	// each, slow Go's mutator down to a few inputs a second).
	f.Add([]byte(`{"uid":"understory-gpu","title":"Understory / GPU — per device","schemaVersion":39,` +
		`"templating":{"list":[{"name":"datasource","type":"datasource","query":"prometheus"},` +
		`{"name":"node","type":"query","includeAll":true,"allValue":".*","datasource":{"type":"prometheus",` +
		`"uid":"${datasource}"},"query":{"qryType":1,"query":"label_values(understory_gpu_available, node)"}}]},` +
		`"panels":[{"id":1,"type":"row","title":"Devices","gridPos":{"h":1,"w":24,"x":0,"y":0},"panels":[]},` +
		`{"id":2,"type":"timeseries","title":"GPU — $node","repeat":"node","gridPos":{"h":8,"w":12,"x":0,"y":1},` +
		`"fieldConfig":{"defaults":{"unit":"percentunit","min":0,"decimals":1,"custom":{"stacking":{"mode":"normal"}}},` +
		`"overrides":[{"matcher":{"id":"byRegexp","options":"GPUs"},"properties":[{"id":"custom.stacking",` +
		`"value":{"mode":"none"}}]}]},"targets":[{"refId":"A","expr":"(DCGM_FI_DEV_GPU_UTIL / 100 and on(UUID) ` +
		`understory_gpu_healthy{node=~\"$node\"}) or on(UUID) understory_gpu_utilization_ratio{node=~\"$node\"}",` +
		`"legendFormat":"{{node}} #{{gpu}}"},{"refId":"B","expr":"increase(x[$__range])","instant":true}]}]}`))
	f.Add([]byte(`{"uid":"u","title":"t","templating":{"list":[{"name":"n","type":"query","query":{"query":"label_values(x, n)"}}]},` +
		`"panels":[{"type":"timeseries","targets":[{"expr":"x{a=\"$n\"}[$__rate_interval]"}]}]}`))
	f.Add([]byte(`{"uid":"u","title":"t","panels":[{"type":"row","panels":[{"targets":[{"expr":"${x:csv}"}]}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrDashboard) {
				t.Fatalf("error %v does not wrap ErrDashboard", err)
			}
			return
		}
		vals := Window{}.values(d)
		for _, v := range d.Templating.List {
			_ = v.QueryString()
			LabelValuesQuery(v.QueryString())
		}
		for _, p := range d.QueryPanels() {
			for _, tg := range p.Targets {
				if _, err := Expand(tg.Expr, vals); err != nil && !errors.Is(err, ErrUnknownVariable) {
					t.Fatalf("Expand(%q): %v", tg.Expr, err)
				}
			}
		}
	})
}
