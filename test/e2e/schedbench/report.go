package schedbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/understory/understory/internal/testenv"
)

// Result is the measurement of one scheduler configuration.
type Result struct {
	Name string `json:"name"`
	// Workload is the pod mix: "cpu" (100m/128Mi) or "gpu" (the same plus
	// nvidia.com/gpu 1 or 2, or understory.io/gpu-milli 500 or 250).
	Workload string `json:"workload"`
	// PodsPerSec is (pods-1) / BindSpanSeconds: binding throughput once the
	// scheduler is scheduling.
	PodsPerSec      float64 `json:"pods_per_sec"`
	BindSpanSeconds float64 `json:"bind_span_s"` // first bind -> last bind
	// WallSeconds is scheduler process start -> last bind (includes
	// start-up and informer sync).
	WallSeconds           float64 `json:"wall_s"`
	FirstBindSeconds      float64 `json:"first_bind_s"` // scheduler start -> first bind
	Pods                  int     `json:"pods"`
	CreatePodsPerSec      float64 `json:"create_pods_per_sec"`
	ExtenderFilterCalls   int64   `json:"extender_filter_calls,omitempty"`
	ExtenderPriorityCalls int64   `json:"extender_prioritize_calls,omitempty"`
	ExtenderBindCalls     int64   `json:"extender_bind_calls,omitempty"`
	LoadAvgBefore         string  `json:"loadavg_before"`
	LoadAvgAfter          string  `json:"loadavg_after"`
	// CPUSeconds is the CPU time (user + system) each of the benchmark's
	// processes used from scheduler start to the last bind: "benchmark" is
	// the test process (the in-process extender, the watch), the others are
	// its child processes by command name.
	CPUSeconds map[string]float64 `json:"cpu_s,omitempty"`
	// CPUMillisPerPod is the sum of CPUSeconds per bound pod, in ms.
	CPUMillisPerPod float64 `json:"cpu_ms_per_pod,omitempty"`
}

// Report is the file written to bench/out/scheduler-throughput.json.
type Report struct {
	Benchmark    string `json:"benchmark"`
	Date         string `json:"date"`
	Kubernetes   string `json:"kubernetes"`
	Nodes        int    `json:"nodes"`
	Pods         int    `json:"pods"`
	GPUsPerNode  int    `json:"gpus_per_node"`
	SchedulerQPS int    `json:"scheduler_client_qps"`
	// PercentageOfNodesToScore is kube-scheduler's setting in every
	// scenario; 0 is its adaptive default (10 % at 5 000 nodes).
	PercentageOfNodesToScore int `json:"percentage_of_nodes_to_score"`
	// Rounds is how often every scenario ran, interleaved (a b c d, a b c d, ...).
	Rounds int `json:"rounds"`
	// ExtenderProtobuf: the real extender's clientset spoke protobuf (else JSON).
	ExtenderProtobuf bool      `json:"extender_protobuf"`
	Etcd             string    `json:"etcd"`
	CreateNodesSecs  float64   `json:"create_nodes_s"`
	Machine          Machine   `json:"machine"`
	Summary          []Summary `json:"summary"`
	Ratios           []Ratio   `json:"ratios"`
	Results          []Result  `json:"results"`
}

// Ratio compares the median pods/s of two scenarios against a target.
type Ratio struct {
	Name        string  `json:"name"`
	Numerator   string  `json:"numerator"`
	Denominator string  `json:"denominator"`
	Value       float64 `json:"value"`
	Target      float64 `json:"target,omitempty"` // 0: informational
	Met         bool    `json:"met"`
}

// ratioSpec is a Ratio before measurement.
type ratioSpec struct {
	name, num, den string
	target         float64
}

// ratios computes the specs whose two scenarios were both measured.
func ratios(sum []Summary, specs []ratioSpec) []Ratio {
	median := map[string]float64{}
	for _, s := range sum {
		median[s.Name] = s.MedianPodsPerSec
	}
	var out []Ratio
	for _, sp := range specs {
		n, okN := median[sp.num]
		d, okD := median[sp.den]
		if !okN || !okD || d <= 0 {
			continue
		}
		r := Ratio{Name: sp.name, Numerator: sp.num, Denominator: sp.den, Value: n / d, Target: sp.target}
		r.Met = r.Value >= sp.target
		out = append(out, r)
	}
	return out
}

// Summary aggregates the runs of one scenario (-benchtime Nx runs N).
type Summary struct {
	Name             string  `json:"name"`
	Runs             int     `json:"runs"`
	MedianPodsPerSec float64 `json:"median_pods_per_sec"`
	MinPodsPerSec    float64 `json:"min_pods_per_sec"`
	MaxPodsPerSec    float64 `json:"max_pods_per_sec"`
}

// set replaces the summary and runs of scenario s.Name.
func (r *Report) set(s Summary, runs []Result) {
	r.Summary = slices.DeleteFunc(r.Summary, func(x Summary) bool { return x.Name == s.Name })
	r.Results = slices.DeleteFunc(r.Results, func(x Result) bool { return x.Name == s.Name })
	r.Summary = append(r.Summary, s)
	r.Results = append(r.Results, runs...)
}

// summarize returns the median (lower middle for an even count), min and
// max pods/s of runs.
func summarize(name string, runs []Result) Summary {
	s := Summary{Name: name, Runs: len(runs)}
	if len(runs) == 0 {
		return s
	}
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.PodsPerSec
	}
	slices.Sort(v)
	s.MinPodsPerSec, s.MaxPodsPerSec = v[0], v[len(v)-1]
	s.MedianPodsPerSec = v[(len(v)-1)/2]
	return s
}

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryKiB string `json:"mem_total"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
}

func describeMachine() Machine {
	return Machine{
		CPUs:      runtime.NumCPU(),
		CPUModel:  procField("/proc/cpuinfo", "model name"),
		MemoryKiB: procField("/proc/meminfo", "MemTotal"),
		Kernel:    strings.TrimSpace(readSmall("/proc/sys/kernel/osrelease")),
		Go:        runtime.Version(),
	}
}

func loadAvg() string {
	f := strings.Fields(readSmall("/proc/loadavg"))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	for _, line := range strings.Split(readSmall(path), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func readSmall(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

// writeReport writes r as indented JSON to path, creating its directory.
func writeReport(path string, r Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating report dir: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// defaultOut is bench/out/scheduler-throughput.json at the module root
// above the working directory.
func defaultOut() (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bench", "out", "scheduler-throughput.json"), nil
}

func nowRFC3339() string { return time.Now().UTC().Format(time.RFC3339) }
