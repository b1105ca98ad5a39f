package openb

import (
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"

	"github.com/understory/understory/scheduler-extender/placement"
)

// Ablation is the understory policy run with other weights or another target
// coverage: the replay's tuning knob, never something the extender serves.
type Ablation struct {
	Params placement.UnderstoryParams
	// Coverage of understory's target workload; 0 keeps the policy's own
	// (placement.PolicyCoverage).
	Coverage float64
}

// ParseAblation overrides understory's default weights with "key=value,..."
// (keys: quant, blend, reserve, usage, gpuusage, coverage). Errors wrap ErrBadConfig.
func ParseAblation(s string) (Ablation, error) {
	a := Ablation{Params: placement.DefaultUnderstoryParams()}
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return a, fmt.Errorf("understory param %q: want key=number: %w", kv, ErrBadConfig)
		}
		switch k {
		case "quant":
			a.Params.Quant = f
		case "blend":
			if f < 0 || f > 1 {
				return a, fmt.Errorf("understory param blend=%v not in [0,1]: %w", f, ErrBadConfig)
			}
			a.Params.Blend = f
		case "reserve":
			a.Params.Reserve = f
		case "usage":
			a.Params.Usage = f
		case "gpuusage":
			a.Params.GPUUsage = f
		case "coverage":
			if f < 0 || f > 1 {
				return a, fmt.Errorf("understory param coverage=%v not in [0,1]: %w", f, ErrBadConfig)
			}
			a.Coverage = f
		default:
			return a, fmt.Errorf("understory param %q unknown: %w", k, ErrBadConfig)
		}
	}
	return a, nil
}

// Factory builds the understory policy with a's weights on the replay's
// workload (which the replay builds at a.Coverage: Config.Coverage).
func (a Ablation) Factory() PolicyFactory {
	return func(w *placement.Workload, _ *rand.Rand) (placement.Policy, error) {
		return placement.NewUnderstoryPolicy(w, a.Params), nil
	}
}
