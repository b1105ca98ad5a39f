package kueueharness

import (
	"errors"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestConfigurationLaysHarnessKeysOverTheShippedConfig(t *testing.T) {
	t.Parallel()
	shipped, err := ReadConfig()
	if err != nil {
		t.Fatal(err)
	}
	out, err := Configuration(Options{Config: shipped, PodsReadyTimeout: 20 * time.Second, BackoffBaseSeconds: 7}, 1001, 1002, 1003, "/certs")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	w := cfg["waitForPodsReady"].(map[string]any)
	if w["timeout"] != "20s" || w["requeuingStrategy"].(map[string]any)["backoffBaseSeconds"] != float64(7) {
		t.Errorf("waitForPodsReady %v", w)
	}
	if _, ok := cfg["fairSharing"]; !ok {
		t.Error("the shipped fairSharing was dropped")
	}
	if cfg["webhook"].(map[string]any)["port"] != float64(1001) || cfg["namespace"] != Namespace {
		t.Errorf("harness keys: %v", cfg)
	}
	if cfg["featureGates"].(map[string]any)["VisibilityOnDemand"] != false {
		t.Errorf("featureGates %v", cfg["featureGates"])
	}
	gk := cfg["controller"].(map[string]any)["groupKindConcurrency"].(map[string]any)
	if gk["Job.batch"] != float64(5) || gk["Workload.kueue.x-k8s.io"] != float64(5) || len(gk) != len(InstallConcurrency()) {
		t.Errorf("groupKindConcurrency %v, want Kueue's install defaults", gk)
	}
}

func TestConfigurationConcurrency(t *testing.T) {
	t.Parallel()
	const base = "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
	for _, tc := range []struct {
		name string
		cfg  string
		over map[string]int
		want map[string]any
	}{
		{"install defaults with an override", base, map[string]int{"Job.batch": 20},
			map[string]any{"Job.batch": float64(20), "Workload.kueue.x-k8s.io": float64(5)}},
		{"the configuration's own section is kept", base + "controller:\n  groupKindConcurrency:\n    Job.batch: 3\n", nil,
			map[string]any{"Job.batch": float64(3), "Workload.kueue.x-k8s.io": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := Configuration(Options{Config: []byte(tc.cfg), GroupKindConcurrency: tc.over}, 1, 2, 3, "/c")
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := yaml.Unmarshal(out, &cfg); err != nil {
				t.Fatal(err)
			}
			gk := cfg["controller"].(map[string]any)["groupKindConcurrency"].(map[string]any)
			for k, v := range tc.want {
				if gk[k] != v {
					t.Errorf("%s = %v, want %v (all %v)", k, gk[k], v, gk)
				}
			}
		})
	}
}

func TestConfigurationRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  string
		opts Options
	}{
		{"not yaml", "{", Options{}},
		{"not a Kueue Configuration", "apiVersion: v1\nkind: ConfigMap\n", Options{}},
		{"override without waitForPodsReady", "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n", Options{PodsReadyTimeout: time.Second}},
		{"no worker", "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n", Options{GroupKindConcurrency: map[string]int{"Job.batch": 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.Config = []byte(tc.cfg)
			if _, err := Configuration(tc.opts, 1, 2, 3, "/c"); !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
		})
	}
}

func TestWithConversionWebhooks(t *testing.T) {
	t.Parallel()
	raw := `---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: workloads.kueue.x-k8s.io}
spec: {group: kueue.x-k8s.io}
---
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: topologies.kueue.x-k8s.io}
spec: {group: kueue.x-k8s.io}
`
	out, err := withConversionWebhooks([]byte(raw), 4242)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(out), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%d documents:\n%s", len(docs), out)
	}
	if !strings.Contains(docs[0], "https://127.0.0.1:4242/convert") || !strings.Contains(docs[0], "strategy: Webhook") {
		t.Errorf("workloads CRD without the conversion webhook:\n%s", docs[0])
	}
	if strings.Contains(docs[1], "conversion") {
		t.Errorf("topologies CRD got a conversion webhook:\n%s", docs[1])
	}
	if _, err := withConversionWebhooks([]byte("---\n"), 1); err == nil {
		t.Error("an empty stream was accepted")
	}
}
