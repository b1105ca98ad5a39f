package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

func TestLoadConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Load([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Period.Duration != DefaultPeriod || cfg.Period.Duration > 200*time.Millisecond {
		t.Errorf("period = %v, want %v (≤ 200ms)", cfg.Period.Duration, DefaultPeriod)
	}
	if cfg.TierName != DefaultTierName || cfg.TierParent != TierParentKubepods || cfg.CgroupRoot != DefaultCgroupRoot {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if cfg.Policy.Threshold <= 0 {
		t.Errorf("policy defaults not applied: %+v", cfg.Policy)
	}
}

func TestLoadConfigOverrides(t *testing.T) {
	t.Parallel()
	cfg, err := Load([]byte(`
period: 50ms
cgroupDriver: systemd
tierParent: besteffort
nri: {enabled: true, socket: /run/nri/nri.sock}
policy:
  threshold: 0.75
batchResources:
  cpu: {policy: maxUsageRequest}
  lsWindow: 10m
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Period.Duration != 50*time.Millisecond || cfg.CgroupDriver != "systemd" || !cfg.NRI.Enabled ||
		cfg.NRI.Socket != "/run/nri/nri.sock" || cfg.Policy.Threshold != 0.75 || cfg.TierParent != TierParentBestEffort {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
	if cfg.BatchResources.CPU.Policy != "maxUsageRequest" || cfg.BatchResources.LSWindow.Duration != 10*time.Minute {
		t.Fatalf("batchResources overrides not applied: %+v", cfg.BatchResources)
	}
	// Fields the file leaves out keep their defaults, also inside policy and batchResources.
	if cfg.Policy.RestoreStepPercent == 0 || cfg.ListenAddress != DefaultListenAddress ||
		cfg.BatchResources.CPU.Threshold == 0 || cfg.BatchResources.Memory.Policy != "maxUsageRequest" {
		t.Fatalf("defaults lost: %+v", cfg)
	}
}

func TestLoadConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, field string }{
		{"period: 1ms", "period"},
		{"period: 11s", "period"},
		{"period: fast", "period"},
		{"cfsPeriod: 2s", "cfsPeriod"},
		{"cgroupDriver: docker", "cgroupDriver"},
		{"tierName: pod-batch", "tierName"},
		{"tierName: ../escape", "tierName"},
		{"tierParent: burstable", "tierParent"},
		{"kubeletCgroupRoot: /a/../../b", "kubeletCgroupRoot"},
		{"kubeletCgroupRoot: ''", "kubeletCgroupRoot"},
		// Under systemd every component of the root is part of a slice unit name.
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /a b", "kubeletCgroupRoot"},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /a:b", "kubeletCgroupRoot"},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /x/.hidden", "kubeletCgroupRoot"},
		{"minPodCPU: 0.0001", "minPodCPU"},
		{"nodeMetricsPeriod: 100ms", "nodeMetricsPeriod"},
		{"nri: {enabled: true, socket: relative.sock}", "nri.socket"},
		{"shutdownBudgetCPU: -1", "shutdownBudgetCPU"},
		{"policy: {threshold: 1.5}", "policy.threshold"},
		{"policy: {restoreStepPercent: 0}", "policy.restoreStepPercent"},
		{"policy: {minBatchCPU: 1, threshold: .nan}", "policy.threshold: not a finite number"},
		{"policy:\n  maxBatchCPU: -.inf", "policy.maxBatchCPU: not a finite number"},
		{"minPodCPU: .nan", "minPodCPU: not a finite number"},
		{"signals: {runqueueDelay: {quantile: .inf}}", "signals.runqueueDelay.quantile: not a finite number"},
		{"policy: {thresold: 0.7}", "thresold"},
		{"policy: {threshold: high}", "policy"},
		{"batchResources: {cpu: {policy: request}}", "batchResources.cpu.policy"},
		{"batchResources: {memory: {threshold: 0}}", "batchResources.memory.threshold"},
		{"batchResources: {lsWindow: 1s}", "batchResources.lsWindow"},
		{"batchResources: {lsPercentile: 2}", "batchResources.lsPercentile"},
		{"polcy: {}", "polcy"},
		{"listenAddress: ''", "listenAddress"},
		{"cgroupRoot: ''", "cgroupRoot"},
		{"signals: {mode: bpf}", "signals.mode"},
		{"signals: {mode: EBPF}", "signals.mode"},
		{"signals: {pollInterval: 1ms}", "signals.pollInterval"},
		{"signals: {runqueueDelay: {quantile: 1.5}}", "signals.runqueueDelay.quantile"},
		{"signals: {runqueueDelay: {threshold: 1us}}", "signals.runqueueDelay.threshold"},
		{"signals: {psi: {window: 100ms}}", "signals.psi.window"},
		{"signals: {psi: {cpuStall: 500ms}}", "signals.psi.cpuStall"},
		{"signals: {psi: {memoryStall: 2s}}", "signals.psi.memoryStall"},
		{"signals: {cutPercent: 0}", "signals.cutPercent"},
		{"signals: {restoreHold: -1s}", "signals.restoreHold"},
		{"signals: {restorePercentPerSecond: 2000}", "signals.restorePercentPerSecond"},
		{"signals: {modes: psi}", "signals"},
		{"gpu: {mps: {mode: start}}", "gpu.mps: mode"},
		{"gpu: {mps: {pipeDirectory: tmp/mps}}", "gpu.mps: pipeDirectory"},
		{"gpu: {mps: {shmDirectory: /dev/shm/}}", "gpu.mps: shmDirectory"},
		{"gpu: {mps: {controlBinary: 'nvidia-cuda-mps-control -d'}}", "gpu.mps: controlBinary"},
		{"gpu: {mps: {clientUID: -5}}", "gpu.mps: clientUID"},
		{"gpu: {mps: {checkPeriod: 1ms}}", "gpu.mps: checkPeriod"},
		{"gpu: {mps: {pipeDir: /tmp/mps}}", "pipeDir"},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			t.Parallel()
			_, err := Load([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Load(%q) succeeded", tc.yaml)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name field %q", err, tc.field)
			}
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, qos.ErrInvalidConfig) &&
				!strings.HasPrefix(tc.field, "policy.") && !strings.HasPrefix(tc.field, "batchResources.") {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

// kubeletCgroupRoot is kubelet's --cgroup-root under either driver: kind's /kubelet
// loads with both, and so does whatever cgroupfs accepted before; a root systemd
// cannot name as slices is refused with a message that says why.
func TestLoadConfigKubeletCgroupRoot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		want string // "" if it must load
	}{
		{"kubeletCgroupRoot: /kubelet", ""},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /kubelet", ""},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /a/b-c/", ""},
		{"kubeletCgroupRoot: /a b", ""},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /a b", "makes no valid slice names with cgroupDriver systemd"},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /x/.hidden", "makes no valid slice names with cgroupDriver systemd"},
		{"cgroupDriver: systemd\nkubeletCgroupRoot: /a/../b", "is not a safe cgroup path"},
		{"kubeletCgroupRoot: /a/../b", "is not a safe cgroup path"},
	} {
		cfg, err := Load([]byte(tc.yaml))
		if tc.want == "" {
			if err != nil {
				t.Errorf("Load(%q): %v", tc.yaml, err)
			} else if _, _, err := cfg.Cgroups(); err != nil {
				t.Errorf("Load(%q) names no tier cgroup: %v", tc.yaml, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("Load(%q) = %v; want ErrInvalid saying %q", tc.yaml, err, tc.want)
		}
	}
}

// The signals section: the four modes the benchmark sets, defaults for what is left out.
func TestLoadConfigSignals(t *testing.T) {
	t.Parallel()
	cfg, err := Load([]byte("{}"))
	if err != nil || cfg.Signals.Mode != "auto" || cfg.Signals.RunqueueDelay.Threshold.Duration != 2*time.Millisecond ||
		cfg.Signals.CutPercent != qos.DefaultCutPercent || cfg.Signals.PSI.Window.Duration != 500*time.Millisecond {
		t.Fatalf("signals defaults %+v, %v", cfg.Signals, err)
	}
	for _, mode := range []string{"auto", "ebpf", "psi", "sampling"} {
		cfg, err := Load([]byte("signals:\n  mode: " + mode + "\n  cutPercent: 25\n  restoreHold: 3s\n"))
		if err != nil || cfg.Signals.Mode != mode || cfg.Signals.CutPercent != 25 ||
			cfg.Signals.RestoreHold.Duration != 3*time.Second || cfg.Signals.PollInterval.Duration != 20*time.Millisecond {
			t.Fatalf("mode %s: %+v, %v", mode, cfg.Signals, err)
		}
	}
}

func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte("{}"))
	f.Add([]byte("period: 50ms\npolicy: {threshold: 0.8}\n"))
	f.Add([]byte("nri: {enabled: true, socket: /x}\ntierName: a\n"))
	f.Add([]byte("kubeletCgroupRoot: /x/y\ncgroupDriver: systemd\n"))
	f.Add([]byte("signals: {mode: psi, psi: {window: 2s, cpuStall: 100ms}, cutPercent: 30}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Load(data)
		if err != nil {
			return
		}
		// Whatever loads must be usable: valid, with a safe tier path.
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded config does not validate: %v", err)
		}
		if _, _, err := cfg.Cgroups(); err != nil {
			t.Fatalf("loaded config names no tier cgroup: %v", err)
		}
		// A reload of it (reload.go): it encodes (/status shows it), and over the
		// defaults only the fields that need a restart are left to differ.
		if d := changedFields(cfg, cfg); len(d) != 0 || toJSONValue(cfg) == nil {
			t.Fatalf("config does not encode or differs from itself: %v", d)
		}
		next := Default()
		CopyLive(&next, cfg)
		for _, f := range changedFields(next, cfg) {
			for _, live := range LiveFields() {
				if f == live {
					t.Fatalf("live field %s differs after CopyLive", f)
				}
			}
		}
	})
}

// gpu.mps: defaults (disabled, NVIDIA's directories) and every key.
func TestLoadConfigMPS(t *testing.T) {
	t.Parallel()
	cfg, err := Load([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.GPU.MPS; m.Mode != mps.ModeDisabled || m.PipeDirectory != "/tmp/nvidia-mps" ||
		m.LogDirectory != "/var/log/nvidia-mps" || m.ShmDirectory != "/run/nvidia-mps-shm" ||
		m.ControlBinary != "nvidia-cuda-mps-control" || m.ClientUID != 1000 {
		t.Fatalf("gpu.mps defaults: %+v", m)
	}
	cfg, err = Load([]byte(`
gpu:
  mps:
    mode: find
    pipeDirectory: /run/nvidia/mps/nvidia.com/gpu/pipe
    shmDirectory: /run/nvidia/mps/shm
    controlBinary: /usr/bin/nvidia-cuda-mps-control
    checkPeriod: 2s
    clientUID: 1000
`))
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.GPU.MPS; m.Mode != mps.ModeFind || m.PipeDirectory != "/run/nvidia/mps/nvidia.com/gpu/pipe" ||
		m.ShmDirectory != "/run/nvidia/mps/shm" || m.ControlBinary != "/usr/bin/nvidia-cuda-mps-control" ||
		m.CheckPeriod.Duration != 2*time.Second || m.ClientUID != 1000 || m.LogDirectory != "/var/log/nvidia-mps" {
		t.Fatalf("gpu.mps overrides: %+v", m)
	}
}

// The configuration shipped in manifests/koordlet loads: every key it sets exists and
// is in range.
func TestShippedConfigLoads(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../manifests/koordlet/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(raw, &cm); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("shipped config: %v", err)
	}
	if cfg.BatchResources.Memory.Policy != qos.ReclaimPolicyMaxUsageRequest || cfg.Escalation.FreezeAfter.Duration == 0 {
		t.Fatalf("shipped config lost its batchResources/escalation sections: %+v", cfg)
	}
}
