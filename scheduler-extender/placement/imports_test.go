package placement

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the placement core pure: only these standard packages, so
// no client-go, no net/http, no locks, no clock, no I/O (docs/extender.md).
func TestImports(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{"cmp": true, "errors": true, "fmt": true, "math": true, "math/bits": true,
		"math/rand": true, "slices": true, "strings": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range af.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if !allowed[path] {
				t.Errorf("%s imports %q: placement must stay pure (allowed: %v)", f, path, allowed)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
