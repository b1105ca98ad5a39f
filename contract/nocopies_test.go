package contract

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoCopies keeps each name one binary writes and another reads declared once, here:
// no non-test Go file of the module outside contract/ spells one of these names as a
// string literal. A copy would compile and pass its own tests while the two binaries
// drift apart; the copy's owner refers to the contract's constant instead. Test files
// may spell them, to check the constant's value from outside.
func TestNoCopies(t *testing.T) {
	t.Parallel()
	names := contractNames(t)
	if len(names) == 0 {
		t.Fatal("no names found in the contract")
	}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			base := d.Name()
			if path != ".." && (base == "contract" || base == "testdata" || base == "vendor" ||
				strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(path, -1, len(src)), src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok != token.STRING {
				continue
			}
			v, err := strconv.Unquote(lit)
			if err != nil {
				continue
			}
			if name, ok := names[v]; ok && !sameSpelling(filepath.ToSlash(path), v) {
				t.Errorf("%s: %q is a copy of contract.%s: use the constant", fset.Position(pos), v, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// contractNames returns the contract's wire names (exported string constants whose names
// hasNamePrefix accepts), by value.
func contractNames(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i >= len(vs.Values) || !id.IsExported() || !hasNamePrefix(id.Name) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
					}
					names[v] = id.Name
				}
			}
		}
	}
	return names
}

// hasNamePrefix reports whether a constant's name says it names something on the wire: a
// resource, an annotation, a label, a pod condition or a service account.
func hasNamePrefix(name string) bool {
	for _, p := range []string{"Resource", "Annotation", "Label", "Condition", "User"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// sameSpelling reports the literals that spell a contract name but name something else:
// NVIDIA's CDI device kind is written like its device plugin's resource name
// (ResourceGPU), yet it is a different name, read by the container runtime.
func sameSpelling(path, v string) bool {
	return path == "../koordlet/gpu/devices/devices.go" && v == ResourceGPU
}
