package openb

import (
	"errors"
	"testing"

	"github.com/understory/understory/scheduler-extender/placement"
)

func TestParseAblation(t *testing.T) {
	t.Parallel()
	def := placement.DefaultUnderstoryParams()
	tests := []struct {
		in   string
		want Ablation
		err  bool
	}{
		{"", Ablation{Params: def}, false},
		{"quant=50, blend=0", Ablation{Params: placement.UnderstoryParams{Quant: 50, Blend: 0, Reserve: 1, Usage: 1, GPUUsage: 1}}, false},
		{"reserve=0,usage=0,gpuusage=0", Ablation{Params: placement.UnderstoryParams{Quant: 100, Blend: 0.3}}, false},
		{"coverage=0.99", Ablation{Params: def, Coverage: 0.99}, false},
		{"coverage=1.5", Ablation{}, true},
		{"blend=2", Ablation{}, true},
		{"quant", Ablation{}, true},
		{"quant=NaN", Ablation{}, true},
		{"fgdsquash=1", Ablation{}, true},
	}
	for _, tc := range tests {
		got, err := ParseAblation(tc.in)
		if tc.err {
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("ParseAblation(%q) err = %v", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Fatalf("ParseAblation(%q) = %+v, %v", tc.in, got, err)
		}
	}
}
