package images

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
)

func archImage(t *testing.T, ref, arch string) *Image {
	t.Helper()
	img, err := Build(Spec{Ref: ref, OS: "linux", Architecture: arch,
		Layers: []Layer{{Name: "l", Files: []File{{Path: "/hello", Mode: 0o755, Data: []byte(arch)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// One multi-platform image: an OCI layout whose one index names the tag and holds one
// image per platform; the same images give the same bytes; images with different
// tags or none are refused.
func TestWriteIndexArchive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	imgs := []*Image{archImage(t, "x.test/u/a:v1", "amd64"), archImage(t, "x.test/u/a:v1", "arm64")}
	path := filepath.Join(dir, "a.oci.tar")
	digest, err := WriteIndexArchive(path, imgs)
	if err != nil {
		t.Fatal(err)
	}
	idx, ref, err := ReadIndexArchive(path, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != digest || ref != "x.test/u/a:v1" {
		t.Fatalf("read back %s named %q, want %s named x.test/u/a:v1", d, ref, digest)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	if strings.Join(platforms, " ") != "linux/amd64 linux/arm64" {
		t.Errorf("platforms %v", platforms)
	}
	again := filepath.Join(dir, "b.oci.tar")
	if _, err := WriteIndexArchive(again, imgs); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("the same images gave different archives")
	}
	if _, err := WriteIndexArchive(filepath.Join(dir, "c.oci.tar"), []*Image{imgs[0], archImage(t, "x.test/u/a:v2", "arm64")}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("two tags in one index: %v", err)
	}
	if _, err := WriteIndexArchive(filepath.Join(dir, "d.oci.tar"), nil); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("no images: %v", err)
	}
}

// The SBOM of an image names its program's module, the Go standard library and every
// module linked in (this test binary's: go-containerregistry), with purls, and the
// image's files beyond the base layer.
func TestSBOM(t *testing.T) {
	t.Parallel()
	// mkimage, built here: it links go-containerregistry (a test binary's build
	// information lists no modules).
	if _, err := exec.LookPath("go"); err != nil {
		testenv.SkipOrFailInCI(t, "no go command to build cmd/mkimage")
	}
	exe := filepath.Join(t.TempDir(), "mkimage")
	cmd := exec.Command("go", "build", "-trimpath", "-o", exe, "./cmd/mkimage")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/mkimage: %v\n%s", err, out)
	}
	spec := Spec{Ref: "x.test/u/a:v1", Labels: map[string]string{LabelVersion: "v1"}, Layers: []Layer{
		{Name: "base", Files: baseFiles()},
		{Name: "glibc", Files: []File{{Path: "/lib64/ld-linux-x86-64.so.2", Mode: 0o755},
			{Path: dpkgStatusDir + "/libc6_amd64", Mode: 0o644,
				Data: []byte("Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u13\n")}}},
		{Name: "a", Files: []File{{Path: "/a", Mode: 0o755}}},
	}}
	data, err := SBOM("x.test/u/a:v1 linux/amd64", spec, exe, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SPDXVersion  string `json:"spdxVersion"`
		CreationInfo struct {
			Created string `json:"created"`
		} `json:"creationInfo"`
		Packages []struct {
			Name         string `json:"name"`
			Version      string `json:"versionInfo"`
			Comment      string `json:"comment"`
			ExternalRefs []struct {
				Locator string `json:"referenceLocator"`
			} `json:"externalRefs"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.CreationInfo.Created != "1970-01-01T00:00:00Z" {
		t.Errorf("document %s created %s", doc.SPDXVersion, doc.CreationInfo.Created)
	}
	found := map[string]string{}
	for _, p := range doc.Packages {
		if len(p.ExternalRefs) > 0 {
			found[p.Name] = p.ExternalRefs[0].Locator
		}
		if p.Name == "image files" && p.Comment != "files of the image beyond its base: /a /lib64/ld-linux-x86-64.so.2 "+
			dpkgStatusDir+"/libc6_amd64" {
			t.Errorf("image files: %q", p.Comment)
		}
	}
	if found["libc6"] != "pkg:deb/debian/libc6@2.36-9+deb12u13?arch=amd64" {
		t.Errorf("libc6: %q, want its Debian purl", found["libc6"])
	}
	if !strings.HasPrefix(found["github.com/google/go-containerregistry"], "pkg:golang/github.com/google/go-containerregistry@v") ||
		!strings.HasPrefix(found["stdlib"], "pkg:golang/stdlib@1.") || found["github.com/understory/understory"] == "" {
		t.Errorf("packages %v: want the main module, stdlib and go-containerregistry with purls", found)
	}
	if _, err := SBOM("x", spec, filepath.Join(t.TempDir(), "missing"), time.Unix(0, 0)); err == nil {
		t.Error("an SBOM of a missing binary")
	}
}

// tarOf is a tar of the given entries (name → content; a name ending in / is a
// directory).
func tarOf(t testing.TB, entries ...[2]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Size: int64(len(e[1])), Typeflag: tar.TypeReg}
		if strings.HasSuffix(e[0], "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e[1])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// An archive that is not one image index in an OCI layout, or that names a path
// outside its directory, is refused and writes nothing outside it.
func TestReadIndexArchiveRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tar  []byte
	}{
		{"not a tar", []byte("hello")},
		{"empty", tarOf(t)},
		{"escapes", tarOf(t, [2]string{"../evil", "x"})},
		{"absolute", tarOf(t, [2]string{"/etc/evil", "x"})},
		{"a directory entry", tarOf(t, [2]string{"blobs/", ""})},
		{"no index", tarOf(t, [2]string{"oci-layout", `{"imageLayoutVersion":"1.0.0"}`})},
		{"no image index", tarOf(t, [2]string{"oci-layout", `{"imageLayoutVersion":"1.0.0"}`},
			[2]string{"index.json", `{"schemaVersion":2,"manifests":[]}`})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := filepath.Join(dir, "a.oci.tar")
			if err := os.WriteFile(p, tc.tar, 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "out")
			if _, _, err := ReadIndexArchive(p, out); err == nil {
				t.Fatal("accepted")
			}
			if _, err := os.Stat(filepath.Join(dir, "evil")); err == nil {
				t.Fatal("wrote outside its directory")
			}
		})
	}
}

// FuzzReadIndexArchive: whatever the archive, reading it neither panics nor writes
// outside its directory.
func FuzzReadIndexArchive(f *testing.F) {
	f.Add(tarOf(f, [2]string{"oci-layout", `{"imageLayoutVersion":"1.0.0"}`}, [2]string{"index.json", `{"schemaVersion":2}`}))
	f.Add(tarOf(f, [2]string{"../x", "y"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "in", "a.oci.tar")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, _ = ReadIndexArchive(p, filepath.Join(dir, "out", "layout"))
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "in" && e.Name() != "out" {
				t.Fatalf("wrote %s outside the layout directory", e.Name())
			}
		}
	})
}
