package helmchart_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/test/e2e/manifestcopy"
)

const (
	// repoRoot is the repository root, relative to this package.
	repoRoot = "../.."
	// chartDir is the chart, relative to this package.
	chartDir = repoRoot + "/charts/understory"
	// namespace is the one namespace the install's objects name.
	namespace = "understory-system"
)

// obj is one decoded Kubernetes object.
type obj = map[string]any

// key names an object: kind/namespace/name.
func key(o obj) string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + "/" + ns + "/" + name
}

// decode splits a multi-document YAML stream into objects, in order.
func decode(data []byte) ([]obj, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []obj
	for {
		m := obj{}
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("document %d: %w", len(objs), err)
		}
		if len(m) > 0 {
			objs = append(objs, m)
		}
	}
}

// run runs a command and returns its stdout; an error carries its stderr.
func run(ctx context.Context, dir, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, errOut.String())
	}
	return out.Bytes(), nil
}

// manifests is a private copy of the repository's manifests/ with certificates
// generated into its certs/ (so the certs component builds), and the kubectl that
// builds its compositions.
type manifests struct {
	root, kubectl string
}

func newManifests(t *testing.T) manifests {
	t.Helper()
	kubectl := controlplane.FindKubectl(t)
	root := filepath.Join(t.TempDir(), "manifests")
	if err := manifestcopy.Copy(filepath.Join(repoRoot, "manifests"), root); err != nil {
		if errors.Is(err, manifestcopy.ErrNoOpenSSL) {
			testenv.SkipOrFailInCI(t, "%v", err)
		}
		t.Fatal(err)
	}
	return manifests{root: root, kubectl: kubectl}
}

// build writes a kustomization under the copy made of resources and components
// (paths relative to the manifests root) and returns `kubectl kustomize` of it.
// origins adds kustomize's config.kubernetes.io/origin annotations.
func (m manifests) build(ctx context.Context, name string, resources, components []string, origins bool) ([]obj, error) {
	dir := filepath.Join(m.root, "helmchart-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	for _, r := range resources {
		fmt.Fprintf(&b, "  - ../%s\n", r)
	}
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, c := range components {
			fmt.Fprintf(&b, "  - ../%s\n", c)
		}
	}
	if origins {
		b.WriteString("buildMetadata: [originAnnotations]\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return m.kustomize(ctx, dir)
}

// kustomize returns the objects of `kubectl kustomize dir`.
func (m manifests) kustomize(ctx context.Context, dir string) ([]obj, error) {
	out, err := run(ctx, "", m.kubectl, "kustomize", dir)
	if err != nil {
		return nil, err
	}
	objs, err := decode(out)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return objs, nil
}

// findHelm returns the helm binary scripts/helm.sh builds (controlplane.HelmBinary).
func findHelm(t *testing.T) string { return controlplane.HelmBinary(t, repoRoot) }
