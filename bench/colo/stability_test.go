package colo

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/qos"
)

// committedTrace is bench/traces/ls-cpu-trace.csv seen from this package.
var committedTrace = filepath.Join("..", "..", defaultStabilityTrace)

// TestStabilityCommittedTrace replays the committed day through the default
// Reclaimer at the agent's 100 ms period and checks the stability targets.
func TestStabilityCommittedTrace(t *testing.T) {
	t.Parallel()
	res, err := runStability(committedTrace, qos.DefaultReclaimConfig(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("changes/h %.2f (baseline %.1f), mean %.2f cores, min/mean %.3f (unsaturated %.3f), "+
		"overcommit max %.2f cores for %.0f s, zero drops %d (unjustified %d; baseline %d, %d)",
		res.BatchCPUChangesPerHour, res.BaselineChangesPerHour, res.BatchCPUMeanCores, res.BatchCPUMinOverMean,
		res.BatchCPUMinOverMeanUnsaturated, res.BatchCPUOvercommitMax, res.BatchCPUOvercommitSeconds,
		res.BatchCPUZeroDrops, res.BatchCPUZeroDropsUnjustified, res.BaselineZeroDrops, res.BaselineZeroDropsUnjustified)
	if res.Hours != 24 || res.Periods != 864000 || res.CapacityCores != 16 {
		t.Fatalf("replayed %v h in %d periods on %v cores, want the whole day", res.Hours, res.Periods, res.CapacityCores)
	}
	if res.BatchCPUChangesPerHour > 12 {
		t.Errorf("batch_cpu_changes_per_hour %.2f, target <= 12", res.BatchCPUChangesPerHour)
	}
	if res.BatchCPUZeroDropsUnjustified != 0 {
		t.Errorf("%d drops to 0 while LS had not used the node", res.BatchCPUZeroDropsUnjustified)
	}
	// The trace's 14:10 incident does use the node: 0 is published then.
	if res.BatchCPUZeroDrops == 0 {
		t.Errorf("no drop to 0, though LS takes the whole node at 14:10")
	}
	if res.BaselineChangesPerHour < 10*res.BatchCPUChangesPerHour {
		t.Errorf("baseline %.1f changes/h is not far above %.2f", res.BaselineChangesPerHour, res.BatchCPUChangesPerHour)
	}
	if res.BaselineZeroDropsUnjustified == 0 {
		t.Errorf("the baseline never drops to 0 on a burst: the trace no longer shows the problem")
	}
	if !(res.BatchCPUMinOverMeanUnsaturated > 0) || !(res.BatchCPUMeanCores > 0.5*res.BaselineMeanCores) {
		t.Errorf("min/mean outside saturation %v, mean %v (baseline %v): batch held too low",
			res.BatchCPUMinOverMeanUnsaturated, res.BatchCPUMeanCores, res.BaselineMeanCores)
	}
	// Overcommit exists (the smoothing lags an LS burst) but is bounded by the
	// biggest burst of the trace (+5 cores) and brief.
	if res.BatchCPUOvercommitMax > 6 || res.BatchCPUOvercommitSeconds > 0.05*res.Hours*3600 {
		t.Errorf("overcommit max %.2f cores, %.0f s", res.BatchCPUOvercommitMax, res.BatchCPUOvercommitSeconds)
	}
	var writes int
	for _, n := range res.BatchCPUReasons {
		writes += n
	}
	if res.BatchCPUReasons[qos.ReasonReclaimInitial] != 1 || res.BatchCPUReasons[qos.ReasonReclaimDrop] == 0 ||
		writes != int(res.BatchCPUWritesPerHour*res.Hours+0.5) {
		t.Errorf("write reasons %v", res.BatchCPUReasons)
	}
}

// TestStabilityGenerateReproducible: the committed trace is what the generator
// writes from its seed, and another seed gives another trace.
func TestStabilityGenerateReproducible(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "trace.csv")
	if err := generateLSTrace(path, defaultTraceSeed); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(committedTrace)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("generateLSTrace(seed %d) differs from %s: regenerate it with `colo stability -generate`",
			defaultTraceSeed, committedTrace)
	}
	if len(want) > 2<<20 {
		t.Errorf("trace is %d bytes, keep it under 2 MiB", len(want))
	}
	other := filepath.Join(dir, "other.csv")
	if err := generateLSTrace(other, 1); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(other); bytes.Equal(b, want) {
		t.Fatal("seed 1 gave the same trace")
	}
	trace, err := parseTrace(bytes.NewReader(want))
	if err != nil {
		t.Fatal(err)
	}
	if len(trace) != int(traceDuration/traceStep) || trace[len(trace)-1].T != traceDuration-traceStep {
		t.Fatalf("%d samples ending at %v", len(trace), trace[len(trace)-1].T)
	}
}

func TestStabilityParseTrace(t *testing.T) {
	t.Parallel()
	h := traceHeader + "\n"
	tests := []struct {
		name    string
		in      string
		wantErr string // "" = valid
		wantN   int
	}{
		{name: "valid with comments and blanks", in: "# c\n\n" + h + "0,16,1,0,0.5\n5,16,2,0.1,0.5\n", wantN: 2},
		{name: "no header", in: "0,16,1,0,0.5\n5,16,2,0.1,0.5\n", wantErr: "header"},
		{name: "one sample", in: h + "0,16,1,0,0.5\n", wantErr: "1 samples"},
		{name: "empty", in: "", wantErr: "0 samples"},
		{name: "short row", in: h + "0,16,1,0\n", wantErr: "4 fields"},
		{name: "NaN", in: h + "0,16,NaN,0,0\n5,16,1,0,0\n", wantErr: "ls_cores \"NaN\""},
		{name: "negative", in: h + "0,16,1,-1,0\n5,16,1,0,0\n", wantErr: "be_cores \"-1\""},
		{name: "Inf", in: h + "0,16,1,0,Inf\n5,16,1,0,0\n", wantErr: "system_cores"},
		{name: "capacity 0", in: h + "0,0,1,0,0\n5,16,1,0,0\n", wantErr: "capacity_cores must be > 0"},
		{name: "not from 0", in: h + "5,16,1,0,0\n10,16,1,0,0\n", wantErr: "first t_s"},
		{name: "not increasing", in: h + "0,16,1,0,0\n0,16,1,0,0\n", wantErr: "not after"},
		{name: "fractional time", in: h + "0,16,1,0,0\n0.5,16,1,0,0\n", wantErr: "whole seconds"},
		{name: "time too far", in: h + "0,16,1,0,0\n1e300,16,1,0,0\n", wantErr: "whole seconds within 30 days"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseTrace(strings.NewReader(tt.in))
			if tt.wantErr == "" {
				if err != nil || len(got) != tt.wantN {
					t.Fatalf("parseTrace = %d samples, %v; want %d", len(got), err, tt.wantN)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errTrace) {
				t.Fatalf("parseTrace error %v, want one containing %q and wrapping errTrace", err, tt.wantErr)
			}
		})
	}
}

func TestStabilityRejects(t *testing.T) {
	t.Parallel()
	bad := qos.DefaultReclaimConfig()
	bad.LSPercentile = 2
	if _, err := runStability(committedTrace, bad, 100*time.Millisecond); !errors.Is(err, qos.ErrInvalidConfig) {
		t.Errorf("invalid config: %v", err)
	}
	if _, err := runStability(committedTrace, qos.DefaultReclaimConfig(), 0); err == nil {
		t.Error("period 0 accepted")
	}
	if _, err := runStability(filepath.Join(t.TempDir(), "none.csv"), qos.DefaultReclaimConfig(),
		time.Second); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing trace: %v", err)
	}
}

// TestStabilityShortTrace replays a hand-made trace: a minute of quiet LS, a
// minute with the node full, quiet again.
func TestStabilityShortTrace(t *testing.T) {
	t.Parallel()
	var trace []traceSample
	for s := range 15 * 60 / 5 {
		ls := 2.0
		if s >= 12 && s < 24 { // 60 s..120 s
			ls = 15.5
		}
		trace = append(trace, traceSample{T: time.Duration(s) * 5 * time.Second, Capacity: 16, LS: ls, Syst: 0.5})
	}
	res := replayStability(trace, qos.DefaultReclaimConfig(), 100*time.Millisecond)
	if res.BatchCPUZeroDrops != 1 || res.BatchCPUZeroDropsUnjustified != 0 || res.BaselineZeroDrops != 1 {
		t.Fatalf("zero drops %d (unjustified %d), baseline %d: want one justified each",
			res.BatchCPUZeroDrops, res.BatchCPUZeroDropsUnjustified, res.BaselineZeroDrops)
	}
	// Free is 0 while the node is full: batch published before the drop is overcommit.
	if !(res.BatchCPUOvercommitMax > 0) || res.BaselineOvercommitMax != 0 {
		t.Fatalf("overcommit %v, baseline %v", res.BatchCPUOvercommitMax, res.BaselineOvercommitMax)
	}
	if res.BatchCPUMinCores != 0 || res.BatchCPUMeanCores <= 0 {
		t.Fatalf("min %v mean %v", res.BatchCPUMinCores, res.BatchCPUMeanCores)
	}
}

func FuzzStabilityParseTrace(f *testing.F) {
	f.Add(traceHeader + "\n0,16,1,0,0.5\n5,16,2,0.1,0.5\n")
	f.Add("# x\n" + traceHeader + "\n0,16,1,0,0.5\n1e9,16,2,0.1,0.5\n")
	f.Add(traceHeader + "\n0,16,-0,0,0\n5,1e308,1e308,1e308,1e308\n")
	f.Fuzz(func(t *testing.T, in string) {
		trace, err := parseTrace(strings.NewReader(in))
		if err != nil {
			return
		}
		for i, s := range trace {
			if s.Capacity <= 0 || s.LS < 0 || s.BE < 0 || s.Syst < 0 || (i > 0 && s.T <= trace[i-1].T) {
				t.Fatalf("accepted bad sample %d: %+v", i, s)
			}
		}
		if trace[len(trace)-1].T > time.Hour {
			return // replaying long traces is the benchmark's job
		}
		res := replayStability(trace, qos.DefaultReclaimConfig(), time.Second)
		if res.BatchCPUMeanCores < 0 || res.BatchCPUMinCores < 0 {
			t.Fatalf("negative result %+v", res)
		}
	})
}
