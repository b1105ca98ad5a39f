package colo

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/koordlet/collect"
)

// phaseResult is what one phase of the scenario measured.
type phaseResult struct {
	Name      string  `json:"name"`
	Seconds   float64 `json:"seconds"`
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	P999ms    float64 `json:"p999_ms"`
	LSCPU     float64 `json:"ls_cpu_seconds"`
	BatchCPU  float64 `json:"batch_cpu_seconds"`
	NodeUtil  float64 `json:"node_utilisation"`
	IdleShare float64 `json:"batch_idle_share"`
	// Published is what the agent published for the scheduler at the end of the
	// phase (agent phases only): batch-cpu in cores, batch-memory in bytes.
	PublishedBatchCPU    float64 `json:"published_batch_cpu_cores,omitempty"`
	PublishedBatchMemory float64 `json:"published_batch_memory_bytes,omitempty"`
	// Agent phases only, during the measurement: ThrottledPeriods sums the CFS periods
	// in which the groups the agent bounds batch in (the tier, or each in-place pod)
	// were throttled; AgentCuts counts the agent's batch CPU cuts.
	ThrottledPeriods uint64  `json:"batch_throttled_periods,omitempty"`
	AgentCuts        float64 `json:"agent_cuts,omitempty"`

	latencies []time.Duration
}

// measure drives the LS service for d and records latency, CPU use and utilisation.
//
// batch_idle_share = batch CPU-seconds / (node CPU-seconds − LS CPU-seconds): the share
// of the CPU the LS pod left idle that batch actually used.
func (s *scenario) measure(ctx context.Context, name string, d time.Duration) (phaseResult, error) {
	ps, err := collect.NewProcStat("/proc")
	if err != nil {
		return phaseResult{}, err
	}
	defer ps.Close()
	// Threads the runtime started since setUp get the load generator's slice too.
	_ = setSlice(loadgenSlice)
	n0, err := ps.Read()
	if err != nil {
		return phaseResult{}, err
	}
	ls0, _ := proc.ReadCPU("/proc", s.ls.Process.Pid)
	b0 := s.batchCPU()
	gen := newOpenLoop("http://"+s.lsAddr+"/work", s.cfg.rate, s.cfg.workers)
	gen.shape = s.cfg.load
	res, err := gen.run(ctx, d)
	if err != nil {
		return phaseResult{}, err
	}
	n1, err := ps.Read()
	if err != nil {
		return phaseResult{}, err
	}
	ls1, _ := proc.ReadCPU("/proc", s.ls.Process.Pid)
	b1 := s.batchCPU()
	wall := res.End.Sub(res.Start).Seconds()
	r := phaseResult{
		Name: name, Seconds: wall, Requests: res.Sent, Errors: res.Errors,
		P50ms: ms(quantile(res.Latencies, 0.50)), P99ms: ms(quantile(res.Latencies, 0.99)),
		P999ms: ms(quantile(res.Latencies, 0.999)),
		LSCPU:  (ls1 - ls0).Seconds(), BatchCPU: (b1 - b0).Seconds(),
		latencies: res.Latencies,
	}
	if total := (n1.Total - n0.Total).Seconds(); total > 0 {
		r.NodeUtil = (n1.Busy - n0.Busy).Seconds() / total
	}
	if left := float64(n1.CPUs)*wall - r.LSCPU; left > 0 {
		r.IdleShare = r.BatchCPU / left
	}
	return r, nil
}

func (s *scenario) batchCPU() time.Duration {
	var sum time.Duration
	for _, pid := range s.batchPIDs() {
		if c, err := proc.ReadCPU("/proc", pid); err == nil {
			sum += c
		}
	}
	return sum
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pool merges the phases of several rounds into one, recomputing the quantiles over all
// their latencies.
func pool(name string, rs []phaseResult) phaseResult {
	out := phaseResult{Name: name}
	var lat []time.Duration
	var left float64
	for _, r := range rs {
		out.Seconds += r.Seconds
		out.Requests += r.Requests
		out.Errors += r.Errors
		out.LSCPU += r.LSCPU
		out.BatchCPU += r.BatchCPU
		out.ThrottledPeriods += r.ThrottledPeriods
		out.AgentCuts += r.AgentCuts
		out.NodeUtil += r.NodeUtil * r.Seconds
		if r.IdleShare > 0 {
			left += r.BatchCPU / r.IdleShare
		}
		lat = append(lat, r.latencies...)
	}
	if out.Seconds > 0 {
		out.NodeUtil /= out.Seconds
	}
	if left > 0 {
		out.IdleShare = out.BatchCPU / left
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	out.latencies = lat
	out.P50ms, out.P99ms, out.P999ms = ms(quantile(lat, .5)), ms(quantile(lat, .99)), ms(quantile(lat, .999))
	return out
}

// printTable prints one row per phase.
func printTable(w func(string, ...any), title string, rs []phaseResult, solo float64) {
	w("\n%s\n", title)
	w("%-22s %9s %9s %9s %8s %10s %9s %10s %7s\n", "phase", "p50 ms", "p99 ms", "p99.9 ms", "p99/solo", "batch CPUs", "LS CPU-s", "batch CPU-s", "node %")
	for _, r := range rs {
		ratio := "-"
		if solo > 0 {
			ratio = fmt.Sprintf("%.2f", r.P99ms/solo)
		}
		cores := 0.0
		if r.Seconds > 0 {
			cores = r.BatchCPU / r.Seconds
		}
		w("%-22s %9.2f %9.2f %9.2f %8s %10.2f %9.1f %10.1f %7.0f\n", r.Name, r.P50ms, r.P99ms, r.P999ms, ratio, cores, r.LSCPU, r.BatchCPU, 100*r.NodeUtil)
	}
}
