package koordlet

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLoadConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := LoadConfig([]byte("{}"))
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
	cfg, err := LoadConfig([]byte(`
period: 50ms
cgroupDriver: systemd
tierParent: besteffort
nri: {enabled: true, socket: /run/nri/nri.sock}
policy:
  threshold: 0.75
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Period.Duration != 50*time.Millisecond || cfg.CgroupDriver != "systemd" || !cfg.NRI.Enabled ||
		cfg.NRI.Socket != "/run/nri/nri.sock" || cfg.Policy.Threshold != 0.75 || cfg.TierParent != TierParentBestEffort {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
	// Fields the file leaves out keep their defaults, also inside policy.
	if cfg.Policy.RestoreStepPercent == 0 || cfg.ListenAddress != DefaultListenAddress {
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
		{"minPodCPU: 0.0001", "minPodCPU"},
		{"nodeMetricsPeriod: 100ms", "nodeMetricsPeriod"},
		{"nri: {enabled: true, socket: relative.sock}", "nri.socket"},
		{"shutdownBudgetCPU: -1", "shutdownBudgetCPU"},
		{"policy: {threshold: 1.5}", "policy.threshold"},
		{"policy: {restoreStepPercent: 0}", "policy.restoreStepPercent"},
		{"polcy: {}", "polcy"},
		{"listenAddress: ''", "listenAddress"},
		{"cgroupRoot: ''", "cgroupRoot"},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			t.Parallel()
			_, err := LoadConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("LoadConfig(%q) succeeded", tc.yaml)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name field %q", err, tc.field)
			}
			if !errors.Is(err, ErrInvalidConfig) && !strings.HasPrefix(tc.field, "policy.") {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte("{}"))
	f.Add([]byte("period: 50ms\npolicy: {threshold: 0.8}\n"))
	f.Add([]byte("nri: {enabled: true, socket: /x}\ntierName: a\n"))
	f.Add([]byte("kubeletCgroupRoot: /x/y\ncgroupDriver: systemd\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := LoadConfig(data)
		if err != nil {
			return
		}
		// Whatever loads must be usable: valid, with a safe tier path.
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded config does not validate: %v", err)
		}
		if _, err := newLayout(cfg); err != nil {
			t.Fatalf("loaded config has no layout: %v", err)
		}
	})
}
