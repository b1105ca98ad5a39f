package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestParseRef(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ref     string
		want    string // tag
		wantErr error
	}{
		{ref: "understory/koordlet:v1.2.0", want: "v1.2.0"},
		{ref: "understory/koordlet:1de3fe7-dirty", want: "1de3fe7-dirty"},
		{ref: "understory.local/pause:realnode", want: "realnode"},
		{ref: "localhost:5000/understory/admission:0.0.0-dev", want: "0.0.0-dev"},
		{ref: "understory/koordlet", wantErr: ErrInvalidRef},
		{ref: "localhost:5000/understory/admission", wantErr: ErrInvalidRef},
		{ref: "understory/koordlet:latest", wantErr: ErrLatestTag},
		{ref: "understory/koordlet:", wantErr: ErrInvalidRef},
		{ref: "Understory/Koordlet:v1", wantErr: ErrInvalidRef},
		{ref: "understory/koordlet@sha256:" + string(bytes.Repeat([]byte("a"), 64)), wantErr: ErrInvalidRef},
		{ref: "", wantErr: ErrInvalidRef},
	}
	for _, tc := range tests {
		t.Run(tc.ref, func(t *testing.T) {
			t.Parallel()
			tag, err := ParseRef(tc.ref)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ParseRef(%q) = %v, want %v", tc.ref, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tag.TagStr() != tc.want || tag.String() != tc.ref {
				t.Errorf("ParseRef(%q) = %q tag %q, want tag %q", tc.ref, tag.String(), tag.TagStr(), tc.want)
			}
		})
	}
}

func TestBuildReadBack(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!program"), 0o600); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 23, 12, 0, 0, 500, time.UTC)
	spec := Spec{
		Ref: "example.test/app:v1", OS: "linux", Architecture: "arm64",
		Layers: []Layer{
			{Name: "base", Files: []File{
				{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0::/:/x\n")},
				{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
				{Path: "/home/app", Mode: fs.ModeDir | 0o700, UID: 1000, GID: 1001},
			}},
			{Name: "app", Files: []File{
				// Source's own mode (0600) is not used: the File's is.
				{Path: "/usr/local/bin/app", Mode: 0o755, Source: src},
				{Path: "/app", Mode: fs.ModeSymlink | 0o777, Link: "usr/local/bin/app"},
				{Path: "/usr/local/bin/suid", Mode: fs.ModeSetuid | 0o755, Data: []byte{}},
			}},
		},
		Entrypoint: []string{"/app", "-v"}, Cmd: []string{"serve"}, Env: []string{"A=b"},
		User: "1000:1001", WorkingDir: "/home/app", Labels: map[string]string{"k": "v"},
		Created: created,
	}
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	back, p := writeAndLoad(t, img)
	if got := repoTags(t, p); !cmp.Equal(got, []string{"example.test/app:v1"}) {
		t.Errorf("RepoTags = %v", got)
	}

	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	wantTime := created.Truncate(time.Second)
	if cf.OS != "linux" || cf.Architecture != "arm64" || !cf.Created.Time.Equal(wantTime) {
		t.Errorf("platform/created = %s/%s %v", cf.OS, cf.Architecture, cf.Created)
	}
	wantCfg := v1.Config{Entrypoint: spec.Entrypoint, Cmd: spec.Cmd, Env: spec.Env, User: spec.User,
		WorkingDir: spec.WorkingDir, Labels: spec.Labels}
	if diff := cmp.Diff(wantCfg, cf.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if len(cf.History) != 2 || cf.History[0].CreatedBy != "understory mkimage: base" ||
		!cf.History[1].Created.Time.Equal(wantTime) {
		t.Errorf("history = %+v", cf.History)
	}
	if len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("diff IDs = %v", cf.RootFS.DiffIDs)
	}

	// The in-memory image is OCI; its layers are gzip OCI layers.
	if mt, err := img.Image.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("media type = %v, %v", mt, err)
	}
	ls, err := img.Image.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type = %v", mt)
		}
	}

	mtime := wantTime.Unix()
	want := []map[string]entry{
		{
			"etc/":       {typ: tar.TypeDir, mode: 0o755, mtime: mtime},
			"etc/passwd": {typ: tar.TypeReg, mode: 0o644, data: "root:x:0:0::/:/x\n", mtime: mtime},
			"home/":      {typ: tar.TypeDir, mode: 0o755, mtime: mtime},
			"home/app/":  {typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1001, mtime: mtime},
			"tmp/":       {typ: tar.TypeDir, mode: 0o1777, mtime: mtime},
		},
		{
			"app":                {typ: tar.TypeSymlink, mode: 0o777, link: "usr/local/bin/app", mtime: mtime},
			"usr/":               {typ: tar.TypeDir, mode: 0o755, mtime: mtime},
			"usr/local/":         {typ: tar.TypeDir, mode: 0o755, mtime: mtime},
			"usr/local/bin/":     {typ: tar.TypeDir, mode: 0o755, mtime: mtime},
			"usr/local/bin/app":  {typ: tar.TypeReg, mode: 0o755, data: "#!program", mtime: mtime},
			"usr/local/bin/suid": {typ: tar.TypeReg, mode: 0o4755, mtime: mtime},
		},
	}
	if diff := cmp.Diff(want, readLayers(t, back), cmp.AllowUnexported(entry{})); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	ok := File{Path: "/a", Mode: 0o644, Data: []byte("a")}
	spec := func(files ...File) Spec {
		return Spec{Ref: "x.test/ab:v1", OS: "linux", Architecture: "amd64", Layers: []Layer{{Name: "l", Files: files}}}
	}
	tests := []struct {
		name string
		spec Spec
		want error
	}{
		{"no tag", Spec{Ref: "x.test/ab", OS: "linux", Architecture: "amd64", Layers: spec(ok).Layers}, ErrInvalidRef},
		{"latest", Spec{Ref: "x.test/ab:latest", OS: "linux", Architecture: "amd64", Layers: spec(ok).Layers}, ErrLatestTag},
		{"no platform", Spec{Ref: "x.test/ab:v1", Layers: spec(ok).Layers}, ErrInvalidSpec},
		{"no layers", Spec{Ref: "x.test/ab:v1", OS: "linux", Architecture: "amd64"}, ErrInvalidSpec},
		{"empty layer", spec(), ErrInvalidSpec},
		{"relative path", spec(File{Path: "a", Data: []byte{}}), ErrInvalidSpec},
		{"unclean path", spec(File{Path: "/a/../b", Data: []byte{}}), ErrInvalidSpec},
		{"root", spec(File{Path: "/", Mode: fs.ModeDir | 0o755}), ErrInvalidSpec},
		{"duplicate", spec(ok, ok), ErrInvalidSpec},
		{"below a file", spec(ok, File{Path: "/a/b", Data: []byte{}}), ErrInvalidSpec},
		{"no content", spec(File{Path: "/a", Mode: 0o644}), ErrInvalidSpec},
		{"two contents", spec(File{Path: "/a", Source: "/etc/hostname", Data: []byte{}}), ErrInvalidSpec},
		{"symlink without target", spec(File{Path: "/a", Mode: fs.ModeSymlink}), ErrInvalidSpec},
		{"NUL in path", spec(File{Path: "/a\x00b", Data: []byte{}}), ErrInvalidSpec},
		{"NUL in link", spec(File{Path: "/a", Mode: fs.ModeSymlink, Link: "b\x00"}), ErrInvalidSpec},
		{"directory with data", spec(File{Path: "/a", Mode: fs.ModeDir, Data: []byte{}}), ErrInvalidSpec},
		{"device", spec(File{Path: "/a", Mode: fs.ModeDevice}), ErrInvalidSpec},
		{"negative owner", spec(File{Path: "/a", Data: []byte{}, UID: -1}), ErrInvalidSpec},
		{"missing source", spec(File{Path: "/a", Source: "/nonexistent/understory"}), fs.ErrNotExist},
		{"directory source", spec(File{Path: "/a", Source: "/"}), ErrInvalidSpec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Build(tc.spec); !errors.Is(err, tc.want) {
				t.Fatalf("Build = %v, want %v", err, tc.want)
			}
		})
	}
}

// The same inputs give the same image and the same tarball bytes; another time
// gives another image.
func TestReproducible(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	if err := os.WriteFile(src, bytes.Repeat([]byte("understory"), 100000), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := func(created time.Time) Spec {
		return Spec{Ref: "x.test/ab:v1", OS: "linux", Architecture: "amd64", Created: created,
			Layers: []Layer{
				{Name: "base", Files: baseFiles()},
				{Name: "bin", Files: []File{{Path: "/bin/a", Mode: 0o755, Source: src}}},
			},
			Entrypoint: []string{"/bin/a"}, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}
	}
	write := func(name string, created time.Time) (v1.Hash, []byte) {
		img, err := Build(spec(created))
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Image.Digest()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := WriteTarball(p, img); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return d, b
	}
	epoch := time.Unix(0, 0)
	d1, b1 := write("1.tar", epoch)
	// The source's mtime must not matter.
	if err := os.Chtimes(src, time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	d2, b2 := write("2.tar", epoch)
	if d1 != d2 || !bytes.Equal(b1, b2) {
		t.Errorf("two builds differ: %s vs %s, tarballs equal: %v", d1, d2, bytes.Equal(b1, b2))
	}
	d3, _ := write("3.tar", time.Unix(1700000000, 0))
	if d3 == d1 {
		t.Errorf("another created time gave the same digest %s", d3)
	}
	// No temporary files are left next to the tarballs.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 4 {
		t.Errorf("dir holds %d entries, want bin and 3 tarballs", len(ents))
	}
}

func TestFilesFromDir(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(os.Mkdir(filepath.Join(root, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(root, "tmp"), os.ModeSticky|0o777))
	must(os.WriteFile(filepath.Join(root, "bin", "busybox"), []byte("bb"), 0o755))
	must(os.Symlink("busybox", filepath.Join(root, "bin", "sh")))
	must(os.WriteFile(filepath.Join(root, "etc"), []byte("x"), 0o600))

	files, err := FilesFromDir(root)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Build(Spec{Ref: "x.test/busybox:v1", OS: "linux", Architecture: "amd64",
		Layers: []Layer{{Name: "rootfs", Files: files}}, Cmd: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	back, _ := writeAndLoad(t, img)
	want := []map[string]entry{{
		"bin/":        {typ: tar.TypeDir, mode: 0o755},
		"bin/busybox": {typ: tar.TypeReg, mode: 0o755, data: "bb"},
		"bin/sh":      {typ: tar.TypeSymlink, mode: 0o777, link: "busybox"},
		"etc":         {typ: tar.TypeReg, mode: 0o600, data: "x"},
		"tmp/":        {typ: tar.TypeDir, mode: 0o1777},
	}}
	if diff := cmp.Diff(want, readLayers(t, back), cmp.AllowUnexported(entry{})); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}

	t.Run("fifo", func(t *testing.T) {
		t.Parallel()
		d := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(d, "fifo"), 0o644); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
		if _, err := FilesFromDir(d); !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("FilesFromDir with a FIFO = %v, want ErrInvalidSpec", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		t.Parallel()
		if _, err := FilesFromDir(t.TempDir()); !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("FilesFromDir of an empty dir = %v, want ErrInvalidSpec", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		if _, err := FilesFromDir(filepath.Join(root, "nope")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("FilesFromDir of a missing dir = %v, want ErrNotExist", err)
		}
	})
}
