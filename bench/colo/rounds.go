package colo

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// bandMethod says what the demo's band is; it is printed under the table.
const bandMethod = "p99/solo is each round's LS p99 over the same round's LS-alone p99: " +
	"median over the rounds; band = lowest–highest round"

// spread is a median and the range (lowest–highest) of per-round values.
type spread struct {
	// Values are per round, in round order; NaN where a round measured nothing.
	Values []float64
	// Median, Min and Max are over the values that are not NaN; NaN when none is.
	Median, Min, Max float64
}

func newSpread(xs []float64) spread {
	s := spread{Values: xs, Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	sorted := slices.Sorted(func(yield func(float64) bool) {
		for _, x := range xs {
			if !math.IsNaN(x) && !yield(x) {
				return
			}
		}
	})
	if len(sorted) == 0 {
		return s
	}
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	if n := len(sorted); n%2 == 1 {
		s.Median = sorted[n/2]
	} else {
		s.Median = (sorted[n/2-1] + sorted[n/2]) / 2
	}
	return s
}

// phaseBand is one CPU phase over paired rounds.
type phaseBand struct {
	Phase cpuPhase
	// VsSolo is, per round, the phase's p99 over the same round's LS-alone p99;
	// VsVanilla over the same round's no-agent p99 (NaN where that measured nothing).
	VsSolo, VsVanilla spread
	// P99ms is the phase's p99 per round, ms.
	P99ms spread
	// Pooled is every request of the phase over the rounds (batch CPUs, idle share).
	Pooled phaseResult
}

// summariseRounds sums up rounds from runRounds (rounds[r][p] is round r's phase p),
// one phaseBand per phase in the canonical order.
func summariseRounds(rounds [][]phaseResult) []phaseBand {
	out := make([]phaseBand, 0, numCPUPhases)
	for p := range numCPUPhases {
		var vsSolo, vsVanilla, p99 []float64
		var phases []phaseResult
		for _, r := range rounds {
			if len(r) < int(numCPUPhases) {
				continue
			}
			phases = append(phases, r[p])
			p99 = append(p99, r[p].P99ms)
			vsSolo = append(vsSolo, pratio(r[p].P99ms, r[phaseSolo].P99ms))
			vsVanilla = append(vsVanilla, pratio(r[p].P99ms, r[phaseVanilla].P99ms))
		}
		out = append(out, phaseBand{Phase: p, VsSolo: newSpread(vsSolo), VsVanilla: newSpread(vsVanilla),
			P99ms: newSpread(p99), Pooled: pool(p.String(), phases)})
	}
	return out
}

// beyondBand says how an agent phase compares with plain BestEffort: "within" when its
// median p99/solo lies inside no agent's band, "better" or "worse" beyond it.
func beyondBand(agent, vanilla phaseBand) string {
	switch m := agent.VsSolo.Median; {
	case math.IsNaN(m) || math.IsNaN(vanilla.VsSolo.Max):
		return "not measured"
	case m > vanilla.VsSolo.Max:
		return "worse than no agent beyond its band"
	case m < vanilla.VsSolo.Min:
		return "better than no agent beyond its band"
	}
	return "within no agent's band"
}

// printBands prints the CPU phases over the rounds: per phase the median p99/solo and
// its band, then each round, then the agent phases against no agent in the same round.
func printBands(w func(string, ...any), bands []phaseBand, rounds int, phase time.Duration) {
	if len(bands) < int(numCPUPhases) {
		return
	}
	w("\nCPU phases, %d rounds × %v\n%s\n", rounds, phase, bandMethod)
	w("%-28s %8s %13s %8s %10s %10s\n", "phase", "p99/solo", "band", "p99 ms", "batch CPUs", "idle share")
	for _, b := range bands {
		band, share := "-", "-"
		if b.Phase != phaseSolo {
			band = rangeString(b.VsSolo)
			share = fmt.Sprintf("%.2f", b.Pooled.IdleShare)
		}
		cores := 0.0
		if b.Pooled.Seconds > 0 {
			cores = b.Pooled.BatchCPU / b.Pooled.Seconds
		}
		w("%-28s %8s %13s %8s %10.2f %10s\n", b.Phase, num(b.VsSolo.Median), band, num(b.P99ms.Median), cores, share)
	}
	w("(p99 ms: median over the rounds; batch CPUs: cores batch used on average; idle share: the part of the\n")
	w("CPU the LS pod left idle that batch used; both over every round)\n")

	w("\nPer round, p99/solo (LS-alone p99 in ms)\n")
	w("%-6s %9s %9s %9s %9s\n", "round", "alone ms", "no agent", "tier", "in-place")
	for i, solo := range bands[phaseSolo].P99ms.Values {
		w("%-6d %9s", i+1, num(solo))
		for _, p := range []cpuPhase{phaseVanilla, phaseTier, phaseInPlace} {
			w(" %9s", num(bands[p].VsSolo.Values[i]))
		}
		w("\n")
	}

	w("\nThe agent against no agent: p99 / no-agent p99 of the same round (median, band), and where the\n")
	w("median p99/solo lies against no agent's band; over all rounds, the CFS periods batch's groups\n")
	w("were throttled in (the tier, or the in-place pods summed) and the agent's CPU cuts\n")
	for _, p := range []cpuPhase{phaseTier, phaseInPlace} {
		b := bands[p]
		w("%-28s %5s %11s   %-38s throttled %d, cuts %.0f\n", p.String()+":", num(b.VsVanilla.Median),
			rangeString(b.VsVanilla), beyondBand(b, bands[phaseVanilla]), b.Pooled.ThrottledPeriods, b.Pooled.AgentCuts)
	}
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func rangeString(s spread) string {
	if math.IsNaN(s.Min) {
		return "-"
	}
	return strings.Join([]string{num(s.Min), num(s.Max)}, "–")
}
