package qos_test

import (
	"go/build"
	"os"
	"strings"
	"testing"
)

// TestPureImports keeps qos a pure policy layer: no IO, no clock, no locks, no
// network, no cgroups. It may use the standard library's pure packages and
// Kubernetes' API types.
func TestPureImports(t *testing.T) {
	t.Parallel()
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"errors": true, "fmt": true, "math": true, "slices": true, "sort": true, "strings": true,
		"strconv": true, "time": true, "unicode/utf8": true, "cmp": true,
		"k8s.io/api/core/v1": true, "k8s.io/apimachinery/pkg/apis/meta/v1": true,
		"k8s.io/apimachinery/pkg/api/resource": true, "k8s.io/apimachinery/pkg/types": true,
		"sigs.k8s.io/yaml": true, "go.yaml.in/yaml/v2": true,
	}
	// "time" is for its types: the clock is the caller's.
	for _, f := range pkg.GoFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, clock := range []string{"time.Now(", "time.Since(", "time.Until(", "time.Sleep(", "time.After(", "time.NewTimer(", "time.NewTicker("} {
			if strings.Contains(string(b), clock) {
				t.Errorf("%s calls %s: qos reads no clock", f, clock)
			}
		}
	}
	for _, imp := range pkg.Imports {
		if !allowed[imp] {
			t.Errorf("qos imports %q: the policy layer must stay pure (no IO, clock, locks or cgroups)", imp)
		}
		if strings.HasPrefix(imp, "github.com/understory/understory/") {
			t.Errorf("qos imports %q: it must not depend on the rest of the module", imp)
		}
	}
}
