package gpureal

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/podsource"
	"github.com/understory/understory/qos"
)

// mpsKeyKnown says whether the agent's config has gpu.mps yet (koordlet/gpu/mps wired).
func mpsKeyKnown() bool {
	_, ok := reflect.TypeOf(config.GPU{}).FieldByName("MPS")
	return ok
}

// TestAgentConfigLoads: the config the driver writes is one the agent accepts, with the
// settings the bench relies on.
func TestAgentConfigLoads(t *testing.T) {
	t.Parallel()
	modes := []string{""}
	if mpsKeyKnown() {
		modes = append(modes, "disabled", "run")
	}
	for _, mode := range modes {
		t.Run("mps="+mode, func(t *testing.T) {
			t.Parallel()
			b, err := renderAgentConfig(agentConfigSpec{CgroupRoot: "/sys/fs/cgroup", KubeletRoot: "/understory-gpureal-x",
				Manifests: "/tmp/m", Listen: "127.0.0.1:1234", NRISocket: "/tmp/x/nri.sock", MPSMode: mode,
				MPSPipe: "/tmp/x/mps-pipe", MPSLog: "/tmp/x/mps-log",
				Extra: map[string]map[string]any{"escalation": {"freezeAfter": "0s"}}})
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(b)
			if err != nil {
				t.Fatalf("the agent refuses the bench's config: %v\n%s", err, b)
			}
			switch {
			case !cfg.NRI.Enabled || cfg.NRI.Socket != "/tmp/x/nri.sock":
				t.Errorf("NRI %+v", cfg.NRI)
			case cfg.StaticPodDir != "/tmp/m" || cfg.KubeletCgroupRoot != "/understory-gpureal-x" ||
				cfg.CgroupDriver != string(cgroups.DriverCgroupfs) || cfg.ListenAddress != "127.0.0.1:1234":
				t.Errorf("node settings %+v", cfg)
			case cfg.GPU.Mode != config.GPUModeAuto || cfg.GPU.Devices.Mode != "env":
				t.Errorf("GPU mode %q, devices %q", cfg.GPU.Mode, cfg.GPU.Devices.Mode)
			case cfg.Escalation.FreezeAfter.Duration != 0:
				t.Errorf("the extra setting was not merged: freezeAfter %v", cfg.Escalation.FreezeAfter)
			}
			if mode != "" {
				// Read back through JSON: the field's type belongs to koordlet/gpu/mps.
				v := reflect.ValueOf(cfg.GPU).FieldByName("MPS").Interface()
				j, _ := json.Marshal(v)
				var got map[string]any
				if err := json.Unmarshal(j, &got); err != nil || got["mode"] != mode ||
					got["pipeDirectory"] != "/tmp/x/mps-pipe" {
					t.Errorf("gpu.mps read back as %s", j)
				}
			}
		})
	}
}

// TestManifests: the static pods the agent reads are the classes, QoS and GPU requests
// the bench means, and the driver puts them in the cgroups kubelet would.
func TestManifests(t *testing.T) {
	t.Parallel()
	n := &node{base: "understory-gpureal-x"}
	for _, tc := range []struct {
		name       string
		spec       podSpec
		wantQOS    corev1.PodQOSClass
		wantParent string
	}{
		{"LS, Burstable, shared GPU", podSpec{Name: "ls", UID: "11111111-2222-4333-8444-555555555555",
			Class: qos.ClassLS, GPUMilli: 500, CPURequestMilli: 1000}, corev1.PodQOSBurstable,
			"/understory-gpureal-x/kubepods/burstable/pod11111111-2222-4333-8444-555555555555"},
		{"batch, BestEffort, shared GPU", podSpec{Name: "batch", UID: "21111111-2222-4333-8444-555555555555",
			Class: qos.ClassBatch, GPUMilli: 500}, corev1.PodQOSBestEffort,
			"/understory-gpureal-x/kubepods/besteffort/pod21111111-2222-4333-8444-555555555555"},
		{"batch without a GPU request", podSpec{Name: "b2", UID: "31111111-2222-4333-8444-555555555555",
			Class: qos.ClassBatch}, corev1.PodQOSBestEffort,
			"/understory-gpureal-x/kubepods/besteffort/pod31111111-2222-4333-8444-555555555555"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := renderManifest(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			pod, err := podsource.ParseManifest("p.yaml", b)
			if err != nil {
				t.Fatalf("the agent refuses the manifest: %v\n%s", err, b)
			}
			class, err := qos.Classify(pod)
			if err != nil || class != tc.spec.Class || pod.UID != tc.spec.UID {
				t.Fatalf("class %v (%v), uid %s", class, err, pod.UID)
			}
			if q := qos.KubeQOSClass(pod); q != tc.wantQOS {
				t.Fatalf("QoS %s, want %s", q, tc.wantQOS)
			}
			milli := pod.Spec.Containers[0].Resources.Limits[contract.ResourceGPUMilli]
			devs, annotated := pod.Annotations[contract.AnnotationGPUDevices]
			if int(milli.Value()) != tc.spec.GPUMilli || annotated != (tc.spec.GPUMilli > 0) ||
				(annotated && devs != "0") {
				t.Fatalf("gpu-milli %v, devices %q (annotated %v)", milli.Value(), devs, annotated)
			}
			if p, err := n.podParent(tc.spec); err != nil || p != tc.wantParent {
				t.Fatalf("pod parent %q, %v; want %q", p, err, tc.wantParent)
			}
		})
	}
	if _, err := renderManifest(podSpec{Name: "x"}); err == nil {
		t.Error("a pod without a UID was rendered")
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	c := defaultPlanConfig()
	phases := plan(c)
	names := map[string]phaseSpec{}
	for _, p := range phases {
		if _, dup := names[p.Name]; dup {
			t.Fatalf("phase %s twice", p.Name)
		}
		names[p.Name] = p
	}
	// Every pair names an earlier nothing-done phase of the same batch and LS shape.
	for _, p := range phases {
		if p.Pair == "" {
			continue
		}
		n, ok := names[p.Pair]
		if !ok || n.Section != sectionNothing || n.BatchKind != p.BatchKind || n.LSMode != p.LSMode ||
			n.Window != p.Window || n.Lead != p.Lead {
			t.Errorf("%s is paired with %+v", p.Name, n)
		}
	}
	// The measured phases are at least 20 s, and the whole run fits one device call.
	for _, name := range []string{phLSAlone, phNothing, phAgent, phBatchAlone, phDeepNothing1, phDeepNothing2,
		phDeepAgent1, phDeepAgent2, phMPS} {
		if names[name].Window < 20*time.Second {
			t.Errorf("%s lasts %v", name, names[name].Window)
		}
	}
	if d := estimate(phases); d > 7*time.Minute {
		t.Errorf("estimated %v: the device call must stay under 8 minutes", d)
	}
	// Sections are contiguous (one agent start each), and batch alone runs before LS.
	seen := map[string]bool{}
	last := ""
	for _, p := range phases {
		if p.Section != last {
			if seen[p.Section] {
				t.Fatalf("section %s comes back after another", p.Section)
			}
			seen[p.Section], last = true, p.Section
		}
	}
	if !hasAlonePhase(phases, sectionNothing) || hasAlonePhase(phases, sectionAgent) {
		t.Error("only the nothing-done section measures batch alone")
	}
	// The memory-cap check ends the MPS section, with LS and batch; -memcap=false drops it.
	if last := phases[len(phases)-1]; last.Name != phMemCap || last.Section != sectionMPS || last.LSMode != lsMem ||
		last.BatchKind != batchShallow {
		t.Errorf("the last phase is %+v, want the memory-cap check", last)
	}
	noCap := c
	noCap.MemCap = false
	if slices.ContainsFunc(plan(noCap), func(p phaseSpec) bool { return p.Name == phMemCap }) {
		t.Error("the memory-cap check with -memcap=false")
	}
	if c.MPS = false; slices.ContainsFunc(plan(c), func(p phaseSpec) bool { return p.Section == sectionMPS }) {
		t.Error("the MPS section without MPS")
	}
	for _, bad := range []planConfig{{Phase: 0, Short: time.Second}, {Phase: 10 * time.Second, Short: 20 * time.Second},
		{Phase: 20 * time.Second, Short: time.Second}} {
		if validatePlan(bad) == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := validatePlan(defaultPlanConfig()); err != nil {
		t.Error(err)
	}
}

// TestApplyAdjustment: what NRI returns becomes the stand-in's cgroup, environment and
// bind mounts (the launcher makes them); what a host process cannot take is reported.
func TestApplyAdjustment(t *testing.T) {
	t.Parallel()
	adj := &api.ContainerAdjustment{}
	adj.SetLinuxCgroupsPath("/r/kubepods/understory-batch/podu/c1")
	adj.AddEnv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/p")
	adj.AddEnv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
	adj.RemoveEnv("CUDA_VISIBLE_DEVICES")
	adj.AddMount(&api.Mount{Source: "/tmp/p", Destination: "/tmp/p", Type: "bind", Options: []string{"bind", "ro"}})
	adj.AddMount(&api.Mount{Source: "/run/nvidia/mps/shm", Destination: "/dev/shm", Type: "bind"})
	adj.AddMount(&api.Mount{Source: "tmpfs", Destination: "/scratch", Type: "tmpfs"})
	adj.AddCDIDevice(&api.CDIDevice{Name: "nvidia.com/gpu=GPU-1"})
	c := &container{ctr: &api.Container{Linux: &api.LinuxContainer{CgroupsPath: "/r/kubepods/besteffort/podu/c1"}}}
	c.apply(&api.CreateContainerResponse{Adjust: adj, Update: []*api.ContainerUpdate{{}}})
	if c.cgroup != "/r/kubepods/understory-batch/podu/c1" || c.report.Adjusted != c.cgroup {
		t.Errorf("cgroup %q", c.cgroup)
	}
	wantEnv := map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/p", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
	if !maps.Equal(c.setEnv, wantEnv) || !slices.Equal(c.removeEnv, []string{"CUDA_VISIBLE_DEVICES"}) {
		t.Errorf("env %v, removed %v", c.setEnv, c.removeEnv)
	}
	want := []string{"CDI device nvidia.com/gpu=GPU-1", "mount tmpfs -> /scratch"}
	if !slices.Equal(c.report.NotApplied, want) || c.report.Updates != 1 || len(c.report.Mounts) != 3 {
		t.Errorf("report %+v", c.report)
	}
	wantMounts := []launchMount{{"/tmp/p", "/tmp/p", true}, {"/run/nvidia/mps/shm", "/dev/shm", false}}
	if !slices.Equal(c.mounts, wantMounts) {
		t.Errorf("mounts to make %v, want %v", c.mounts, wantMounts)
	}
	env := envWith([]string{"PATH=/bin", "CUDA_VISIBLE_DEVICES=1", "CUDA_MPS_PIPE_DIRECTORY=/old"}, c.setEnv,
		c.removeEnv)
	slices.Sort(env)
	if !slices.Equal(env, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PIPE_DIRECTORY=/tmp/p",
		"PATH=/bin"}) {
		t.Errorf("environment %v", env)
	}

	// No plugin: nothing changes.
	c = &container{ctr: &api.Container{Linux: &api.LinuxContainer{CgroupsPath: "/r/kubepods/besteffort/podu/c2"}}}
	c.apply(&api.CreateContainerResponse{})
	if c.cgroup != "/r/kubepods/besteffort/podu/c2" || c.report.Adjusted != "" || len(c.report.NotApplied) != 0 {
		t.Errorf("no adjustment: %+v", c.report)
	}
}

func TestDecisionKeyAndSampler(t *testing.T) {
	t.Parallel()
	gpu := func(reason string, duty float64, ls, batch int) map[string]any {
		var lsPods, batchPods []any
		for range ls {
			lsPods = append(lsPods, "ns/ls")
		}
		for range batch {
			batchPods = append(batchPods, "ns/b")
		}
		return map[string]any{"index": 0.0, "lsPods": lsPods, "batchPods": batchPods,
			"decision": map[string]any{"reason": reason, "duty": duty, "lsUtilPercent": 33.3}}
	}
	status := func(esc bool, gpus ...map[string]any) map[string]any {
		var l []any
		for _, g := range gpus {
			l = append(l, g)
		}
		return map[string]any{"gpu": map[string]any{"gpus": l}, "escalation": map[string]any{"freeze": esc}}
	}
	if k := decisionKey(gpu("ls-active", 1, 1, 2)); k != "reason=ls-active duty=1 lsPods=1 batchPods=2" {
		t.Fatalf("key %q", k)
	}
	if k := decisionKey(map[string]any{}); k != "no decision" {
		t.Fatalf("key of nothing %q", k)
	}
	s := &sampler{start: time.Now()}
	s.add(status(false, gpu("ls-active", 1, 1, 1)), nil)
	s.add(status(false, gpu("ls-active", 1, 1, 1)), nil)
	s.add(status(false, gpu("hold", 1, 1, 1)), nil)
	s.add(status(true, gpu("hold", 1, 1, 1)), nil)
	s.add(nil, context.DeadlineExceeded)
	got := s.result()
	if len(got) != 3 || got[0].Count != 2 || !strings.HasPrefix(got[0].Key, "reason=ls-active") ||
		!strings.HasSuffix(got[2].Key, "cpuFreeze=true") || s.errs != 1 {
		t.Fatalf("samples %+v (errors %d)", got, s.errs)
	}
	var ex map[string]any
	if err := json.Unmarshal(got[0].Example, &ex); err != nil || ex["decision"] == nil {
		t.Fatalf("example %s", got[0].Example)
	}
	if missing := missingPods(map[string]any{"pods": map[string]any{"LS": []any{map[string]any{"uid": "a"}}}},
		[]string{"a", "b"}); !slices.Equal(missing, []string{"b"}) {
		t.Fatalf("missing %v", missing)
	}
}

func TestNewUUID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		u := newUUID()
		if len(u) != 36 || u[14] != '4' || !strings.ContainsRune("89ab", rune(u[19])) || seen[u] {
			t.Fatalf("uuid %q", u)
		}
		seen[u] = true
		// kubelet-safe as a cgroup name component.
		if _, err := (cgroups.Naming{Driver: cgroups.DriverCgroupfs}).PodPath(cgroups.QOSBestEffort, u); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSelectSections: -sections keeps the named sections' phases in plan order and
// refuses unknown names and an empty result.
func TestSelectSections(t *testing.T) {
	t.Parallel()
	all := plan(defaultPlanConfig())
	noMPS := defaultPlanConfig()
	noMPS.MPS = false
	tests := []struct {
		name     string
		phases   []phaseSpec
		sections []string
		want     []string
		wantErr  string
	}{
		{name: "none: all", phases: all, want: phaseNames(all)},
		{name: "baselines and MPS", phases: all, sections: []string{sectionMPS, sectionNothing},
			want: []string{phBatchAlone, phDeepAlone, phLSAlone, phNothing, phDeepNothing1, phDeepNothing2,
				phIdleNothing, phWakeNothing, phMPS, phMemCap}},
		{name: "MPS alone", phases: all, sections: []string{sectionMPS}, want: []string{phMPS, phMemCap}},
		{name: "unknown", phases: all, sections: []string{"agent-mp"}, wantErr: `unknown section "agent-mp"`},
		{name: "MPS section off", phases: plan(noMPS), sections: []string{sectionMPS}, wantErr: "no phase left"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := selectSections(tc.phases, tc.sections)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(phaseNames(got), tc.want) {
				t.Fatalf("phases %v, want %v", phaseNames(got), tc.want)
			}
		})
	}
}

func phaseNames(ps []phaseSpec) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}
