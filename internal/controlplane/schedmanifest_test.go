package controlplane

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestManifestSchedulerConfig(t *testing.T) {
	t.Parallel()
	repo, err := ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		manifest string
		wantErr  bool
	}{
		{name: "repository manifest", manifest: string(repo)},
		{name: "minimal", manifest: "extenders:\n- urlPrefix: http://x\n  filterVerb: filter\n"},
		{name: "tls dropped", manifest: "extenders:\n- urlPrefix: https://x\n  enableHTTPS: true\n  tlsConfig: {caFile: /nope}\n"},
		{name: "no extenders", manifest: "kind: KubeSchedulerConfiguration\n", wantErr: true},
		{name: "two extenders", manifest: "extenders:\n- urlPrefix: http://a\n- urlPrefix: http://b\n", wantErr: true},
		{name: "extender not a mapping", manifest: "extenders:\n- http://a\n", wantErr: true},
		{name: "no urlPrefix", manifest: "extenders:\n- filterVerb: filter\n", wantErr: true},
		{name: "not yaml", manifest: "extenders: [", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := ManifestSchedulerConfig([]byte(tc.manifest), testURL)
			if tc.wantErr {
				if !errors.Is(err, ErrSchedulerManifest) {
					t.Fatalf("err = %v, want ErrSchedulerManifest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var before, after map[string]any
			if err := yaml.Unmarshal([]byte(tc.manifest), &before); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(out), &after); err != nil {
				t.Fatal(err)
			}
			ext := after["extenders"].([]any)[0].(map[string]any)
			if ext["urlPrefix"] != testURL {
				t.Errorf("urlPrefix = %v, want %s", ext["urlPrefix"], testURL)
			}
			// Only the URL changes, and the TLS settings go with a plain http URL.
			if _, ok := ext["tlsConfig"]; ok {
				t.Errorf("tlsConfig kept for the plain http URL %s", testURL)
			}
			be := before["extenders"].([]any)[0].(map[string]any)
			be["urlPrefix"] = testURL
			delete(be, "tlsConfig")
			delete(be, "enableHTTPS")
			b1, _ := json.Marshal(before)
			b2, _ := json.Marshal(after)
			if string(b1) != string(b2) {
				t.Errorf("configuration changed beyond urlPrefix:\n%s\n%s", b1, b2)
			}
		})
	}
}

func TestManifestExtender(t *testing.T) {
	t.Parallel()
	repo, err := ReadSchedulerManifest()
	if err != nil {
		t.Fatal(err)
	}
	ext, err := ManifestExtender(repo, testURL)
	if err != nil {
		t.Fatal(err)
	}
	if ext.URLPrefix != testURL || ext.FilterVerb != "filter" || ext.PrioritizeVerb != "prioritize" || ext.BindVerb != "bind" ||
		ext.Weight <= 0 || !ext.NodeCacheCapable || ext.Ignorable || ext.HTTPTimeout == "" {
		t.Errorf("extender entry %+v does not match the manifest", ext)
	}
	managed := map[string]bool{}
	for _, m := range ext.ManagedResources {
		managed[m.Name] = m.IgnoredByScheduler
	}
	if ignored, ok := managed["nvidia.com/gpu"]; !ok || ignored {
		t.Errorf("nvidia.com/gpu managed=%v ignoredByScheduler=%v, want managed and counted", ok, ignored)
	}
	if ignored, ok := managed["understory.io/gpu-milli"]; !ok || !ignored {
		t.Errorf("understory.io/gpu-milli managed=%v ignoredByScheduler=%v, want managed and ignored", ok, ignored)
	}
	if _, err := ManifestExtender([]byte("extenders:\n- urlPrefix: http://x\n"), testURL); !errors.Is(err, ErrSchedulerManifest) {
		t.Errorf("entry without verbs: err = %v, want ErrSchedulerManifest", err)
	}
}

const testURL = "http://127.0.0.1:4242"

func FuzzManifestSchedulerConfig(f *testing.F) {
	f.Add("extenders:\n- urlPrefix: http://x\n")
	f.Add("extenders:\n- {urlPrefix: 1}\n")
	f.Add("extenders: {}\n")
	f.Add("- a\n- b\n")
	f.Fuzz(func(t *testing.T, manifest string) {
		out, err := ManifestSchedulerConfig([]byte(manifest), testURL)
		if err != nil {
			return
		}
		if !strings.Contains(out, testURL) {
			t.Fatalf("output without the URL: %q", out)
		}
		if _, err := ManifestSchedulerConfig([]byte(out), testURL); err != nil {
			t.Fatalf("output does not parse again: %v", err)
		}
	})
}
