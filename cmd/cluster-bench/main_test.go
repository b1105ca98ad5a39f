package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/bench/clusterbench"
)

func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.csv")
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("t_s,node,ls_cpu,ls_mem\n0,a,2,0.1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "cluster.json")
	rep := clusterbench.NewReport(clusterbench.DefaultOptions(500), "v1.34.4", "v0.7.0", []clusterbench.SizeResult{
		{Nodes: 500, CPUUtilWith: 0.5, CPUUtilWithout: 0.2, APIRequestsPerSec: 100, Series: []clusterbench.Point{{T: 10, With: 0.5, Without: 0.2}}},
		{Nodes: 1000, CPUUtilWith: 0.5, CPUUtilWithout: 0.2, CPUUtilGainPoints: 30, APIRequestsPerSec: 200,
			Admission: true, AdmissionCallsPerSec: 42.5, AdmissionMutateP99Ms: 1.25,
			Kueue: true, KueueWorkloadsCreated: 120, KueueWorkloadsAdmitted: 100, KueueWorkloadsFinished: 80,
			KueueTenantCPUShares: map[string]float64{"tenant-a": 0.52, "tenant-b": 0.48}, KueueFairShareError: 0.04,
			KueueEvictionsByReason: map[string]int{"Preempted": 3, "PodsReadyTimeout": 1}, KueueWorkloadsEvicted: 4,
			KueueWorkers: 20},
	})
	if err := clusterbench.WriteReport(report, rep); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"no command", nil, 2, ""},
		{"unknown", []string{"frob"}, 2, ""},
		{"synth", []string{"synth-ls", "-nodes", "3", "-length", "10m", "-step", "30s", "-out", trace}, 0, ""},
		{"bad synth", []string{"synth-ls", "-step", "0s"}, 2, ""},
		{"check", []string{"check-ls", "-in", trace}, 0, "3 nodes, 60 samples"},
		{"check bad", []string{"check-ls", "-in", bad}, 1, ""},
		{"check missing", []string{"check-ls"}, 1, ""},
		{"report", []string{"report", "-in", report, "-png", filepath.Join(dir, "p.png")}, 0, "cpu_util_gain_points"},
		{"report webhook", []string{"report", "-in", report}, 0, "42.5"},
		{"report webhook off", []string{"report", "-in", report}, 0, "off"},
		{"report kueue", []string{"report", "-in", report}, 0, "1000 nodes: kueue Workloads 120 created, 100 admitted, 80 finished"},
		{"report kueue shares", []string{"report", "-in", report}, 0, "tenant-a 0.52 tenant-b 0.48 (fair-share error 0.04"},
		{"report kueue workers", []string{"report", "-in", report}, 0, "(20 Job and Workload workers)"},
		{"report kueue evictions", []string{"report", "-in", report}, 0, "4 evicted (PodsReadyTimeout 1, Preempted 3); partial gangs 0"},
		{"stray arg", []string{"report", "x"}, 2, ""},
	} {
		// Sequential: "check" reads what "synth" wrote.
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code {
			t.Fatalf("%s: exit %d, want %d (stderr %s)", tc.name, code, tc.code, errb.String())
		}
		if !strings.Contains(out.String(), tc.out) {
			t.Errorf("%s: output %q lacks %q", tc.name, out.String(), tc.out)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "p.png")); err != nil || fi.Size() == 0 {
		t.Errorf("png not written: %v", err)
	}
}
