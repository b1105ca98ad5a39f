package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/understory/understory/internal/testenv"
)

// The test programs: they print their name and uid, and the cgo one whether it
// could dlopen NVML, as go-nvml does.
const (
	helloStatic = `package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("hello %s uid=%d\n", os.Args[0], os.Getuid()) }
`
	helloCgo = `package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
static int has_nvml(void) {
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (h) { dlclose(h); return 1; }
	return 0;
}
*/
import "C"

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("hello %s uid=%d nvml=%d\n", os.Args[0], os.Getuid(), C.has_nvml()) }
`
)

// buildHello compiles a test program, with cgo (dynamically linked to glibc) or
// without (static), into dir/name.
func buildHello(t *testing.T, dir, name string, cgo bool) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.SkipOrFailInCI(t, "no go command to build the test programs")
	}
	src := t.TempDir()
	code, cgoEnv := helloStatic, "CGO_ENABLED=0"
	if cgo {
		if _, err := exec.LookPath("gcc"); err != nil {
			testenv.SkipOrFailInCI(t, "no C compiler for the cgo test program")
		}
		code, cgoEnv = helloCgo, "CGO_ENABLED=1"
	}
	for f, data := range map[string]string{"go.mod": "module hello\n\ngo 1.22\n", "main.go": code} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), cgoEnv, "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test program: %v\n%s", err, b)
	}
	return out
}

// entry is a layer entry as read back.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	link     string
	data     string
	mtime    int64
}

// readLayers reads every layer of img back, in order, as path → entry.
func readLayers(t *testing.T, img v1.Image) []map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]entry
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, readTar(t, rc))
		rc.Close()
	}
	return out
}

func readTar(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	m := map[string]entry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatal(err)
		}
		var data bytes.Buffer
		if _, err := io.Copy(&data, tr); err != nil {
			t.Fatal(err)
		}
		m[h.Name] = entry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, link: h.Linkname,
			data: data.String(), mtime: h.ModTime.Unix()}
	}
}

// writeAndLoad writes img to a tarball in a temp dir and reads it back by its tag,
// as an importer would.
func writeAndLoad(t *testing.T, img *Image) (v1.Image, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := WriteTarball(p, img); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(img.Tag.String())
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("read back %s: %v", p, err)
	}
	return back, p
}

// repoTags reads the RepoTags of a tarball's manifest.json.
func repoTags(t *testing.T, p string) []string {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, d := range m {
		tags = append(tags, d.RepoTags...)
	}
	return tags
}

// extract unpacks the flattened file system of img into dir (root only: it keeps
// owners).
func extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) && p != dir {
			t.Fatalf("entry %q escapes the root", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, os.FileMode(h.Mode).Perm()); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			t.Fatalf("unexpected entry type %c for %s", h.Typeflag, h.Name)
		}
		if err != nil {
			t.Fatal(err)
		}
		// MkdirAll and OpenFile apply the umask and drop the sticky bit: set them.
		if h.Typeflag != tar.TypeSymlink {
			if err := os.Chmod(p, modeOf(h.Mode)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			t.Fatal(err)
		}
	}
}

// modeOf converts a tar header mode to an os.FileMode for chmod.
func modeOf(m int64) os.FileMode {
	mode := os.FileMode(m).Perm()
	if m&tarSticky != 0 {
		mode |= os.ModeSticky
	}
	if m&tarSetuid != 0 {
		mode |= os.ModeSetuid
	}
	if m&tarSetgid != 0 {
		mode |= os.ModeSetgid
	}
	return mode
}
