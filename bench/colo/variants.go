package colo

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Batch workloads a variant's burners run (`colo burner -kind`).
const (
	// burnCPU is arithmetic in registers: it takes CPU time from LS and nothing else.
	burnCPU = "cpu"
	// burnMemBW streams over a buffer far larger than the last-level cache (memcpy
	// between its halves): it takes CPU time, and memory bandwidth and LLC lines, which
	// no CPU quota accounts for.
	burnMemBW = "membw"
)

// Load shapes of the LS service.
const (
	loadSteady = "steady" // one request every 1/rate
	loadBursty = "bursty" // Poisson bursts: on for burstOn at a peak rate, off for burstOff
)

// loadShape is how the LS requests arrive. The mean rate is the scenario's rate in
// both shapes, so that a bursty variant asks the same work of the LS pod as a steady
// one and differs only in how that work is bunched.
type loadShape struct {
	Kind     string
	BurstOn  time.Duration
	BurstOff time.Duration
	// Seed fixes the Poisson arrivals, so that every phase of every round sees the
	// same bursts (the phases are compared with each other).
	Seed uint64
}

// MarshalJSON writes the shape with its durations in milliseconds.
func (l loadShape) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Kind       string `json:"kind"`
		BurstOnMs  int64  `json:"burst_on_ms,omitempty"`
		BurstOffMs int64  `json:"burst_off_ms,omitempty"`
		Seed       uint64 `json:"seed,omitempty"`
	}{l.Kind, l.BurstOn.Milliseconds(), l.BurstOff.Milliseconds(), l.Seed})
}

// variant is one scenario of the benchmark's variant section: what differs from the
// base scenario (the flags of `colo bench`).
type variant struct {
	Name        string    `json:"name"`
	Description string    `json:"description"`
	Rate        float64   `json:"rate"`
	BatchPods   int       `json:"batch_pods"`
	Threads     int       `json:"threads_per_batch_pod"`
	Burner      string    `json:"burner"`
	BufferMiB   int       `json:"buffer_mib_per_batch_pod,omitempty"`
	Load        loadShape `json:"load"`
}

// Names of the variants.
const (
	variantBase       = "base"
	variantLSHeavy    = "ls-heavy"
	variantSmallBatch = "small-batch"
	variantMemBW      = "membw"
	variantBursty     = "bursty"
)

// defaultVariants is the variant table. base is the scenario of the paired rounds
// (`-rate`, `-batch-pods`, `-threads`); the others change one thing each.
func defaultVariants(base scenarioConfig) []variant {
	return []variant{
		{Name: variantBase, Description: "the paired rounds' scenario: LS at -rate, -batch-pods × -threads CPU burners",
			Rate: base.rate, BatchPods: base.batchPods, Threads: base.threads, Burner: burnCPU,
			Load: loadShape{Kind: loadSteady}},
		{Name: variantLSHeavy, Description: "more LS load: 1 100 requests/s against 6 single-thread batch pods",
			Rate: 1100, BatchPods: 6, Threads: 1, Burner: burnCPU, Load: loadShape{Kind: loadSteady}},
		{Name: variantSmallBatch, Description: "more, smaller batch pods: 12 single-thread pods",
			Rate: base.rate, BatchPods: 12, Threads: 1, Burner: burnCPU, Load: loadShape{Kind: loadSteady}},
		{Name: variantMemBW, Description: "memory-bandwidth-heavy batch: each pod streams memcpy over 256 MiB " +
			"(far beyond the LLC)", Rate: base.rate, BatchPods: base.batchPods, Threads: base.threads,
			Burner: burnMemBW, BufferMiB: 256, Load: loadShape{Kind: loadSteady}},
		{Name: variantBursty, Description: "bursty LS: Poisson arrivals in 300 ms bursts every second " +
			"(3.3× the mean rate within a burst, nothing between)", Rate: base.rate, BatchPods: base.batchPods,
			Threads: base.threads, Burner: burnCPU,
			Load: loadShape{Kind: loadBursty, BurstOn: 300 * time.Millisecond, BurstOff: 700 * time.Millisecond, Seed: 14}},
	}
}

// validate says what is wrong with a variant, naming it.
func (v variant) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("variant %q: %s", v.Name, fmt.Sprintf(format, a...))
	}
	switch {
	case v.Name == "" || strings.ContainsAny(v.Name, ", \t"):
		return bad("a name without commas or spaces is required")
	case v.Rate <= 0:
		return bad("rate %v must be > 0", v.Rate)
	case v.BatchPods < 1 || v.BatchPods > 100:
		return bad("%d batch pods: 1..100", v.BatchPods)
	case v.Threads < 1:
		return bad("%d threads per batch pod: at least 1", v.Threads)
	}
	switch v.Burner {
	case burnCPU:
		if v.BufferMiB != 0 {
			return bad("a cpu burner has no buffer (buffer %d MiB)", v.BufferMiB)
		}
	case burnMemBW:
		// Each thread copies between two halves of its share: at least 1 MiB per half.
		if v.BufferMiB < 2*v.Threads || v.BufferMiB > 4096 {
			return bad("buffer %d MiB: 2 MiB per thread .. 4096 MiB", v.BufferMiB)
		}
	default:
		return bad("burner %q: %s or %s", v.Burner, burnCPU, burnMemBW)
	}
	return v.Load.validate(v.Name)
}

func (l loadShape) validate(name string) error {
	switch l.Kind {
	case loadSteady:
		if l.BurstOn != 0 || l.BurstOff != 0 {
			return fmt.Errorf("variant %q: a steady load has no bursts", name)
		}
	case loadBursty:
		if l.BurstOn < 10*time.Millisecond || l.BurstOff < 0 {
			return fmt.Errorf("variant %q: bursts of %v every %v: on ≥ 10ms, off ≥ 0", name, l.BurstOn, l.BurstOn+l.BurstOff)
		}
	default:
		return fmt.Errorf("variant %q: load %q: %s or %s", name, l.Kind, loadSteady, loadBursty)
	}
	return nil
}

// selectVariants picks the named variants (comma-separated, in the order given;
// empty: none) and validates each. Unknown or repeated names
// are errors.
func selectVariants(table []variant, list string) ([]variant, error) {
	names := splitList(list)
	var out []variant
	for _, n := range names {
		i := slices.IndexFunc(table, func(v variant) bool { return v.Name == n })
		if i < 0 {
			known := make([]string, len(table))
			for j, v := range table {
				known[j] = v.Name
			}
			return nil, fmt.Errorf("-variants: unknown variant %q (known: %s)", n, strings.Join(known, ", "))
		}
		if slices.ContainsFunc(out, func(v variant) bool { return v.Name == n }) {
			return nil, fmt.Errorf("-variants: %q named twice", n)
		}
		if err := table[i].validate(); err != nil {
			return nil, err
		}
		out = append(out, table[i])
	}
	return out, nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// apply returns the scenario configuration of the variant.
func (v variant) apply(sc scenarioConfig) scenarioConfig {
	sc.rate, sc.batchPods, sc.threads = v.Rate, v.BatchPods, v.Threads
	sc.burner, sc.bufferMiB = v.Burner, v.BufferMiB
	sc.load = v.Load
	return sc
}
