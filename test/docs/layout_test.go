package docs_test

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the repository root, from this package's folder.
const moduleRoot = "../.."

// layoutSection returns the text of README's "## Layout" section.
func layoutSection(readme []byte) (string, error) {
	var b strings.Builder
	in := false
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.TrimSpace(strings.TrimPrefix(line, "## ")) == "Layout"
		case in:
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if b.Len() == 0 {
		return "", errors.New(`README.md has no "## Layout" section`)
	}
	return b.String(), nil
}

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

// TestReadmeLayoutNamesEveryPackageFolder: README's Layout section names every folder
// that holds a Go package, each as its last path element with a slash ("gpu/" for
// koordlet/gpu), and a folder named there that no longer exists fails too.
func TestReadmeLayoutNamesEveryPackageFolder(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(moduleRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	layout, err := layoutSection(readme)
	if err != nil {
		t.Fatal(err)
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
			t.Errorf("README.md's Layout section does not name %s/ (write it as `%s/`, or `%s/` inside its parent's entry)",
				dir, dir, filepath.Base(dir))
		}
	}
	for _, named := range namedFolders(layout) {
		if !slices.ContainsFunc(all, func(d string) bool { return d == named || strings.HasSuffix(d, "/"+named) }) {
			t.Errorf("README.md's Layout section names `%s/`, which is no folder of the tree", named)
		}
	}
}

func TestLayoutSection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		readme string
		want   string
		ok     bool
	}{
		{name: "between headings", readme: "# T\n## A\na\n## Layout\n`x/` y\n## B\nb\n", want: "`x/` y\n", ok: true},
		{name: "last section", readme: "## Layout\nl\n", want: "l\n", ok: true},
		{name: "missing", readme: "## Other\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := layoutSection([]byte(tc.readme))
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("layoutSection = %q, %v; want %q, ok %t", got, err, tc.want, tc.ok)
			}
		})
	}
}
