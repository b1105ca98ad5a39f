//go:build cgo

package gpureal

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDryRun runs the whole orchestration without a GPU, in short phases: real
// kubelet-style cgroups below a private kubelet root, NRI's runtime side with the
// agent's real plugin connected, the agent's packages as the agent (the test binary,
// with go-nvml's mock as the GPU, whose processes are the pods' real processes), and the
// fake stand-ins launched inside their container cgroups.
func TestDryRun(t *testing.T) {
	t.Parallel()
	const cgroupRoot = "/sys/fs/cgroup"
	h, self := rootCgroupsSelf(t, cgroupRoot, "the dry run creates cgroups and runs the agent")
	// The agent's MPS key exists once koordlet/gpu/mps is wired; before, none is written.
	// With it, the MPS section runs too: the test agent starts no daemon (a control
	// socket of the test's stands in for one), so its containers get no CUDA_MPS_* and
	// the section must say so; it checks a second agent's start on the same runtime.
	mps := mpsNone
	if mpsKeyKnown() {
		mps = mpsRun
	}
	dir := t.TempDir()
	pipe := filepath.Join(dir, "mps-pipe")
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pipe, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := &options{
		Plan: planConfig{Phase: time.Second, Short: 1500 * time.Millisecond, Lead: 500 * time.Millisecond,
			MPS: mps == mpsRun, MemCap: true},
		MPSPipe: pipe,
		Out:     filepath.Join(dir, "gpu-real.json"), LogDir: dir, CgroupRoot: cgroupRoot,
		AgentCmd: []string{self}, AgentEnv: []string{testAgentEnv + "=1"}, Self: self,
		AgentConfigExtra: map[string]map[string]any{"escalation": {"freezeAfter": "0s"}},
		Fake:             true, FakeLSWork: 2 * time.Millisecond, FakeBatchWork: time.Millisecond, MPS: mps,
		LSRate: 100, LSMatmuls: 17, LSSize: 4096, BatchSize: 8192, BatchEvery: 8, DeepEvery: 64,
		LSGPUMilli: 500, BatchGPUMilli: 500, ReadyTimeout: 30 * time.Second, Stdout: &out,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, o)
	defer func() {
		if t.Failed() {
			t.Logf("driver output:\n%s", out.String())
			for _, f := range []string{"gpureal-agent-agent.log", "gpureal-standins.log"} {
				t.Logf("%s:\n%s", f, tailFile(filepath.Join(dir, f), 4000))
			}
		}
	}()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if err := writeResult(o.Out, res); err != nil {
		t.Fatal(err)
	}

	// Every phase measured what it should.
	want := plan(o.Plan)
	if len(res.Phases) != len(want) {
		t.Fatalf("%d phases measured, want %d", len(res.Phases), len(want))
	}
	for i, p := range res.Phases {
		if p.Name != want[i].Name {
			t.Fatalf("phase %d is %s, want %s", i, p.Name, want[i].Name)
		}
		if p.LSMode == lsMem {
			// The memory-cap check: the test agent starts no MPS daemon, so the batch fake
			// is no MPS client and the check says it did not run (memcap_test.go runs it).
			if p.MemCap == nil || p.MemCap.Met || !strings.HasPrefix(p.MemCap.Verdict, "not run") || p.LS != nil ||
				p.Batch != nil {
				t.Errorf("%s: %+v", p.Name, p)
			}
			continue
		}
		ls := p.LS
		if p.LSMode == lsGoIdle {
			if p.LS != nil {
				t.Errorf("%s: LS figures for a window in which LS is idle", p.Name)
			}
			ls = p.LeadLS // its active lead-in
		}
		if (p.LSMode != lsOff) != (ls != nil && ls.Requests > 0) {
			t.Errorf("%s: LS mode %q but LS stats %+v", p.Name, p.LSMode, ls)
		}
		// Batch may be frozen for a whole agent phase: its result is what must come.
		if (p.BatchKind != batchNone) != (p.Batch != nil && len(p.Batch.Timeline) > 0) {
			t.Errorf("%s: batch %q but batch stats %+v", p.Name, p.BatchKind, p.Batch)
		}
		if agent := p.Section != sectionNothing; agent != (p.AgentCPUPct != nil) || agent != (len(p.Agent) > 0) {
			t.Errorf("%s (section %s): agent CPU %v, %d /status samples", p.Name, p.Section, p.AgentCPUPct,
				len(p.Agent))
		}
	}
	if r := byName(res.Phases)[phIdleAgent].Recovery; r == nil {
		t.Errorf("no recovery measured in %s", phIdleAgent)
	}

	// The agent saw the stand-ins on its (mock) GPU, in their pods: the cgroups and the
	// NRI placement are what the agent's attribution expects.
	seenLS, seenBatch := false, false
	for _, s := range byName(res.Phases)[phAgent].Agent {
		var g struct {
			LSPods    []string `json:"lsPods"`
			BatchPods []string `json:"batchPods"`
		}
		if err := json.Unmarshal(s.Example, &g); err != nil {
			t.Fatal(err)
		}
		seenLS = seenLS || len(g.LSPods) > 0
		seenBatch = seenBatch || len(g.BatchPods) > 0
	}
	if !seenLS || !seenBatch {
		t.Errorf("the agent's GPU decisions in %s never showed LS and batch pods: %+v", phAgent,
			byName(res.Phases)[phAgent].Agent)
	}

	// NRI: the agent moved batch below its tier and gave shared-GPU containers their
	// device; the nothing-done section's runtime had no plugin.
	wantSections := 2
	if mps == mpsRun {
		wantSections = 3
	}
	if len(res.Sections) != wantSections {
		t.Fatalf("%d sections, want %d", len(res.Sections), wantSections)
	}
	for _, s := range res.Sections {
		if len(s.Containers) == 0 {
			t.Fatalf("section %s: no containers", s.Name)
		}
		for _, c := range s.Containers {
			moved := strings.Contains(c.Adjusted, "/kubepods/understory-batch/pod")
			env := c.Env["NVIDIA_VISIBLE_DEVICES"]
			switch {
			case s.Name == sectionNothing && (c.Adjusted != "" || len(c.Env) != 0):
				t.Errorf("no agent, yet %s was adjusted: %+v", c.Pod, c)
			case s.Name != sectionNothing && moved != (c.Class == "batch"):
				t.Errorf("%s (%s): adjusted cgroups path %q", c.Pod, c.Class, c.Adjusted)
			case s.Name != sectionNothing && (!strings.HasPrefix(env, "GPU-") || c.SawEnv["NVIDIA_VISIBLE_DEVICES"] != env):
				t.Errorf("%s: NRI set NVIDIA_VISIBLE_DEVICES=%q, the process saw %q", c.Pod, env,
					c.SawEnv["NVIDIA_VISIBLE_DEVICES"])
			case c.PID == 0 || c.Refused != "":
				t.Errorf("%s: pid %d, refused %q", c.Pod, c.PID, c.Refused)
			case s.Name == sectionMPS && c.UID != mpsClientUID:
				t.Errorf("%s in the MPS section ran as uid %d, want the MPS client UID %d", c.Pod, c.UID, mpsClientUID)
			case s.Name != sectionMPS && c.UID != os.Getuid():
				t.Errorf("%s ran as uid %d, want the driver's %d", c.Pod, c.UID, os.Getuid())
			}
		}
	}
	if mps == mpsRun {
		mpsSec := res.Sections[2]
		if mpsSec.Name != sectionMPS || !strings.Contains(mpsSec.AgentConfig, "mode: run") ||
			!slices.ContainsFunc(mpsSec.Notes, func(n string) bool { return strings.Contains(n, "no CUDA_MPS_*") }) {
			t.Errorf("MPS section %s: config %q, notes %q", mpsSec.Name, mpsSec.AgentConfig, mpsSec.Notes)
		}
	}
	if len(res.Targets) != 5 {
		t.Errorf("%d targets, want 5", len(res.Targets))
	}

	// The JSON reads back, and the table names every phase.
	var back result
	b, err := os.ReadFile(o.Out)
	if err != nil || json.Unmarshal(b, &back) != nil || back.Schema != resultSchema || len(back.Phases) != len(want) {
		t.Fatalf("result file: %v, %d phases", err, len(back.Phases))
	}
	var table bytes.Buffer
	printTable(&table, res)
	for _, p := range want {
		if !strings.Contains(table.String(), p.Name) {
			t.Errorf("the table misses %s:\n%s", p.Name, table.String())
		}
	}

	// Nothing is left: the kubelet root and everything in it (the agent's tier too).
	if rel := strings.TrimPrefix(res.Host.KubeletRoot, "/"); rel == "" || h.Exists(rel) {
		t.Errorf("the bench's cgroups %q were left behind", res.Host.KubeletRoot)
	}
}
