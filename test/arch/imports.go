package arch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ModulePath is the module's import path; Graph holds paths relative to it.
const ModulePath = "github.com/understory/understory"

// Graph is the module's import graph between its own packages, by paths relative
// to the module root ("koordlet/gpu"). Imports of packages outside the module are
// left out.
type Graph struct {
	// Imports are a package's imports from its non-test Go files.
	Imports map[string][]string
	// TestImports are a package's imports from its _test.go files (internal and
	// external test packages) that its non-test files do not already import.
	TestImports map[string][]string
}

// Packages are the graph's packages, sorted.
func (g *Graph) Packages() []string {
	var ps []string
	for p := range g.Imports {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// listedFiles is what LoadGraph reads of `go list -json`.
type listedFiles struct {
	ImportPath     string
	Dir            string
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
	TestGoFiles    []string
	XTestGoFiles   []string
}

// LoadGraph lists every package of the module under dir with `go list ./...` and
// reads the imports of all its Go files, those the build constraints of this
// platform leave out included, so that a file for another platform or behind a
// build tag obeys the rules too.
func LoadGraph(dir string) (*Graph, error) {
	cmd := exec.Command("go", "list",
		"-json=ImportPath,Dir,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles,XTestGoFiles", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	g := &Graph{Imports: map[string][]string{}, TestImports: map[string][]string{}}
	fset := token.NewFileSet()
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var l listedFiles
		if err := dec.Decode(&l); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list: %w", err)
		}
		from, ok := relPath(l.ImportPath)
		if !ok {
			continue
		}
		var prod, test []string
		files := slices.Concat(l.GoFiles, l.CgoFiles, l.IgnoredGoFiles, l.TestGoFiles, l.XTestGoFiles)
		for _, name := range files {
			f, err := parser.ParseFile(fset, filepath.Join(l.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				return nil, fmt.Errorf("parsing imports: %w", err)
			}
			for _, spec := range f.Imports {
				path, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: import %s: %w", name, spec.Path.Value, err)
				}
				to, ok := relPath(path)
				if !ok || to == from {
					continue
				}
				if strings.HasSuffix(name, "_test.go") {
					test = append(test, to)
				} else {
					prod = append(prod, to)
				}
			}
		}
		slices.Sort(prod)
		prod = slices.Compact(prod)
		slices.Sort(test)
		test = slices.DeleteFunc(slices.Compact(test), func(p string) bool { return slices.Contains(prod, p) })
		g.Imports[from] = prod
		g.TestImports[from] = test
	}
	if len(g.Imports) == 0 {
		return nil, errors.New("go list found no package of the module")
	}
	return g, nil
}

// relPath is path relative to the module root; ok is false outside the module.
func relPath(path string) (string, bool) {
	return strings.CutPrefix(path, ModulePath+"/")
}

// under reports whether the package p is the folder dir or below it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// Rule is one import rule: a package that From matches must not import a
// package that Forbids rejects.
type Rule struct {
	Name string
	// Tests makes the imports of _test.go files count too; without it only the
	// non-test files' imports do (what the binaries are built from).
	Tests bool
	// From reports whether the rule holds the importing package p.
	From func(g *Graph, p string) bool
	// Forbids reports whether p importing to breaks the rule.
	Forbids func(g *Graph, p, to string) bool
}

// Exception lets one import break one rule: known debt, named with why.
type Exception struct {
	Rule, From, To string
	Why            string
}

// Violation is one import that breaks a rule.
type Violation struct {
	Rule, From, To string
	Test           bool // the import is in a _test.go file
}

func (v Violation) String() string {
	where := "imports"
	if v.Test {
		where = "imports in its tests"
	}
	return fmt.Sprintf("rule %q: %s/%s %s %s/%s", v.Rule, ModulePath, v.From, where, ModulePath, v.To)
}

// Check returns every import of g that breaks one of rules, leaving out those an
// exception names, and the exceptions that no import needs any more.
func Check(g *Graph, rules []Rule, exceptions []Exception) (broken []Violation, stale []Exception) {
	used := make([]bool, len(exceptions))
	for _, r := range rules {
		for _, p := range g.Packages() {
			if !r.From(g, p) {
				continue
			}
			check := func(imports []string, test bool) {
				for _, to := range imports {
					if !r.Forbids(g, p, to) {
						continue
					}
					i := slices.IndexFunc(exceptions, func(e Exception) bool {
						return e.Rule == r.Name && e.From == p && e.To == to
					})
					if i >= 0 {
						used[i] = true
						continue
					}
					broken = append(broken, Violation{Rule: r.Name, From: p, To: to, Test: test})
				}
			}
			check(g.Imports[p], false)
			if r.Tests {
				check(g.TestImports[p], true)
			}
		}
	}
	for i, e := range exceptions {
		if !used[i] {
			stale = append(stale, e)
		}
	}
	return broken, stale
}

// IsLeaf reports whether p is a leaf: a package whose non-test files import, of
// the module, only contract and packages under internal/ that are leaves
// themselves. A package importing nothing of the module is a leaf; so is
// contract.
func IsLeaf(g *Graph, p string) bool {
	for _, to := range g.Imports[p] {
		if to == "contract" {
			continue
		}
		if !under(to, "internal") || !IsLeaf(g, to) {
			return false
		}
	}
	return true
}

// ToolMains are the mains under cmd/ of the benchmarks and tools (docs/layout.md,
// "Benchmarks, research and tools"): they drive bench/ and are not production.
// Every other package outside bench/ and test/ is production.
var ToolMains = []string{
	"cmd/cluster-bench",
	"cmd/colo",
	"cmd/dashboard-render",
	"cmd/extender-bench",
	"cmd/gpu-bench",
	"cmd/gpu-model",
	"cmd/gpu-real",
	"cmd/mkimage",
	"cmd/openb-replay",
}

// TestHarnesses are the packages under internal/ that tests and benchmarks share and
// production must never link: they start processes (a control plane, Kueue) or fail a
// test. Test-support packages (named like httptest: cgroupstest, timeslicetest) may
// use them.
var TestHarnesses = []string{"internal/controlplane", "internal/kueueharness", "internal/testenv"}

// Production reports whether p is production code: not under bench/ or test/
// and not one of ToolMains.
func Production(p string) bool {
	return !under(p, "bench") && !under(p, "test") && !slices.Contains(ToolMains, p)
}

// Rules are the module's import rules. Unless a rule says Tests, it counts the
// imports of non-test files only.
func Rules() []Rule {
	anyOf := func(dirs ...string) func(p string) bool {
		return func(p string) bool {
			return slices.ContainsFunc(dirs, func(d string) bool { return under(p, d) })
		}
	}
	from := func(dirs ...string) func(*Graph, string) bool {
		in := anyOf(dirs...)
		return func(_ *Graph, p string) bool { return in(p) }
	}
	forbids := func(dirs ...string) func(*Graph, string, string) bool {
		in := anyOf(dirs...)
		return func(_ *Graph, _, to string) bool { return in(to) }
	}
	return []Rule{{
		Name:    "production imports neither bench nor test",
		From:    func(_ *Graph, p string) bool { return Production(p) },
		Forbids: forbids("bench", "test"),
	}, {
		Name:    "koordlet imports nothing of the scheduler extender",
		From:    from("koordlet"),
		Forbids: forbids("scheduler-extender"),
	}, {
		Name:    "the scheduler extender imports nothing of koordlet",
		From:    from("scheduler-extender"),
		Forbids: forbids("koordlet"),
	}, {
		Name:    "admission imports neither koordlet nor the scheduler extender",
		From:    from("admission"),
		Forbids: forbids("koordlet", "scheduler-extender"),
	}, {
		Name:    "qos imports neither cgroups nor metrics",
		From:    from("qos"),
		Forbids: forbids("cgroups", "metrics"),
	}, {
		Name:    "contract imports nothing of the module",
		From:    from("contract"),
		Forbids: func(*Graph, string, string) bool { return true },
	}, {
		Name: "internal holds only leaves",
		From: from("internal"),
		Forbids: func(g *Graph, _, to string) bool {
			return to != "contract" && (!under(to, "internal") || !IsLeaf(g, to))
		},
	}, {
		Name: "production imports no test harness",
		From: func(_ *Graph, p string) bool {
			return Production(p) && !slices.Contains(TestHarnesses, p) && !strings.HasSuffix(path.Base(p), "test")
		},
		Forbids: func(_ *Graph, _, to string) bool {
			return slices.Contains(TestHarnesses, to)
		},
	}, {
		Name:    "nothing outside test imports test",
		Tests:   true,
		From:    func(_ *Graph, p string) bool { return !under(p, "test") },
		Forbids: forbids("test"),
	}}
}
