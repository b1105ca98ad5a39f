package gpureal

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// noGPUHere skips a test on a machine with an NVIDIA GPU.
func noGPUHere(t *testing.T) {
	t.Helper()
	if m, _ := filepath.Glob("/dev/nvidia[0-9]*"); len(m) > 0 {
		t.Skip("this machine has an NVIDIA GPU")
	}
	if _, err := exec.LookPath("nvidia-smi"); err == nil {
		t.Skip("nvidia-smi is installed here")
	}
}

func TestFindGPU(t *testing.T) {
	t.Parallel()
	dev := t.TempDir()
	if err := os.WriteFile(filepath.Join(dev, "nvidia0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := findGPU(context.Background(), dev); err != nil {
		t.Fatalf("a /dev/nvidia0 is a GPU: %v", err)
	}
	noGPUHere(t)
	if err := findGPU(context.Background(), t.TempDir()); !errors.Is(err, ErrNoGPU) {
		t.Fatalf("findGPU without a GPU = %v, want ErrNoGPU", err)
	}
}

// TestNoGPUStopsAtOnce: without a GPU the bench stops before anything else, with the
// message that says where to run it; so does make bench-gpu-real's script.
func TestNoGPUStopsAtOnce(t *testing.T) {
	t.Parallel()
	noGPUHere(t)
	agent := filepath.Join(t.TempDir(), "koordlet")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	err := Main([]string{"-agent", agent, "-workloads", "workloads", "-out", filepath.Join(t.TempDir(), "x.json")},
		&out, &errw)
	if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "docs/benchmarks.md") {
		t.Fatalf("Main without a GPU = %v, want ErrNoGPU", err)
	}
	if out.Len() != 0 {
		t.Fatalf("it ran something: %s", out.String())
	}
	cmd := exec.Command("../../scripts/bench-gpu-real.sh")
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(b), "no NVIDIA GPU") {
		t.Fatalf("the script without a GPU: %v, %s", err, b)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	agent := filepath.Join(t.TempDir(), "koordlet")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notExec := filepath.Join(t.TempDir(), "koordlet")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
		mps  bool
	}{
		{"defaults", []string{"-agent", agent, "-workloads", "workloads"}, true, true},
		{"mps off", []string{"-agent", agent, "-workloads", "workloads", "-mps", "off"}, true, false},
		{"fake has no MPS section", []string{"-agent", agent, "-fake"}, true, false},
		{"bad mps", []string{"-agent", agent, "-workloads", "workloads", "-mps", "on"}, false, false},
		{"agent missing", []string{"-agent", agent + ".nope", "-workloads", "workloads"}, false, false},
		{"agent not executable", []string{"-agent", notExec, "-workloads", "workloads"}, false, false},
		{"no stand-ins there", []string{"-agent", agent, "-workloads", t.TempDir()}, false, false},
		{"phase too short for the idle target", []string{"-agent", agent, "-fake", "-short", "1s"}, false, false},
		{"gpu-milli above a GPU", []string{"-agent", agent, "-fake", "-ls-gpu-milli", "1500"}, false, false},
		{"stray argument", []string{"-agent", agent, "-fake", "now"}, false, false},
		{"CPU freeze off", []string{"-agent", agent, "-fake", "-cpu-freeze=false"}, true, false},
		{"LS cap", []string{"-agent", agent, "-workloads", "workloads", "-mps-ls-cap", "100", "-sections", "nothing,agent-mps"}, true, true},
		{"LS cap above 100", []string{"-agent", agent, "-workloads", "workloads", "-mps-ls-cap", "101"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var errw bytes.Buffer
			o, err := parseFlags(tc.args, &errw)
			if (err == nil) != tc.ok {
				t.Fatalf("parseFlags = %v, want ok %v", err, tc.ok)
			}
			if err == nil && o.Plan.MPS != tc.mps {
				t.Fatalf("MPS section %v, want %v", o.Plan.MPS, tc.mps)
			}
			cpuOff := slices.Contains(tc.args, "-cpu-freeze=false")
			if err == nil && (o.AgentConfigExtra["escalation"]["freezeAfter"] == "0s") != cpuOff {
				t.Fatalf("agent config extra %v", o.AgentConfigExtra)
			}
			if err == nil && slices.Contains(tc.args, "-mps-ls-cap") {
				cfg, rerr := renderAgentConfig(agentConfigSpec{MPSMode: "run", Extra: o.AgentConfigExtra})
				if rerr != nil || !strings.Contains(string(cfg), "lsCapPercent: 100") || !strings.Contains(string(cfg), "mode: run") {
					t.Fatalf("config with -mps-ls-cap: %v\n%s", rerr, cfg)
				}
				if !slices.Equal(o.Plan.Sections, []string{sectionNothing, sectionMPS}) {
					t.Fatalf("sections %v", o.Plan.Sections)
				}
			}
		})
	}
}
