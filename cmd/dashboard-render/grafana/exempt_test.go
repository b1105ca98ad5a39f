package grafana

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// exemptDashboards are two dashboards for the exemption tests: "node" with a GPU
// panel, a mixed panel and a panel whose query is broken, "gpu" with only GPU data.
func exemptDashboards() []Dashboard {
	return []Dashboard{
		{UID: "node", Templating: Templating{List: []Variable{
			{Name: "node", Type: "query", Query: json.RawMessage(`"label_values(cpu, node)"`)},
		}}, Panels: []Panel{
			{ID: 1, Type: "timeseries", Title: "CPU", Targets: []Target{{RefID: "A", Expr: "cpu"}}},
			{ID: 2, Type: "timeseries", Title: "GPU used", Targets: []Target{{RefID: "A", Expr: "gpu_util"}}},
			{ID: 3, Type: "timeseries", Title: "Mixed", Targets: []Target{
				{RefID: "A", Expr: "cpu"}, {RefID: "B", Expr: "gpu_util"}, {RefID: "C", Expr: "gangs"}}},
			{ID: 4, Type: "timeseries", Title: "Broken", Targets: []Target{{RefID: "A", Expr: "bad"}}},
			{ID: 5, Type: "timeseries", Title: "Had data", Targets: []Target{{RefID: "A", Expr: "cpu"}}},
		}},
		{UID: "gpu", Templating: Templating{List: []Variable{
			{Name: "host", Type: "query", Query: json.RawMessage(`"label_values(gpu_available, hostname)"`)},
			{Name: "gpu", Type: "query", Query: json.RawMessage(`"label_values(gpu_healthy, gpu)"`)},
			{Name: "datasource", Type: "datasource", Query: json.RawMessage(`"prometheus"`)},
		}}, Panels: []Panel{
			{ID: 1, Type: "row", Title: "Devices", Panels: []Panel{
				{ID: 2, Type: "timeseries", Title: "Util", Targets: []Target{{RefID: "A", Expr: "gpu_util"}}},
			}},
			{ID: 3, Type: "stat", Title: "Healthy", Targets: []Target{{RefID: "A", Expr: "gpu_healthy", Instant: true}}},
		}},
	}
}

// TestCheckExempt: exempt panels, targets and variables that lack data are
// reported apart, not as failures; a broken query, a non-exempt target of an exempt
// panel and a variable outside the exemption still fail; an exempt target with data
// is simply OK.
func TestCheckExempt(t *testing.T) {
	t.Parallel()
	const noGPU, noGang = "no GPU on this node", "no gangs in this test"
	promAPI := fakeProm(t, map[string][]float64{"cpu": {1, 2}, "bad": nil},
		map[string][]string{"node": {"n1"}})
	exempt := []Exemption{
		{Dashboard: "node", Panel: "GPU used", Reason: noGPU},
		{Dashboard: "node", Panel: "Mixed", Targets: []string{"B"}, Reason: noGPU},
		{Dashboard: "node", Panel: "Broken", Reason: "a bad query is never excused"},
		{Dashboard: "node", Panel: "Had data", Reason: "exempt, yet has data"},
		{Dashboard: "gpu", Reason: noGPU},
		{Dashboard: "gpu", Variable: "gpu", Reason: noGPU},
	}
	start := time.Unix(1_800_000_000, 0)
	r, err := Check(context.Background(), promAPI, exemptDashboards(), Window{Start: start, End: start.Add(time.Minute)},
		exempt...)
	if err != nil {
		t.Fatal(err)
	}
	key := func(p PanelResult) string { return p.Dashboard + "/" + p.Title }
	var failed, exempted []string
	for _, p := range r.Failed() {
		failed = append(failed, key(p))
	}
	for _, p := range r.Exempted() {
		exempted = append(exempted, key(p))
		if got := p.Exempt(); len(got) != 1 || got[0] != noGPU {
			t.Errorf("%s: reasons %q, want [%q]", key(p), got, noGPU)
		}
		if s := p.String(); !strings.Contains(s, "(exempt: "+noGPU+")") {
			t.Errorf("%s: String() = %q, want the exemption's reason", key(p), s)
		}
	}
	// Mixed: B is exempt, but C (gangs) is not and lacks data.
	if want := "node/Mixed node/Broken"; strings.Join(failed, " ") != want {
		t.Errorf("failed %v, want %s", failed, want)
	}
	if want := "node/GPU used gpu/Util gpu/Healthy"; strings.Join(exempted, " ") != want {
		t.Errorf("exempted %v, want %s", exempted, want)
	}
	for _, p := range r.Panels {
		switch key(p) {
		case "node/Mixed":
			if p.Excused() || p.Targets[1].Exempt != noGPU || !p.Targets[1].excused() || p.Targets[2].Exempt != "" {
				t.Errorf("Mixed: %+v: want B excused, C not exempt, the panel failing", p)
			}
		case "node/Broken":
			if p.Excused() || !errors.Is(p.Targets[0].Err, ErrBadQuery) {
				t.Errorf("Broken: %+v: want a bad query, not excused", p)
			}
		case "node/Had data":
			if !p.OK() || p.Excused() || p.Targets[0].Exempt == "" {
				t.Errorf("Had data: %+v: want OK with its exemption noted", p)
			}
		case "node/CPU":
			if !p.OK() || p.Targets[0].Exempt != "" {
				t.Errorf("CPU: %+v: want OK, not exempt", p)
			}
		}
	}
	var fv, ev []string
	for _, v := range r.FailedVariables() {
		fv = append(fv, v.Dashboard+"/"+v.Name)
	}
	for _, v := range r.ExemptedVariables() {
		ev = append(ev, v.Dashboard+"/"+v.Name)
	}
	// gpu/host is not exempt by the dashboard-wide exemption: only panels are.
	if strings.Join(fv, " ") != "gpu/host" || strings.Join(ev, " ") != "gpu/gpu" {
		t.Errorf("variables: failed %v, exempted %v; want [gpu/host], [gpu/gpu]", fv, ev)
	}

	// Without exemptions the same run fails every panel without data, as before.
	r, err = Check(context.Background(), promAPI, exemptDashboards(), Window{Start: start, End: start.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if n, m := len(r.Failed()), len(r.Exempted()); n != 5 || m != 0 {
		t.Errorf("without exemptions: %d failed, %d exempted; want 5, 0", n, m)
	}
}

// failAPI fails the test on any query: a check refused up front must not run one.
type failAPI struct {
	API
	t *testing.T
}

func (f failAPI) FormatQuery(context.Context, string) (string, error) {
	f.t.Error("a query ran although the exemptions were invalid")
	return "", errors.New("unexpected")
}

// TestExemptionInvalid: an exemption that is incomplete, ambiguous or names what
// the dashboards do not have is refused before any query, naming it.
func TestExemptionInvalid(t *testing.T) {
	t.Parallel()
	ds := exemptDashboards()
	start := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name string
		e    Exemption
		want string
	}{
		{"no dashboard", Exemption{Panel: "CPU", Reason: "r"}, "no dashboard uid"},
		{"no reason", Exemption{Dashboard: "node", Panel: "CPU"}, "no reason"},
		{"panel and variable", Exemption{Dashboard: "node", Panel: "CPU", Variable: "node", Reason: "r"},
			"both a panel and a variable"},
		{"targets without panel", Exemption{Dashboard: "node", Targets: []string{"A"}, Reason: "r"},
			"targets without a panel"},
		{"unknown dashboard", Exemption{Dashboard: "nope", Reason: "r"}, "no such dashboard"},
		{"unknown panel", Exemption{Dashboard: "node", Panel: "GPU Used", Reason: "r"}, "no such query panel"},
		{"row is no query panel", Exemption{Dashboard: "gpu", Panel: "Devices", Reason: "r"}, "no such query panel"},
		{"unknown target", Exemption{Dashboard: "node", Panel: "Mixed", Targets: []string{"D"}, Reason: "r"},
			`no (visible) target "D"`},
		{"unknown variable", Exemption{Dashboard: "gpu", Variable: "uuid", Reason: "r"}, "no such query variable"},
		{"datasource variable", Exemption{Dashboard: "gpu", Variable: "datasource", Reason: "r"},
			"no such query variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Check(context.Background(), failAPI{t: t}, ds, Window{Start: start, End: start.Add(time.Minute)},
				Exemption{Dashboard: "gpu", Reason: "valid"}, tc.e)
			if !errors.Is(err, ErrExemption) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check with %+v: %v, want ErrExemption saying %q", tc.e, err, tc.want)
			}
		})
	}
}
