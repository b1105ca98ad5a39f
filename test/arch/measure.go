package arch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Package is one package of the module, parsed and type-checked from its
// non-test Go files (the files go list names in GoFiles for this platform).
type Package struct {
	Path  string
	Dir   string
	Fset  *token.FileSet
	Files []*ast.File // parallel to Names
	Names []string    // base names of Files
	Types *types.Package
	Info  *types.Info
	lines map[string]int
}

// listed is what Load reads of `go list -json`.
type listed struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
}

// Load type-checks the packages paths (import paths of this module) from
// their source, in dependency order, and returns them in the order of paths; every other package is imported from
// the export data `go list -export -deps` builds. A package of paths that
// imports another of paths sees its source-checked form, so objects compare
// equal across them. dir is where go list runs (inside the module).
func Load(dir string, paths ...string) ([]*Package, error) {
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,Export,GoFiles"}, paths...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	exports := map[string]string{}
	var order []listed // the wanted packages, dependencies first (go list -deps lists in post-order)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list: %w", err)
		}
		exports[p.ImportPath] = p.Export
		if slices.Contains(paths, p.ImportPath) {
			order = append(order, p)
		}
	}
	fset := token.NewFileSet()
	checked := map[string]*types.Package{}
	gc := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	imp := importerFunc(func(path string) (*types.Package, error) {
		if p, ok := checked[path]; ok {
			return p, nil
		}
		return gc.Import(path)
	})
	var pkgs []*Package
	for _, l := range order {
		p := &Package{Path: l.ImportPath, Dir: l.Dir, Fset: fset, lines: map[string]int{}}
		for _, name := range l.GoFiles {
			src, err := os.ReadFile(filepath.Join(l.Dir, name))
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", name, err)
			}
			f, err := parser.ParseFile(fset, filepath.Join(l.Dir, name), src, parser.SkipObjectResolution)
			if err != nil {
				return nil, fmt.Errorf("parsing: %w", err)
			}
			p.Files, p.Names = append(p.Files, f), append(p.Names, name)
			p.lines[name] = bytes.Count(src, []byte{'\n'})
		}
		p.Info = &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
		conf := types.Config{Importer: imp}
		p.Types, err = conf.Check(l.ImportPath, fset, p.Files, p.Info)
		if err != nil {
			return nil, fmt.Errorf("type-checking %s: %w", l.ImportPath, err)
		}
		checked[l.ImportPath] = p.Types
		pkgs = append(pkgs, p)
	}
	if len(pkgs) != len(paths) {
		return nil, fmt.Errorf("go list found %d of the %d packages %v", len(pkgs), len(paths), paths)
	}
	slices.SortFunc(pkgs, func(a, b *Package) int { return slices.Index(paths, a.Path) - slices.Index(paths, b.Path) })
	return pkgs, nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// Lines is the number of lines (newline characters) of the package's non-test
// Go files.
func (p *Package) Lines() int {
	n := 0
	for _, l := range p.lines {
		n += l
	}
	return n
}

// fileOf is the base name of the file of pos, "" outside p's files.
func (p *Package) fileOf(pos token.Pos) string {
	if !pos.IsValid() {
		return ""
	}
	f := p.Fset.File(pos)
	if f == nil {
		return ""
	}
	if filepath.Dir(f.Name()) != p.Dir {
		return ""
	}
	return filepath.Base(f.Name())
}

// Edges is the package's file graph: Edges()[a][b] is how many identifiers in
// file a refer to an object (package-level type, func, var or const, method,
// struct field, interface method) declared in file b of the same package, for
// a != b. Every use of an identifier counts (go/types' Info.Uses: selectors'
// fields and methods included).
func (p *Package) Edges() map[string]map[string]int {
	edges := map[string]map[string]int{}
	for id, obj := range p.Info.Uses {
		if obj.Pkg() != p.Types {
			continue
		}
		from, to := p.fileOf(id.Pos()), p.fileOf(obj.Pos())
		if from == "" || to == "" || from == to {
			continue
		}
		if edges[from] == nil {
			edges[from] = map[string]int{}
		}
		edges[from][to]++
	}
	return edges
}

// BackRefs are the package's back-references: the edges a → b of its file
// graph (Edges: file a refers to a declaration of file b, a != b) whose
// reverse b → a exists too, that is, b refers back to a. Each such edge counts
// once, however many identifiers run along it, so two files that refer to each
// other make two back-references. No order of the files enters: a package
// whose files can be layered, each referring only to files below it, has none,
// whatever its files are called. Sorted by a, then b.
func (p *Package) BackRefs() [][2]string {
	edges := p.Edges()
	var out [][2]string
	for a, tos := range edges {
		for b := range tos {
			if edges[b][a] > 0 {
				out = append(out, [2]string{a, b})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i][0] < out[j][0] || out[i][0] == out[j][0] && out[i][1] < out[j][1]
	})
	return out
}

// Reach is the static call graph of pkgs from the function or method named
// root ("Func" or "Type.Method", pointer receivers written without the star)
// of pkgs[0]: the function declarations of pkgs whose objects a reachable
// declaration's body refers to (called or taken as a value; closures are part
// of the declaration they sit in). A call of an interface method reaches the
// method of that name of every named type declared in pkgs that implements the
// interface (itself or its pointer). It returns the reachable functions
// ("file: Type.Method") and the files that hold them, per package path, both
// sorted. Calls into other packages (the standard library, client-go,
// placement) are not followed.
func Reach(pkgs []*Package, root string) (funcs []string, files map[string][]string, err error) {
	decls := map[*types.Func]*ast.FuncDecl{}
	owner := map[*types.Func]*Package{}
	var named []*types.Named
	var rootFn *types.Func
	for i, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				fn, _ := p.Info.Defs[fd.Name].(*types.Func)
				if fn == nil {
					continue
				}
				decls[fn], owner[fn] = fd, p
				if i == 0 && funcName(fn) == root {
					rootFn = fn
				}
			}
		}
		for _, name := range p.Types.Scope().Names() {
			if tn, ok := p.Types.Scope().Lookup(name).(*types.TypeName); ok {
				if n, ok := tn.Type().(*types.Named); ok {
					named = append(named, n)
				}
			}
		}
	}
	if rootFn == nil {
		return nil, nil, fmt.Errorf("no function %s in %s", root, pkgs[0].Path)
	}
	seen := map[*types.Func]bool{rootFn: true}
	queue := []*types.Func{rootFn}
	add := func(fn *types.Func) {
		if _, ok := decls[fn]; ok && !seen[fn] {
			seen[fn] = true
			queue = append(queue, fn)
		}
	}
	for len(queue) > 0 {
		fn := queue[0]
		queue = queue[1:]
		info := owner[fn].Info
		ast.Inspect(decls[fn], func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			callee, ok := info.Uses[id].(*types.Func)
			if !ok {
				return true
			}
			callee = callee.Origin()
			if iface := interfaceOf(callee); iface != nil {
				for _, t := range named {
					for _, typ := range []types.Type{t, types.NewPointer(t)} {
						if types.IsInterface(t) || !types.Implements(typ, iface) {
							continue
						}
						obj, _, _ := types.LookupFieldOrMethod(typ, true, callee.Pkg(), callee.Name())
						if m, ok := obj.(*types.Func); ok {
							add(m.Origin())
						}
					}
				}
				return true
			}
			add(callee)
			return true
		})
	}
	files = map[string][]string{}
	for fn := range seen {
		p := owner[fn]
		file := p.fileOf(decls[fn].Pos())
		funcs = append(funcs, shortPath(p.Path)+"/"+file+": "+funcName(fn))
		if !slices.Contains(files[p.Path], file) {
			files[p.Path] = append(files[p.Path], file)
		}
	}
	slices.Sort(funcs)
	for _, fs := range files {
		slices.Sort(fs)
	}
	return funcs, files, nil
}

// interfaceOf is the interface fn is a method of; nil for a concrete function
// or method.
func interfaceOf(fn *types.Func) *types.Interface {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil {
		return nil
	}
	iface, _ := sig.Recv().Type().Underlying().(*types.Interface)
	return iface
}

// funcName is "Func" or "Type.Method" (without the star of a pointer receiver).
func funcName(fn *types.Func) string {
	sig := fn.Type().(*types.Signature)
	if sig.Recv() == nil {
		return fn.Name()
	}
	t := sig.Recv().Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj().Name() + "." + fn.Name()
	}
	return fn.Name()
}

// shortPath is the last element of an import path.
func shortPath(path string) string { return path[strings.LastIndex(path, "/")+1:] }

// Methods counts the methods declared on each named type of the package (value
// and pointer receivers together), by type name.
func (p *Package) Methods() map[string]int {
	out := map[string]int{}
	for _, name := range p.Types.Scope().Names() {
		tn, ok := p.Types.Scope().Lookup(name).(*types.TypeName)
		if !ok {
			continue
		}
		if n, ok := tn.Type().(*types.Named); ok && !types.IsInterface(n) && n.NumMethods() > 0 {
			out[name] = n.NumMethods()
		}
	}
	return out
}
