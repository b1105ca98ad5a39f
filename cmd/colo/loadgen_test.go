package main

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
