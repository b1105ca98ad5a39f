package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProm answers Prometheus' HTTP API: every query with one series (empty: none),
// every label with one value.
func fakeProm(t *testing.T, empty bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			t.Error(err)
		}
		var data any
		switch {
		case r.URL.Path == "/api/v1/format_query":
			data = r.Form.Get("query")
		case strings.HasPrefix(r.URL.Path, "/api/v1/label/"):
			data = []string{"n1"}
		case r.URL.Path == "/api/v1/query_range":
			res := []any{}
			if !empty {
				var vals [][]any
				start := time.Now().Add(-time.Hour).Unix()
				for i := range 50 {
					vals = append(vals, []any{start + int64(i)*60, fmt.Sprint(i % 7)})
				}
				res = append(res, map[string]any{"metric": map[string]string{"node": "n1"}, "values": vals})
			}
			data = map[string]any{"resultType": "matrix", "result": res}
		case r.URL.Path == "/api/v1/query":
			res := []any{}
			if !empty {
				res = append(res, map[string]any{"metric": map[string]string{}, "value": []any{time.Now().Unix(), "0.125"}})
			}
			data = map[string]any{"resultType": "vector", "result": res}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

const shipped = "../../manifests/grafana"

func TestRenderAndCheck(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-prometheus", fakeProm(t, false), "-dashboards", shipped, "-out", out,
		"-check", "-var", "node=n1", "-width", "1200"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	files, _ := filepath.Glob(filepath.Join(shipped, "*.json"))
	for _, name := range []string{"node", "ls-harm", "gpu", "scheduler"} {
		f, err := os.Open(filepath.Join(out, name+".png"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s.png: %v", name, err)
		}
		if cfg.Width != 1200 || cfg.Height < 400 {
			t.Errorf("%s.png is %dx%d, want 1200 wide and a few panels high", name, cfg.Width, cfg.Height)
		}
		if !strings.Contains(stdout.String(), filepath.Join(out, name+".png")) {
			t.Errorf("stdout does not name %s.png:\n%s", name, stdout.String())
		}
	}
	if len(files) != 4 || !strings.Contains(stdout.String(), "0 panels and 0 variables without data") {
		t.Errorf("%d dashboards; stdout:\n%s", len(files), stdout.String())
	}
}

func TestCheckFailsOnEmptyPanels(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-prometheus", fakeProm(t, true), "-dashboards", shipped, "-check"},
		&stdout, &stderr)
	if !errors.Is(err, errNoData) {
		t.Fatalf("run = %v, want errNoData", err)
	}
	if !strings.Contains(stderr.String(), "no data: understory-gpu panel") {
		t.Errorf("stderr does not name the empty panels:\n%s", stderr.String())
	}
}

func TestBadArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},                          // no -prometheus
		{"-prometheus", "http://x"}, // nothing to do
		{"-prometheus", "http://x", "-check", "-var", "novalue"},
		{"-prometheus", "http://x", "-check", "-end", "yesterday"},
		{"-prometheus", "http://x", "-check", "-range", "-1h"},
		{"-prometheus", "http://x", "-check", "-dashboards", "/nonexistent"},
		{"-prometheus", "http://x", "-check", "extra"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
