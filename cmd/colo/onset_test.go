package main

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/signals/runqlat"
)

func TestSummarizeReaction(t *testing.T) {
	t.Parallel()
	const busy = 1500 * time.Millisecond
	tests := []struct {
		name                           string
		steps                          []reactionStep
		stepMs, fromHarmMs             []float64
		noCut, harmed, cutsWithoutHarm int
		probed                         bool
	}{
		{name: "no probe: from the step only",
			steps:  []reactionStep{{CutMs: 40, OnsetMs: -1}, {CutMs: -1, OnsetMs: -1}},
			stepMs: []float64{40, 1500}, noCut: 1},
		{name: "harm then cut; cut before the bench saw harm",
			steps:  []reactionStep{{CutMs: 60, OnsetMs: 20, HaveOnset: true}, {CutMs: 10, OnsetMs: 30, HaveOnset: true}},
			stepMs: []float64{60, 10}, fromHarmMs: []float64{40, 0}, harmed: 2, probed: true},
		{name: "harm and no cut: the rest of the step",
			steps:  []reactionStep{{CutMs: -1, OnsetMs: 500, HaveOnset: true}},
			stepMs: []float64{1500}, fromHarmMs: []float64{1000}, noCut: 1, harmed: 1, probed: true},
		{name: "no harm: no cut needed; a cut anyway is counted",
			steps:  []reactionStep{{CutMs: -1, OnsetMs: -1, HaveOnset: true}, {CutMs: 80, OnsetMs: -1, HaveOnset: true}},
			stepMs: []float64{1500, 80}, noCut: 1, cutsWithoutHarm: 1, probed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := summarizeReaction(tc.steps, busy)
			if !slices.Equal(r.StepMs, tc.stepMs) || !slices.Equal(r.FromHarmMs, tc.fromHarmMs) ||
				r.NoCut != tc.noCut || r.Harmed != tc.harmed || r.CutsWithoutHarm != tc.cutsWithoutHarm || r.Probed != tc.probed {
				t.Fatalf("summary %+v", r)
			}
		})
	}
}

// The bench's harm rule is the agent's default: ≥ 20 delays and the 99th percentile in a
// bucket starting at or above 2 ms.
func TestOnsetHarmedRule(t *testing.T) {
	t.Parallel()
	hist := func(fast, slow uint64) runqlat.Histogram {
		var h runqlat.Histogram
		h.Buckets[3] = fast  // [8, 16) µs
		h.Buckets[11] = slow // [2.048, 4.096) ms
		h.Count = fast + slow
		return h
	}
	tests := []struct {
		name       string
		fast, slow uint64
		want       bool
	}{
		{"too few delays", 10, 9, false},
		{"one slow in 20: the 99th percentile is it", 19, 1, true},
		{"one slow in 200: below the 99th percentile", 199, 1, false},
		{"three slow in 200", 197, 3, true},
		{"none slow", 500, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := harmed(hist(tc.fast, tc.slow)); got != tc.want {
				t.Fatalf("harmed(%d fast, %d slow) = %v, want %v", tc.fast, tc.slow, got, tc.want)
			}
		})
	}
}

// waitRestored waits out the minimum, then until the value stops rising.
func TestWaitRestored(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	rising := func() (float64, error) { // rises for its first 10 reads, then stays
		return float64(min(calls.Add(1), 10)), nil
	}
	start := time.Now()
	if err := waitRestored(context.Background(), rising, 50*time.Millisecond, 300*time.Millisecond, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// 50 ms, ~9 rising reads 100 ms apart, then 300 ms flat.
	if d := time.Since(start); d < 1200*time.Millisecond || calls.Load() < 13 {
		t.Fatalf("returned after %v and %d reads: want the rise waited out, then 300 ms flat", d, calls.Load())
	}
	flat := func() (float64, error) { return 1, nil }
	start = time.Now()
	if err := waitRestored(context.Background(), flat, 10*time.Millisecond, 200*time.Millisecond, time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Fatalf("flat value: returned after %v, want about 210 ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitRestored(ctx, flat, time.Second, time.Second, time.Second); err == nil {
		t.Fatal("cancelled context: want an error")
	}
}
