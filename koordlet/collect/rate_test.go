package collect

import (
	"math"
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type sample struct {
		now    time.Time
		value  time.Duration
		cores  float64
		wantOK bool
	}
	tests := []struct {
		name    string
		samples []sample
	}{
		{"first sample has no rate", []sample{
			{at(0), time.Second, 0, false},
		}},
		{"steady usage", []sample{
			{at(0), 0, 0, false},
			{at(100), 150 * time.Millisecond, 1.5, true},
			{at(200), 150 * time.Millisecond, 0, true},
			{at(1200), 2150 * time.Millisecond, 2, true},
		}},
		{"counter reset becomes the new baseline", []sample{
			{at(0), 10 * time.Second, 0, false},
			{at(100), 50 * time.Millisecond, 0, false},
			{at(200), 100 * time.Millisecond, 0.5, true},
		}},
		{"same instant is ignored, baseline kept", []sample{
			{at(0), 0, 0, false},
			{at(0), 99 * time.Millisecond, 0, false},
			{at(100), 100 * time.Millisecond, 1, true},
		}},
		{"time going backwards resets", []sample{
			{at(100), 0, 0, false},
			{at(50), 10 * time.Millisecond, 0, false},
			{at(150), 60 * time.Millisecond, 0.5, true},
		}},
		{"int64 wrap keeps the delta", []sample{
			{at(0), time.Duration(math.MaxInt64 - int64(50*time.Millisecond)), 0, false},
			{at(100), time.Duration(math.MinInt64 + int64(50*time.Millisecond) - 1), 1, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var r Rate
			for i, s := range tc.samples {
				cores, ok := r.Update(s.now, s.value)
				if ok != s.wantOK || math.Abs(cores-s.cores) > 1e-9 {
					t.Errorf("sample %d: Update = (%v, %v), want (%v, %v)", i, cores, ok, s.cores, s.wantOK)
				}
			}
		})
	}
}

func TestRateReset(t *testing.T) {
	t.Parallel()
	var r Rate
	now := time.Now()
	r.Update(now, 0)
	if _, ok := r.Update(now.Add(time.Second), time.Second); !ok {
		t.Fatal("second sample gave no rate")
	}
	r.Reset()
	if _, ok := r.Update(now.Add(2*time.Second), 2*time.Second); ok {
		t.Error("rate after Reset without a new baseline")
	}
}
