package contract

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func validMetrics() NodeMetrics {
	return NodeMetrics{
		Version: NodeMetricsVersion, Timestamp: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC), WindowMillis: 10000,
		CPU:    CPUMetrics{Capacity: 2000, Used: 1200, LS: 400, Batch: 700, BatchBudget: 1300},
		Memory: MemoryMetrics{Capacity: 8 << 30, Used: 3 << 30, LS: 1 << 30, Batch: 1 << 30},
	}
}

func TestNodeMetricsRoundTrip(t *testing.T) {
	t.Parallel()
	m := validMetrics()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"v":1,"ts":"2026-11-22T03:00:00Z","win":10000,"cpu":{"cap":2000,"used":1200,"ls":400,"batch":700,"budget":1300},"mem":{"cap":8589934592,"used":3221225472,"ls":1073741824,"batch":1073741824}}`
	if string(b) != want {
		t.Fatalf("encoding changed (this is a cross-binary contract, see docs/node-metrics.md):\n got %s\nwant %s", b, want)
	}
	got, err := DecodeNodeMetrics(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if got != m {
		t.Fatalf("round trip: got %+v, want %+v", got, m)
	}
}

// TestNodeMetricsBatch: the optional batch field is written only when set, zero stays
// distinct from absent, and annotations written before the field existed still decode.
func TestNodeMetricsBatch(t *testing.T) {
	t.Parallel()
	const v1 = `{"v":1,"ts":"2026-11-22T03:00:00Z","win":10000,"cpu":{"cap":2000,"used":1200,"ls":400,"batch":700,"budget":1300},"mem":{"cap":8589934592,"used":3221225472,"ls":1073741824,"batch":1073741824}}`
	withBatch := func(b *BatchResources) NodeMetrics { m := validMetrics(); m.Batch = b; return m }
	for _, tc := range []struct {
		name string
		m    NodeMetrics
		want string // encoding
	}{
		{"absent", withBatch(nil), v1},
		{"set", withBatch(&BatchResources{CPU: 3500, Memory: 6 << 30}),
			strings.TrimSuffix(v1, "}") + `,"batch":{"cpu":3500,"mem":6442450944}}`},
		{"zero is not absent", withBatch(&BatchResources{}), strings.TrimSuffix(v1, "}") + `,"batch":{"cpu":0,"mem":0}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := tc.m.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("encoding (a cross-binary contract, see docs/node-metrics.md):\n got %s\nwant %s", b, tc.want)
			}
			got, err := DecodeNodeMetrics(string(b))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.m) {
				t.Fatalf("round trip: got %+v (batch %+v), want %+v (batch %+v)", got, got.Batch, tc.m, tc.m.Batch)
			}
		})
	}
	// An annotation from an agent that predates the field, and one from a newer agent
	// with fields this build does not know, both decode.
	for _, s := range []string{v1, strings.TrimSuffix(v1, "}") + `,"batch":{"cpu":1,"mem":2,"gpu":3},"new":{"x":1}}`} {
		if _, err := DecodeNodeMetrics(s); err != nil {
			t.Errorf("DecodeNodeMetrics(%s) = %v", s, err)
		}
	}
	if m, err := DecodeNodeMetrics(strings.TrimSuffix(v1, "}") + `,"batch":null}`); err != nil || m.Batch != nil {
		t.Errorf("batch null: %+v, %v; want nil batch", m.Batch, err)
	}
}

func TestDecodeNodeMetricsRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     error
	}{
		{"empty", "", ErrInvalidNodeMetrics},
		{"not json", "cpu=2", ErrInvalidNodeMetrics},
		{"future version", `{"v":3,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1}}`, ErrUnsupportedVersion},
		{"no version", `{"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1}}`, ErrUnsupportedVersion},
		{"no timestamp", `{"v":1,"win":1,"cpu":{"cap":1}}`, ErrInvalidNodeMetrics},
		{"no window", `{"v":1,"ts":"2026-11-22T03:00:00Z","cpu":{"cap":1}}`, ErrInvalidNodeMetrics},
		{"negative", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1,"ls":-5}}`, ErrInvalidNodeMetrics},
		{"negative batch cpu", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"batch":{"cpu":-1,"mem":0}}`, ErrInvalidNodeMetrics},
		{"negative batch mem", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"batch":{"cpu":0,"mem":-1}}`, ErrInvalidNodeMetrics},
		{"batch not an object", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"batch":5}`, ErrInvalidNodeMetrics},
		{"zero capacity", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":0}}`, ErrInvalidNodeMetrics},
		{"wrong type", `{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":"2"}}`, ErrInvalidNodeMetrics},
		{"too large", `{"v":1,"pad":"` + strings.Repeat("x", maxNodeMetricsBytes) + `"}`, ErrInvalidNodeMetrics},
		{"too large for any version", `{"v":2,"pad":"` + strings.Repeat("x", maxNodeMetricsV2Bytes) + `"}`,
			ErrInvalidNodeMetrics},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodeNodeMetrics(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("DecodeNodeMetrics(%.40q) = %v, want %v", tc.in, err, tc.want)
			}
		})
	}
}

func TestNodeMetricsFreshness(t *testing.T) {
	t.Parallel()
	m := validMetrics()
	const skew = 10 * time.Second
	for _, tc := range []struct {
		name   string
		now    time.Time
		maxAge time.Duration
		skew   time.Duration
		fresh  bool
		age    time.Duration
	}{
		{"recent", m.Timestamp.Add(5 * time.Second), 30 * time.Second, skew, true, 5 * time.Second},
		{"too old", m.Timestamp.Add(31 * time.Second), 30 * time.Second, skew, false, 31 * time.Second},
		{"ahead within the skew", m.Timestamp.Add(-skew), 30 * time.Second, skew, true, 0},
		{"ahead beyond the skew", m.Timestamp.Add(-time.Minute), 30 * time.Second, skew, false, 0},
		{"a year ahead", m.Timestamp.Add(-365 * 24 * time.Hour), 30 * time.Second, skew, false, 0},
		{"no skew allowed", m.Timestamp.Add(-time.Millisecond), 30 * time.Second, 0, false, 0},
		{"negative skew is 0", m.Timestamp, 30 * time.Second, -time.Second, true, 0},
	} {
		if got := m.Fresh(tc.now, tc.maxAge, tc.skew); got != tc.fresh {
			t.Errorf("%s: Fresh(%v, %v, %v) = %v, want %v", tc.name, tc.now, tc.maxAge, tc.skew, got, tc.fresh)
		}
		if got := m.Age(tc.now); got != tc.age {
			t.Errorf("%s: Age(%v) = %v, want %v", tc.name, tc.now, got, tc.age)
		}
	}
}

// Every version DecodeNodeMetrics accepts round-trips, and a decoded value's two annotations
// read back as version 2.
func FuzzDecodeNodeMetrics(f *testing.F) {
	b, _ := validMetrics().Encode()
	f.Add(string(b))
	m := validMetrics()
	m.Batch = &BatchResources{CPU: 3500, Memory: 1 << 30}
	b, _ = m.Encode()
	f.Add(string(b))
	f.Add(`{"v":1}`)
	f.Add(`{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"batch":{"cpu":-1}}`)
	f.Add(`{"v":1,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1,"used":-1}}`)
	f.Add(goldenV2)
	f.Add(goldenV1)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":[]}}`)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":[{"i":0,"uuid":"x"}],` +
		`"alloc":{"pods":[{"ns":"a","name":"b","devs":[0]}]}}}`)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":null}}`)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":[{"i":0,"uuid":"GPU-0",` +
		`"ok":true,"lsFree":250,"mps":true}]}}`)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":[{"i":0,"uuid":"GPU-0",` +
		`"lsFree":-5,"mps":"yes"}]}}`)
	f.Add(`{"v":2,"ts":"2026-11-22T03:00:00Z","win":1,"cpu":{"cap":1},"gpu":{"devs":[{"i":-1,"util":NaN}]}}`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := DecodeNodeMetrics(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidNodeMetrics) && !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded value does not validate: %v", err)
		}
		out, err := m.Encode()
		if err != nil {
			t.Fatalf("re-encoding a decoded value: %v", err)
		}
		again, err := DecodeNodeMetrics(string(out))
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip changed the value:\n%+v\n%+v", m, again)
		}
		// Both annotations of a decoded value decode, and the pair reads back as version 2.
		ann, err := m.EncodeAnnotations()
		if err != nil {
			t.Fatalf("EncodeAnnotations of a decoded value: %v", err)
		}
		got, err := DecodeNodeAnnotations(ann)
		if err != nil || got.Version != NodeMetricsVersion2 {
			t.Fatalf("DecodeNodeAnnotations = version %d, %v", got.Version, err)
		}
	})
}
