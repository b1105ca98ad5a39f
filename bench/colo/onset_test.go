package colo

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestSummarizeReaction(t *testing.T) {
	t.Parallel()
	const busy = 1500 * time.Millisecond
	tests := []struct {
		name                           string
		steps                          []reactionStep
		stepMs, fromHarmMs             []float64
		noCut, harmed, cutsWithoutHarm int
		probed, probedBatch            bool
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
		{name: "a probe counting batch's harm only says so",
			steps:  []reactionStep{{CutMs: 30, OnsetMs: 10, HaveOnset: true, OnsetBatch: true}},
			stepMs: []float64{30}, fromHarmMs: []float64{20}, harmed: 1, probed: true, probedBatch: true},
		{name: "no harm: no cut needed; a cut anyway is counted",
			steps:  []reactionStep{{CutMs: -1, OnsetMs: -1, HaveOnset: true}, {CutMs: 80, OnsetMs: -1, HaveOnset: true}},
			stepMs: []float64{1500, 80}, noCut: 1, cutsWithoutHarm: 1, probed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := summarizeReaction(tc.steps, busy)
			if !slices.Equal(r.StepMs, tc.stepMs) || !slices.Equal(r.FromHarmMs, tc.fromHarmMs) ||
				r.NoCut != tc.noCut || r.Harmed != tc.harmed || r.CutsWithoutHarm != tc.cutsWithoutHarm || r.Probed != tc.probed ||
				r.ProbedBatch != tc.probedBatch {
				t.Fatalf("summary %+v", r)
			}
			// Quantiles over the step order's values (nearest rank), 0 when empty.
			if r.StepMax != slices.Max(tc.stepMs) || r.StepP99 != slices.Max(tc.stepMs) ||
				(len(tc.fromHarmMs) > 0 && r.FromHarmP99 != slices.Max(tc.fromHarmMs)) ||
				(len(tc.fromHarmMs) == 0 && r.FromHarmP99 != 0) {
				t.Fatalf("quantiles %+v", r)
			}
		})
	}
	// Two steps: the median is the lower (nearest rank), the settle median from settles.
	r := summarizeReaction([]reactionStep{{CutMs: 90, SettleMs: 300, OnsetMs: -1}, {CutMs: 30, SettleMs: 100, OnsetMs: -1}}, busy)
	if r.StepP50 != 30 || r.SettleP50 != 100 || !slices.Equal(r.StepMs, []float64{90, 30}) {
		t.Fatalf("two steps: %+v", r)
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
