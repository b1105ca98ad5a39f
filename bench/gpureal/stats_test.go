package gpureal

import (
	"math"
	"slices"
	"testing"
)

func TestQuantile(t *testing.T) {
	t.Parallel()
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for _, tc := range []struct {
		name string
		in   []float64
		q    float64
		want float64
	}{
		{"empty", nil, 0.99, 0},
		{"one", []float64{7}, 0.99, 7},
		{"median of 1..100 (nearest rank)", hundred, 0.5, 50},
		{"p99 of 1..100", hundred, 0.99, 99},
		{"p100", hundred, 1, 100},
		{"p0 is the smallest", hundred, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := quantile(tc.in, tc.q); got != tc.want {
				t.Fatalf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func TestSummariseLS(t *testing.T) {
	t.Parallel()
	// 300 requests at 100/s over 3 s: the first second slow (10 ms), the rest 3 ms,
	// one outlier of 50 ms in the last second (its max, not its p99: 1 of 100).
	var r lsRunResult
	for i := range 300 {
		r.Sched = append(r.Sched, float64(i)/100)
		lat := 3.0
		if i < 100 {
			lat = 10
		}
		if i == 250 {
			lat = 50
		}
		r.LatMS = append(r.LatMS, lat)
	}
	r.Unsent = 2
	for _, tc := range []struct {
		name               string
		from, to           float64
		wantN              int
		wantP50, wantP99   float64
		wantFirst, wantMax float64
		wantPerSecond      []float64
	}{
		{"whole run", 0, 3, 300, 3, 10, 10, 50, []float64{10, 3, 3}},
		{"from the second second", 1, 3, 200, 3, 3, 3, 50, []float64{3, 3}},
		{"first second only", 0, 1, 100, 10, 10, 10, 10, []float64{10}},
		{"outside", 5, 6, 0, 0, 0, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := summariseLS(r, tc.from, tc.to)
			if st.Requests != tc.wantN || st.P50 != tc.wantP50 || st.P99 != tc.wantP99 ||
				st.FirstSecondP99 != tc.wantFirst || st.Max != tc.wantMax || st.Unsent != 2 {
				t.Fatalf("summariseLS = %+v", st)
			}
			if !slices.Equal(st.P99PerSecond, tc.wantPerSecond) {
				t.Fatalf("p99 per second %v, want %v", st.P99PerSecond, tc.wantPerSecond)
			}
		})
	}
	// A result whose lists differ in length (a broken stand-in) never indexes past them.
	if st := summariseLS(lsRunResult{Sched: []float64{0, 0.1}, LatMS: []float64{1}}, 0, 1); st.Requests != 1 {
		t.Fatalf("mismatched lists: %+v", st)
	}
}

// steady is a batch run of `every` matmuls per synchronize at rate matmuls/s over
// [from, to) seconds.
func steady(r *batchRunResult, rate, from, to float64) {
	step := float64(r.Every) / rate
	for t := from + step; t < to; t += step {
		r.Syncs = append(r.Syncs, t)
	}
}

func TestSummariseBatch(t *testing.T) {
	t.Parallel()
	r := batchRunResult{Every: 8}
	steady(&r, 600, 0, 10)
	st := summariseBatch(r, 0, 10)
	if math.Abs(st.PerSecond-600) > 600*0.01 {
		t.Fatalf("rate %v, want 600", st.PerSecond)
	}
	if len(st.Timeline) != 40 || st.TimelineStepS != timelineStep {
		t.Fatalf("timeline of %d steps of %v s", len(st.Timeline), st.TimelineStepS)
	}
	for i, v := range st.Timeline[1:] {
		if math.Abs(v-600) > 600*0.15 {
			t.Fatalf("timeline step %d: %v, want about 600", i+1, v)
		}
	}
	if z := summariseBatch(r, 3, 3); z.PerSecond != 0 || len(z.Timeline) != 0 {
		t.Fatalf("an empty window: %+v", z)
	}
}

func TestTimeToRate(t *testing.T) {
	t.Parallel()
	const alone = 600.0
	for _, tc := range []struct {
		name       string
		build      func(r *batchRunResult)
		wantS      float64 // -1: never
		tolerance  float64
		wantSusMin float64
	}{
		{"frozen 1 s, then full", func(r *batchRunResult) { steady(r, alone, 5, 15) }, 1.5, 0.06, 0.97},
		{"full at once", func(r *batchRunResult) { steady(r, alone, 3.5, 15) }, 0.5, 0.06, 0.97},
		{"80 % for good (a duty of 0.2)", func(r *batchRunResult) { steady(r, 0.8*alone, 4, 15) }, -1, 0, 0.78},
		{"frozen 3 s, then full", func(r *batchRunResult) { steady(r, alone, 7, 15) }, 3.5, 0.06, 0.85},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := batchRunResult{Every: 8}
			tc.build(&r)
			rec := timeToRate(r, 4, 14, alone, 0.9)
			if tc.wantS < 0 {
				if rec.Seconds != -1 {
					t.Fatalf("recovered at %v s, want never", rec.Seconds)
				}
			} else if math.Abs(rec.Seconds-tc.wantS) > tc.tolerance {
				t.Fatalf("recovered at %v s, want %v", rec.Seconds, tc.wantS)
			}
			if rec.SustainedFrac < tc.wantSusMin || rec.SustainedFrac > 1.02 {
				t.Fatalf("sustained %v, want ≥ %v", rec.SustainedFrac, tc.wantSusMin)
			}
		})
	}
	if rec := timeToRate(batchRunResult{Every: 8}, 0, 10, 0, 0.9); rec.Seconds != -1 {
		t.Fatalf("no alone rate: %+v", rec)
	}
}

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		line string
		want float64
		err  bool
	}{
		{"plain", "1234 (koordlet) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0", 3, false},
		{"name with spaces and parentheses", "99 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 7 3 0 0", 0.1, false},
		{"truncated", "99 (x) R 1 2", 0, true},
		{"no name", "99 x R", 0, true},
		{"not a number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s 0 0", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseStatCPU(tc.line)
			if (err != nil) != tc.err || math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("parseStatCPU = %v, %v; want %v (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add("1234 (koordlet) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0")
	f.Add("1 ()) R")
	f.Fuzz(func(t *testing.T, line string) {
		v, err := parseStatCPU(line)
		if err == nil && (v < 0 || math.IsNaN(v)) {
			t.Fatalf("parseStatCPU(%q) = %v", line, v)
		}
	})
}
