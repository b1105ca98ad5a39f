package images

import (
	"bytes"
	"errors"
	"io/fs"
	"path"
	"strings"
	"testing"
	"time"
)

// A reference from the command line: either refused with a sentinel, or a tag that
// is written out, not latest, and printed back as given.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"understory/koordlet:v1", "understory/koordlet", "x:latest", "localhost:5000/a/b:c",
		"a/b@sha256:00", "", ":", "a/b:c:d", "UPPER/x:v1", "a//b:v"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		tag, err := ParseRef(ref)
		if err != nil {
			if !errors.Is(err, ErrInvalidRef) && !errors.Is(err, ErrLatestTag) {
				t.Fatalf("ParseRef(%q) = %v: not a sentinel", ref, err)
			}
			return
		}
		if tag.TagStr() == "latest" || tag.String() != ref || !strings.HasSuffix(ref, ":"+tag.TagStr()) {
			t.Fatalf("ParseRef(%q) = %q (tag %q)", ref, tag.String(), tag.TagStr())
		}
	})
}

// Paths as a spec might give them: refused with ErrInvalidSpec, or a tar whose
// every entry has its parent before it.
func FuzzLayerTar(f *testing.F) {
	f.Add("/a/b", "/a", true)
	f.Add("/a", "/a", false)
	f.Add("a/../b", "/b/c", true)
	f.Add("/x/./y", "//z", false)
	f.Fuzz(func(t *testing.T, p1, p2 string, dir bool) {
		second := File{Path: p2, Mode: 0o644, Data: []byte("2")}
		if dir {
			second = File{Path: p2, Mode: fs.ModeDir | 0o755}
		}
		data, err := layerTar([]File{{Path: p1, Mode: 0o755, Data: []byte("1")}, second}, time.Unix(0, 0))
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("layerTar(%q, %q) = %v: not ErrInvalidSpec", p1, p2, err)
			}
			return
		}
		entries := readTar(t, bytes.NewReader(data))
		for name := range entries {
			p := "/" + strings.TrimSuffix(name, "/")
			if parent := path.Dir(p); parent != "/" {
				if e, ok := entries[strings.TrimPrefix(parent, "/")+"/"]; !ok || e.mtime != 0 {
					t.Fatalf("entry %s without its parent directory in %v", name, keys(entries))
				}
			}
		}
	})
}
