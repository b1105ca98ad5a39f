package colo

// `colo stability` replays a recorded day of LS CPU usage through the agent's
// reclaimer (qos.Reclaimer) at the agent's control period and measures how
// stable the published understory.io/batch-cpu is, next to a naive baseline that
// publishes the instant free CPU every period (what flaps in Koordinator issues
// #1906 and #2118). `colo stability -generate` rewrites the committed trace
// bench/traces/ls-cpu-trace.csv from its seed.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/qos"
)

// Shape of the generated trace. Kept here so `-generate` reproduces the
// committed file byte for byte.
const (
	// defaultStabilityTrace is the committed trace.
	defaultStabilityTrace = "bench/traces/ls-cpu-trace.csv"
	// defaultTraceSeed is the seed the committed trace was generated with.
	defaultTraceSeed = 20240607
	traceCapacity    = 16.0 // node CPUs
	traceStep        = 5 * time.Second
	traceDuration    = 24 * time.Hour
	traceHeader      = "t_s,capacity_cores,ls_cores,be_cores,system_cores"
	// Memory is not in the trace; the replay feeds a constant node so the
	// Reclaimer's memory side runs too.
	stabilityMemCapacity = 64 << 30
	stabilityMemLS       = 20 << 30
	stabilityMemRequest  = 24 << 30
	// saturationTime is how long in total, within lsWindow, LS + BE + system
	// must have been at capacity×threshold or more for a published 0 to count
	// as "LS truly used the node": 100 control periods, two trace rows.
	saturationTime = 10 * time.Second
)

// errTrace is wrapped by every error about the trace file's content.
var errTrace = errors.New("invalid stability trace")

// traceSample is one row of the trace: usage in cores at T since the start.
type traceSample struct {
	T                      time.Duration
	Capacity, LS, BE, Syst float64
}

// stabilityResult is what runStability measures. The batch_cpu_* figures are the
// Reclaimer's; baseline_* the naive publisher's, which publishes
// clamp(capacity×threshold − LS − BE − system, 0, capacity) of the instant
// sample every period it changes.
type stabilityResult struct {
	Trace         string  `json:"trace"`
	Hours         float64 `json:"hours"`
	PeriodMs      float64 `json:"period_ms"`
	Periods       int     `json:"periods"`
	CapacityCores float64 `json:"capacity_cores"`
	Config        any     `json:"config"`

	// Changes count writes that changed the published millicores (the initial
	// write excluded); writes also count refreshes of an unchanged value.
	BatchCPUChangesPerHour float64 `json:"batch_cpu_changes_per_hour"`
	BatchCPUWritesPerHour  float64 `json:"batch_cpu_writes_per_hour"`
	BatchCPUMeanCores      float64 `json:"batch_cpu_mean_cores"`
	BatchCPUMinCores       float64 `json:"batch_cpu_min_cores"`
	BatchCPUMinOverMean    float64 `json:"batch_cpu_min_over_mean"`
	// The same minimum over the periods when LS had not saturated the node
	// (see batch_cpu_zero_unjustified_periods) within the preceding 2×lsWindow:
	// the window holds a saturation for lsWindow, the rise limit then needs a
	// while to bring batch back.
	BatchCPUMinOverMeanUnsaturated float64 `json:"batch_cpu_min_over_mean_unsaturated"`
	// Overcommit is published − (capacity − LS − BE − system) of the instant
	// sample, when positive: what scheduled batch pods could not get then.
	BatchCPUOvercommitMax     float64 `json:"batch_cpu_overcommit_max"`
	BatchCPUOvercommitSeconds float64 `json:"batch_cpu_overcommit_seconds"`
	// Periods with 0 published, and those of them when LS had NOT truly used
	// the node: LS + BE + system had been at capacity × threshold or more for
	// less than 10 s in total within the preceding lsWindow.
	BatchCPUZeroPeriods            int `json:"batch_cpu_zero_periods"`
	BatchCPUZeroUnjustifiedPeriods int `json:"batch_cpu_zero_unjustified_periods"`
	// Changes to 0, and those of them made when LS had not truly used the node
	// (as above). A 0 that outlasts the saturation (the window still holds it,
	// then the rise limit) counts in the periods above, not here.
	BatchCPUZeroDrops            int `json:"batch_cpu_zero_drops"`
	BatchCPUZeroDropsUnjustified int `json:"batch_cpu_zero_drops_unjustified"`
	// Writes by Reason.
	BatchCPUReasons map[string]int `json:"batch_cpu_write_reasons"`

	BaselineChangesPerHour         float64 `json:"baseline_changes_per_hour"`
	BaselineMeanCores              float64 `json:"baseline_mean_cores"`
	BaselineMinCores               float64 `json:"baseline_min_cores"`
	BaselineMinOverMean            float64 `json:"baseline_min_over_mean"`
	BaselineMinOverMeanUnsaturated float64 `json:"baseline_min_over_mean_unsaturated"`
	BaselineOvercommitMax          float64 `json:"baseline_overcommit_max"`
	BaselineZeroPeriods            int     `json:"baseline_zero_periods"`
	// Zero periods of the baseline without LS saturation, as above.
	BaselineZeroUnjustifiedPeriods int `json:"baseline_zero_unjustified_periods"`
	BaselineZeroDrops              int `json:"baseline_zero_drops"`
	BaselineZeroDropsUnjustified   int `json:"baseline_zero_drops_unjustified"`
}

// runStability replays the trace at tracePath through a qos.Reclaimer built
// from cfg, calling Next once per period (each trace sample is held for the
// periods it covers), and through the naive baseline.
func runStability(tracePath string, cfg qos.ReclaimConfig, period time.Duration) (stabilityResult, error) {
	if err := cfg.Validate(); err != nil {
		return stabilityResult{}, err
	}
	if period <= 0 {
		return stabilityResult{}, fmt.Errorf("period %v must be positive", period)
	}
	f, err := os.Open(tracePath)
	if err != nil {
		return stabilityResult{}, err
	}
	defer f.Close()
	trace, err := parseTrace(f)
	if err != nil {
		return stabilityResult{}, fmt.Errorf("%s: %w", tracePath, err)
	}
	res := replayStability(trace, cfg, period)
	res.Trace = tracePath
	return res, nil
}

// replayStability is runStability on a parsed trace.
func replayStability(trace []traceSample, cfg qos.ReclaimConfig, period time.Duration) stabilityResult {
	thr := cfg.CPU.Threshold
	justified := saturatedWithin(trace, thr, cfg.LSWindow.Duration)
	recent := saturatedWithin(trace, thr, 2*cfg.LSWindow.Duration)
	r := qos.NewReclaimer(cfg)
	start := time.Date(2024, 6, 7, 0, 0, 0, 0, time.UTC) // any fixed time: the Reclaimer reads no clock
	end := trace[len(trace)-1].T + traceStepOf(trace)

	res := stabilityResult{PeriodMs: float64(period) / float64(time.Millisecond), CapacityCores: trace[0].Capacity,
		Config: cfg, BatchCPUReasons: map[string]int{}}
	type series struct {
		sum, min       float64
		minUnsat       float64
		changes        int
		zeroDrops      int
		zeroDropsUnj   int
		last           int64
		zero, zeroUnj  int
		overMax, overS float64
	}
	ours := series{min: math.Inf(1), minUnsat: math.Inf(1), last: -1}
	base := series{min: math.Inf(1), minUnsat: math.Inf(1), last: -1}
	record := func(s *series, milli int64, free float64, just, recentSat bool) {
		if milli != s.last {
			if s.last >= 0 {
				s.changes++
				if milli == 0 {
					s.zeroDrops++
					if !just {
						s.zeroDropsUnj++
					}
				}
			}
			s.last = milli
		}
		v := float64(milli) / 1000
		s.sum += v
		s.min = math.Min(s.min, v)
		if !recentSat {
			s.minUnsat = math.Min(s.minUnsat, v)
		}
		if milli == 0 {
			s.zero++
			if !just {
				s.zeroUnj++
			}
		}
		if over := v - free; over > 0 {
			s.overMax = math.Max(s.overMax, over)
			s.overS += period.Seconds()
		}
	}
	i := 0
	for at := time.Duration(0); at < end; at += period {
		for i+1 < len(trace) && trace[i+1].T <= at {
			i++
		}
		smp := trace[i]
		out := r.Next(qos.ReclaimInput{Now: start.Add(at),
			CPU: qos.ResourceUsage{Capacity: smp.Capacity, LSUsage: smp.LS, BEUsage: smp.BE, SystemUsage: smp.Syst},
			Memory: qos.ResourceUsage{Capacity: stabilityMemCapacity, LSUsage: stabilityMemLS,
				LSRequest: stabilityMemRequest},
		})
		res.Periods++
		free := smp.Capacity - smp.LS - smp.BE - smp.Syst
		milli := ours.last
		if out.CPU.Write {
			res.BatchCPUReasons[out.CPU.Reason]++
			milli = out.BatchCPUMilli()
		}
		record(&ours, milli, free, justified[i], recent[i])

		naive := max(0, min(smp.Capacity*thr-smp.LS-smp.BE-smp.Syst, smp.Capacity))
		record(&base, int64(math.Floor(naive*1000)), free, justified[i], recent[i])
	}
	res.Hours = end.Hours()
	n := float64(res.Periods)
	res.BatchCPUChangesPerHour = float64(ours.changes) / res.Hours
	for _, c := range res.BatchCPUReasons {
		res.BatchCPUWritesPerHour += float64(c)
	}
	res.BatchCPUWritesPerHour /= res.Hours
	res.BatchCPUMeanCores = ours.sum / n
	res.BatchCPUMinCores = ours.min
	res.BatchCPUMinOverMean = ratio(ours.min, res.BatchCPUMeanCores)
	res.BatchCPUMinOverMeanUnsaturated = ratio(finiteOr(ours.minUnsat, ours.min), res.BatchCPUMeanCores)
	res.BatchCPUOvercommitMax = ours.overMax
	res.BatchCPUOvercommitSeconds = ours.overS
	res.BatchCPUZeroPeriods, res.BatchCPUZeroUnjustifiedPeriods = ours.zero, ours.zeroUnj
	res.BatchCPUZeroDrops, res.BatchCPUZeroDropsUnjustified = ours.zeroDrops, ours.zeroDropsUnj

	res.BaselineChangesPerHour = float64(base.changes) / res.Hours
	res.BaselineMeanCores = base.sum / n
	res.BaselineMinCores = base.min
	res.BaselineMinOverMean = ratio(base.min, res.BaselineMeanCores)
	res.BaselineMinOverMeanUnsaturated = ratio(finiteOr(base.minUnsat, base.min), res.BaselineMeanCores)
	res.BaselineOvercommitMax = base.overMax
	res.BaselineZeroPeriods, res.BaselineZeroUnjustifiedPeriods = base.zero, base.zeroUnj
	res.BaselineZeroDrops, res.BaselineZeroDropsUnjustified = base.zeroDrops, base.zeroDropsUnj
	return res
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func finiteOr(v, alt float64) float64 {
	if math.IsInf(v, 0) {
		return alt
	}
	return v
}

// traceStepOf is the spacing of the trace's samples (that of the last two), so
// the last sample is held as long as the others.
func traceStepOf(trace []traceSample) time.Duration {
	if len(trace) < 2 {
		return time.Second
	}
	return trace[len(trace)-1].T - trace[len(trace)-2].T
}

// saturatedWithin reports, per sample, whether within the preceding window
// (sample included) LS + BE + system was at or above capacity×threshold for at
// least saturationTime in total: LS truly used the node, so a published 0 is
// right. One sample's burst (one control period, or one 5 s trace row) is not.
func saturatedWithin(trace []traceSample, thr float64, window time.Duration) []bool {
	out := make([]bool, len(trace))
	step := traceStepOf(trace)
	var sat time.Duration // saturated time of the samples lo..i
	lo := 0
	full := func(s traceSample) bool { return s.LS+s.BE+s.Syst >= s.Capacity*thr }
	for i, s := range trace {
		if full(s) {
			sat += step
		}
		for trace[lo].T <= s.T-window {
			if full(trace[lo]) {
				sat -= step
			}
			lo++
		}
		out[i] = sat >= saturationTime
	}
	return out
}

// parseTrace reads the CSV trace: '#' comment lines, the header traceHeader,
// then rows of t_s (whole seconds, strictly increasing, starting at 0),
// capacity_cores (> 0) and the three usages (>= 0), all finite.
func parseTrace(r io.Reader) ([]traceSample, error) {
	sc := bufio.NewScanner(r)
	var out []traceSample
	header := false
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if !header {
			if text != traceHeader {
				return nil, fmt.Errorf("line %d: header %.64q, want %q: %w", line, text, traceHeader, errTrace)
			}
			header = true
			continue
		}
		f := strings.Split(text, ",")
		if len(f) != 5 {
			return nil, fmt.Errorf("line %d: %d fields, want 5: %w", line, len(f), errTrace)
		}
		var v [5]float64
		for k, s := range f {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
				return nil, fmt.Errorf("line %d: %s %.64q is not a finite number >= 0: %w",
					line, strings.Split(traceHeader, ",")[k], s, errTrace)
			}
			v[k] = x
		}
		if v[0] != math.Trunc(v[0]) || v[0] > float64(30*24*time.Hour/time.Second) {
			return nil, fmt.Errorf("line %d: t_s %v must be whole seconds within 30 days: %w", line, v[0], errTrace)
		}
		s := traceSample{T: time.Duration(v[0]) * time.Second, Capacity: v[1], LS: v[2], BE: v[3], Syst: v[4]}
		switch {
		case len(out) == 0 && s.T != 0:
			return nil, fmt.Errorf("line %d: the first t_s is %v, want 0: %w", line, v[0], errTrace)
		case len(out) > 0 && s.T <= out[len(out)-1].T:
			return nil, fmt.Errorf("line %d: t_s %v is not after the previous one: %w", line, v[0], errTrace)
		case s.Capacity == 0:
			return nil, fmt.Errorf("line %d: capacity_cores must be > 0: %w", line, errTrace)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("%d samples, want at least 2: %w", len(out), errTrace)
	}
	return out, nil
}

// generateLSTrace writes a day of LS, BE and system CPU usage of a 16-CPU node
// at 5 s resolution to path, from seed: a daily cycle (night trough, office-hours
// plateau with a lunch and an evening bump), AR(1) plus white noise, random LS
// bursts (about 4 an hour, 5 s to 10 min, +1 to +5 cores), a 10-minute incident at
// 14:10 in which LS takes the whole node, an hourly 30 s system spike (log
// rotation) and a 15-minute BE job every 6 hours. The same seed gives the same
// bytes.
func generateLSTrace(path string, seed int64) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Synthetic LS CPU usage of a %v-CPU node, 24 h at %v, seed %d.\n", traceCapacity, traceStep, seed)
	b.WriteString("# Generated by `colo stability -generate` (bench/colo/stability.go, generateLSTrace);\n")
	b.WriteString("# replayed by `colo stability` and TestStability. Usage in cores; t_s in seconds.\n")
	b.WriteString(traceHeader + "\n")

	rng := rand.New(rand.NewPCG(uint64(seed), 0x5ab1e))
	ar := 0.0
	burstEnd, burstAmp := time.Duration(-1), 0.0
	steps := int(traceDuration / traceStep)
	perStep := traceStep.Seconds() / 3600 // hours per step
	for k := range steps {
		t := time.Duration(k) * traceStep
		h := t.Hours()
		daily := 0.5 - 0.5*math.Cos(2*math.Pi*(h-4)/24) // 0 at 04:00, 1 at 16:00
		ls := 2.5 + 6*daily + 1.2*bump(h, 12.5, 0.6) + 1.0*bump(h, 20, 1)
		ar = 0.9*ar + rng.NormFloat64()*0.4*math.Sqrt(1-0.81) // stationary σ 0.4
		ls += ar + rng.NormFloat64()*0.2
		if t >= burstEnd && rng.Float64() < 4*perStep {
			d := time.Duration(rng.ExpFloat64() * float64(time.Minute))
			d = min(max(d, 5*time.Second), 10*time.Minute)
			burstEnd, burstAmp = t+d, 1+4*rng.Float64()
		}
		if t < burstEnd {
			ls += burstAmp
		}
		if h >= 14+10.0/60 && h < 14+20.0/60 { // the incident: LS takes the node
			ls = traceCapacity - 0.3
		}
		be := 0.3 + 0.1*rng.NormFloat64()
		if math.Mod(h, 6) >= 3 && math.Mod(h, 6) < 3.25 {
			be += 1.5
		}
		sys := 0.6 + 0.08*rng.NormFloat64()
		if t%time.Hour < 30*time.Second {
			sys += 1
		}
		ls, be, sys = math.Max(ls, 0.05), math.Max(be, 0), math.Max(sys, 0.05)
		if over := ls + be + sys - traceCapacity; over > 0 { // cannot use more than the node
			ls = math.Max(0, ls-over)
		}
		fmt.Fprintf(&b, "%d,%v,%.2f,%.2f,%.2f\n", int64(t/time.Second), traceCapacity, ls, be, sys)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// bump is a Gaussian bump of height 1 centred on hour c with width w hours.
func bump(h, c, w float64) float64 { return math.Exp(-(h - c) * (h - c) / (2 * w * w)) }

// printStability prints the replay's figures next to the naive baseline's.
func printStability(printf func(string, ...any), st stabilityResult) {
	printf("published batch-cpu over %.0f h of a recorded noisy LS trace (%s), %.0f-core node:\n",
		st.Hours, st.Trace, st.CapacityCores)
	printf("  %-28s %12s %12s\n", "", "reclaimer", "instant")
	printf("  %-28s %12.1f %12.1f\n", "changes per hour", st.BatchCPUChangesPerHour, st.BaselineChangesPerHour)
	printf("  %-28s %12.2f %12.2f\n", "mean published (cores)", st.BatchCPUMeanCores, st.BaselineMeanCores)
	printf("  %-28s %12.3f %12.3f\n", "min/mean outside saturation", st.BatchCPUMinOverMeanUnsaturated,
		st.BaselineMinOverMeanUnsaturated)
	printf("  %-28s %12d %12d\n", "drops to 0 without LS need", st.BatchCPUZeroDropsUnjustified,
		st.BaselineZeroDropsUnjustified)
	printf("  %-28s %12.2f %12.2f\n", "max over-promise (cores)", st.BatchCPUOvercommitMax, st.BaselineOvercommitMax)
}
