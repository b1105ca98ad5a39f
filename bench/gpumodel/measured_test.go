package gpumodel

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// TestH200IsTheRecordedRun checks the figures the model is fitted to against the run they
// were copied from (bench/out/gpu-real.json), so that a typo or a newer recorded run
// cannot leave the fit on numbers no run measured.
func TestH200IsTheRecordedRun(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../out/gpu-real.json")
	if err != nil {
		t.Fatal(err)
	}
	var run struct {
		Phases []struct {
			Name string `json:"name"`
			LS   *struct {
				P50            float64 `json:"p50Ms"`
				P90            float64 `json:"p90Ms"`
				P99            float64 `json:"p99Ms"`
				Mean           float64 `json:"meanMs"`
				FirstSecondP99 float64 `json:"firstSecondP99Ms"`
			} `json:"ls"`
			Batch *struct {
				PerSecond float64 `json:"matmulsPerSecond"`
			} `json:"batch"`
		} `json:"phases"`
	}
	if err := json.Unmarshal(b, &run); err != nil {
		t.Fatal(err)
	}
	rows := map[string]Row{}
	for _, p := range run.Phases {
		var r Row
		if p.LS != nil {
			r = Row{P50: p.LS.P50, P90: p.LS.P90, P99: p.LS.P99, Mean: p.LS.Mean, FirstSecondP99: p.LS.FirstSecondP99}
		}
		if p.Batch != nil {
			r.Batch = p.Batch.PerSecond
		}
		rows[p.Name] = r
	}
	mean := func(a, b Row) Row {
		return Row{P50: (a.P50 + b.P50) / 2, P90: (a.P90 + b.P90) / 2, P99: (a.P99 + b.P99) / 2,
			Mean: (a.Mean + b.Mean) / 2, FirstSecondP99: (a.FirstSecondP99 + b.FirstSecondP99) / 2,
			Batch: (a.Batch + b.Batch) / 2}
	}
	m := H200()
	for _, tc := range []struct {
		name      string
		got, want Row
	}{
		{"ls-alone", m.LSAlone, rows["ls-alone"]},
		{"batch-alone", Row{Batch: m.BatchAlone}, Row{Batch: rows["batch-alone"].Batch}},
		{"deep-alone", Row{Batch: m.DeepAlone}, Row{Batch: rows["deep-alone"].Batch}},
		{"nothing", m.Nothing, rows["nothing"]},
		{"deep-nothing (mean of both)", m.DeepNothing, mean(rows["deep-nothing-1"], rows["deep-nothing-2"])},
		{"freeze (agent)", m.Freeze, rows["agent"]},
	} {
		for _, f := range []struct {
			field     string
			got, want float64
		}{
			{"p50", tc.got.P50, tc.want.P50}, {"p90", tc.got.P90, tc.want.P90}, {"p99", tc.got.P99, tc.want.P99},
			{"mean", tc.got.Mean, tc.want.Mean}, {"first-second p99", tc.got.FirstSecondP99, tc.want.FirstSecondP99},
			{"batch", tc.got.Batch, tc.want.Batch},
		} {
			if math.Abs(f.got-f.want) > 1e-3*math.Max(1, math.Abs(f.want)) {
				t.Errorf("%s %s: H200() has %v, the recorded run %v", tc.name, f.field, f.got, f.want)
			}
		}
	}
}
