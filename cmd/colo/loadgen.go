package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"
)

// openLoop sends requests at a fixed arrival rate regardless of how fast they
// complete, and measures each latency from the request's scheduled send time, so
// queueing delay (coordinated omission) is counted rather than hidden.
type openLoop struct {
	url     string
	rate    float64 // requests per second
	workers int     // concurrent connections available
	client  *http.Client
}

// loadResult is what one open-loop run measured.
type loadResult struct {
	Sent, Errors int
	Latencies    []time.Duration // sorted ascending
	Start, End   time.Time
}

func newOpenLoop(url string, rate float64, workers int) *openLoop {
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers, DisableCompression: true}
	return &openLoop{url: url, rate: rate, workers: workers, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// run sends for the given duration (or until ctx ends) and returns the measured latencies.
func (o *openLoop) run(ctx context.Context, d time.Duration) (loadResult, error) {
	if o.rate <= 0 {
		return loadResult{}, fmt.Errorf("rate %v must be > 0", o.rate)
	}
	interval := time.Duration(float64(time.Second) / o.rate)
	n := int(d / interval)
	sched := make(chan time.Time, n)
	lat := make([]time.Duration, n)
	var mu sync.Mutex
	res := loadResult{Start: time.Now()}
	var wg sync.WaitGroup
	idx := 0
	for range o.workers {
		wg.Go(func() {
			for at := range sched {
				err := o.do(ctx)
				l := time.Since(at)
				mu.Lock()
				if err != nil {
					res.Errors++
				} else {
					lat[idx] = l
					idx++
				}
				mu.Unlock()
			}
		})
	}
	start := res.Start
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-ctx.Done():
				t.Stop()
				close(sched)
				wg.Wait()
				return res, ctx.Err()
			case <-t.C:
			}
		}
		sched <- at
		res.Sent++
	}
	close(sched)
	wg.Wait()
	res.End = time.Now()
	res.Latencies = lat[:idx]
	sort.Slice(res.Latencies, func(i, j int) bool { return res.Latencies[i] < res.Latencies[j] })
	return res, nil
}

func (o *openLoop) do(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.url, nil)
	if err != nil {
		return err
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// quantile returns the q-quantile (0..1) of sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}
