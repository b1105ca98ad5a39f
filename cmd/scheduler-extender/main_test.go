package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string // error part; "" for success
		chk  func(options) bool
	}{
		{"defaults", nil, "", func(o options) bool { return o.listen == ":8888" && o.cfg.Policy == "understory" && o.cfg.Seed != 0 }},
		{"overrides", []string{"-listen", "127.0.0.1:9000", "-policy", "bestfit", "-gang-plan-ttl", "2m",
			"-gang-bind-timeout", "10s", "-metrics-max-age", "30s", "-seed", "7"}, "",
			func(o options) bool {
				return o.listen == "127.0.0.1:9000" && o.cfg.Policy == "bestfit" && o.cfg.GangPlanTTL == 2*time.Minute &&
					o.cfg.GangBindTimeout == 10*time.Second && o.cfg.MetricsMaxAge == 30*time.Second && o.cfg.Seed == 7
			}},
		{"unknown policy", []string{"-policy", "x"}, "unknown placement policy", nil},
		{"bind wait longer than write timeout", []string{"-gang-bind-timeout", "1m"}, "write timeout", nil},
		{"stray argument", []string{"extra"}, "unexpected arguments", nil},
		{"bad duration", []string{"-assumed-ttl", "soon"}, "invalid value", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || !tc.chk(o) {
				t.Fatalf("got %+v, %v", o, err)
			}
		})
	}
}
