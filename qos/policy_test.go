package qos_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

func TestDefaultPolicy(t *testing.T) {
	t.Parallel()
	p := qos.DefaultPolicy()
	want := qos.Policy{Threshold: 0.9, MinBatchCPU: 0.1, MaxBatchCPU: 0, RestoreStepPercent: 10}
	if p != want {
		t.Fatalf("DefaultPolicy() = %+v, want %+v", p, want)
	}
	if p.Threshold != qos.DefaultThreshold {
		t.Errorf("Threshold %v != DefaultThreshold %v", p.Threshold, qos.DefaultThreshold)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("DefaultPolicy().Validate() = %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	with := func(f func(*qos.Policy)) qos.Policy {
		p := qos.DefaultPolicy()
		f(&p)
		return p
	}
	tests := []struct {
		name string
		p    qos.Policy
		// wantIn are substrings of the error; nil = valid.
		wantIn []string
	}{
		{name: "default", p: qos.DefaultPolicy()},
		{name: "threshold 1", p: with(func(p *qos.Policy) { p.Threshold = 1 })},
		{name: "tiny threshold", p: with(func(p *qos.Policy) { p.Threshold = 1e-9 })},
		{name: "min 0", p: with(func(p *qos.Policy) { p.MinBatchCPU = 0 })},
		{name: "min equals max", p: with(func(p *qos.Policy) { p.MinBatchCPU, p.MaxBatchCPU = 2, 2 })},
		{name: "min above node-sized max 0 is fine", p: with(func(p *qos.Policy) { p.MinBatchCPU = 64 })},
		{name: "restore 100", p: with(func(p *qos.Policy) { p.RestoreStepPercent = 100 })},

		{name: "threshold 1.5", p: with(func(p *qos.Policy) { p.Threshold = 1.5 }),
			wantIn: []string{"threshold: 1.5 must be in (0, 1]"}},
		{name: "threshold 0", p: with(func(p *qos.Policy) { p.Threshold = 0 }),
			wantIn: []string{"threshold: 0 must be in (0, 1]"}},
		{name: "threshold NaN", p: with(func(p *qos.Policy) { p.Threshold = math.NaN() }),
			wantIn: []string{"threshold: NaN"}},
		{name: "threshold -Inf", p: with(func(p *qos.Policy) { p.Threshold = math.Inf(-1) }),
			wantIn: []string{"threshold: -Inf"}},
		{name: "min negative", p: with(func(p *qos.Policy) { p.MinBatchCPU = -1 }),
			wantIn: []string{"minBatchCPU: -1 must be"}},
		{name: "min NaN", p: with(func(p *qos.Policy) { p.MinBatchCPU = math.NaN() }),
			wantIn: []string{"minBatchCPU: NaN"}},
		{name: "min Inf", p: with(func(p *qos.Policy) { p.MinBatchCPU = math.Inf(1) }),
			wantIn: []string{"minBatchCPU: +Inf"}},
		{name: "max negative", p: with(func(p *qos.Policy) { p.MaxBatchCPU = -0.5 }),
			wantIn: []string{"maxBatchCPU: -0.5 must be"}},
		{name: "max Inf", p: with(func(p *qos.Policy) { p.MaxBatchCPU = math.Inf(1) }),
			wantIn: []string{"maxBatchCPU: +Inf"}},
		{name: "min above max", p: with(func(p *qos.Policy) { p.MinBatchCPU, p.MaxBatchCPU = 3, 2 }),
			wantIn: []string{"minBatchCPU: 3 must not exceed maxBatchCPU (2)"}},
		{name: "restore 0", p: with(func(p *qos.Policy) { p.RestoreStepPercent = 0 }),
			wantIn: []string{"restoreStepPercent: 0 must be in (0, 100]"}},
		{name: "restore 101", p: with(func(p *qos.Policy) { p.RestoreStepPercent = 101 }),
			wantIn: []string{"restoreStepPercent: 101"}},
		{name: "restore NaN", p: with(func(p *qos.Policy) { p.RestoreStepPercent = math.NaN() }),
			wantIn: []string{"restoreStepPercent: NaN"}},
		{name: "zero policy names every required field", p: qos.Policy{},
			wantIn: []string{"threshold: 0", "restoreStepPercent: 0"}},
		{name: "all bad at once", p: qos.Policy{Threshold: 2, MinBatchCPU: -1, MaxBatchCPU: -1, RestoreStepPercent: -1},
			wantIn: []string{"threshold", "minBatchCPU", "maxBatchCPU", "restoreStepPercent"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.p.Validate()
			if tt.wantIn == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, qos.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, s := range tt.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestLoadPolicy(t *testing.T) {
	t.Parallel()
	def := qos.DefaultPolicy()
	tests := []struct {
		name   string
		in     string
		want   qos.Policy
		wantIn []string // error substrings; nil = success
	}{
		{name: "empty document", in: "", want: def},
		{name: "null document", in: "null", want: def},
		{name: "comment only", in: "# nothing\n", want: def},
		{name: "empty mapping", in: "{}", want: def},
		{name: "full", in: "threshold: 0.8\nminBatchCPU: 0.5\nmaxBatchCPU: 12\nrestoreStepPercent: 5\n",
			want: qos.Policy{Threshold: 0.8, MinBatchCPU: 0.5, MaxBatchCPU: 12, RestoreStepPercent: 5}},
		{name: "partial keeps defaults", in: "threshold: 0.75\n",
			want: qos.Policy{Threshold: 0.75, MinBatchCPU: 0.1, MaxBatchCPU: 0, RestoreStepPercent: 10}},
		{name: "integers", in: "threshold: 1\nmaxBatchCPU: 4\n",
			want: qos.Policy{Threshold: 1, MinBatchCPU: 0.1, MaxBatchCPU: 4, RestoreStepPercent: 10}},
		{name: "null field keeps default", in: "threshold:\nminBatchCPU: 0\n",
			want: qos.Policy{Threshold: 0.9, MinBatchCPU: 0, MaxBatchCPU: 0, RestoreStepPercent: 10}},
		{name: "JSON", in: `{"threshold": 0.5, "restoreStepPercent": 50}`,
			want: qos.Policy{Threshold: 0.5, MinBatchCPU: 0.1, MaxBatchCPU: 0, RestoreStepPercent: 50}},

		{name: "unknown field", in: "threshold: 0.8\nthresold: 0.7\n", wantIn: []string{`unknown field "thresold"`}},
		{name: "snake case is unknown", in: "min_batch_cpu: 1\n", wantIn: []string{`unknown field "min_batch_cpu"`}},
		{name: "wrong type", in: "threshold: high\n", wantIn: []string{"threshold"}},
		{name: "list value", in: "maxBatchCPU: [1, 2]\n", wantIn: []string{"maxBatchCPU"}},
		{name: "duplicate key", in: "threshold: 0.8\nthreshold: 0.7\n", wantIn: []string{"threshold"}},
		{name: "out of range", in: "threshold: 1.5\n", wantIn: []string{"threshold: 1.5 must be in (0, 1]"}},
		{name: "negative min", in: "minBatchCPU: -2\n", wantIn: []string{"minBatchCPU: -2"}},
		{name: "min above max", in: "minBatchCPU: 4\nmaxBatchCPU: 2\n", wantIn: []string{"minBatchCPU: 4 must not exceed"}},
		{name: "restore 0", in: "restoreStepPercent: 0\n", wantIn: []string{"restoreStepPercent: 0"}},
		// Refused; the agent's loader (koordlet/config) names the path of such a value.
		{name: "NaN", in: "minBatchCPU: 1\nthreshold: .nan\n", wantIn: []string{"parsing QoS policy", "NaN"}},
		{name: "Inf", in: "maxBatchCPU: -.inf\n", wantIn: []string{"parsing QoS policy", "Inf"}},
		{name: "not a mapping", in: "- threshold: 0.5\n", wantIn: []string{"parsing QoS policy"}},
		{name: "scalar document", in: "0.9\n", wantIn: []string{"parsing QoS policy"}},
		{name: "bad YAML", in: "threshold: [\n", wantIn: []string{"parsing QoS policy"}},
		{name: "nested under policy key is unknown", in: "policy:\n  threshold: 0.5\n", wantIn: []string{`unknown field "policy"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := qos.LoadPolicy([]byte(tt.in))
			if tt.wantIn == nil {
				if err != nil || got != tt.want {
					t.Fatalf("LoadPolicy = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, qos.ErrInvalidConfig) {
				t.Fatalf("LoadPolicy err = %v, want ErrInvalidConfig", err)
			}
			if got != (qos.Policy{}) {
				t.Errorf("LoadPolicy returned %+v with an error, want zero Policy", got)
			}
			for _, s := range tt.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

// TestPolicyEmbedded checks the documented recipe for a bigger config that
// holds Policy under "policy:".
func TestPolicyEmbedded(t *testing.T) {
	t.Parallel()
	type agentConfig struct {
		NodeName string     `json:"nodeName"`
		Policy   qos.Policy `json:"policy"`
	}
	tests := []struct {
		name    string
		in      string
		want    qos.Policy
		wantErr string // substring; "" = success
	}{
		{name: "partial policy keeps defaults", in: "nodeName: n1\npolicy:\n  minBatchCPU: 1\n",
			want: qos.Policy{Threshold: 0.9, MinBatchCPU: 1, MaxBatchCPU: 0, RestoreStepPercent: 10}},
		{name: "no policy key", in: "nodeName: n1\n", want: qos.DefaultPolicy()},
		{name: "unknown policy field", in: "policy:\n  treshold: 0.5\n", wantErr: `unknown field "treshold"`},
		{name: "invalid value caught by Validate", in: "policy:\n  threshold: 2\n", wantErr: "threshold: 2 must be in (0, 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := agentConfig{Policy: qos.DefaultPolicy()}
			err := yaml.UnmarshalStrict([]byte(tt.in), &cfg)
			if err == nil {
				err = cfg.Policy.Validate()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || cfg.Policy != tt.want {
				t.Fatalf("policy = %+v, %v; want %+v", cfg.Policy, err, tt.want)
			}
		})
	}
}

func TestPolicyMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	p := qos.Policy{Threshold: 0.85, MinBatchCPU: 0.25, MaxBatchCPU: 6, RestoreStepPercent: 7.5}
	out, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"threshold:", "minBatchCPU:", "maxBatchCPU:", "restoreStepPercent:"} {
		if !strings.Contains(string(out), key) {
			t.Errorf("marshalled policy %q lacks key %q", out, key)
		}
	}
	back, err := qos.LoadPolicy(out)
	if err != nil || back != p {
		t.Fatalf("round trip = %+v, %v; want %+v", back, err, p)
	}
}

// FuzzLoadPolicy: any input either loads a valid policy that survives a
// marshal round trip, or fails with ErrInvalidConfig.
func FuzzLoadPolicy(f *testing.F) {
	for _, s := range []string{
		"", "threshold: 0.8\n", "threshold: 1.5\n", "minBatchCPU: 1\nmaxBatchCPU: 0.5\n",
		"{\"restoreStepPercent\": 100}", "threshold: .nan", "x: 1", "- 1", "threshold: [", "&a [*a]",
		"threshold: 1e-300\nmaxBatchCPU: 1e300\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := qos.LoadPolicy(data)
		if err != nil {
			if !errors.Is(err, qos.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if p != (qos.Policy{}) {
				t.Fatalf("non-zero policy %+v returned with error", p)
			}
			return
		}
		if verr := p.Validate(); verr != nil {
			t.Fatalf("loaded policy %+v does not validate: %v", p, verr)
		}
		out, err := yaml.Marshal(p)
		if err != nil {
			t.Fatalf("marshal %+v: %v", p, err)
		}
		back, err := qos.LoadPolicy(out)
		if err != nil || back != p {
			t.Fatalf("round trip of %+v = %+v, %v", p, back, err)
		}
	})
}
