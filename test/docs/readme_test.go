package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxReadmeLines is the most lines README.md may have: it is the entrance, and what is
// reference lives in docs/ (docs/README.md lists it).
const maxReadmeLines = 250

// TestReadmeIsShort: README.md has at most maxReadmeLines lines.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(moduleRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := lineCount(readme); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move reference material to docs/ and link it", n, maxReadmeLines)
	}
}

// TestReadmeInstallCommands: README's Install section keeps the commands a user of a
// release runs, which TestInstallFromRegistry (test/e2e/realnode) runs in the same
// order (make release, make push, helm install of the chart), and the cert-manager
// alternative; the make targets they name exist.
func TestReadmeInstallCommands(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(moduleRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	install, err := section(readme, "Install")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	want := []string{
		"make release REGISTRY=registry.example/understory",
		"make push REGISTRY=registry.example/understory",
		"helm install understory dist/understory-*.tgz -n understory-system --create-namespace",
		"kubectl apply --server-side -f dist/install.yaml",
		"kubectl apply -k manifests/",
		"helm install understory charts/understory -n understory-system --create-namespace",
	}
	last := -1
	for _, w := range want {
		i := strings.Index(install, w)
		switch {
		case i < 0:
			t.Errorf("README.md's Install section lacks %q", w)
		case i < last:
			t.Errorf("README.md's Install section has %q before the commands listed ahead of it", w)
		default:
			last = i
		}
	}
	makefile, err := os.ReadFile(filepath.Join(moduleRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"release", "push", "images"} {
		if !bytes.Contains(makefile, []byte("\n"+target+":")) {
			t.Errorf("the Makefile has no target %q, which README.md's Install section runs", target)
		}
	}
}
