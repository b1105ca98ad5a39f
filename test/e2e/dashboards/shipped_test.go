package dashboards

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/understory/understory/cmd/dashboard-render/grafana"
	"github.com/understory/understory/internal/testenv"
)

// shippedDir is manifests/grafana, where the dashboards are shipped.
func shippedDir(t *testing.T) string {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "manifests", "grafana")
}

// TestShippedQueriesParse runs every shipped expression through a real Prometheus
// scraping nothing: each must parse and run (Prometheus' own parser, format_query
// and the query itself), expanding only the variables its dashboard defines. Data is
// the end-to-end test's job.
func TestShippedQueriesParse(t *testing.T) {
	t.Parallel()
	ds, err := grafana.Load(shippedDir(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := StartPrometheus(ctx, t, PrometheusOptions{})
	end := time.Now()
	r, err := grafana.Check(ctx, p.API(), ds, grafana.Window{Start: end.Add(-5 * time.Minute), End: end})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pr := range r.Panels {
		if pr.Err != nil {
			t.Errorf("%v", pr)
		}
		for _, tr := range pr.Targets {
			n++
			if tr.Err != nil && !errors.Is(tr.Err, grafana.ErrNoData) {
				t.Errorf("%s panel %d %q target %s: %v\n\t%s", pr.Dashboard, pr.ID, pr.Title, tr.RefID, tr.Err, tr.Expr)
			}
		}
	}
	for _, v := range r.Variables {
		if v.Err != nil && !errors.Is(v.Err, grafana.ErrNoData) {
			t.Errorf("%s variable %s: %v", v.Dashboard, v.Name, v.Err)
		}
	}
	t.Logf("%d panels, %d queries and %d variables parsed by Prometheus", len(r.Panels), n, len(r.Variables))
}
