package qos_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/qos"
)

func TestChooseGPUMPSCaps(t *testing.T) {
	t.Parallel()
	def := qos.DefaultGPUMPSPolicy()
	custom := def
	custom.MaxBatchPercent, custom.MinBatchPercent, custom.LSHeadroomPercent = 50, 5, 0
	lsFull := def
	lsFull.LSCapPercent = 100
	lsLow := def
	lsLow.LSCapPercent = 50
	tests := []struct {
		name      string
		p         qos.GPUMPSPolicy
		in        qos.GPUMPSCapInput
		ls, batch int
		reasonIn  string
	}{
		// The hand-measured best on the H200: LS ≈ 33 % busy, LS 75 % / batch 25 %.
		{"LS 33 % busy, the H200's hand-measured best", def, qos.GPUMPSCapInput{LSDemandPercent: 33}, 75, 25, "batch at its most (25 %)"},
		{"no LS yet", def, qos.GPUMPSCapInput{}, 75, 25, "batch at its most"},
		{"lsCapPercent 100: LS may use every SM", lsFull, qos.GPUMPSCapInput{LSDemandPercent: 33}, 100, 25,
			"LS cap 100 % (lsCapPercent) overlaps"},
		{"lsCapPercent below the rest: the rest", lsLow, qos.GPUMPSCapInput{LSDemandPercent: 33}, 75, 25, "at its most"},
		{"LS demand squeezes batch", def, qos.GPUMPSCapInput{LSDemandPercent: 60}, 85, 15, "batch squeezed to 15 %"},
		{"fractional demand rounds up for LS", def, qos.GPUMPSCapInput{LSDemandPercent: 60.2}, 86, 14, "squeezed"},
		{"LS demand high: batch at its floor", def, qos.GPUMPSCapInput{LSDemandPercent: 80}, 90, 10, "floor (10 %"},
		{"demand above 100", def, qos.GPUMPSCapInput{LSDemandPercent: 250}, 90, 10, "floor"},
		{"NaN demand is the worst case", def, qos.GPUMPSCapInput{LSDemandPercent: math.NaN()}, 90, 10, "LS demand NaN unusable"},
		{"negative demand is the worst case", def, qos.GPUMPSCapInput{LSDemandPercent: -1}, 90, 10, "unusable"},
		{"infinite demand", def, qos.GPUMPSCapInput{LSDemandPercent: math.Inf(1)}, 90, 10, "unusable"},
		{"LS requests fit beside the default", def, qos.GPUMPSCapInput{LSDemandPercent: 10, LSRequestMilli: []int64{300, 200}},
			75, 25, "at its most"},
		{"LS requests above the floor bound batch", def, qos.GPUMPSCapInput{LSRequestMilli: []int64{950}}, 95, 5,
			"bounded to 5 % by LS requests of 950 milli"},
		{"LS request 951 milli rounds up for LS", def, qos.GPUMPSCapInput{LSRequestMilli: []int64{951}}, 96, 4, "bounded"},
		{"requests above 1000 are a whole GPU: batch keeps 1 %", def,
			qos.GPUMPSCapInput{LSRequestMilli: []int64{2000, 5000}}, 99, 1, "by LS requests of 1000 milli"},
		{"negative request ignored", def, qos.GPUMPSCapInput{LSDemandPercent: 33, LSRequestMilli: []int64{-500}}, 75, 25, "at its most"},
		{"batch's own request raises its floor", def, qos.GPUMPSCapInput{LSDemandPercent: 80, BatchRequestMilli: 150}, 85, 15,
			"floor (15 %"},
		{"batch's request never above maxBatchPercent", def, qos.GPUMPSCapInput{LSDemandPercent: 80, BatchRequestMilli: 900},
			75, 25, "floor (25 %"},
		{"batch request beyond 1000", def, qos.GPUMPSCapInput{BatchRequestMilli: 1 << 40}, 75, 25, ""},
		{"negative batch request", def, qos.GPUMPSCapInput{LSDemandPercent: 80, BatchRequestMilli: -100}, 90, 10, "floor"},
		{"custom policy: half and half", custom, qos.GPUMPSCapInput{LSDemandPercent: 33}, 50, 50, "at its most (50 %)"},
		{"custom policy squeezed", custom, qos.GPUMPSCapInput{LSDemandPercent: 93}, 93, 7, "squeezed"},
		{"invalid policy: the defaults", qos.GPUMPSPolicy{MaxBatchPercent: 100}, qos.GPUMPSCapInput{LSDemandPercent: 33}, 75, 25, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := qos.ChooseGPUMPSCaps(tc.p, tc.in)
			if got.LSPercent != tc.ls || got.BatchPercent != tc.batch || !strings.Contains(got.Reason, tc.reasonIn) {
				t.Fatalf("ChooseGPUMPSCaps(%+v) = %+v, want LS %d batch %d, reason with %q", tc.in, got, tc.ls, tc.batch, tc.reasonIn)
			}
		})
	}
}

// Whatever the inputs: batch in [1, maxBatchPercent] and never 100, LS + batch = 100,
// and LS's cap covers its requests.
func FuzzChooseGPUMPSCaps(f *testing.F) {
	f.Add(33.0, int64(0), int64(0), int64(0), 25, 10, 25.0)
	f.Add(math.NaN(), int64(999), int64(-1), int64(1<<50), 99, 1, 0.0)
	f.Add(-5.0, int64(1001), int64(400), int64(300), 0, 0, math.Inf(1))
	f.Fuzz(func(t *testing.T, demand float64, r1, r2, batchReq int64, maxB, minB int, headroom float64) {
		p := qos.GPUMPSPolicy{LSHeadroomPercent: headroom, MinBatchPercent: minB, MaxBatchPercent: maxB,
			FreezeMarginPercent: 5, DemandWindow: escDur(time.Minute)}
		got := qos.ChooseGPUMPSCaps(p, qos.GPUMPSCapInput{LSDemandPercent: demand, LSRequestMilli: []int64{r1, r2},
			BatchRequestMilli: batchReq})
		maxBatch := maxB
		if p.Validate() != nil {
			maxBatch = 99 // forced into range: at most 99 in any case
		}
		req := min(max(r1, 0), 1000) + min(max(r2, 0), 1000)
		reqPct := int(min((min(req, 1000)+9)/10, 99))
		if got.BatchPercent < 1 || got.BatchPercent > 99 || got.BatchPercent > maxBatch ||
			got.LSPercent+got.BatchPercent != 100 || got.LSPercent < reqPct || got.Reason == "" {
			t.Fatalf("ChooseGPUMPSCaps(%v, %d, %d, %d; %+v) = %+v", demand, r1, r2, batchReq, p, got)
		}
	})
}

func TestGPUDemandPeak(t *testing.T) {
	t.Parallel()
	const w = 10 * time.Second
	type obs struct {
		at   time.Duration
		v    float64
		want float64
	}
	tests := []struct {
		name string
		obs  []obs
	}{
		{"a peak lasts one window at least, two at most", []obs{
			{0, 30, 30}, {5 * time.Second, 10, 30}, {10 * time.Second, 5, 30}, {19 * time.Second, 5, 30},
			{20 * time.Second, 4, 5}, {30 * time.Second, 3, 4}, {40 * time.Second, 0, 3},
		}},
		{"a long gap forgets everything", []obs{{0, 80, 80}, {25 * time.Second, 7, 7}}},
		{"clock back restarts", []obs{{10 * time.Second, 80, 80}, {0, 7, 7}}},
		{"bad samples: NaN is 100, negative 0", []obs{{0, math.NaN(), 100}, {25 * time.Second, -4, 0},
			{26 * time.Second, math.Inf(-1), 100}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var g qos.GPUDemandPeak
			if g.Peak() != 0 {
				t.Fatalf("empty peak %v", g.Peak())
			}
			for i, o := range tc.obs {
				if got := g.Observe(gpuT0.Add(o.at), o.v, w); got != o.want || g.Peak() != o.want {
					t.Fatalf("obs %d at %v: peak %v (Peak %v), want %v", i, o.at, got, g.Peak(), o.want)
				}
			}
		})
	}
}
