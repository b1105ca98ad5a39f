package timeslice_test

import (
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/understory/understory/koordlet/gpu/timeslice/timeslicetest"
)

// glibcOldest is the newest glibc symbol version the shim may bind: it is preloaded into
// tenants' programs, and a program whose glibc lacks a version the shim needs does not
// start.
const glibcOldest = "GLIBC_2.17"

// glibcVersion parses "GLIBC_2.17" into (2, 17).
func glibcVersion(v string) ([2]int, bool) {
	rest, ok := strings.CutPrefix(v, "GLIBC_")
	if !ok {
		return [2]int{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 2 {
		return [2]int{}, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return [2]int{major, minor}, err1 == nil && err2 == nil
}

// TestShimGlibcVersions: the shim as built binds no glibc symbol version newer than
// 2.17 (the build host's glibc gave dlsym, stat and fstat newer ones) and needs
// libdl.so.2, where an older glibc keeps dlsym.
func TestShimGlibcVersions(t *testing.T) {
	t.Parallel()
	b := timeslicetest.Build(t, t.TempDir())
	f, err := elf.Open(b.Shim)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	limit, _ := glibcVersion(glibcOldest)
	for _, s := range syms {
		if s.Version == "" {
			continue
		}
		v, ok := glibcVersion(s.Version)
		if !ok {
			t.Errorf("%s binds version %q of %s: not glibc's", s.Name, s.Version, s.Library)
			continue
		}
		if v[0] > limit[0] || v[0] == limit[0] && v[1] > limit[1] {
			t.Errorf("%s binds %s, newer than %s: the shim would stop programs on an older glibc", s.Name,
				s.Version, glibcOldest)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil || !slices.Contains(libs, "libdl.so.2") {
		t.Fatalf("needed libraries %v, %v; want libdl.so.2", libs, err)
	}
}

// TestShimBuildsAgree: the Makefile and the agent's Dockerfile build the shim with the
// flags the tests build it with.
func TestShimBuildsAgree(t *testing.T) {
	t.Parallel()
	root := filepath.Join(timeslicetest.SourceDir(t), "..", "..", "..")
	want := strings.Join(timeslicetest.ShimCFlags(), " ")
	link := strings.Join(timeslicetest.ShimLinkFlags(), " ")
	for _, name := range []string{"Makefile", filepath.Join("build", "koordlet.Dockerfile")} {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "\\\n", " ")
		i := strings.Index(text, "understory_tsg.c")
		if i < 0 {
			t.Fatalf("%s builds no shim", name)
		}
		start := strings.LastIndex(text[:i], "gcc ")
		end := strings.IndexByte(text[i:], '\n')
		cmd := strings.Join(strings.Fields(text[start:i+end]), " ")
		if !strings.HasPrefix(cmd, "gcc "+want+" -o ") || !strings.HasSuffix(cmd, "understory_tsg.c "+link) {
			t.Errorf("%s: %q; want gcc %s -o … understory_tsg.c %s", name, cmd, want, link)
		}
	}
}
