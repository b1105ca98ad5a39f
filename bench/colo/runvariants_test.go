package colo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestVariantsEndToEnd runs the variant section on this machine with the shortest
// settings: the bursty and membw variants (the load shape and the memory burner through
// real processes), one round, the agent's default path and psi. psi is refused by an
// agent from before the signals section and must then be recorded as such, never
// measured under its name; with the section it must report its source.
func TestVariantsEndToEnd(t *testing.T) {
	sc := realScenarioConfig(t, "the variant benchmark")
	sc.batchPods, sc.threads, sc.rounds, sc.rate, sc.workers = 2, 1, 100, 200, 16
	dc := demoConfig{phase: time.Second, warmup: 300 * time.Millisecond, threshold: 0.9, period: 100 * time.Millisecond}
	vs, err := selectVariants(defaultVariants(sc), "membw,bursty")
	if err != nil {
		t.Fatal(err)
	}
	vs[0].BufferMiB = 16 // the wiring, not the bandwidth
	vc := variantConfig{variants: vs, paths: []string{pathDefault, pathPSI}, rounds: 1, phase: time.Second, steps: 1,
		overhead: time.Second}
	var out bytes.Buffer
	printf := func(f string, a ...any) { fmt.Fprintf(&out, f, a...) }
	logf := func(f string, a ...any) { printf("  "+f+"\n", a...) }
	sc.logf = logf
	res, err := runVariants(context.Background(), sc, dc, vc, printf, logf)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatalf("result is not JSON: %v", err)
	}
	if len(res.Variants) != 2 || len(res.SignalPaths) != 2 || len(res.Targets) == 0 {
		t.Fatalf("%d variants, %d signal paths, %d checks\n%s", len(res.Variants), len(res.SignalPaths),
			len(res.Targets), out.String())
	}
	for _, v := range res.Variants {
		if v.SoloP99Ms <= 0 || v.VanillaP99Ms <= 0 || len(v.Rounds) != 1 {
			t.Errorf("%s: solo %v, vanilla %v, %d rounds", v.Name, v.SoloP99Ms, v.VanillaP99Ms, len(v.Rounds))
		}
		for _, p := range v.Paths {
			switch {
			case p.Path == pathDefault && (p.P99Ms <= 0 || !p.SourceMatches):
				t.Errorf("%s/%s: not measured: %+v", v.Name, p.Path, p)
			case p.Path == pathPSI && p.Rejected == "" && len(p.ActiveSources) == 0:
				t.Errorf("%s/psi: accepted but no source recorded: %+v", v.Name, p)
			case p.Path == pathPSI && p.Rejected != "" && p.P99Ms != 0:
				t.Errorf("%s/psi: rejected but measured: %+v", v.Name, p)
			}
		}
	}
	for _, sp := range res.SignalPaths {
		if sp.Rejected == "" && (sp.AgentPods != 110 || len(sp.ReactionsMs) != 1) {
			t.Errorf("%s: %d pods, %d reactions", sp.Path, sp.AgentPods, len(sp.ReactionsMs))
		}
	}
	for _, c := range res.Targets {
		if c.Path == pathPSI && c.Measured && !res.SignalPaths[1].SourceMatches {
			t.Errorf("check %+v measured under psi without psi shown to run", c)
		}
	}
}
