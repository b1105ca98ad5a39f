package clusterbench

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/understory/understory/bench/openb"
)

func TestParseLSTrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		err      bool
		nodes    int
		length   time.Duration
		cpuReq   float64
	}{
		{name: "minimal", in: "t_s,node,ls_cpu,ls_mem\n100,a,0.2,0.4\n115,a,0.3,0.4\n100,b,0.1,0.2\n115,b,0.5,0.2\n",
			nodes: 2, length: 30 * time.Second, cpuReq: 0.3},
		{name: "requests and extra columns", in: "x,ls_mem,ls_cpu,node,t_s,ls_cpu_req\n1,0.4,0.2,a,0,0.6\n",
			nodes: 1, length: time.Second, cpuReq: 0.6},
		{name: "missing column", in: "t_s,node,ls_cpu\n0,a,0.1\n", err: true},
		{name: "above one", in: "t_s,node,ls_cpu,ls_mem\n0,a,1.5,0.1\n", err: true},
		{name: "NaN", in: "t_s,node,ls_cpu,ls_mem\n0,a,NaN,0.1\n", err: true},
		{name: "empty node", in: "t_s,node,ls_cpu,ls_mem\n0,,0.1,0.1\n", err: true},
		{name: "no rows", in: "t_s,node,ls_cpu,ls_mem\n", err: true},
		{name: "empty", in: "", err: true},
		{name: "two years", in: "t_s,node,ls_cpu,ls_mem\n0,a,0.1,0.1\n63072000,a,0.1,0.1\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr, err := ParseLSTrace(strings.NewReader(tc.in), "trace.csv")
			if tc.err {
				if !errors.Is(err, ErrBadTrace) {
					t.Fatalf("err = %v, want ErrBadTrace", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Nodes) != tc.nodes || tr.Length != tc.length || tr.Nodes[0].CPURequest != tc.cpuReq {
				t.Fatalf("nodes %d length %v req %v, want %d %v %v", len(tr.Nodes), tr.Length, tr.Nodes[0].CPURequest,
					tc.nodes, tc.length, tc.cpuReq)
			}
		})
	}
}

func TestLSTraceAt(t *testing.T) {
	t.Parallel()
	tr, err := ParseLSTrace(strings.NewReader("t_s,node,ls_cpu,ls_mem\n0,a,0.1,0.5\n10,a,0.2,0.5\n20,a,0.3,0.5\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   time.Duration
		want float64
	}{{0, 0.1}, {9 * time.Second, 0.1}, {10 * time.Second, 0.2}, {29 * time.Second, 0.3}, {30 * time.Second, 0.1}} {
		if got := tr.At(0, tc.at).CPU; got != tc.want {
			t.Errorf("At(0, %v) = %v, want %v", tc.at, got, tc.want)
		}
	}
}

func TestSynthesizeRoundTrip(t *testing.T) {
	t.Parallel()
	p := DefaultSynthParams(3, 10*time.Minute, 1)
	tr := Synthesize(p)
	var buf bytes.Buffer
	if err := tr.WriteCSV(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ParseLSTrace(&buf, "synth")
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Nodes) != 3 || back.Length != tr.Length {
		t.Fatalf("round trip: %d nodes, length %v; want 3, %v", len(back.Nodes), back.Length, tr.Length)
	}
	for _, n := range tr.Nodes {
		for _, s := range n.Samples {
			if s.CPU < 0.01 || s.CPU > p.CPURequest || s.Memory < 0 || s.Memory > n.MemRequest {
				t.Fatalf("sample %+v outside [0.01, %v] / [0, %v]", s, p.CPURequest, n.MemRequest)
			}
		}
	}
}

func FuzzParseLSTrace(f *testing.F) {
	f.Add("t_s,node,ls_cpu,ls_mem\n0,a,0.1,0.5\n10,a,0.2,0.5\n")
	f.Add("node,t_s,ls_mem,ls_cpu,ls_mem_req\nb,-5,0,1,1\n")
	f.Add("t_s,node,ls_cpu,ls_mem\n1e300,a,0.1,0.1\n")
	f.Fuzz(func(t *testing.T, in string) {
		tr, err := ParseLSTrace(strings.NewReader(in), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrBadTrace) {
				t.Fatalf("error without ErrBadTrace: %v", err)
			}
			return
		}
		if tr.Length <= 0 {
			t.Fatalf("length %v", tr.Length)
		}
		for i := range tr.Nodes {
			s := tr.At(i, 0)
			if math.IsNaN(s.CPU) || s.CPU < 0 || s.CPU > 1 {
				t.Fatalf("At = %+v", s)
			}
		}
	})
}

func TestBuildWorkload(t *testing.T) {
	t.Parallel()
	in := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
		"p0,4000,1024,0,0,,BE,Running,0,600,0\n" +
		"p1,8000,2048,1,500,,LS,Running,0,1200,0\n" +
		"p2,1000,1024,0,0,,BE,Pending,0,,\n"
	tasks, err := ParseOpenbTasks(strings.NewReader(in), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 {
		t.Fatalf("%d tasks, want 2 (the pending one has no times)", len(tasks))
	}
	p := WorkloadParams{Span: time.Hour, Compression: 20, MinDuration: 10 * time.Second, MaxDuration: time.Minute,
		CPULoad: 1, GPULoad: 1, SpareCPUMilli: 100_000, GPUMilli: 8000, GangShare: 0.5, GangMax: 4, Seed: 1}
	jobs, err := BuildWorkload(tasks, p)
	if err != nil {
		t.Fatal(err)
	}
	var cpuWork, gpuWork float64
	gangs := 0
	for i, j := range jobs {
		if i > 0 && j.At < jobs[i-1].At {
			t.Fatal("jobs not sorted by arrival")
		}
		if j.Duration < p.MinDuration || j.Duration > p.MaxDuration {
			t.Fatalf("duration %v outside bounds", j.Duration)
		}
		if j.GPU() {
			gpuWork += float64(j.NumGPU*j.GPUMilli) * j.Duration.Seconds()
		} else {
			cpuWork += float64(j.CPUMilli*int64(j.Members)) * j.Duration.Seconds()
		}
		if j.Members > 1 {
			gangs++
		}
	}
	// Offered load within 15 % of the asked one over an hour.
	if got := cpuWork / p.Span.Seconds() / p.SpareCPUMilli; got < 0.85 || got > 1.15 {
		t.Errorf("offered CPU load %.2f, want about 1", got)
	}
	if got := gpuWork / p.Span.Seconds() / p.GPUMilli; got < 0.85 || got > 1.15 {
		t.Errorf("offered GPU load %.2f, want about 1", got)
	}
	if gangs == 0 {
		t.Error("no gang")
	}
}

func parseMetrics(t *testing.T, s string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	f, err := p.TextToMetricFamilies(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestHistogramQuantileAndRates(t *testing.T) {
	t.Parallel()
	h := func(a, b, c, inf int) string {
		return "# TYPE x histogram\n" +
			`x_bucket{verb="filter",le="0.001"} ` + itoa(a) + "\n" +
			`x_bucket{verb="filter",le="0.005"} ` + itoa(b) + "\n" +
			`x_bucket{verb="filter",le="0.01"} ` + itoa(c) + "\n" +
			`x_bucket{verb="filter",le="+Inf"} ` + itoa(inf) + "\n" +
			`x_sum{verb="filter"} 1` + "\n" + `x_count{verb="filter"} ` + itoa(inf) + "\n" +
			"# TYPE apiserver_request_total counter\n" +
			`apiserver_request_total{verb="PATCH",resource="nodes",subresource="status",code="200"} ` + itoa(inf) + "\n"
	}
	before, after := parseMetrics(t, h(10, 10, 10, 10)), parseMetrics(t, h(60, 110, 110, 110))
	q, n := histogramQuantile(before, after, "x", "filter", 0.5)
	if n != 100 || math.Abs(q-0.001) > 1e-9 {
		t.Errorf("p50 = %v over %d, want 0.001 over 100", q, n)
	}
	q, _ = histogramQuantile(before, after, "x", "filter", 0.99)
	if want := 0.001 + 0.004*(99-50)/50.0; math.Abs(q-want) > 1e-9 {
		t.Errorf("p99 = %v, want %v", q, want)
	}
	if q, n := histogramQuantile(before, before, "x", "filter", 0.99); !math.IsNaN(q) || n != 0 {
		t.Errorf("no observations: %v, %d; want NaN, 0", q, n)
	}
	rates := requestRates(before, after, 10)
	if len(rates) != 1 || rates[0].PerSec != 10 || rates[0].Subresource != "status" {
		t.Errorf("rates = %+v, want PATCH nodes/status 10/s", rates)
	}
}

func TestSlopes(t *testing.T) {
	t.Parallel()
	sizes := []SizeResult{{Nodes: 1000, APIRequestsPerSec: 200, AgentNodeWritesPerSec: 10},
		{Nodes: 500, APIRequestsPerSec: 100, AgentNodeWritesPerSec: 5}}
	for _, s := range Slopes(sizes) {
		switch s.Metric {
		case "api_requests_per_s":
			if math.Abs(s.PerNode-0.2) > 1e-9 || math.Abs(s.Exponent-1) > 1e-9 || !s.Linear {
				t.Errorf("%+v, want 0.2/node, exponent 1", s)
			}
		case "agent_node_writes_per_s":
			if math.Abs(s.PerNode-0.01) > 1e-9 {
				t.Errorf("%+v, want 0.01/node", s)
			}
		}
	}
	if Slopes(sizes[:1]) != nil {
		t.Error("one size has no slope")
	}
}

func FuzzParseOpenbTasks(f *testing.F) {
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,scheduled_time,deletion_time\np,1000,10,0,0,0,60\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,scheduled_time,deletion_time\np,1000,10,1,500,5,4\n")
	f.Fuzz(func(t *testing.T, in string) {
		tasks, err := ParseOpenbTasks(strings.NewReader(in), "fuzz")
		if err != nil {
			if !errors.Is(err, openb.ErrBadCSV) {
				t.Fatalf("error without openb.ErrBadCSV: %v", err)
			}
			return
		}
		for _, tk := range tasks {
			if tk.Duration <= 0 {
				t.Fatalf("task %+v has no duration", tk)
			}
		}
	})
}
