package realnode

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// realnodeConfigChanges are the agent settings manifests/overlays/realnode/config.yaml
// changes on purpose (a short test on a small machine); everything else must stay the
// base's (manifests/koordlet/configmap.yaml), so the e2e tests what users install.
var realnodeConfigChanges = []string{"nodeMetricsPeriod", "nodeMetricsReport.maxInterval", "batchResources.lsWindow", "batchResources.smoothing",
	"batchResources.riseStepPercentPerMinute"}

// flatten turns nested maps into dotted keys.
func flatten(prefix string, in map[string]any, out map[string]any) {
	for k, v := range in {
		if m, ok := v.(map[string]any); ok {
			flatten(prefix+k+".", m, out)
			continue
		}
		out[prefix+k] = v
	}
}

// TestRealnodeOverlayConfig: the realnode overlay's agent configuration differs from the
// base's only in realnodeConfigChanges (runs anywhere: files only).
func TestRealnodeOverlayConfig(t *testing.T) {
	t.Parallel()
	repo := repoRoot(t)
	read := func(rel string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(read("manifests/koordlet/configmap.yaml"), &cm); err != nil {
		t.Fatal(err)
	}
	var base, mine map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &base); err != nil || base == nil {
		t.Fatalf("base config.yaml: %v", err)
	}
	if err := yaml.Unmarshal(read("manifests/overlays/realnode/config.yaml"), &mine); err != nil || mine == nil {
		t.Fatalf("overlays/realnode/config.yaml: %v", err)
	}
	b, m := map[string]any{}, map[string]any{}
	flatten("", base, b)
	flatten("", mine, m)
	keys := slices.Sorted(maps.Keys(b))
	for k := range m {
		if _, ok := b[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if slices.Contains(realnodeConfigChanges, k) {
			if reflect.DeepEqual(b[k], m[k]) {
				t.Errorf("%s: the overlay sets the base's value %v; drop it from realnodeConfigChanges", k, m[k])
			}
			continue
		}
		if !reflect.DeepEqual(b[k], m[k]) {
			t.Errorf("%s: overlays/realnode/config.yaml has %v, the base %v: keep them alike (or list the key in "+
				"realnodeConfigChanges and docs/real-node.md)", k, m[k], b[k])
		}
	}
}
