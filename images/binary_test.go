package images

import (
	"errors"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// An upstream binary's image (the real node's kube-scheduler): the tag as given,
// the binary at the entrypoint path over the shared base layer, the user; a cgo
// binary carries its loader and libraries.
func TestBinaryImages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	static := buildHello(t, dir, "static", false)
	dynamic := buildHello(t, dir, "dynamic", true)
	const ref = "registry.k8s.io/kube-scheduler:v1.34.4"
	tests := []struct {
		name       string
		o          BinaryOptions
		wantUser   string
		wantLayers int
	}{
		{"static, defaults", BinaryOptions{Ref: ref, Binary: static, Entrypoint: "/usr/local/bin/kube-scheduler"},
			NonRootUser, 2},
		{"cgo, root, labels", BinaryOptions{Ref: ref, Binary: dynamic, Entrypoint: "/usr/local/bin/kube-scheduler",
			User: RootUser, LibRoot: "/", Labels: map[string]string{"k": "v"}}, RootUser, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.o.Created = time.Unix(1700000000, 0)
			spec, err := BinarySpec(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			img, err := Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			back, p := writeAndLoad(t, img)
			if got := repoTags(t, p); !slices.Equal(got, []string{ref}) {
				t.Errorf("RepoTags = %v", got)
			}
			cf, err := back.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			want := v1.Config{Entrypoint: []string{tc.o.Entrypoint}, User: tc.wantUser, WorkingDir: "/", Labels: tc.o.Labels}
			if diff := cmp.Diff(want, cf.Config); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || cf.Created.Unix() != 1700000000 {
				t.Errorf("platform/created = %s/%s %v", cf.OS, cf.Architecture, cf.Created)
			}
			layers := readLayers(t, back)
			if len(layers) != tc.wantLayers {
				t.Fatalf("%d layers, want %d", len(layers), tc.wantLayers)
			}
			app := layers[len(layers)-1]
			if e, ok := app["usr/local/bin/kube-scheduler"]; !ok || e.mode != 0o755 || e.uid != 0 {
				t.Errorf("binary layer = %v", keys(app))
			}
			for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
				if e, ok := app[d]; !ok || e.mode != 0o755 {
					t.Errorf("binary layer has no directory %s (0755): %v", d, keys(app))
				}
			}
			if layers[0]["etc/passwd"].data == "" {
				t.Errorf("no base layer: %v", keys(layers[0]))
			}
		})
	}
}

func TestBinarySpecErrors(t *testing.T) {
	t.Parallel()
	static := buildHello(t, t.TempDir(), "static", false)
	notELF := filepath.Join(t.TempDir(), "script")
	copyFile(t, "binary.go", notELF)
	tests := []struct {
		name    string
		o       BinaryOptions
		wantErr error // from BinarySpec, else from Build
	}{
		{"relative entrypoint", BinaryOptions{Ref: "x.test/ab:v1", Binary: static, Entrypoint: "bin/a"}, ErrInvalidSpec},
		{"root entrypoint", BinaryOptions{Ref: "x.test/ab:v1", Binary: static, Entrypoint: "/"}, ErrInvalidSpec},
		{"unclean entrypoint", BinaryOptions{Ref: "x.test/ab:v1", Binary: static, Entrypoint: "/a/../b"}, ErrInvalidSpec},
		{"no entrypoint", BinaryOptions{Ref: "x.test/ab:v1", Binary: static}, ErrInvalidSpec},
		{"no binary", BinaryOptions{Ref: "x.test/ab:v1", Binary: filepath.Join(t.TempDir(), "nope"), Entrypoint: "/a"},
			fs.ErrNotExist},
		{"latest", BinaryOptions{Ref: "x.test/ab:latest", Binary: static, Entrypoint: "/a"}, ErrLatestTag},
		{"no tag", BinaryOptions{Ref: "x.test/ab", Binary: static, Entrypoint: "/a"}, ErrInvalidRef},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec, err := BinarySpec(tc.o)
			if err == nil {
				_, err = Build(spec)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
	if _, err := BinarySpec(BinaryOptions{Ref: "x.test/ab:v1", Binary: notELF, Entrypoint: "/a"}); err == nil {
		t.Error("a file that is not ELF was accepted")
	}
}
