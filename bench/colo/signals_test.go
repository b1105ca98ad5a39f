package colo

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/koordlet/config"
)

func TestSelectPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		list    string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{"ebpf,psi,sampling", []string{"ebpf", "psi", "sampling"}, ""},
		{" auto ", []string{"auto"}, ""},
		{"default,ebpf", []string{"default", "ebpf"}, ""},
		{"ebpf,bpf", nil, `unknown path "bpf"`},
		{"psi,psi", nil, "named twice"},
	}
	for _, tt := range tests {
		t.Run(tt.list, func(t *testing.T) {
			t.Parallel()
			got, err := selectPaths(tt.list)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestWithSignalsMode: the mode is set, every other field of the agent's configuration
// and of an existing signals section kept.
func TestWithSignalsMode(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.StaticPodDir = "/tmp/manifests"
	base, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      string
		wantErr bool
		want    map[string]any // expected signals section
	}{
		// The agent's own configuration: whatever signals section it has (an older
		// agent's has none), mode set, every other key of it kept (want nil: derived below).
		{"agent config", string(base), false, nil},
		{"existing section", "period: 50ms\nsignals:\n  mode: auto\n  runqueueDelay: 5ms\n", false,
			map[string]any{"mode": "psi", "runqueueDelay": "5ms"}},
		{"null section", "signals:\n", false, map[string]any{"mode": "psi"}},
		{"empty document", "", false, map[string]any{"mode": "psi"}},
		{"section not a map", "signals: fast\n", true, nil},
		{"not yaml", "{", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := withSignalsMode([]byte(tt.in), "psi")
			if tt.wantErr {
				if err == nil {
					t.Fatalf("accepted:\n%s", out)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var before, after map[string]any
			if err := yaml.Unmarshal([]byte(tt.in), &before); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(out, &after); err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if want == nil {
				want = map[string]any{}
				if sec, ok := before["signals"].(map[string]any); ok {
					for k, v := range sec {
						want[k] = v
					}
				}
				want["mode"] = "psi"
			}
			if !reflect.DeepEqual(after["signals"], want) {
				t.Fatalf("signals = %v, want %v", after["signals"], want)
			}
			for k, v := range before {
				if k != "signals" && !reflect.DeepEqual(after[k], v) {
					t.Errorf("%s changed: %v → %v", k, v, after[k])
				}
			}
		})
	}
}

// metricsNewAgent is an agent's exposition with the signals section.
const metricsNewAgent = `# HELP understory_signal_source 1 for the LS harm signal source in use.
# TYPE understory_signal_source gauge
understory_signal_source{source="ebpf"} 0
understory_signal_source{source="psi"} 1
understory_signal_source{source="sampling"} 0
# HELP understory_signal_source_unavailable 1 for each better source that could not be used.
# TYPE understory_signal_source_unavailable gauge
understory_signal_source_unavailable{reason="no_btf",source="ebpf"} 1
# HELP understory_batch_cuts_total Batch CPU budget cuts by the signal that caused them.
# TYPE understory_batch_cuts_total counter
understory_batch_cuts_total{signal="psi_cpu"} 7
understory_batch_cuts_total{signal="utilisation"} 2
understory_batch_cuts_total{signal="runqueue_delay"} 0
# HELP understory_ls_harm_signals_total LS harm seen.
# TYPE understory_ls_harm_signals_total counter
understory_ls_harm_signals_total{signal="psi_cpu"} 9
# HELP understory_batch_actions_total Actions.
# TYPE understory_batch_actions_total counter
understory_batch_actions_total{action="cut"} 9
understory_batch_actions_total{action="restore"} 4
# HELP understory_batch_cut_reaction_seconds Per cut.
# TYPE understory_batch_cut_reaction_seconds histogram
understory_batch_cut_reaction_seconds_bucket{signal="psi_cpu",le="0.001"} 0
understory_batch_cut_reaction_seconds_bucket{signal="psi_cpu",le="0.005"} 3
understory_batch_cut_reaction_seconds_bucket{signal="psi_cpu",le="0.01"} 6
understory_batch_cut_reaction_seconds_bucket{signal="psi_cpu",le="0.05"} 7
understory_batch_cut_reaction_seconds_bucket{signal="psi_cpu",le="+Inf"} 7
understory_batch_cut_reaction_seconds_sum{signal="psi_cpu"} 0.04
understory_batch_cut_reaction_seconds_count{signal="psi_cpu"} 7
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.001"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.005"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.01"} 0
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="0.05"} 1
understory_batch_cut_reaction_seconds_bucket{signal="utilisation",le="+Inf"} 2
understory_batch_cut_reaction_seconds_sum{signal="utilisation"} 3.05
understory_batch_cut_reaction_seconds_count{signal="utilisation"} 2
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="0.001"} 0
understory_batch_cut_reaction_seconds_bucket{signal="runqueue_delay",le="+Inf"} 0
understory_batch_cut_reaction_seconds_sum{signal="runqueue_delay"} 0
understory_batch_cut_reaction_seconds_count{signal="runqueue_delay"} 0
`

// metricsOldAgent is an agent's exposition before the signals section.
const metricsOldAgent = `# TYPE understory_batch_actions_total counter
understory_batch_actions_total{action="cut"} 3
understory_batch_actions_total{action="restore"} 4
# TYPE understory_batch_cut_reaction_seconds histogram
understory_batch_cut_reaction_seconds_bucket{le="0.05"} 1
understory_batch_cut_reaction_seconds_bucket{le="0.1"} 3
understory_batch_cut_reaction_seconds_bucket{le="+Inf"} 3
understory_batch_cut_reaction_seconds_sum 0.2
understory_batch_cut_reaction_seconds_count 3
`

func TestParseAgentSignals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		text    string
		want    agentSignals
		wantErr bool
	}{
		{"agent with signals", metricsNewAgent, agentSignals{
			Source:       "psi",
			Sources:      map[string]float64{"ebpf": 0, "psi": 1, "sampling": 0},
			Unavailable:  map[string]string{"ebpf": "no_btf"},
			CutsBySignal: map[string]float64{"psi_cpu": 7, "utilisation": 2, "runqueue_delay": 0},
			HarmBySignal: map[string]float64{"psi_cpu": 9},
			CutReaction: map[string]histSummary{
				// 7 cuts: p50 (rank 3.5) in the 10 ms bucket (6 cuts ≤ 10 ms), p99
				// (rank 6.93) in the 50 ms one.
				"psi_cpu": {Count: 7, P50Ms: 10, P99Ms: 50},
				// 2 cuts: p50 (rank 1) in 50 ms, p99 past every finite bucket.
				"utilisation": {Count: 2, P50Ms: 50, P99Ms: -1},
			},
		}, false},
		{"agent before signals", metricsOldAgent, agentSignals{
			CutsBySignal: map[string]float64{unlabelled: 3},
			CutReaction:  map[string]histSummary{unlabelled: {Count: 3, P50Ms: 100, P99Ms: 100}},
		}, false},
		{"gauge all zero", "# TYPE understory_signal_source gauge\nunderstory_signal_source{source=\"psi\"} 0\n",
			agentSignals{Sources: map[string]float64{"psi": 0}}, false},
		{"nothing", "", agentSignals{}, false},
		{"garbage", "understory_signal_source{source=\"psi\" 1\n", agentSignals{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseAgentSignals(strings.NewReader(tt.text))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("accepted: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestBucketQuantile(t *testing.T) {
	t.Parallel()
	bounds := []float64{0.01, 0.05, 0.1, math.Inf(1)}
	cum := []float64{50, 90, 99, 100}
	tests := []struct {
		q, count, want float64
	}{
		{0.5, 100, 0.01},
		{0.51, 100, 0.05},
		{0.99, 100, 0.1},
		{1, 100, math.Inf(1)},
		{0.5, 0, 0},
	}
	for _, tt := range tests {
		if got := bucketQuantile(bounds, cum, tt.count, tt.q); got != tt.want {
			t.Errorf("q %v of %v: %v, want %v", tt.q, tt.count, got, tt.want)
		}
	}
	if boundMs(0.05) != 50 || boundMs(math.Inf(1)) != -1 {
		t.Errorf("boundMs: %v, %v", boundMs(0.05), boundMs(math.Inf(1)))
	}
}

func TestStatusSignalSource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body, want string
		wantErr    bool
	}{
		{`{"healthy":true}`, "", false},
		{`{"signals":{"mode":"auto","active":"ebpf"}}`, "ebpf", false},
		{`{"signals":{"source":"psi"}}`, "psi", false},
		{`{"signals":{"activeSource":"sampling"}}`, "sampling", false},
		{`{"signals":"psi"}`, "", false},
		{`{"signals":{"active":""}}`, "", false},
		{`not json`, "", true},
	}
	for _, tt := range tests {
		got, err := statusSignalSource([]byte(tt.body))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: %q, %v; want %q (error %v)", tt.body, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestSourceVerdict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		requested, active string
		ok                bool
		note              string
	}{
		{"ebpf", "ebpf", true, ""},
		{"auto", "psi", true, ""},
		{"ebpf", "psi", false, "requested ebpf, but the agent ran psi"},
		{"psi", "", false, "did not report"},
		{"auto", "", false, "did not report"},
		{"default", "", true, ""},
		{"default", "psi", true, ""},
	}
	for _, tt := range tests {
		ok, note := sourceVerdict(tt.requested, tt.active)
		if ok != tt.ok || !strings.Contains(note, tt.note) || (tt.ok && note != "") {
			t.Errorf("%s/%s: %v %q; want %v %q", tt.requested, tt.active, ok, note, tt.ok, tt.note)
		}
	}
}

// TestReadAgentSignals reads the gauge from /metrics, and the source from /status when
// the gauge says nothing.
func TestReadAgentSignals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, metrics, status, want string
	}{
		{"gauge", metricsNewAgent, `{}`, "psi"},
		{"status fallback", metricsOldAgent, `{"signals":{"active":"sampling"}}`, "sampling"},
		{"neither", metricsOldAgent, `{}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mux := http.NewServeMux()
			mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(tt.metrics)) })
			mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(tt.status)) })
			srv := httptest.NewServer(mux)
			defer srv.Close()
			got, err := readAgentSignals(&agentProc{addr: strings.TrimPrefix(srv.URL, "http://")})
			if err != nil || got.Source != tt.want {
				t.Fatalf("source %q, %v; want %q", got.Source, err, tt.want)
			}
		})
	}
}

func FuzzParseAgentSignals(f *testing.F) {
	for _, s := range []string{metricsNewAgent, metricsOldAgent, "", "# TYPE x gauge\nx 1\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		got, err := parseAgentSignals(strings.NewReader(text))
		if err != nil {
			return
		}
		if got.Source != "" && got.Sources[got.Source] <= 0 {
			t.Fatalf("source %q with gauge %v", got.Source, got.Sources[got.Source])
		}
		for sig, h := range got.CutReaction {
			if h.Count <= 0 || math.IsNaN(h.P99Ms) || math.IsInf(h.P99Ms, 0) {
				t.Fatalf("%s: %+v", sig, h)
			}
		}
		// It goes into the benchmark's JSON as it is.
		if _, err := json.Marshal(got); err != nil {
			t.Fatalf("not JSON: %v (%+v)", err, got)
		}
	})
}

func FuzzStatusSignalSource(f *testing.F) {
	for _, s := range []string{`{"signals":{"active":"ebpf"}}`, `{}`, `[]`, `{"signals":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		_, _ = statusSignalSource([]byte(body))
	})
}
