package colo

import (
	"context"
	"strings"
	"testing"
	"time"
)

func baseScenarioConfig() scenarioConfig {
	return scenarioConfig{rate: 500, batchPods: 4, threads: 2}
}

// TestDefaultVariantsValid checks the variant table: every variant valid, names unique,
// base equal to the paired rounds' scenario, each other variant the scenario its name says.
func TestDefaultVariantsValid(t *testing.T) {
	t.Parallel()
	vs := defaultVariants(baseScenarioConfig())
	seen := map[string]bool{}
	for _, v := range vs {
		if err := v.validate(); err != nil {
			t.Errorf("%s: %v", v.Name, err)
		}
		if seen[v.Name] {
			t.Errorf("%s named twice", v.Name)
		}
		seen[v.Name] = true
		if v.Description == "" {
			t.Errorf("%s has no description", v.Name)
		}
	}
	want := map[string]func(variant) bool{
		variantBase: func(v variant) bool {
			return v.Rate == 500 && v.BatchPods == 4 && v.Threads == 2 && v.Burner == burnCPU && v.Load.Kind == loadSteady
		},
		variantLSHeavy:    func(v variant) bool { return v.Rate == 1100 && v.BatchPods == 6 && v.Threads == 1 },
		variantSmallBatch: func(v variant) bool { return v.BatchPods >= 12 && v.Threads == 1 },
		variantMemBW:      func(v variant) bool { return v.Burner == burnMemBW && v.BufferMiB >= 64 },
		variantBursty:     func(v variant) bool { return v.Load.Kind == loadBursty && v.Load.BurstOff > 0 },
	}
	for name, ok := range want {
		found := false
		for _, v := range vs {
			if v.Name == name {
				found = true
				if !ok(v) {
					t.Errorf("%s: %+v is not the scenario its name says", name, v)
				}
			}
		}
		if !found {
			t.Errorf("no %s variant", name)
		}
	}
}

func TestVariantValidate(t *testing.T) {
	t.Parallel()
	good := variant{Name: "x", Rate: 10, BatchPods: 1, Threads: 1, Burner: burnCPU, Load: loadShape{Kind: loadSteady}}
	tests := []struct {
		name   string
		change func(*variant)
		want   string // substring of the error; "" for valid
	}{
		{"good", func(*variant) {}, ""},
		{"no name", func(v *variant) { v.Name = "" }, "name"},
		{"comma in name", func(v *variant) { v.Name = "a,b" }, "name"},
		{"zero rate", func(v *variant) { v.Rate = 0 }, "rate"},
		{"no pods", func(v *variant) { v.BatchPods = 0 }, "batch pods"},
		{"too many pods", func(v *variant) { v.BatchPods = 101 }, "batch pods"},
		{"no threads", func(v *variant) { v.Threads = 0 }, "threads"},
		{"unknown burner", func(v *variant) { v.Burner = "gpu" }, "burner"},
		{"cpu with buffer", func(v *variant) { v.BufferMiB = 8 }, "no buffer"},
		{"membw small buffer", func(v *variant) { v.Burner, v.BufferMiB, v.Threads = burnMemBW, 3, 2 }, "buffer"},
		{"membw ok", func(v *variant) { v.Burner, v.BufferMiB = burnMemBW, 256 }, ""},
		{"unknown load", func(v *variant) { v.Load.Kind = "sine" }, "load"},
		{"steady with bursts", func(v *variant) { v.Load.BurstOn = time.Second }, "no bursts"},
		{"bursty too short", func(v *variant) {
			v.Load = loadShape{Kind: loadBursty, BurstOn: time.Millisecond, BurstOff: time.Second}
		}, "bursts"},
		{"bursty ok", func(v *variant) {
			v.Load = loadShape{Kind: loadBursty, BurstOn: 100 * time.Millisecond, BurstOff: 0}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := good
			tt.change(&v)
			err := v.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("valid variant refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v; want one about %q", err, tt.want)
			case err != nil && !strings.Contains(err.Error(), `"`+v.Name+`"`):
				t.Fatalf("error %v does not name the variant", err)
			}
		})
	}
}

func TestSelectVariants(t *testing.T) {
	t.Parallel()
	table := defaultVariants(baseScenarioConfig())
	tests := []struct {
		list    string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"base", []string{"base"}, ""},
		{"bursty, base", []string{"bursty", "base"}, ""},
		{"base,ls-heavy,small-batch,membw,bursty", []string{"base", "ls-heavy", "small-batch", "membw", "bursty"}, ""},
		{"base,nope", nil, `unknown variant "nope"`},
		{"base,base", nil, "named twice"},
	}
	for _, tt := range tests {
		t.Run(tt.list, func(t *testing.T) {
			t.Parallel()
			got, err := selectVariants(table, tt.list)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, v := range got {
				names = append(names, v.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("got %v, want %v", names, tt.want)
			}
		})
	}
}

func TestVariantApply(t *testing.T) {
	t.Parallel()
	sc := scenarioConfig{rate: 500, batchPods: 4, threads: 2, lsCPU: "1", tierParent: "kubepods"}
	for _, v := range defaultVariants(sc) {
		got := v.apply(sc)
		if got.rate != v.Rate || got.batchPods != v.BatchPods || got.threads != v.Threads || got.burner != v.Burner ||
			got.bufferMiB != v.BufferMiB || got.load != v.Load {
			t.Errorf("%s: applied %+v", v.Name, got)
		}
		if got.lsCPU != "1" || got.tierParent != "kubepods" {
			t.Errorf("%s: apply lost the rest of the configuration: %+v", v.Name, got)
		}
	}
}

// TestBurnMemory runs the memory-bandwidth burner on a small buffer: it says ready
// after touching its buffer, copies until cancelled, and refuses an empty share.
func TestBurnMemory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- burnMemory(ctx, 2, 4<<20, func() { close(ready) }) }()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the burner never said ready")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the burner did not stop when cancelled")
	}
	if err := burnMemory(context.Background(), 4, 3, func() { t.Error("ready with nothing to copy") }); err == nil {
		t.Fatal("a 3-byte buffer over 4 threads was accepted")
	}
}
