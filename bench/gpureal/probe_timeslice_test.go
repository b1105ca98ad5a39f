package gpureal

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/gpu/timeslice/timeslicetest"
)

// probeResult is the part of probe-timeslice.json the test reads.
type probeResult struct {
	Fake      bool `json:"fake"`
	Processes map[string]struct {
		PID        int   `json:"pid"`
		Shim       bool  `json:"shim"`
		ShimMapped *bool `json:"shimMapped"`
	} `json:"processes"`
	Phases []struct {
		Name string `json:"name"`
		LS   *struct {
			Requests int     `json:"requests"`
			P99      float64 `json:"p99Ms"`
		} `json:"ls"`
		Batch *struct {
			PerSecond float64 `json:"perSecond"`
		} `json:"batch"`
		LSP99VsAlone *float64 `json:"lsP99VsAlone"`
	} `json:"phases"`
	Reports map[string]struct {
		Lines   []string `json:"lines"`
		Summary struct {
			Events        int            `json:"events"`
			Modes         map[string]int `json:"modes"`
			SetOK         int            `json:"setOK"`
			ReadBackEqual int            `json:"readBackEqual"`
		} `json:"summary"`
	} `json:"reports"`
	Verdict string `json:"verdict"`
}

// TestProbeTimesliceDryRun runs bench/gpureal/probe-timeslice.sh without a GPU: the
// stand-ins on the fake torch, the shim built as the Makefile builds it, and (where the
// case says) the fake driver preloaded after it, allocating one channel group in each
// shim process as a CUDA context would. It checks the phases, the shim in the right
// processes with the right slices, its reports and the verdict; not a GPU result.
func TestProbeTimesliceDryRun(t *testing.T) {
	t.Parallel()
	py := python(t)
	b := timeslicetest.Build(t, t.TempDir())
	torchDir, err := filepath.Abs(filepath.Join("testdata", "faketorch")) // the script runs from the repository root
	if err != nil {
		t.Fatal(err)
	}
	wantPhases := []string{"ls alone", "batch alone", "batch 100 us alone", "pair, driver default",
		"pair, batch 100 us, LS default", "pair, batch 100 us, LS 10000 us"}
	for _, tc := range []struct {
		name       string
		fakeDriver bool
		shim       string
		wantRC     int
		verdict    string
	}{
		// With the fake torch, LS's latencies say nothing: go or no-go, but not inconclusive.
		{name: "contexts seen", fakeDriver: true, verdict: "FAKE RUN, no GPU, not a result: "},
		{name: "no context reaches the shim", verdict: "FAKE RUN, no GPU, not a result: inconclusive: the shim saw no " +
			"channel-group allocation in batch (shim mapped: True)"},
		{name: "no shim built", shim: "/nonexistent/libunderstory-tsg.so", wantRC: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			shim := b.Shim
			if tc.shim != "" {
				shim = tc.shim
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "probe-timeslice.sh", "--phase", "0.4", "--skip", "0",
				"--ls-args", "--warmup 3 --rate 200", "--batch-args", "--size 16")
			cmd.Env = append(os.Environ(), "PROBE_FAKE=1", "PROBE_SHIM="+shim, "PROBE_OUT="+out, "PYTHON="+py,
				"PYTHONPATH="+torchDir, "PYTHONDONTWRITEBYTECODE=1")
			if tc.fakeDriver {
				cmd.Env = append(cmd.Env, "PROBE_EXTRA_PRELOAD="+b.Fake, "FAKE_RM_ALLOC_AT_LOAD=1")
			}
			outb, err := cmd.CombinedOutput()
			if rc := cmd.ProcessState.ExitCode(); rc != tc.wantRC {
				t.Fatalf("probe-timeslice.sh exited %d (%v), want %d:\n%s", rc, err, tc.wantRC, outb)
			}
			if tc.wantRC != 0 {
				if !strings.Contains(string(outb), "make tsg-shim") {
					t.Errorf("no hint to build the shim:\n%s", outb)
				}
				return
			}
			raw, err := os.ReadFile(filepath.Join(out, "probe-timeslice.json"))
			if err != nil {
				t.Fatalf("%v\n%s", err, outb)
			}
			var r probeResult
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			if !r.Fake || !strings.HasPrefix(r.Verdict, tc.verdict) || !strings.Contains(string(outb), "verdict: "+r.Verdict) ||
				tc.fakeDriver && strings.Contains(r.Verdict, "inconclusive") {
				t.Errorf("verdict %q (fake %t), want it to start %q and be printed:\n%s", r.Verdict, r.Fake, tc.verdict, outb)
			}
			if len(r.Phases) != len(wantPhases) {
				t.Fatalf("%d phases, want %v", len(r.Phases), wantPhases)
			}
			for i, p := range r.Phases {
				if p.Name != wantPhases[i] {
					t.Errorf("phase %d is %q, want %q", i, p.Name, wantPhases[i])
				}
				if p.LS != nil && (p.LS.Requests == 0 || p.LS.P99 <= 0 || p.LSP99VsAlone == nil) {
					t.Errorf("phase %q: LS measured %+v", p.Name, p.LS)
				}
				if p.Batch != nil && p.Batch.PerSecond <= 0 {
					t.Errorf("phase %q: batch measured %+v", p.Name, p.Batch)
				}
			}
			for role, shimmed := range map[string]bool{"ls": false, "batch": false, "ls-default": true, "ls-long": true,
				"batch-100": true} {
				p, ok := r.Processes[role]
				if !ok || p.PID == 0 || p.Shim != shimmed || p.ShimMapped == nil || *p.ShimMapped != shimmed {
					t.Errorf("process %s: %+v, want the shim loaded: %t", role, p, shimmed)
				}
			}
			if !tc.fakeDriver {
				for role, rep := range r.Reports {
					if rep.Summary.Events != 0 {
						t.Errorf("%s reported %v without a driver", role, rep.Lines)
					}
				}
				return
			}
			for role, want := range map[string]struct {
				mode, asked string
			}{
				"batch-100":  {"set", "asked=100 "},
				"ls-long":    {"set", "asked=10000 "},
				"ls-default": {"report", "asked=- "},
			} {
				rep := r.Reports[role]
				if rep.Summary.Events != 1 || rep.Summary.Modes[want.mode] != 1 || len(rep.Lines) != 1 ||
					!strings.Contains(rep.Lines[0], want.asked) {
					t.Errorf("%s's report: %+v, want one %s event with %s", role, rep, want.mode, want.asked)
				}
				if want.mode == "set" && (rep.Summary.SetOK != 1 || rep.Summary.ReadBackEqual != 1) {
					t.Errorf("%s's report: %+v, want its slice set and read back", role, rep.Summary)
				}
			}
		})
	}
}
