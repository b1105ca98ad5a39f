package grafana

import (
	"testing"

	"github.com/prometheus/common/model"
)

func TestFormatUnit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{0.5, "percentunit", "50%"},
		{0.12345, "percentunit", "12.3%"}, // three significant digits,
		{3 << 30, "bytes", "3 GiB"},
		{1536, "bytes", "1.5 KiB"},
		{0.115, "s", "115 ms"},
		{2.5e-5, "s", "25 µs"},
		{2, "s", "2 s"},
		{0, "s", "0"},
		{0.25, "ops", "0.25/s"},
		{3, "reqps", "3 req/s"},
		{12500, "short", "12.5k"},
		{2.5e6, "", "2.5M"},
		{-0.5, "short", "-0.5"},
	} {
		if got := formatUnit(tc.v, tc.unit); got != tc.want {
			t.Errorf("formatUnit(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
}

func TestLegendAndTitle(t *testing.T) {
	t.Parallel()
	m := model.Metric{"node": "n1", "gpu": "3"}
	for _, tc := range []struct{ format, want string }{
		{"{{node}} #{{gpu}}", "n1 #3"},
		{"{{ node }}{{Hostname}} used", "n1 used"},
		{"budget", "budget"},
		{"", `{gpu="3", node="n1"}`},
	} {
		if got := legend(tc.format, m); got != tc.want {
			t.Errorf("legend(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
	d := Dashboard{Templating: Templating{List: []Variable{{Name: "node", Type: "query", IncludeAll: true, AllValue: ".*"}}}}
	if got := displayTitle("CPU — $node", d, map[string]string{"node": ".*"}); got != "CPU — All" {
		t.Errorf("title %q, want CPU — All", got)
	}
	if got := displayTitle("CPU — $node", d, map[string]string{"node": "n1"}); got != "CPU — n1" {
		t.Errorf("title %q, want CPU — n1", got)
	}
}
