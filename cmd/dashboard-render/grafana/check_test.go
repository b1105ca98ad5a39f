package grafana

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
)

// fakeProm answers Prometheus' API for the queries it knows: exprs maps an
// expression to the values of its one series ("bad" answers bad_data, absent
// answers an empty result); labels maps a label to its values.
func fakeProm(t *testing.T, exprs map[string][]float64, labels map[string][]string) v1.API {
	t.Helper()
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			t.Error(err)
		}
		q := r.Form.Get("query")
		seen = append(seen, r.URL.Path+" "+q)
		reply := func(code int, body any) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(body)
		}
		ok := func(data any) { reply(200, map[string]any{"status": "success", "data": data}) }
		vals, known := exprs[q]
		if known && vals == nil {
			reply(400, map[string]any{"status": "error", "errorType": "bad_data", "error": "parse error"})
			return
		}
		switch {
		case r.URL.Path == "/api/v1/format_query":
			ok(q)
		case strings.HasPrefix(r.URL.Path, "/api/v1/label/"):
			name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/label/"), "/values")
			ok(append([]string{}, labels[name]...))
		case r.URL.Path == "/api/v1/query_range":
			var ps [][]any
			for i, v := range vals {
				s := fmt.Sprint(v)
				if math.IsNaN(v) {
					s = "NaN"
				}
				ps = append(ps, []any{1000 + i, s})
			}
			res := []any{}
			if len(ps) > 0 {
				res = append(res, map[string]any{"metric": map[string]string{"a": "b"}, "values": ps})
			}
			ok(map[string]any{"resultType": "matrix", "result": res})
		case r.URL.Path == "/api/v1/query":
			res := []any{}
			if len(vals) > 0 {
				res = append(res, map[string]any{"metric": map[string]string{}, "value": []any{1000, fmt.Sprint(vals[0])}})
			}
			ok(map[string]any{"resultType": "vector", "result": res})
		default:
			reply(404, map[string]any{"status": "error", "errorType": "not_found", "error": r.URL.Path})
		}
	}))
	t.Cleanup(srv.Close)
	c, err := api.NewClient(api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return v1.NewAPI(c)
}

func TestCheckClassifies(t *testing.T) {
	t.Parallel()
	d := Dashboard{UID: "u", Title: "t", Templating: Templating{List: []Variable{
		{Name: "datasource", Type: "datasource", Query: json.RawMessage(`"prometheus"`)},
		{Name: "node", Type: "query", IncludeAll: true, AllValue: ".*",
			Query: json.RawMessage(`{"query":"label_values(up{job=\"a\"}, node)"}`)},
		{Name: "gpu", Type: "query", Query: json.RawMessage(`"label_values(gpus, gpu)"`)},
	}}, Panels: []Panel{
		{ID: 1, Type: "row", Title: "row", Panels: []Panel{
			{ID: 2, Type: "timeseries", Title: "data", Targets: []Target{{RefID: "A", Expr: `up{node=~"$node"}[$__rate_interval]`}}},
		}},
		{ID: 3, Type: "timeseries", Title: "nan only", Targets: []Target{{RefID: "A", Expr: "nan"}}},
		{ID: 4, Type: "timeseries", Title: "one empty target", Targets: []Target{
			{RefID: "A", Expr: "up"}, {RefID: "B", Expr: "absent"}}},
		{ID: 5, Type: "stat", Title: "bad", Targets: []Target{{RefID: "A", Expr: "bad", Instant: true}}},
		{ID: 6, Type: "stat", Title: "instant", Targets: []Target{{RefID: "A", Expr: `x[$__range]`, Instant: true}}},
		{ID: 7, Type: "timeseries", Title: "unknown var", Targets: []Target{{RefID: "A", Expr: `x{a="$nope"}`}}},
		{ID: 8, Type: "timeseries", Title: "no targets"},
		{ID: 9, Type: "timeseries", Title: "hidden only", Targets: []Target{{RefID: "A", Expr: "up", Hide: true}}},
		{ID: 10, Type: "text", Title: "text"},
	}}
	promAPI := fakeProm(t, map[string][]float64{
		`up{node=~".*"}[4s]`: {1, 2}, "nan": {math.NaN(), math.NaN()}, "up": {1}, "bad": nil,
		`x[60s]`: {3},
	}, map[string][]string{"node": {"n1"}})
	start := time.Unix(1_800_000_000, 0)
	r, err := Check(context.Background(), promAPI, []Dashboard{d}, Window{Start: start, End: start.Add(time.Minute),
		RateInterval: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]error{2: nil, 3: ErrNoData, 4: ErrNoData, 5: ErrBadQuery, 6: nil, 7: ErrUnknownVariable,
		8: ErrNoQuery, 9: ErrNoQuery}
	if len(r.Panels) != len(want) {
		t.Fatalf("%d panels checked, want %d (rows and text panels skipped): %+v", len(r.Panels), len(want), r.Panels)
	}
	for _, p := range r.Panels {
		var got error
		if p.Err != nil {
			got = p.Err
		}
		for _, tr := range p.Targets {
			if tr.Err != nil && got == nil {
				got = tr.Err
			}
		}
		if w := want[p.ID]; (w == nil) != (got == nil) || (w != nil && !errors.Is(got, w)) {
			t.Errorf("panel %d %q: %v, want %v", p.ID, p.Title, got, w)
		}
		if p.OK() != (want[p.ID] == nil) {
			t.Errorf("panel %d OK() = %v", p.ID, p.OK())
		}
	}
	if n := len(r.Failed()); n != 6 {
		t.Errorf("%d failed panels, want 6", n)
	}
	if got := r.Panels[0].Targets[0]; got.Series != 1 || got.Points != 2 {
		t.Errorf("data panel: %d series, %d points; want 1, 2", got.Series, got.Points)
	}
	fv := r.FailedVariables()
	if len(r.Variables) != 2 || len(fv) != 1 || fv[0].Name != "gpu" || !errors.Is(fv[0].Err, ErrNoData) {
		t.Errorf("variables %+v: want node listing n1 and gpu failing with no data", r.Variables)
	}
	if _, err := Check(context.Background(), promAPI, []Dashboard{d}, Window{Start: start, End: start}); !errors.Is(err, ErrWindow) {
		t.Errorf("empty window: %v, want ErrWindow", err)
	}
}
