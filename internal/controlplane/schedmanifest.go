package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/testenv"
)

// SchedulerManifestRelPath is the example KubeSchedulerConfiguration, relative to the module root.
const SchedulerManifestRelPath = "manifests/scheduler/kube-scheduler-config.yaml"

// ErrSchedulerManifest marks a scheduler manifest the harness cannot use.
var ErrSchedulerManifest = errors.New("unusable scheduler manifest")

// ReadSchedulerManifest reads SchedulerManifestRelPath from the module root above the working
// directory (go test runs in the package directory).
func ReadSchedulerManifest() ([]byte, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, SchedulerManifestRelPath))
	if err != nil {
		return nil, fmt.Errorf("reading scheduler manifest: %w", err)
	}
	return b, nil
}

// ManifestSchedulerConfig returns manifest (a KubeSchedulerConfiguration with
// exactly one extender) with that extender's urlPrefix replaced by url.
// Everything else is kept as written; StartScheduler then
// substitutes clientConnection.kubeconfig. A plain http url (the harness's
// loopback extender) also drops the entry's enableHTTPS and tlsConfig: the
// shipped ones name certificate files on a control-plane host, which
// kube-scheduler would fail to read here.
func ManifestSchedulerConfig(manifest []byte, url string) (string, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal(manifest, &cfg); err != nil {
		return "", fmt.Errorf("parsing scheduler manifest: %w: %w", err, ErrSchedulerManifest)
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
// for SchedulerConfig (the rest of the manifest, e.g.
// percentageOfNodesToScore, is left out).
func ManifestExtender(manifest []byte, url string) (Extender, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal(manifest, &cfg); err != nil {
		return Extender{}, fmt.Errorf("parsing scheduler manifest: %w: %w", err, ErrSchedulerManifest)
	}
	ext, err := onlyExtender(cfg)
	if err != nil {
		return Extender{}, err
	}
	b, err := yaml.Marshal(ext)
	if err != nil {
		return Extender{}, fmt.Errorf("encoding extender entry: %w", err)
	}
	var out Extender
	if err := yaml.Unmarshal(b, &out); err != nil {
		return Extender{}, fmt.Errorf("decoding extender entry: %w: %w", err, ErrSchedulerManifest)
	}
	if out.FilterVerb == "" || !out.NodeCacheCapable || len(out.ManagedResources) == 0 {
		return Extender{}, fmt.Errorf("extender entry needs filterVerb, nodeCacheCapable and managedResources: %w", ErrSchedulerManifest)
	}
	out.URLPrefix = url
	return out, nil
}

func onlyExtender(cfg map[string]any) (map[string]any, error) {
	exts, ok := cfg["extenders"].([]any)
	if !ok || len(exts) != 1 {
		return nil, fmt.Errorf("want exactly one entry in extenders, got %v: %w", cfg["extenders"], ErrSchedulerManifest)
	}
	ext, ok := exts[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("extenders[0] is a %T, want a mapping: %w", exts[0], ErrSchedulerManifest)
	}
	if u, ok := ext["urlPrefix"].(string); !ok || u == "" {
		return nil, fmt.Errorf("extenders[0].urlPrefix missing: %w", ErrSchedulerManifest)
	}
	return ext, nil
}
