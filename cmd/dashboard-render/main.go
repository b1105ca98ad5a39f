// Command dashboard-render draws Understory's Grafana dashboards from a Prometheus
// server as PNG images, one per dashboard, laid out as on Grafana's grid, and can
// check that every panel shows data (docs/grafana.md).
//
//	dashboard-render -prometheus http://prometheus:9090 -range 1h -out /tmp/dashboards
//	dashboard-render -prometheus http://prometheus:9090 -check            # no images
//
// `make dashboards` runs the end-to-end test (test/e2e/dashboards), which renders
// docs/img/dashboards/*.png from a real run with the same code (cmd/dashboard-render/grafana).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"

	"github.com/understory/understory/cmd/dashboard-render/grafana"
)

// errNoData: -check found panels or variables without data.
var errNoData = errors.New("some panels show no data")

// vars collects -var name=value flags.
type vars map[string]string

func (v vars) String() string { return fmt.Sprint(map[string]string(v)) }

func (v vars) Set(s string) error {
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want name=value", s)
	}
	v[strings.TrimPrefix(name, "$")] = val
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-render:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dashboard-render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	promURL := fs.String("prometheus", "", "Prometheus base URL, e.g. http://127.0.0.1:9090 (required)")
	dir := fs.String("dashboards", "manifests/grafana", "directory of dashboard JSON files")
	out := fs.String("out", "", "directory for <dashboard>.png (empty: render nothing)")
	rng := fs.Duration("range", time.Hour, "time range shown, ending at -end")
	endFlag := fs.String("end", "", "end of the range, RFC 3339 (default now)")
	step := fs.Duration("step", 0, "query resolution (default range/200, at least 1s)")
	rate := fs.Duration("rate-interval", time.Minute, "what $__rate_interval stands for (4 scrape intervals)")
	width := fs.Int("width", 1800, "image width in pixels")
	check := fs.Bool("check", false, "check that every panel and variable shows data; exit 1 if not")
	values := vars{}
	fs.Var(values, "var", "template variable value, name=value (repeatable; default: its All value, else .+)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *promURL == "" {
		return errors.New("-prometheus is required")
	}
	if *out == "" && !*check {
		return errors.New("nothing to do: give -out DIR, -check, or both")
	}
	end := time.Now()
	if *endFlag != "" {
		t, err := time.Parse(time.RFC3339, *endFlag)
		if err != nil {
			return fmt.Errorf("-end: %w", err)
		}
		end = t
	}
	if *rng <= 0 || *width < 100 {
		return fmt.Errorf("-range %v, -width %d: must be positive (width at least 100)", *rng, *width)
	}
	ds, err := grafana.Load(*dir)
	if err != nil {
		return err
	}
	client, err := api.NewClient(api.Config{Address: *promURL})
	if err != nil {
		return err
	}
	promAPI := v1.NewAPI(client)
	w := grafana.Window{Start: end.Add(-*rng), End: end, Step: *step, RateInterval: *rate, Values: values}

	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		for _, d := range ds {
			path := filepath.Join(*out, strings.TrimPrefix(d.UID, "understory-")+".png")
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			err = grafana.Render(ctx, promAPI, d, grafana.RenderOptions{Window: w, Width: *width}, f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("rendering %s: %w", d.UID, err)
			}
			fmt.Fprintln(stdout, path)
		}
	}
	if !*check {
		return nil
	}
	r, err := grafana.Check(ctx, promAPI, ds, w)
	if err != nil {
		return err
	}
	failed, fv := r.Failed(), r.FailedVariables()
	for _, p := range failed {
		fmt.Fprintln(stderr, "no data:", p)
	}
	for _, v := range fv {
		fmt.Fprintf(stderr, "%s variable %s lists nothing: %v\n", v.Dashboard, v.Name, v.Err)
	}
	fmt.Fprintf(stdout, "%d panels, %d variables checked: %d panels and %d variables without data\n", len(r.Panels),
		len(r.Variables), len(failed), len(fv))
	if len(failed)+len(fv) > 0 {
		return errNoData
	}
	return nil
}
