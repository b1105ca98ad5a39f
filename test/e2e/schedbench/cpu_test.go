package schedbench

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	extender "github.com/understory/understory/scheduler-extender"
)

// statLine is a /proc/<pid>/stat line with the given name, ppid and ticks.
func statLine(pid int, comm string, ppid int, utime, stime int64) string {
	return fmt.Sprintf("%d (%s) S %d 1 1 0 -1 4194560 100 0 0 0 %d %d 0 0 20 0 8 0 12345 1000 100", pid, comm, ppid, utime, stime)
}

func TestStatCPU(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		line     string
		wantComm string
		wantPPID int
		wantCPU  time.Duration
		wantErr  bool
	}{
		{name: "plain", line: statLine(7, "etcd", 3, 150, 50), wantComm: "etcd", wantPPID: 3, wantCPU: 2 * time.Second},
		{name: "name with spaces and parens", line: statLine(7, "a (b) c", 3, 1, 0), wantComm: "a (b) c", wantPPID: 3, wantCPU: 10 * time.Millisecond},
		{name: "no name", line: "7 S 3", wantErr: true},
		{name: "too few fields", line: "7 (x) S 3 1 1", wantErr: true},
		{name: "bad ppid", line: "7 (x) S p 1 1 0 -1 0 0 0 0 0 1 1", wantErr: true},
		{name: "negative ticks", line: statLine(7, "x", 3, -1, 0), wantErr: true},
		{name: "bad ticks", line: "7 (x) S 3 1 1 0 -1 0 0 0 0 0 u 1", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comm, ppid, cpu, err := statCPU(tc.line)
			if tc.wantErr {
				if !errors.Is(err, errStat) {
					t.Fatalf("err = %v, want errStat", err)
				}
				return
			}
			if err != nil || comm != tc.wantComm || ppid != tc.wantPPID || cpu != tc.wantCPU {
				t.Errorf("statCPU = %q, %d, %v, %v; want %q, %d, %v", comm, ppid, cpu, err, tc.wantComm, tc.wantPPID, tc.wantCPU)
			}
		})
	}
}

func FuzzStatCPU(f *testing.F) {
	f.Add(statLine(1, "kube-apiserver", 1, 10, 20))
	f.Add("1 ()) S 1 1 1 0 -1 0 0 0 0 0 9 9")
	f.Add(")(")
	f.Fuzz(func(t *testing.T, line string) {
		if _, _, cpu, err := statCPU(line); err == nil && cpu < 0 {
			t.Fatalf("negative cpu %v for %q", cpu, line)
		}
	})
}

func TestCPUTimes(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	files := map[string]string{
		"10/stat": statLine(10, "schedbench.test", 1, 100, 100),
		"11/stat": statLine(11, "etcd", 10, 50, 0),
		"12/stat": statLine(12, "etcd", 10, 25, 25),
		"13/stat": statLine(13, "kube-scheduler", 10, 7, 3),
		"14/stat": statLine(14, "other", 99, 1000, 0), // not ours
		"15/stat": "garbage",
		"self/x":  "not a pid",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := cpuTimes(root, 10)
	want := map[string]time.Duration{selfName: 2 * time.Second, "etcd": time.Second, "kube-scheduler": 100 * time.Millisecond}
	if !maps.Equal(got, want) {
		t.Errorf("cpuTimes = %v, want %v", got, want)
	}
	if got := cpuTimes(filepath.Join(root, "missing"), 10); len(got) != 0 {
		t.Errorf("missing root: %v, want empty", got)
	}
	// The real /proc: this process is there.
	if _, ok := cpuTimes("/proc", os.Getpid())[selfName]; !ok {
		t.Errorf("cpuTimes(/proc) has no entry for this process")
	}
}

func TestCPUDelta(t *testing.T) {
	t.Parallel()
	before := map[string]time.Duration{"a": time.Second, "gone": time.Second, "same": time.Second}
	after := map[string]time.Duration{"a": 3 * time.Second, "new": time.Second / 2, "same": time.Second}
	want := map[string]float64{"a": 2, "new": 0.5}
	if got := cpuDelta(before, after); !maps.Equal(got, want) {
		t.Errorf("cpuDelta = %v, want %v", got, want)
	}
}

func TestBenchPods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		workload  string
		wantGPU   []int // NumGPU of pods 0..3
		wantMilli []int // GPUMilli of pods 0..3
	}{
		{workload: workloadCPU, wantGPU: []int{0, 0, 0, 0}, wantMilli: []int{0, 0, 0, 0}},
		{workload: workloadGPU, wantGPU: []int{1, 2, 1, 1}, wantMilli: []int{1000, 1000, 500, 250}},
	}
	for _, tc := range tests {
		t.Run(tc.workload, func(t *testing.T) {
			t.Parallel()
			pods := benchPods("ns", 8, tc.workload)
			if len(pods) != 8 {
				t.Fatalf("%d pods, want 8", len(pods))
			}
			for i, p := range pods {
				req, err := extender.PodRequest(p)
				if err != nil {
					t.Fatalf("pod %d: %v", i, err)
				}
				if req.NumGPU != tc.wantGPU[i%4] || req.GPUMilli != tc.wantMilli[i%4] || req.CPUMilli != 100 {
					t.Errorf("pod %d: %+v, want %d gpus of %d milli and 100m cpu", i, req, tc.wantGPU[i%4], tc.wantMilli[i%4])
				}
				for name, q := range p.Spec.Containers[0].Resources.Limits {
					if r := p.Spec.Containers[0].Resources.Requests[name]; r.Cmp(q) != 0 {
						t.Errorf("pod %d: %s limit %v != request %v", i, name, q, r)
					}
				}
			}
		})
	}
}

func TestRatios(t *testing.T) {
	t.Parallel()
	sum := []Summary{{Name: "a", MedianPodsPerSec: 100}, {Name: "b", MedianPodsPerSec: 90}, {Name: "zero"}}
	specs := []ratioSpec{
		{name: "b/a", num: "b", den: "a", target: 0.9},
		{name: "b/a strict", num: "b", den: "a", target: 0.95},
		{name: "a/b info", num: "a", den: "b"},
		{name: "missing", num: "b", den: "c", target: 1},
		{name: "by zero", num: "a", den: "zero", target: 1},
	}
	got := ratios(sum, specs)
	want := []Ratio{
		{Name: "b/a", Numerator: "b", Denominator: "a", Value: 0.9, Target: 0.9, Met: true},
		{Name: "b/a strict", Numerator: "b", Denominator: "a", Value: 0.9, Target: 0.95},
		{Name: "a/b info", Numerator: "a", Denominator: "b", Value: 100.0 / 90, Met: true},
	}
	if len(got) != len(want) {
		t.Fatalf("ratios = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ratio %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
