package docs_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// extenderDoc is the page whose type table states how many methods each of the
// extender's types has; extenderRoot is the extender's source tree (its packages).
const (
	extenderDoc  = "docs/extender.md"
	extenderRoot = "scheduler-extender"
)

// errNoMethodTable is returned by methodTable for a page without the type table.
var errNoMethodTable = errors.New(`no table with "type" and "methods" columns`)

// methodTable reads the first Markdown table of page whose header has the columns
// "type" and "methods": each row names one or more types (backquoted, comma-separated)
// and as many counts. It returns the stated count of each type.
func methodTable(page []byte) (map[string]int, error) {
	var (
		want             map[string]int
		typeCol, methCol = -1, -1
	)
	for _, line := range strings.Split(string(page), "\n") {
		cells, ok := tableRow(line)
		if !ok {
			if want != nil {
				return want, nil // the table ended
			}
			typeCol, methCol = -1, -1
			continue
		}
		if want == nil {
			if typeCol < 0 { // a header candidate
				typeCol, methCol = slices.Index(cells, "type"), slices.Index(cells, "methods")
				if typeCol < 0 || methCol < 0 {
					typeCol, methCol = -1, -1
				}
				continue
			}
			want = map[string]int{} // the delimiter row
			continue
		}
		if typeCol >= len(cells) || methCol >= len(cells) {
			return nil, fmt.Errorf("row %q: fewer cells than the header", line)
		}
		names, counts := strings.Split(cells[typeCol], ","), strings.Split(cells[methCol], ",")
		if len(names) != len(counts) {
			return nil, fmt.Errorf("row %q: %d types, %d counts", line, len(names), len(counts))
		}
		for i, n := range names {
			name := strings.Trim(strings.TrimSpace(n), "`")
			c, err := strconv.Atoi(strings.TrimSpace(counts[i]))
			if err != nil || name == "" {
				return nil, fmt.Errorf("row %q: type %q, count %q", line, name, counts[i])
			}
			want[name] = c
		}
	}
	if want == nil {
		return nil, errNoMethodTable
	}
	return want, nil
}

// tableRow splits a Markdown table row into its trimmed cells.
func tableRow(line string) ([]string, bool) {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil, false
	}
	cells := strings.Split(line[1:len(line)-1], "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells, true
}

// methodCounts counts the methods declared on each named type in the non-test Go files
// under root (value and pointer receivers together, generic receivers by their type's
// name), keyed by type name, with the package folders each name is declared in.
func methodCounts(root string) (counts map[string]int, where map[string][]string, err error) {
	counts, where = map[string]int{}, map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(p))
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 {
					counts[receiverName(d.Recv.List[0].Type)]++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && !slices.Contains(where[ts.Name.Name], dir) {
						where[ts.Name.Name] = append(where[ts.Name.Name], dir)
					}
				}
			}
		}
		return nil
	})
	return counts, where, err
}

// receiverName is the name of a receiver's type: T, *T, T[P], *T[P, Q].
func receiverName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// TestExtenderMethodCounts: every type of docs/extender.md's type table is declared once
// in the extender's packages and has as many methods as the table says.
func TestExtenderMethodCounts(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join(moduleRoot, extenderDoc))
	if err != nil {
		t.Fatal(err)
	}
	want, err := methodTable(page)
	if err != nil {
		t.Fatalf("%s: %v", extenderDoc, err)
	}
	if len(want) < 10 {
		t.Fatalf("%s: the type table names %d types: not the table of the extender's types?", extenderDoc, len(want))
	}
	got, where, err := methodCounts(filepath.Join(moduleRoot, extenderRoot))
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		dirs := where[name]
		for i, d := range dirs {
			dirs[i] = strings.TrimPrefix(d, moduleRoot+"/")
		}
		switch {
		case len(dirs) == 0:
			t.Errorf("%s names type %s, which no package under %s/ declares", extenderDoc, name, extenderRoot)
		case len(dirs) > 1:
			t.Errorf("%s names type %s, which %v all declare: say which", extenderDoc, name, dirs)
		case got[name] != want[name]:
			t.Errorf("%s says %s has %d methods; %s declares %d", extenderDoc, name, want[name], dirs[0], got[name])
		}
	}
}

func TestMethodTable(t *testing.T) {
	t.Parallel()
	const head = "| type | job | methods |\n| --- | --- | --- |\n"
	tests := []struct {
		name, page string
		want       map[string]int
		ok         bool
	}{
		{name: "rows", page: "text\n\n" + head + "| `A` | a | 3 |\n| `b`, `c` | b | 1, 2 |\n\nafter\n| `Z` | z | 9 |\n",
			want: map[string]int{"A": 3, "b": 1, "c": 2}, ok: true},
		{name: "other tables first", page: "| path | body |\n| --- | --- |\n| x | y |\n\n" + head + "| `A` | a | 0 |\n",
			want: map[string]int{"A": 0}, ok: true},
		{name: "counts and types disagree", page: head + "| `a`, `b` | x | 1 |\n"},
		{name: "not a number", page: head + "| `a` | x | many |\n"},
		{name: "no table", page: "| type | job |\n| --- | --- |\n| `a` | x |\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := methodTable([]byte(tc.page))
			if (err == nil) != tc.ok {
				t.Fatalf("methodTable: %v, want ok %t", err, tc.ok)
			}
			if tc.ok && !maps.Equal(got, tc.want) {
				t.Fatalf("methodTable = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMethodCounts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := map[string]string{
		"a.go":       "package a\ntype T struct{}\ntype G[P any] struct{}\ntype I interface{ M() }\nfunc (T) A() {}\nfunc (*T) B() {}\nfunc (G[P]) C() {}\nfunc F() {}\n",
		"a_test.go":  "package a\nfunc (T) TestOnly() {}\n",
		"sub/b.go":   "package b\ntype T struct{}\ntype U struct{}\nfunc (*U) D() {}\n",
		"testdata/x": "not go",
	}
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	counts, where, err := methodCounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"T": 2, "G": 1, "U": 1}; !maps.Equal(counts, want) {
		t.Errorf("counts = %v, want %v", counts, want)
	}
	if got := len(where["T"]); got != 2 {
		t.Errorf("T declared in %v, want two folders", where["T"])
	}
	if got := len(where["I"]); got != 1 {
		t.Errorf("I declared in %v, want one folder", where["I"])
	}
}
