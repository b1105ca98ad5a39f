package colo

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
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
	rate    float64 // requests per second (the mean, for a bursty shape)
	workers int     // concurrent connections available
	shape   loadShape
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
	offsets, err := arrivals(o.shape, o.rate, d)
	if err != nil {
		return loadResult{}, err
	}
	n := len(offsets)
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
	for _, off := range offsets {
		at := start.Add(off)
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

// arrivals returns the send times, as offsets from the start, of a run of length d.
// Steady: one every 1/rate. Bursty: Poisson arrivals (seeded, so every run of a shape
// sends the same pattern) during the first BurstOn of every BurstOn+BurstOff cycle,
// at rate × cycle/BurstOn, so that the mean rate is still rate; nothing in between.
func arrivals(shape loadShape, rate float64, d time.Duration) ([]time.Duration, error) {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("rate %v must be > 0", rate)
	}
	switch shape.Kind {
	case "", loadSteady:
		interval := time.Duration(float64(time.Second) / rate)
		if interval <= 0 {
			return nil, fmt.Errorf("rate %v is beyond one request per nanosecond", rate)
		}
		out := make([]time.Duration, 0, int(d/interval))
		for i := range int(d / interval) {
			out = append(out, time.Duration(i)*interval)
		}
		return out, nil
	case loadBursty:
		if err := shape.validate("load"); err != nil {
			return nil, err
		}
		cycle := shape.BurstOn + shape.BurstOff
		peak := rate * cycle.Seconds() / shape.BurstOn.Seconds()
		rng := rand.New(rand.NewPCG(shape.Seed, 0x5eed))
		out := make([]time.Duration, 0, int(rate*d.Seconds()*1.1)+1)
		var t float64 // seconds into the "on" time, which runs only within bursts
		on := shape.BurstOn.Seconds()
		for {
			t += rng.ExpFloat64() / peak
			burst := math.Floor(t / on)
			at := time.Duration((burst*cycle.Seconds() + (t - burst*on)) * float64(time.Second))
			if at >= d {
				return out, nil
			}
			out = append(out, at)
		}
	}
	return nil, fmt.Errorf("load shape %q: %s or %s", shape.Kind, loadSteady, loadBursty)
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
