package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the repository root, from this package's folder.
const moduleRoot = "../.."

// layoutFile is the page that maps the tree, from the module root; the map is its
// "# Layout" heading, the whole page.
const layoutFile = "docs/layout.md"

// packageDirs returns the folders under root (slash-separated, relative) that hold a Go
// file, and every folder, skipping testdata, bin, bench/out and hidden folders (and what
// is below them).
func packageDirs(root string) (dirs, all []string, err error) {
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			if rel == "bin" || rel == "bench/out" { // build and bench outputs: named, not walked
				all = append(all, rel)
				return filepath.SkipDir
			}
			all = append(all, rel)
			return nil
		}
		if strings.HasSuffix(rel, ".go") {
			if dir := filepath.ToSlash(filepath.Dir(rel)); dir != "." && !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
		return nil
	})
	return dirs, all, err
}

// namedFolders returns the folders the layout names: the backquoted words that end in a
// slash, without it.
func namedFolders(layout string) []string {
	var out []string
	for i, part := range strings.Split(layout, "`") {
		if i%2 == 1 && strings.HasSuffix(part, "/") && !strings.ContainsAny(part, " \t") {
			out = append(out, strings.TrimSuffix(part, "/"))
		}
	}
	return out
}

// TestLayoutNamesEveryPackageFolder: docs/layout.md names every folder
// that holds a Go package, each as its last path element with a slash ("gpu/" for
// koordlet/gpu), and a folder named there that no longer exists fails too.
func TestLayoutNamesEveryPackageFolder(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join(moduleRoot, layoutFile))
	if err != nil {
		t.Fatal(err)
	}
	layout, err := section(page, "Layout")
	if err != nil {
		t.Fatalf("%s: %v", layoutFile, err)
	}
	dirs, all, err := packageDirs(moduleRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found %d package folders under %s: not the module root?", len(dirs), moduleRoot)
	}
	for _, dir := range dirs {
		if !strings.Contains(layout, "`"+dir+"/`") && !strings.Contains(layout, "`"+filepath.Base(dir)+"/`") {
			t.Errorf("%s does not name %s/ (write it as `%s/`, or `%s/` inside its parent's entry)",
				layoutFile, dir, dir, filepath.Base(dir))
		}
	}
	for _, named := range namedFolders(layout) {
		if !slices.ContainsFunc(all, func(d string) bool { return d == named || strings.HasSuffix(d, "/"+named) }) {
			t.Errorf("%s names `%s/`, which is no folder of the tree", layoutFile, named)
		}
	}
}
