package clusterbench

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBadTrace marks an LS trace the benchmark cannot use; the message names the line
// and the column.
var ErrBadTrace = errors.New("bad LS trace")

// LS trace columns (docs/cluster-bench.md, "The LS trace format"). The usage columns
// are fractions of the node's allocatable, so a trace taken on one cluster drives
// nodes of any size.
const (
	colTime   = "t_s"
	colNode   = "node"
	colCPU    = "ls_cpu"
	colMem    = "ls_mem"
	colCPUReq = "ls_cpu_req" // optional
	colMemReq = "ls_mem_req" // optional
)

// maxTraceRows bounds what ParseLSTrace reads (a week of 15 s samples on 100 nodes
// is 4 million rows).
const maxTraceRows = 20_000_000

// maxTraceSpan bounds the time a trace covers.
const maxTraceSpan = 366 * 24 * time.Hour

// LSSample is one node's LS figures at one time: fractions of allocatable.
type LSSample struct {
	At     time.Duration // from the trace's start
	CPU    float64
	Memory float64
}

// NodeTrace is one node's LS usage over time, sorted by At, and its LS requests.
type NodeTrace struct {
	Name    string
	Samples []LSSample
	// CPURequest and MemRequest are the LS pods' requests, fractions of allocatable.
	CPURequest, MemRequest float64
}

// LSTrace is the LS usage of a set of nodes.
type LSTrace struct {
	Nodes []NodeTrace
	// Length is the time of the last sample plus one step: the trace loops after it.
	Length time.Duration
	// Source says where it came from (a file, or "synthetic" with its parameters).
	Source string
}

// At returns the sample of node n of the trace in force at t (the last sample at or
// before t, the trace looping every Length). Bench node i plays trace node i mod
// len(Nodes), shifted by i / len(Nodes) sevenths of the length so that nodes sharing
// a trace node do not move in step.
func (tr *LSTrace) At(i int, t time.Duration) LSSample {
	k := len(tr.Nodes)
	nt := &tr.Nodes[i%k]
	shift := time.Duration(int64(tr.Length) / 7 * int64(i/k))
	t = (t + shift) % tr.Length
	j, found := slices.BinarySearchFunc(nt.Samples, t, func(s LSSample, t time.Duration) int {
		switch {
		case s.At < t:
			return -1
		case s.At > t:
			return 1
		}
		return 0
	})
	if !found {
		j--
	}
	if j < 0 {
		j = 0
	}
	return nt.Samples[j]
}

// ReadLSTrace reads a trace file (ParseLSTrace).
func ReadLSTrace(path string) (*LSTrace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening LS trace: %w", err)
	}
	defer f.Close()
	return ParseLSTrace(f, path)
}

// ParseLSTrace reads the CSV trace format: a header naming at least t_s, node,
// ls_cpu and ls_mem (any order, other columns ignored), then one row per node and
// sample time. t_s is seconds from any origin (the earliest becomes 0), ls_cpu and
// ls_mem the LS usage as a fraction of the node's allocatable in [0, 1];
// ls_cpu_req and ls_mem_req, optional, the LS requests, same unit (a node's largest
// value counts; missing: the node's peak usage). Every bad row is an error naming
// name:line and the column, wrapping ErrBadTrace.
func ParseLSTrace(r io.Reader, name string) (*LSTrace, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w: %w", name, err, ErrBadTrace)
	}
	idx := map[string]int{}
	for i, h := range head {
		idx[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range []string{colTime, colNode, colCPU, colMem} {
		if _, ok := idx[c]; !ok {
			return nil, fmt.Errorf("%s: header %q lacks column %s: %w", name, truncate(strings.Join(head, ","), 64), c, ErrBadTrace)
		}
	}
	type acc struct {
		samples     []LSSample
		cpuReq      float64
		memReq      float64
		hasCPU, has bool
	}
	nodes := map[string]*acc{}
	var order []string
	minT, maxT := math.Inf(1), math.Inf(-1)
	var secs []float64
	rows := 0
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w: %w", name, line, err, ErrBadTrace)
		}
		if rows++; rows > maxTraceRows {
			return nil, fmt.Errorf("%s: more than %d rows: %w", name, maxTraceRows, ErrBadTrace)
		}
		field := func(c string) (string, bool) {
			i, ok := idx[c]
			if !ok || i >= len(rec) {
				return "", false
			}
			return strings.TrimSpace(rec[i]), true
		}
		num := func(c string, lo, hi float64) (float64, bool, error) {
			s, ok := field(c)
			if !ok || s == "" {
				return 0, false, nil
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsNaN(v) || v < lo || v > hi {
				return 0, false, fmt.Errorf("%s:%d: column %s: %.64q is not a number in [%v, %v]: %w", name, line, c, s, lo, hi, ErrBadTrace)
			}
			return v, true, nil
		}
		node, _ := field(colNode)
		if node == "" {
			return nil, fmt.Errorf("%s:%d: column node: empty: %w", name, line, ErrBadTrace)
		}
		t, ok, err := num(colTime, -1e12, 1e12)
		if err == nil && !ok {
			err = fmt.Errorf("%s:%d: column %s: empty: %w", name, line, colTime, ErrBadTrace)
		}
		if err != nil {
			return nil, err
		}
		cpu, okC, err := num(colCPU, 0, 1)
		if err != nil {
			return nil, err
		}
		mem, okM, err := num(colMem, 0, 1)
		if err != nil {
			return nil, err
		}
		if !okC || !okM {
			return nil, fmt.Errorf("%s:%d: columns %s and %s must both be set: %w", name, line, colCPU, colMem, ErrBadTrace)
		}
		cReq, okCR, err := num(colCPUReq, 0, 1)
		if err != nil {
			return nil, err
		}
		mReq, okMR, err := num(colMemReq, 0, 1)
		if err != nil {
			return nil, err
		}
		a := nodes[node]
		if a == nil {
			a = &acc{}
			nodes[node] = a
			order = append(order, node)
		}
		a.samples = append(a.samples, LSSample{At: time.Duration(t * float64(time.Second)), CPU: cpu, Memory: mem})
		if okCR {
			a.cpuReq, a.hasCPU = math.Max(a.cpuReq, cReq), true
		}
		if okMR {
			a.memReq, a.has = math.Max(a.memReq, mReq), true
		}
		minT, maxT = math.Min(minT, t), math.Max(maxT, t)
		if len(secs) < 2 || secs[len(secs)-1] != t {
			secs = append(secs, t)
		}
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("%s: no rows: %w", name, ErrBadTrace)
	}
	if maxT-minT > maxTraceSpan.Seconds() {
		return nil, fmt.Errorf("%s: column %s spans %.0f s, more than %v: %w", name, colTime, maxT-minT, maxTraceSpan, ErrBadTrace)
	}
	step := traceStep(secs)
	tr := &LSTrace{Source: name, Length: time.Duration((maxT - minT + step) * float64(time.Second))}
	origin := time.Duration(minT * float64(time.Second))
	for _, n := range order {
		a := nodes[n]
		slices.SortStableFunc(a.samples, func(x, y LSSample) int { return cmp.Compare(x.At, y.At) })
		nt := NodeTrace{Name: n, Samples: a.samples, CPURequest: a.cpuReq, MemRequest: a.memReq}
		for i := range nt.Samples {
			nt.Samples[i].At -= origin
		}
		if !a.hasCPU || !a.has {
			var pc, pm float64
			for _, s := range nt.Samples {
				pc, pm = math.Max(pc, s.CPU), math.Max(pm, s.Memory)
			}
			if !a.hasCPU {
				nt.CPURequest = pc
			}
			if !a.has {
				nt.MemRequest = pm
			}
		}
		tr.Nodes = append(tr.Nodes, nt)
	}
	return tr, nil
}

// traceStep is the most common gap between consecutive distinct sample times (1 s
// when there is only one time).
func traceStep(secs []float64) float64 {
	slices.Sort(secs)
	count := map[float64]int{}
	best, bestN := 1.0, 0
	for i := 1; i < len(secs); i++ {
		d := secs[i] - secs[i-1]
		if d <= 0 {
			continue
		}
		count[d]++
		if count[d] > bestN {
			best, bestN = d, count[d]
		}
	}
	return best
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// SynthParams are the parameters of the synthetic LS trace (docs/cluster-bench.md,
// "The synthetic LS trace" gives their reasons).
type SynthParams struct {
	Nodes  int
	Length time.Duration // one compressed day
	Step   time.Duration
	// CPU: each node's mean LS usage is uniform in [MeanLo, MeanHi] of allocatable,
	// modulated by a daily cycle of relative amplitude DayAmplitude (phase spread
	// PhaseSpread radians between nodes), AR(1) noise (coefficient NoiseRho,
	// stationary deviation NoiseSigma) and bursts (per-step probability BurstProb,
	// height BurstHeight, length BurstLen); clamped to [0.01, CPURequest].
	MeanLo, MeanHi, DayAmplitude, PhaseSpread float64
	NoiseRho, NoiseSigma                      float64
	BurstProb, BurstHeight                    float64
	BurstLen                                  time.Duration
	CPURequest                                float64
	// Memory: uniform in [MemLo, MemHi], near constant (noise MemNoise); the
	// request is usage + MemHeadroom.
	MemLo, MemHi, MemNoise, MemHeadroom float64
	Seed                                int64
}

// DefaultSynthParams are the defaults of the synthetic LS trace.
func DefaultSynthParams(nodes int, length time.Duration, seed int64) SynthParams {
	return SynthParams{Nodes: nodes, Length: length, Step: 5 * time.Second,
		MeanLo: 0.10, MeanHi: 0.30, DayAmplitude: 0.4, PhaseSpread: 0.3,
		NoiseRho: 0.9, NoiseSigma: 0.04, BurstProb: 0.002, BurstHeight: 0.3, BurstLen: 30 * time.Second,
		CPURequest: 0.6, MemLo: 0.3, MemHi: 0.5, MemNoise: 0.01, MemHeadroom: 0.1, Seed: seed}
}

// Synthesize builds the synthetic LS trace of p.
func Synthesize(p SynthParams) *LSTrace {
	rng := rand.New(rand.NewSource(p.Seed))
	steps := max(int(p.Length/p.Step), 1)
	tr := &LSTrace{Length: time.Duration(steps) * p.Step,
		Source: fmt.Sprintf("synthetic %+v", p)}
	for n := range p.Nodes {
		mean := p.MeanLo + rng.Float64()*(p.MeanHi-p.MeanLo)
		phase := rng.NormFloat64() * p.PhaseSpread
		mem := p.MemLo + rng.Float64()*(p.MemHi-p.MemLo)
		nt := NodeTrace{Name: fmt.Sprintf("synth-%d", n), CPURequest: p.CPURequest,
			MemRequest: math.Min(1, mem+p.MemHeadroom), Samples: make([]LSSample, steps)}
		noise := rng.NormFloat64() * p.NoiseSigma
		innov := p.NoiseSigma * math.Sqrt(1-p.NoiseRho*p.NoiseRho)
		var burstLeft time.Duration
		for s := range steps {
			day := 2 * math.Pi * float64(s) / float64(steps)
			noise = p.NoiseRho*noise + rng.NormFloat64()*innov
			if burstLeft <= 0 && rng.Float64() < p.BurstProb {
				burstLeft = p.BurstLen
			}
			cpu := mean*(1+p.DayAmplitude*math.Sin(day+phase)) + noise
			if burstLeft > 0 {
				cpu += p.BurstHeight
				burstLeft -= p.Step
			}
			nt.Samples[s] = LSSample{At: time.Duration(s) * p.Step,
				CPU:    math.Min(math.Max(cpu, 0.01), p.CPURequest),
				Memory: math.Min(math.Max(mem+rng.NormFloat64()*p.MemNoise, 0), nt.MemRequest)}
		}
		tr.Nodes = append(tr.Nodes, nt)
	}
	return tr
}

// WriteCSV writes tr in the trace format (requests included), the inverse of
// ParseLSTrace.
func (tr *LSTrace) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{colTime, colNode, colCPU, colMem, colCPUReq, colMemReq}); err != nil {
		return fmt.Errorf("writing trace: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
	for _, nt := range tr.Nodes {
		for _, s := range nt.Samples {
			if err := cw.Write([]string{strconv.FormatFloat(s.At.Seconds(), 'f', -1, 64), nt.Name, f(s.CPU), f(s.Memory),
				f(nt.CPURequest), f(nt.MemRequest)}); err != nil {
				return fmt.Errorf("writing trace: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing trace: %w", err)
	}
	return nil
}
