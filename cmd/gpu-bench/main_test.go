package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/cgroups/cgroupstest"
)

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-duties", "0.5,1"}, `-duties: "1" is not a fraction in (0, 1)`},
		{[]string{"-duties", "x"}, `-duties: "x"`},
		{[]string{"-duties", " , "}, "-duties: no duty given"},
		{[]string{"-period", "1ms"}, "-period 1ms not in [10ms, 1s]"},
		{[]string{"-window", "150ms"}, "-window 150ms must be a whole number of periods (100ms)"},
		{[]string{"-point", "100ms"}, "-point 100ms must be at least one window (500ms)"},
		{[]string{"-freezers", "v3"}, `-freezers: "v3" is neither v1 nor v2`},
		{[]string{"-freezers", "v1,v1"}, "-freezers: v1 given twice"},
		{[]string{"-freezers", ","}, "-freezers: none given"},
		{[]string{"-cgroup-root", ""}, "-cgroup-root: empty"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-nope"}, "flag provided but not defined"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// The bench end to end with a short setting, on this machine's real freezers: it writes
// the JSON with every point and removes its cgroups. Accuracy is the duty package's test
// (and the bench's own output), not checked here.
func TestBenchShort(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the bench test must run in CI, as root")
		}
		t.Skip("the duty bench creates cgroups: needs root")
	}
	cgroupstest.LockCPU(t)
	out := filepath.Join(t.TempDir(), "sub", "gpu.json")
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"-out", out, "-point", "400ms", "-window", "200ms",
		"-duties", "0.25,0.75"}, &stdout, io.Discard)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	t.Log(stdout.String())
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if len(res.Duty) == 0 || len(res.DutyErrorPct) != 2 {
		t.Fatalf("result %s", b)
	}
	for _, key := range []string{"25", "75"} {
		if v, ok := res.DutyErrorPct[key]; !ok || math.IsNaN(v) || v < 0 || v > 100 {
			t.Fatalf("duty_error_pct[%s] = %v, %v in %s", key, v, ok, b)
		}
	}
	for _, r := range res.Duty {
		if len(r.Points) != 2 || r.Points[0].Windows != 2 || r.Points[0].BaselineCPUs <= 0 {
			t.Fatalf("%s points %+v", r.Freezer, r.Points)
		}
	}
	for _, want := range []string{`"period_ms": 100`, `"window_ms": 200`, `"duty_error_max_pct"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s", want)
		}
	}
	if strings.Contains(string(b), "reaction_ms") || strings.Contains(string(b), "collect_us_per_device") {
		t.Errorf("parts that did not run appear in %s", b)
	}
	for _, c := range []string{"freezer", "unified", "cpu", "memory", ""} {
		dir := filepath.Join("/sys/fs/cgroup", c)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "understory-gpu-bench-") {
				t.Errorf("left behind %s/%s", dir, e.Name())
			}
		}
	}
}
