package clusterbench

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/bench/openb"
)

// TraceTask is one openb task: its request (through openb's own row parser) and
// its duration in the trace (deletion_time - scheduled_time, seconds).
type TraceTask struct {
	Pod      openb.Pod
	Duration time.Duration
}

// ReadOpenbTasks reads an openb pod list (e.g. openb_pod_list_default.csv) with the
// durations openb.ParsePods leaves out. Rows without both times, or with deletion
// before scheduling, are skipped (Pending and Failed tasks); a row openb's parser
// refuses is an error.
func ReadOpenbTasks(path string) ([]TraceTask, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening openb pod list: %w", err)
	}
	defer f.Close()
	return ParseOpenbTasks(f, path)
}

// ParseOpenbTasks is ReadOpenbTasks on a reader.
func ParseOpenbTasks(r io.Reader, name string) ([]TraceTask, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w: %w", name, err, openb.ErrBadCSV)
	}
	var out []TraceTask
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w: %w", name, line, err, openb.ErrBadCSV)
		}
		row := map[string]string{}
		for i, h := range head {
			if i < len(rec) {
				row[strings.TrimSpace(h)] = strings.TrimSpace(rec[i])
			}
		}
		p, err := openb.ParsePodRow(row)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		start, e1 := strconv.ParseInt(row["scheduled_time"], 10, 64)
		end, e2 := strconv.ParseInt(row["deletion_time"], 10, 64)
		if e1 != nil || e2 != nil || end <= start {
			continue
		}
		out = append(out, TraceTask{Pod: p, Duration: time.Duration(end-start) * time.Second})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no task with both times: %w", name, openb.ErrBadCSV)
	}
	return out, nil
}

// Job is one batch job of the workload: Members pods of one shape (a gang when
// Members > 1), arriving At after the start, each running Duration.
type Job struct {
	Name     string
	At       time.Duration
	Duration time.Duration
	Members  int
	// Per pod: batch CPU in millicores, batch memory in bytes, and the GPU request
	// (NumGPU whole GPUs, or one share of GPUMilli when GPUMilli < 1000).
	CPUMilli, MemBytes int64
	NumGPU, GPUMilli   int
}

// GPU reports whether the job asks for GPUs.
func (j Job) GPU() bool { return j.NumGPU > 0 }

// WorkloadParams shape the batch workload.
type WorkloadParams struct {
	// Span is how long jobs arrive.
	Span time.Duration
	// Compression divides every openb duration; durations are then clamped to
	// [MinDuration, MaxDuration].
	Compression              float64
	MinDuration, MaxDuration time.Duration
	// CPULoad is the offered batch CPU (requests × duration per second) as a
	// fraction of SpareCPUMilli; GPULoad the offered GPU milli as a fraction of
	// GPUMilli.
	CPULoad, GPULoad float64
	SpareCPUMilli    float64
	GPUMilli         float64
	// GangShare of the CPU jobs are gangs of 2..GangMax members.
	GangShare float64
	GangMax   int
	Seed      int64
}

// BuildWorkload draws the jobs: CPU jobs from the trace's CPU-only tasks, GPU jobs
// from its GPU tasks, each stream a Poisson process whose rate offers the asked
// load. The list is sorted by arrival.
func BuildWorkload(tasks []TraceTask, p WorkloadParams) ([]Job, error) {
	var cpuT, gpuT []TraceTask
	for _, t := range tasks {
		if t.Pod.Request.NumGPU > 0 {
			gpuT = append(gpuT, t)
		} else if t.Pod.Request.CPUMilli > 0 {
			cpuT = append(cpuT, t)
		}
	}
	if len(cpuT) == 0 {
		return nil, fmt.Errorf("no CPU-only task in the trace: %w", openb.ErrBadCSV)
	}
	rng := rand.New(rand.NewSource(p.Seed))
	dur := func(t TraceTask) time.Duration {
		d := time.Duration(float64(t.Duration) / math.Max(p.Compression, 1e-9))
		return min(max(d, p.MinDuration), p.MaxDuration)
	}
	gangMean := 1 + p.GangShare*(float64(max(p.GangMax, 2))+2)/2 - p.GangShare
	var jobs []Job
	stream := func(pool []TraceTask, rate float64, prefix string, gangs bool) {
		if rate <= 0 || len(pool) == 0 {
			return
		}
		at := time.Duration(0)
		for i := 0; ; i++ {
			at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if at >= p.Span {
				return
			}
			t := pool[rng.Intn(len(pool))]
			j := Job{Name: fmt.Sprintf("%s-%d", prefix, i), At: at, Duration: dur(t), Members: 1,
				CPUMilli: t.Pod.Request.CPUMilli, MemBytes: t.Pod.Request.MemoryMiB << 20,
				NumGPU: t.Pod.Request.NumGPU, GPUMilli: t.Pod.Request.GPUMilli}
			if gangs && rng.Float64() < p.GangShare {
				j.Members = 2 + rng.Intn(max(p.GangMax, 2)-1)
				j.Name = fmt.Sprintf("gang-%d", i)
			}
			jobs = append(jobs, j)
		}
	}
	// Rates: offered = rate × E[size × duration].
	mean := func(pool []TraceTask, size func(TraceTask) float64) float64 {
		s := 0.0
		for _, t := range pool {
			s += size(t) * dur(t).Seconds()
		}
		return s / float64(len(pool))
	}
	cpuRate := p.CPULoad * p.SpareCPUMilli / (mean(cpuT, func(t TraceTask) float64 { return float64(t.Pod.Request.CPUMilli) }) * gangMean)
	stream(cpuT, cpuRate, "cpu", true)
	if p.GPUMilli > 0 && len(gpuT) > 0 {
		gpuRate := p.GPULoad * p.GPUMilli / mean(gpuT, func(t TraceTask) float64 {
			return float64(t.Pod.Request.NumGPU * t.Pod.Request.GPUMilli)
		})
		stream(gpuT, gpuRate, "gpu", false)
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].At < jobs[b].At })
	return jobs, nil
}

// NodeShape is one node type: allocatable CPU (millicores), memory (bytes), GPUs and
// GPU model.
type NodeShape struct {
	CPUMilli int64
	MemBytes int64
	GPUs     int
	Model    string
}

// ReadOpenbNodeShapes reads an openb node list into shapes (columns sn, cpu_milli,
// memory_mib, gpu, model), split into CPU-only and GPU nodes.
func ReadOpenbNodeShapes(path string) (cpu, gpu []NodeShape, err error) {
	nodes, err := openb.ReadNodes(path, 0)
	if err != nil {
		return nil, nil, err
	}
	for _, n := range nodes {
		s := NodeShape{CPUMilli: n.CPUMilli, MemBytes: n.MemoryMiB << 20, GPUs: len(n.GPUFree), Model: n.Model}
		if s.GPUs > 0 {
			gpu = append(gpu, s)
		} else {
			cpu = append(cpu, s)
		}
	}
	if len(cpu) == 0 {
		return nil, nil, fmt.Errorf("%s: no CPU-only node: %w", path, openb.ErrBadCSV)
	}
	return cpu, gpu, nil
}
