package runqlat

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"
)

// encode is the kernel's layout of h (the inverse of DecodeHistogram).
func encode(h Histogram) []byte {
	b := make([]byte, 0, rawHistogramSize)
	for _, v := range h.Buckets {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	b = binary.NativeEndian.AppendUint64(b, h.Count)
	b = binary.NativeEndian.AppendUint64(b, h.SumNs)
	return binary.NativeEndian.AppendUint64(b, h.Batch)
}

func TestDecodeHistogram(t *testing.T) {
	t.Parallel()
	full := Histogram{Count: 6, SumNs: 123456789, Batch: 2}
	full.Buckets[0], full.Buckets[3], full.Buckets[NumBuckets-1] = 1, 4, 1

	tests := []struct {
		name    string
		raw     []byte
		want    Histogram
		wantErr error
	}{
		{name: "zero", raw: make([]byte, rawHistogramSize)},
		{name: "values", raw: encode(full), want: full},
		{name: "empty", raw: nil, wantErr: ErrMalformed},
		{name: "short", raw: make([]byte, rawHistogramSize-8), wantErr: ErrMalformed},
		{name: "long", raw: make([]byte, rawHistogramSize+1), wantErr: ErrMalformed},
		{name: "per-CPU layout", raw: make([]byte, 2*rawHistogramSize), wantErr: ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeHistogram(tc.raw)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBucketUpper(t *testing.T) {
	t.Parallel()
	tests := []struct {
		i    int
		want time.Duration
	}{
		{-1, 0},
		{0, 2 * time.Microsecond},
		{1, 4 * time.Microsecond},
		{9, 1024 * time.Microsecond},
		{NumBuckets - 2, (1 << 25) * time.Microsecond},
		{NumBuckets - 1, math.MaxInt64},
		{NumBuckets, math.MaxInt64},
	}
	for _, tc := range tests {
		if got := BucketUpper(tc.i); got != tc.want {
			t.Errorf("BucketUpper(%d) = %v, want %v", tc.i, got, tc.want)
		}
	}
}

func hist(buckets map[int]uint64) Histogram {
	var h Histogram
	for i, n := range buckets {
		h.Buckets[i] = n
		h.Count += n
		h.SumNs += n * uint64(BucketUpper(i)/2)
	}
	return h
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	// 90 delays under 2 µs, 9 in [64, 128) µs, 1 in [4, 8) ms.
	h := hist(map[int]uint64{0: 90, 6: 9, 12: 1})
	tests := []struct {
		name string
		h    Histogram
		q    float64
		want time.Duration
	}{
		{"empty", Histogram{}, 0.9, 0},
		{"count without buckets", Histogram{Count: 3, SumNs: 5}, 0.5, 0},
		{"min", h, 0, 2 * time.Microsecond},
		{"p50", h, 0.5, 2 * time.Microsecond},
		{"p90", h, 0.9, 2 * time.Microsecond},
		{"p91", h, 0.91, 128 * time.Microsecond},
		{"p99", h, 0.99, 128 * time.Microsecond},
		{"p999", h, 0.999, 8192 * time.Microsecond},
		{"max", h, 1, 8192 * time.Microsecond},
		{"above 1", h, 7, 8192 * time.Microsecond},
		{"negative", h, -1, 2 * time.Microsecond},
		{"NaN", h, math.NaN(), 2 * time.Microsecond},
		{"overflow bucket", hist(map[int]uint64{NumBuckets - 1: 1}), 0.5, math.MaxInt64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.h.Quantile(tc.q); got != tc.want {
				t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func TestSub(t *testing.T) {
	t.Parallel()
	prev := hist(map[int]uint64{0: 5, 3: 2})
	now := hist(map[int]uint64{0: 7, 3: 2, 10: 4})
	reset := hist(map[int]uint64{10: 1}) // after Unwatch/Watch: smaller
	partial := now
	partial.Buckets[0] = prev.Buckets[0] - 1 // one bucket went back: a reset too

	tests := []struct {
		name       string
		now, prev  Histogram
		want       Histogram
		wantTotals uint64
	}{
		{"growth", now, prev, hist(map[int]uint64{0: 2, 10: 4}), 6},
		{"nothing new", now, now, Histogram{}, 0},
		{"from zero", now, Histogram{}, now, now.Total()},
		{"reset", reset, now, reset, 1},
		{"one bucket back", partial, prev, partial, partial.Total()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tc.now.Sub(tc.prev)
			if got != tc.want || got.Total() != tc.wantTotals {
				t.Errorf("Sub = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// fuzzHist makes a histogram of up to rawHistogramSize fuzz bytes (zero
// padded), small values in the buckets so sums do not wrap.
func fuzzHist(b []byte) Histogram {
	raw := make([]byte, rawHistogramSize)
	copy(raw, b)
	h, _ := DecodeHistogram(raw)
	for i := range h.Buckets {
		h.Buckets[i] >>= 16
	}
	return h
}

func FuzzDecodeHistogram(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, rawHistogramSize))
	f.Add(make([]byte, rawHistogramSize-1))
	f.Add(encode(hist(map[int]uint64{0: 90, 6: 9, 12: 1})))
	f.Add(encode(Histogram{Count: math.MaxUint64, SumNs: math.MaxUint64, Batch: math.MaxUint64}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHistogram(b)
		if len(b) != rawHistogramSize {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%d bytes: err = %v, want ErrMalformed", len(b), err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(encode(h)) != string(b) {
			t.Fatal("decode/encode does not round-trip")
		}
		// Whatever the kernel hands over, reading it must not panic.
		_ = h.Quantile(0.99)
		_ = h.Sub(h)
	})
}

func FuzzHistogramSubQuantile(f *testing.F) {
	f.Add(encode(hist(map[int]uint64{0: 5})), encode(hist(map[int]uint64{0: 7, 10: 4})), 0.9)
	f.Add([]byte{}, []byte{1}, 0.5)
	f.Add(encode(hist(map[int]uint64{3: 1})), encode(Histogram{}), 1.0)
	f.Add([]byte{0xff, 0xff, 0xff}, []byte{0xff}, math.NaN())
	f.Fuzz(func(t *testing.T, a, b []byte, q float64) {
		prev, now := fuzzHist(a), fuzzHist(b)
		d := now.Sub(prev)
		// A delta never exceeds what is there now.
		for i := range d.Buckets {
			if d.Buckets[i] > now.Buckets[i] {
				t.Fatalf("bucket %d: delta %d > now %d", i, d.Buckets[i], now.Buckets[i])
			}
		}
		if d.Count > now.Count || d.SumNs > now.SumNs || d.Batch > now.Batch {
			t.Fatalf("delta %+v exceeds now %+v", d, now)
		}
		// Without a reset, prev + delta is now.
		if d != now && prev.add(d) != now {
			t.Fatalf("prev + (now - prev) != now: %+v + %+v", prev, d)
		}
		if now.Sub(now) != (Histogram{}) {
			t.Fatal("h - h is not empty")
		}

		// Quantile is 0 for an empty histogram, else a bucket bound, and
		// grows with q.
		got := now.Quantile(q)
		if now.Total() == 0 {
			if got != 0 {
				t.Fatalf("Quantile of empty = %v", got)
			}
			return
		}
		isBound := false
		for i := range NumBuckets {
			isBound = isBound || got == BucketUpper(i)
		}
		if !isBound {
			t.Fatalf("Quantile(%v) = %v, not a bucket bound", q, got)
		}
		if lo, hi := now.Quantile(0), now.Quantile(1); got < lo || got > hi {
			t.Fatalf("Quantile(%v) = %v outside [%v, %v]", q, got, lo, hi)
		}
		if !math.IsNaN(q) && q < 1 && now.Quantile(math.Nextafter(q, 2)) < got {
			t.Fatalf("Quantile decreases after %v", q)
		}
	})
}

func TestRank(t *testing.T) {
	t.Parallel()
	h100 := hist(map[int]uint64{0: 90, 6: 10})
	tests := []struct {
		name string
		h    Histogram
		q    float64
		want uint64
	}{
		{"empty", Histogram{}, 0.99, 0},
		{"p99 of 100", h100, 0.99, 99},
		{"p0 is the first", h100, 0, 1},
		{"above 1 clamps", h100, 2, 100},
		{"NaN reads as 0", h100, math.NaN(), 1},
		{"p99 of 20 is the last", hist(map[int]uint64{3: 20}), 0.99, 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.h.Rank(tc.q); got != tc.want {
				t.Fatalf("Rank(%v) = %d, want %d", tc.q, got, tc.want)
			}
		})
	}
}
