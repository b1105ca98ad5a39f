package arch

import (
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the repository root, from this package's folder.
const moduleRoot = "../.."

const (
	corePath = "github.com/understory/understory/scheduler-extender"
	wirePath = corePath + "/wire"
	gangPath = corePath + "/gang"
)

// The extender's targets: its core package stays small, its files layered and
// a filter call short.
const (
	maxCoreLines       = 4500
	maxCoreBackRefs    = 30
	maxCoreFilterFiles = 10
	maxMethods         = 25
)

// extenderPackages are the extender's packages: the core first (Reach starts there),
// then its wire and gang packages.
var extenderPackages = []string{corePath, wirePath, gangPath}

// TestExtenderShape measures the extender's packages (logged: go test -v) and
// checks the core package's targets: at most maxCoreLines lines, at most
// maxCoreBackRefs back-references, a filter call through at most
// maxCoreFilterFiles of its files, and no type with more than maxMethods
// methods in any of the packages.
func TestExtenderShape(t *testing.T) {
	t.Parallel()
	pkgs, err := Load(moduleRoot, extenderPackages...)
	if err != nil {
		t.Fatal(err)
	}
	core := pkgs[0]
	for _, p := range pkgs {
		t.Logf("%s: %d files, %d lines, %d back-references", p.Path, len(p.Files), p.Lines(), len(p.BackRefs()))
		edges := p.Edges()
		for _, br := range p.BackRefs() {
			if br[0] < br[1] {
				t.Logf("  back-references %s -> %s (%d identifiers) and back (%d)", br[0], br[1],
					edges[br[0]][br[1]], edges[br[1]][br[0]])
			}
		}
		for typ, n := range p.Methods() {
			t.Logf("  type %s: %d methods", typ, n)
			if n > maxMethods {
				t.Errorf("%s: type %s has %d methods, more than %d", p.Path, typ, n, maxMethods)
			}
		}
	}
	funcs, files, err := Reach(pkgs[:1], "Server.handleFilter")
	if err != nil {
		t.Fatal(err)
	}
	filterFiles := files[corePath]
	t.Logf("a filter call visits %d files of the core package: %s", len(filterFiles), strings.Join(filterFiles, ", "))
	for _, f := range funcs {
		t.Logf("  filter reaches %s", f)
	}
	_, all, err := Reach(pkgs, "Server.handleFilter")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	n := 0
	for p, fs := range all {
		paths = append(paths, p)
		n += len(fs)
	}
	slices.Sort(paths)
	for _, p := range paths {
		t.Logf("a filter call through every extender package visits %s: %s", p, strings.Join(all[p], ", "))
	}
	t.Logf("a filter call through every extender package visits %d files", n)
	if _, files, err := Reach(pkgs[:1], "podRecordOf"); err == nil {
		t.Logf("building a pod's record visits %d files of the core package: %s", len(files[corePath]),
			strings.Join(files[corePath], ", "))
	} else {
		t.Error(err)
	}
	if _, files, err := Reach(pkgs[:1], "State.upsertPodLocked"); err == nil {
		t.Logf("entering a record in the index visits %d files of the core package: %s", len(files[corePath]),
			strings.Join(files[corePath], ", "))
	} else {
		t.Error(err)
	}

	if n := core.Lines(); n > maxCoreLines {
		t.Errorf("the core package has %d lines of non-test Go, more than %d", n, maxCoreLines)
	}
	if n := len(core.BackRefs()); n > maxCoreBackRefs {
		t.Errorf("the core package has %d back-references, more than %d", n, maxCoreBackRefs)
	}
	if n := len(filterFiles); n > maxCoreFilterFiles {
		t.Errorf("a filter call visits %d files of the core package, more than %d", n, maxCoreFilterFiles)
	}
}
