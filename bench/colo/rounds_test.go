package colo

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRoundOrder(t *testing.T) {
	t.Parallel()
	all := []cpuPhase{phaseSolo, phaseVanilla, phaseTier, phaseInPlace}
	tests := []struct {
		name   string
		round  int
		rotate bool
		want   []cpuPhase
	}{
		{"fixed, first round", 0, false, all},
		{"fixed, later round", 3, false, all},
		{"rotated, first round", 0, true, []cpuPhase{phaseSolo, phaseVanilla, phaseInPlace, phaseTier}},
		{"rotated, second round", 1, true, []cpuPhase{phaseVanilla, phaseTier, phaseSolo, phaseInPlace}},
		{"rotated, third round", 2, true, []cpuPhase{phaseTier, phaseInPlace, phaseVanilla, phaseSolo}},
		{"rotated, fourth round", 3, true, []cpuPhase{phaseInPlace, phaseSolo, phaseTier, phaseVanilla}},
		{"rotated, fifth round starts over", 4, true, []cpuPhase{phaseSolo, phaseVanilla, phaseInPlace, phaseTier}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := roundOrder(tt.round, tt.rotate); !slices.Equal(got, tt.want) {
				t.Fatalf("roundOrder(%d, %v) = %v, want %v", tt.round, tt.rotate, got, tt.want)
			}
		})
	}
}

// TestRoundOrderEveryPosition checks the point of the rotation: over four rounds every
// phase runs once in every position, and follows every other phase exactly once.
func TestRoundOrderEveryPosition(t *testing.T) {
	t.Parallel()
	seen := map[[2]cpuPhase]int{}
	for pos := range int(numCPUPhases) {
		var at []cpuPhase
		for r := range int(numCPUPhases) {
			o := roundOrder(r, true)
			at = append(at, o[pos])
			if pos > 0 {
				seen[[2]cpuPhase{o[pos-1], o[pos]}]++
			}
		}
		slices.Sort(at)
		if !slices.Equal(at, []cpuPhase{phaseSolo, phaseVanilla, phaseTier, phaseInPlace}) {
			t.Fatalf("position %d holds %v over four rounds, want every phase once", pos, at)
		}
	}
	for pair, n := range seen {
		if n > 1 || pair[0] == pair[1] {
			t.Errorf("%v follows %v in %d rounds", pair[1], pair[0], n)
		}
	}
	if want := int(numCPUPhases) * (int(numCPUPhases) - 1); len(seen) != want {
		t.Errorf("%d ordered pairs of successive phases, want all %d", len(seen), want)
	}
}

func TestNewSpread(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	tests := []struct {
		name             string
		xs               []float64
		median, min, max float64
	}{
		{"none", nil, nan, nan, nan},
		{"one", []float64{1.2}, 1.2, 1.2, 1.2},
		{"odd", []float64{1.3, 0.9, 1.1}, 1.1, 0.9, 1.3},
		{"even: mean of the middle two", []float64{1.4, 1.0, 1.2, 0.8}, 1.1, 0.8, 1.4},
		{"NaN rounds left out", []float64{nan, 1.0, 2.0, nan}, 1.5, 1.0, 2.0},
		{"only NaN", []float64{nan}, nan, nan, nan},
	}
	same := func(a, b float64) bool { return (math.IsNaN(a) && math.IsNaN(b)) || math.Abs(a-b) < 1e-12 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSpread(tt.xs)
			if !same(s.Median, tt.median) || !same(s.Min, tt.min) || !same(s.Max, tt.max) || len(s.Values) != len(tt.xs) {
				t.Fatalf("newSpread(%v) = %+v, want median %v, band %v–%v", tt.xs, s, tt.median, tt.min, tt.max)
			}
		})
	}
}

// testRounds builds rounds from per-round p99s (ms) in the canonical phase order; batch
// used 1.5 cores in every batch phase, with an idle share of 0.8; each round the tier was
// throttled in 1 period and cut twice, the in-place pods in 4 periods and cut 3 times.
func testRounds(p99s ...[4]float64) [][]phaseResult {
	var out [][]phaseResult
	for _, r := range p99s {
		round := make([]phaseResult, numCPUPhases)
		for p := range numCPUPhases {
			round[p] = phaseResult{Name: p.String(), Seconds: 5, P99ms: r[p]}
			if p != phaseSolo {
				round[p].BatchCPU, round[p].IdleShare = 7.5, 0.8
			}
			switch p {
			case phaseTier:
				round[p].ThrottledPeriods, round[p].AgentCuts = 1, 2
			case phaseInPlace:
				round[p].ThrottledPeriods, round[p].AgentCuts = 4, 3
			}
		}
		out = append(out, round)
	}
	return out
}

func TestSummariseRounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		rounds [][]phaseResult
		// Per phase: median p99/solo, band, median p99 / no agent.
		median, min, max, vsVanilla [4]float64
		inPlace                     string
	}{
		{
			// Solo drifts from 2 to 4 ms; the same-round ratios do not.
			name: "drift cancels in the pairing",
			rounds: testRounds([4]float64{2, 2.2, 2.0, 2.4}, [4]float64{3, 3.3, 3.0, 3.6},
				[4]float64{4, 4.8, 4.0, 4.8}),
			median: [4]float64{1, 1.1, 1, 1.2}, min: [4]float64{1, 1.1, 1, 1.2}, max: [4]float64{1, 1.2, 1, 1.2},
			vsVanilla: [4]float64{1 / 1.1, 1, 1 / 1.1, 1.2 / 1.1}, inPlace: "within no agent's band",
		},
		{
			name:   "in-place worse beyond the band",
			rounds: testRounds([4]float64{2, 2.2, 2.2, 3.0}, [4]float64{2, 2.4, 2.0, 3.2}),
			median: [4]float64{1, 1.15, 1.05, 1.55}, min: [4]float64{1, 1.1, 1, 1.5}, max: [4]float64{1, 1.2, 1.1, 1.6},
			vsVanilla: [4]float64{(1/1.1 + 1/1.2) / 2, 1, (1 + 1/1.2) / 2, (3/2.2 + 3.2/2.4) / 2},
			inPlace:   "worse than no agent beyond its band",
		},
		{
			// A round whose solo measured nothing counts in no ratio.
			name:   "empty solo left out",
			rounds: testRounds([4]float64{0, 2.2, 2.0, 2.4}, [4]float64{2, 1.8, 1.6, 1.4}),
			median: [4]float64{1, 0.9, 0.8, 0.7}, min: [4]float64{1, 0.9, 0.8, 0.7}, max: [4]float64{1, 0.9, 0.8, 0.7},
			vsVanilla: [4]float64{0, 1, (2/2.2 + 1.6/1.8) / 2, (2.4/2.2 + 1.4/1.8) / 2},
			inPlace:   "better than no agent beyond its band",
		},
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bands := summariseRounds(tt.rounds)
			if len(bands) != int(numCPUPhases) {
				t.Fatalf("%d bands, want %d", len(bands), numCPUPhases)
			}
			for p, b := range bands {
				if b.Phase != cpuPhase(p) {
					t.Fatalf("band %d is %v", p, b.Phase)
				}
				if !near(b.VsSolo.Median, tt.median[p]) || !near(b.VsSolo.Min, tt.min[p]) || !near(b.VsSolo.Max, tt.max[p]) {
					t.Errorf("%v: p99/solo %+v, want median %v, band %v–%v", b.Phase, b.VsSolo, tt.median[p], tt.min[p], tt.max[p])
				}
				if p != int(phaseSolo) && !near(b.VsVanilla.Median, tt.vsVanilla[p]) {
					t.Errorf("%v: vs no agent %+v, want median %v", b.Phase, b.VsVanilla, tt.vsVanilla[p])
				}
				if p != int(phaseSolo) && !near(b.Pooled.BatchCPU/b.Pooled.Seconds, 1.5) {
					t.Errorf("%v: pooled batch %v cores, want 1.5", b.Phase, b.Pooled.BatchCPU/b.Pooled.Seconds)
				}
			}
			if got := beyondBand(bands[phaseInPlace], bands[phaseVanilla]); got != tt.inPlace {
				t.Errorf("in-place: %q, want %q", got, tt.inPlace)
			}
		})
	}
}

func TestPrintBands(t *testing.T) {
	t.Parallel()
	rounds := testRounds([4]float64{2, 2.2, 2.0, 2.4}, [4]float64{2.5, 2.5, 2.25, 3.75}, [4]float64{0, 1, 1, 1})
	var b strings.Builder
	printBands(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, summariseRounds(rounds), 3, 5*time.Second)
	const want = `
CPU phases, 3 rounds × 5s
p99/solo is each round's LS p99 over the same round's LS-alone p99: median over the rounds; band = lowest–highest round
phase                        p99/solo          band   p99 ms batch CPUs idle share
LS alone                         1.00             -     2.00       0.00          -
LS + batch, no agent             1.05     1.00–1.10     2.20       1.50       0.80
LS + batch, agent tier           0.95     0.90–1.00     2.00       1.50       0.80
LS + batch, agent in-place       1.35     1.20–1.50     2.40       1.50       0.80
(p99 ms: median over the rounds; batch CPUs: cores batch used on average; idle share: the part of the
CPU the LS pod left idle that batch used; both over every round)

Per round, p99/solo (LS-alone p99 in ms)
round   alone ms  no agent      tier  in-place
1           2.00      1.10      1.00      1.20
2           2.50      1.00      0.90      1.50
3           0.00         -         -         -

The agent against no agent: p99 / no-agent p99 of the same round (median, band), and where the
median p99/solo lies against no agent's band; over all rounds, the CFS periods batch's groups
were throttled in (the tier, or the in-place pods summed) and the agent's CPU cuts
LS + batch, agent tier:       0.91   0.90–1.00   better than no agent beyond its band   throttled 3, cuts 6
LS + batch, agent in-place:   1.09   1.00–1.50   worse than no agent beyond its band    throttled 12, cuts 9
`
	if got := b.String(); got != want {
		t.Errorf("printBands:\n%s\nwant:\n%s", got, want)
	}
}

func TestPrintBandsTooFew(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printBands(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, nil, 0, time.Second)
	if b.Len() != 0 {
		t.Fatalf("printed %q for no rounds", b.String())
	}
}

func TestEstimateDemo(t *testing.T) {
	t.Parallel()
	demo := DemoOptions("/bin/colo")
	tests := []struct {
		name     string
		dc       demoConfig
		min, max time.Duration
	}{
		// The demo must finish in ≤ 4 minutes after the build (2 min 35 s measured).
		{"make demo", demoConfig{phase: demo.Phase, warmup: demo.Warmup, memory: demo.Memory, rounds: demo.Rounds,
			memPhase: demo.MemoryPhase}, 2 * time.Minute, 4 * time.Minute},
		// Measured on 2026-11-27: about 43 s.
		{"memory only", demoConfig{memory: true, memPhase: 8 * time.Second}, 40 * time.Second, 50 * time.Second},
		// 2 s set-up + 2 × (4 × 5 s + 3 × 1 s + 2 × 1.5 s).
		{"CPU only", demoConfig{phase: 5 * time.Second, warmup: time.Second, rounds: 2}, 54 * time.Second, 54 * time.Second},
		{"nothing", demoConfig{}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := estimateDemo(tt.dc); got < tt.min || got > tt.max {
				t.Fatalf("estimate %v, want %v..%v", got, tt.min, tt.max)
			}
		})
	}
}
