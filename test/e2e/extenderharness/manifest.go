package extenderharness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/test/e2e/controlplane"
)

// ManifestRelPath is the example KubeSchedulerConfiguration, relative to the module root.
const ManifestRelPath = "manifests/scheduler/kube-scheduler-config.yaml"

// ErrManifest marks a scheduler manifest the harness cannot use.
var ErrManifest = errors.New("unusable scheduler manifest")

// ReadManifest reads ManifestRelPath from the module root above the working
// directory (go test runs in the package directory).
func ReadManifest() ([]byte, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("finding module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			b, err := os.ReadFile(filepath.Join(dir, ManifestRelPath))
			if err != nil {
				return nil, fmt.Errorf("reading scheduler manifest: %w", err)
			}
			return b, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil, fmt.Errorf("no go.mod above the working directory: %w", os.ErrNotExist)
		}
		dir = parent
	}
}

// SchedulerConfig returns manifest (a KubeSchedulerConfiguration with
// exactly one extender) with that extender's urlPrefix replaced by url.
// Everything else is kept as written; controlplane.StartScheduler then
// substitutes clientConnection.kubeconfig. A plain http url (the harness's
// loopback extender) also drops the entry's enableHTTPS and tlsConfig: the
// shipped ones name certificate files on a control-plane host, which
// kube-scheduler would fail to read here.
func SchedulerConfig(manifest []byte, url string) (string, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal(manifest, &cfg); err != nil {
		return "", fmt.Errorf("parsing scheduler manifest: %w: %w", err, ErrManifest)
	}
	ext, err := onlyExtender(cfg)
	if err != nil {
		return "", err
	}
	ext["urlPrefix"] = url
	if strings.HasPrefix(url, "http://") {
		delete(ext, "tlsConfig")
		delete(ext, "enableHTTPS")
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("encoding scheduler configuration: %w", err)
	}
	return string(out), nil
}

// ManifestExtender returns the manifest's extender entry with urlPrefix url,
// for controlplane.SchedulerConfig (the rest of the manifest, e.g.
// percentageOfNodesToScore, is left out).
func ManifestExtender(manifest []byte, url string) (controlplane.Extender, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal(manifest, &cfg); err != nil {
		return controlplane.Extender{}, fmt.Errorf("parsing scheduler manifest: %w: %w", err, ErrManifest)
	}
	ext, err := onlyExtender(cfg)
	if err != nil {
		return controlplane.Extender{}, err
	}
	b, err := yaml.Marshal(ext)
	if err != nil {
		return controlplane.Extender{}, fmt.Errorf("encoding extender entry: %w", err)
	}
	var out controlplane.Extender
	if err := yaml.Unmarshal(b, &out); err != nil {
		return controlplane.Extender{}, fmt.Errorf("decoding extender entry: %w: %w", err, ErrManifest)
	}
	if out.FilterVerb == "" || !out.NodeCacheCapable || len(out.ManagedResources) == 0 {
		return controlplane.Extender{}, fmt.Errorf("extender entry needs filterVerb, nodeCacheCapable and managedResources: %w", ErrManifest)
	}
	out.URLPrefix = url
	return out, nil
}

func onlyExtender(cfg map[string]any) (map[string]any, error) {
	exts, ok := cfg["extenders"].([]any)
	if !ok || len(exts) != 1 {
		return nil, fmt.Errorf("want exactly one entry in extenders, got %v: %w", cfg["extenders"], ErrManifest)
	}
	ext, ok := exts[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("extenders[0] is a %T, want a mapping: %w", exts[0], ErrManifest)
	}
	if u, ok := ext["urlPrefix"].(string); !ok || u == "" {
		return nil, fmt.Errorf("extenders[0].urlPrefix missing: %w", ErrManifest)
	}
	return ext, nil
}
