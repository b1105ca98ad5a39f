package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/understory/understory/images"
	"github.com/understory/understory/internal/testenv"
)

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	rootfs := t.TempDir()
	if err := os.WriteFile(filepath.Join(rootfs, "x"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "x.tar")
	// Runs after the parallel subtests: no failed run leaves a tarball.
	t.Cleanup(func() {
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed run left %s: %v", out, err)
		}
	})
	tests := []struct {
		name  string
		args  []string
		epoch string
		want  error
	}{
		{"no subcommand", nil, "", errUsage},
		{"unknown subcommand", []string{"pull"}, "", errUsage},
		{"push without registry", []string{"push"}, "", errUsage},
		{"bad epoch", []string{"dir"}, "yesterday", errUsage},
		{"negative epoch", []string{"dir"}, "-1", errUsage},
		{"project without version", []string{"project"}, "", errUsage},
		{"project extra args", []string{"project", "-version", "v1", "x"}, "", errUsage},
		{"project unknown flag", []string{"project", "-nope"}, "", errUsage},
		{"release without version", []string{"release", "-bin", "amd64=" + rootfs}, "", errUsage},
		{"release without binaries", []string{"release", "-version", "v1"}, "", errUsage},
		{"release bad bin", []string{"release", "-version", "v1", "-bin", rootfs}, "", errUsage},
		{"dir without ref", []string{"dir", "-rootfs", rootfs, "-out", out}, "", errUsage},
		{"dir without rootfs", []string{"dir", "-ref", "x.test/ab:v1", "-out", out}, "", errUsage},
		{"dir bad env", []string{"dir", "-ref", "x.test/ab:v1", "-rootfs", rootfs, "-out", out, "-env", "NOEQUALS"}, "", errUsage},
		{"dir bad label", []string{"dir", "-ref", "x.test/ab:v1", "-rootfs", rootfs, "-out", out, "-label", "=v"}, "", errUsage},
		{"dir latest", []string{"dir", "-ref", "x.test/ab:latest", "-rootfs", rootfs, "-out", out}, "", images.ErrLatestTag},
		{"dir no tag", []string{"dir", "-ref", "x.test/ab", "-rootfs", rootfs, "-out", out}, "", images.ErrInvalidRef},
		{"dir empty rootfs", []string{"dir", "-ref", "x.test/ab:v1", "-rootfs", t.TempDir(), "-out", out}, "", images.ErrInvalidSpec},
		{"binary without ref", []string{"binary", "-bin", rootfs + "/x", "-entrypoint", "/x", "-out", out}, "", errUsage},
		{"binary without bin", []string{"binary", "-ref", "x.test/ab:v1", "-entrypoint", "/x", "-out", out}, "", errUsage},
		{"binary without entrypoint", []string{"binary", "-ref", "x.test/ab:v1", "-bin", rootfs + "/x", "-out", out}, "", errUsage},
		{"binary without out", []string{"binary", "-ref", "x.test/ab:v1", "-bin", rootfs + "/x", "-entrypoint", "/x"}, "", errUsage},
		{"binary bad label", []string{"binary", "-ref", "x.test/ab:v1", "-bin", rootfs + "/x", "-entrypoint", "/x",
			"-out", out, "-label", "nolabel"}, "", errUsage},
		{"binary relative entrypoint", []string{"binary", "-ref", "x.test/ab:v1", "-bin", rootfs + "/x", "-entrypoint", "x",
			"-out", out}, "", images.ErrInvalidSpec},
		{"binary missing", []string{"binary", "-ref", "x.test/ab:v1", "-bin", rootfs + "/nope", "-entrypoint", "/x",
			"-out", out}, "", os.ErrNotExist},
		{"project missing binaries", []string{"project", "-version", "v1", "-bin", t.TempDir(), "-out", t.TempDir()}, "", os.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := run(tc.args, io.Discard, io.Discard, tc.epoch)
			if !errors.Is(err, tc.want) {
				t.Fatalf("run(%q) = %v, want %v", tc.args, err, tc.want)
			}
		})
	}
}

func TestDir(t *testing.T) {
	t.Parallel()
	rootfs := t.TempDir()
	if err := os.WriteFile(filepath.Join(rootfs, "pause"), []byte("pause"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pause.tar")
	var stdout bytes.Buffer
	args := []string{"dir", "-ref", "understory.local/pause:realnode", "-rootfs", rootfs, "-out", out,
		"-entrypoint", "/pause", "-entrypoint", "-v", "-cmd", "sh", "-env", "PATH=/bin", "-env", "A=b=c",
		"-user", "0", "-label", "k=v", "-arch", "arm64"}
	if err := run(args, &stdout, io.Discard, "1700000000"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stdout.String(), "understory.local/pause:realnode\t"+out+"\tsha256:") {
		t.Errorf("stdout = %q", stdout.String())
	}
	// The same tree in another (temporary) directory: the same image, byte for byte.
	rootfs2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(rootfs2, "pause"), []byte("pause"), 0o755); err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(t.TempDir(), "pause.tar")
	args2 := slices.Clone(args)
	args2[4], args2[6] = rootfs2, out2
	if err := run(args2, io.Discard, io.Discard, "1700000000"); err != nil {
		t.Fatal(err)
	}
	b1, err1 := os.ReadFile(out)
	b2, err2 := os.ReadFile(out2)
	if err1 != nil || err2 != nil || !bytes.Equal(b1, b2) {
		t.Errorf("the same tree in two directories gave different tarballs (%v, %v)", err1, err2)
	}

	tag, err := name.NewTag("understory.local/pause:realnode")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/pause", "-v"}) || !slices.Equal(c.Cmd, []string{"sh"}) ||
		!slices.Equal(c.Env, []string{"PATH=/bin", "A=b=c"}) || c.User != "0" || c.WorkingDir != "/" ||
		c.Labels["k"] != "v" || cf.Architecture != "arm64" || cf.Created.Unix() != 1700000000 {
		t.Errorf("config = %+v, arch %s, created %v", c, cf.Architecture, cf.Created)
	}
}

func TestProject(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.SkipOrFailInCI(t, "no go command to build the test program")
	}
	// One static program stands in for every binary (the agent may be static too).
	src, bin, out := t.TempDir(), t.TempDir(), t.TempDir()
	for f, data := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.22\n",
		"main.go": "package main\n\nfunc main() { println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(bin, "hello"), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	hello, err := os.ReadFile(filepath.Join(bin, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range images.Components() {
		if err := os.WriteFile(filepath.Join(bin, c.Binary), hello, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, e := range c.Extra { // the time-slice shim, `make tsg-shim`'s
			if err := os.WriteFile(filepath.Join(bin, e.Source), []byte("\x7fELF"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := run([]string{"project", "-version", "0.0.0-dev", "-bin", bin, "-out", out}, io.Discard, io.Discard, ""); err != nil {
		t.Fatal(err)
	}

	data, err := os.ReadFile(filepath.Join(out, "images.json"))
	if err != nil {
		t.Fatal(err)
	}
	var list []built
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != len(images.Components()) {
		t.Fatalf("images.json lists %d images, want %d", len(list), len(images.Components()))
	}
	for i, c := range images.Components() {
		b := list[i]
		if b.Name != c.Name || b.Ref != c.Repo+":0.0.0-dev" || b.Tar != c.Name+".tar" || b.User != c.User ||
			!slices.Equal(b.Entrypoint, c.Entrypoint()) || !strings.HasPrefix(b.ID, "sha256:") {
			t.Errorf("images.json entry %d = %+v", i, b)
		}
		tag, err := name.NewTag(b.Ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(filepath.Join(out, b.Tar), &tag)
		if err != nil {
			t.Fatalf("%s: %v", b.Tar, err)
		}
		id, err := img.ConfigName()
		if err != nil || id.String() != b.ID {
			t.Errorf("%s: image ID %v (%v), images.json says %s", b.Tar, id, err, b.ID)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Created.Unix() != 0 {
			t.Errorf("%s: created %v, want the Unix epoch without SOURCE_DATE_EPOCH", b.Tar, cf.Created)
		}
	}
}

// mkimage binary: the real node's kube-scheduler image from a (here: stand-in)
// static binary, named as the manifests name it.
func TestBinary(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.SkipOrFailInCI(t, "no go command to build the test program")
	}
	src, bin := t.TempDir(), filepath.Join(t.TempDir(), "kube-scheduler")
	for f, data := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.22\n",
		"main.go": "package main\n\nfunc main() { println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	const ref = "registry.k8s.io/kube-scheduler:v1.34.4"
	out := filepath.Join(t.TempDir(), "kube-scheduler.tar")
	var stdout bytes.Buffer
	args := []string{"binary", "-ref", ref, "-bin", bin, "-entrypoint", "/usr/local/bin/kube-scheduler", "-out", out,
		"-label", "org.opencontainers.image.version=v1.34.4"}
	if err := run(args, &stdout, io.Discard, "1700000000"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stdout.String(), ref+"\t"+out+"\tsha256:") {
		t.Errorf("stdout = %q", stdout.String())
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/kube-scheduler"}) || c.User != images.NonRootUser ||
		c.Labels["org.opencontainers.image.version"] != "v1.34.4" || cf.Created.Unix() != 1700000000 {
		t.Errorf("config = %+v, created %v", c, cf.Created)
	}
	// The same binary again: the same bytes.
	out2 := filepath.Join(t.TempDir(), "again.tar")
	args[len(args)-3] = out2
	if err := run(args, io.Discard, io.Discard, "1700000000"); err != nil {
		t.Fatal(err)
	}
	b1, err1 := os.ReadFile(out)
	b2, err2 := os.ReadFile(out2)
	if err1 != nil || err2 != nil || !bytes.Equal(b1, b2) {
		t.Errorf("the same binary gave different tarballs (%v, %v)", err1, err2)
	}
}
