package colo

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestOpenLoopCountsQueueing checks the load generator does not hide queueing: with one
// connection and a server slower than the arrival rate, later requests wait for earlier
// ones, and their latency, measured from the scheduled send time, grows.
func TestOpenLoopCountsQueueing(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		time.Sleep(20 * time.Millisecond)
	}))
	defer srv.Close()
	// 100 requests/s for 0.2 s = 20 requests, served one at a time in 20 ms each: the
	// last one is scheduled at 190 ms and finishes at about 400 ms.
	res, err := newOpenLoop(srv.URL, 100, 1).run(context.Background(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 20 || len(res.Latencies) != 20 || served.Load() != 20 {
		t.Fatalf("sent %d, measured %d, served %d; want 20", res.Sent, len(res.Latencies), served.Load())
	}
	if max := res.Latencies[len(res.Latencies)-1]; max < 150*time.Millisecond {
		t.Fatalf("worst latency %v: queueing behind slow requests is hidden", max)
	}
	if min := res.Latencies[0]; min < 20*time.Millisecond {
		t.Fatalf("best latency %v is below the service time", min)
	}
}

func TestOpenLoopRejectsBadRate(t *testing.T) {
	t.Parallel()
	if _, err := newOpenLoop("http://127.0.0.1:1", 0, 1).run(context.Background(), time.Second); err == nil {
		t.Fatal("rate 0 accepted")
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	var xs []time.Duration
	for i := 1; i <= 1000; i++ {
		xs = append(xs, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {0.999, 999 * time.Millisecond}, {1, time.Second}} {
		if got := quantile(xs, tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing")
	}
}

func TestPoolRecomputesQuantiles(t *testing.T) {
	t.Parallel()
	a := phaseResult{Seconds: 1, BatchCPU: 1, IdleShare: 0.5, latencies: []time.Duration{1, 2, 3}}
	b := phaseResult{Seconds: 1, BatchCPU: 1, IdleShare: 1, latencies: []time.Duration{4, 5, 6}}
	p := pool("x", []phaseResult{a, b})
	if len(p.latencies) != 6 || p.latencies[5] != 6 || p.BatchCPU != 2 {
		t.Fatalf("pooled %+v", p)
	}
	// idle share pools as total batch over total idle: (1+1) / (2+1).
	if want := 2.0 / 3.0; p.IdleShare < want-1e-9 || p.IdleShare > want+1e-9 {
		t.Fatalf("idle share %v, want %v", p.IdleShare, want)
	}
}

func TestArrivals(t *testing.T) {
	t.Parallel()
	bursty := loadShape{Kind: loadBursty, BurstOn: 300 * time.Millisecond, BurstOff: 700 * time.Millisecond, Seed: 14}
	tests := []struct {
		name    string
		shape   loadShape
		rate    float64
		d       time.Duration
		wantN   [2]int // inclusive bounds on the count
		wantErr bool
	}{
		{"steady", loadShape{Kind: loadSteady}, 100, time.Second, [2]int{100, 100}, false},
		{"steady by default", loadShape{}, 500, 2 * time.Second, [2]int{1000, 1000}, false},
		// Poisson with mean 500/s over 20 s: 10 000 ± a few hundred.
		{"bursty keeps the mean rate", bursty, 500, 20 * time.Second, [2]int{9500, 10500}, false},
		{"zero rate", loadShape{Kind: loadSteady}, 0, time.Second, [2]int{}, true},
		{"unknown shape", loadShape{Kind: "sine"}, 10, time.Second, [2]int{}, true},
		{"bad bursts", loadShape{Kind: loadBursty}, 10, time.Second, [2]int{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := arrivals(tt.shape, tt.rate, tt.d)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("accepted: %d arrivals", len(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) < tt.wantN[0] || len(got) > tt.wantN[1] {
				t.Fatalf("%d arrivals, want %d..%d", len(got), tt.wantN[0], tt.wantN[1])
			}
			for i, at := range got {
				if at < 0 || at >= tt.d || (i > 0 && at < got[i-1]) {
					t.Fatalf("arrival %d at %v: outside [0, %v) or out of order", i, at, tt.d)
				}
				if tt.shape.Kind == loadBursty {
					cycle := tt.shape.BurstOn + tt.shape.BurstOff
					if at%cycle >= tt.shape.BurstOn {
						t.Fatalf("arrival %d at %v falls between bursts", i, at)
					}
				}
			}
		})
	}
}

// TestArrivalsBurstyRepeatable: every phase of every round gets the same bursts.
func TestArrivalsBurstyRepeatable(t *testing.T) {
	t.Parallel()
	shape := loadShape{Kind: loadBursty, BurstOn: 200 * time.Millisecond, BurstOff: 300 * time.Millisecond, Seed: 7}
	a, errA := arrivals(shape, 400, 3*time.Second)
	b, errB := arrivals(shape, 400, 3*time.Second)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if len(a) != len(b) {
		t.Fatalf("%d vs %d arrivals", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("arrival %d: %v vs %v", i, a[i], b[i])
		}
	}
	shape.Seed = 8
	c, _ := arrivals(shape, 400, 3*time.Second)
	if len(c) == len(a) && c[0] == a[0] && c[len(c)-1] == a[len(a)-1] {
		t.Fatal("another seed gave the same arrivals")
	}
}

// TestOpenLoopBursty sends a bursty load through the generator.
func TestOpenLoopBursty(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	gen := newOpenLoop(srv.URL, 200, 8)
	gen.shape = loadShape{Kind: loadBursty, BurstOn: 50 * time.Millisecond, BurstOff: 50 * time.Millisecond, Seed: 1}
	want, err := arrivals(gen.shape, 200, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	res, err := gen.run(context.Background(), 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != len(want) || len(res.Latencies)+res.Errors != len(want) {
		t.Fatalf("sent %d, measured %d, errors %d; want %d", res.Sent, len(res.Latencies), res.Errors, len(want))
	}
}
