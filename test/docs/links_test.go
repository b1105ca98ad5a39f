package docs_test

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// docPages returns README.md and every Markdown file of docs/, as slash-separated paths
// from the module root.
func docPages(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(moduleRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := []string{"README.md"}
	for _, p := range m {
		pages = append(pages, "docs/"+filepath.Base(p))
	}
	if len(pages) < 10 {
		t.Fatalf("found %d pages under %s: not the module root?", len(pages), moduleRoot)
	}
	return pages
}

// TestDocsIndexListsEveryDoc: docs/README.md links every Markdown file of docs/ (but
// itself), and each one line at most once.
func TestDocsIndexListsEveryDoc(t *testing.T) {
	t.Parallel()
	index, err := os.ReadFile(filepath.Join(moduleRoot, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int{}
	for _, l := range links(index) {
		if target, _, _ := strings.Cut(l, "#"); !strings.Contains(target, "/") && strings.HasSuffix(target, ".md") {
			listed[target]++
		}
	}
	for _, p := range docPages(t) {
		name, ok := strings.CutPrefix(p, "docs/")
		if !ok || name == "README.md" {
			continue
		}
		switch n := listed[name]; {
		case n == 0:
			t.Errorf("docs/README.md does not list %s: add it with one line saying what it holds", name)
		case n > 1:
			t.Errorf("docs/README.md lists %s %d times: once is the index", name, n)
		}
	}
}

// TestRelativeLinksResolve: every relative link of README.md and the docs names a file
// or folder of the tree, and its #fragment (also a fragment alone, within the page) a
// heading of that page.
func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	for _, page := range docPages(t) {
		t.Run(page, func(t *testing.T) {
			t.Parallel()
			text, err := os.ReadFile(filepath.Join(moduleRoot, page))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range links(text) {
				if strings.Contains(l, "://") || strings.HasPrefix(l, "mailto:") {
					continue
				}
				target, frag, _ := strings.Cut(l, "#")
				file := page
				if target != "" {
					file = path.Join(path.Dir(page), target)
				}
				if strings.HasPrefix(file, "../") {
					t.Errorf("%s: link %q leaves the repository", page, l)
					continue
				}
				data, err := os.ReadFile(filepath.Join(moduleRoot, filepath.FromSlash(file)))
				if err != nil {
					if fi, serr := os.Stat(filepath.Join(moduleRoot, filepath.FromSlash(file))); serr == nil && fi.IsDir() && frag == "" {
						continue // a folder of the tree
					}
					t.Errorf("%s: link %q: %v", page, l, err)
					continue
				}
				if frag != "" && strings.HasSuffix(file, ".md") && !slices.Contains(anchors(data), frag) {
					t.Errorf("%s: link %q: %s has no heading whose anchor is #%s", page, l, file, frag)
				}
			}
		})
	}
}
