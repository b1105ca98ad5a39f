package images

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/understory/understory/internal/testenv"
)

func TestComponents(t *testing.T) {
	t.Parallel()
	numeric := regexp.MustCompile(`^[0-9]+:[0-9]+$`)
	seen := map[string]bool{}
	for _, c := range Components() {
		if seen[c.Name] {
			t.Errorf("component %s twice", c.Name)
		}
		seen[c.Name] = true
		if c.Repo != "understory/"+c.Name || c.Binary == "" || !strings.HasPrefix(c.Package, "./cmd/") {
			t.Errorf("component %+v: want repo understory/<name>, a binary and a ./cmd/ package", c)
		}
		if !numeric.MatchString(c.User) {
			t.Errorf("component %s: user %q is not numeric uid:gid", c.Name, c.User)
		}
		if got, ok := ComponentNamed(c.Name); !ok || got.Repo != c.Repo {
			t.Errorf("ComponentNamed(%s) = %+v, %v", c.Name, got, ok)
		}
	}
	// The names the manifests use, and who runs as root: only the agent.
	for name, user := range map[string]string{"koordlet": RootUser, "scheduler-extender": NonRootUser,
		"admission": NonRootUser, "kueue-quota": NonRootUser} {
		if c, ok := ComponentNamed(name); !ok || c.User != user {
			t.Errorf("component %s = %+v, %v; want user %s", name, c, ok, user)
		}
	}
	if _, ok := ComponentNamed("nope"); ok {
		t.Error("ComponentNamed(nope) found something")
	}
}

// projectBin builds a bin directory as `make build` would: the cgo agent
// dynamically linked, everything else static. The programs are test programs.
func projectBin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	static := buildHello(t, dir, "static.tmp", false)
	dynamic := buildHello(t, dir, "dynamic.tmp", true)
	for _, c := range Components() {
		src := static
		if c.CGO {
			src = dynamic
		}
		copyFile(t, src, filepath.Join(dir, c.Binary))
		for _, e := range c.Extra {
			if err := os.WriteFile(filepath.Join(dir, e.Source), []byte("\x7fELF extra "+e.Source), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// The project's images, read back from their tarballs: tag, user, entrypoint,
// labels, platform and layers; the base layer is shared; each image runs, as its
// user, in a root of nothing but its own files.
func TestProjectImages(t *testing.T) {
	t.Parallel()
	bin := projectBin(t)
	const version = "v1.2.3-4-gabcdef0-dirty"
	o := ProjectOptions{Version: version, BinDir: bin, LibRoot: "/", Created: time.Unix(1700000000, 0)}
	var baseDiffIDs []v1.Hash
	for _, c := range Components() {
		t.Run(c.Name, func(t *testing.T) {
			spec, err := ProjectSpec(c, o)
			if err != nil {
				t.Fatal(err)
			}
			img, err := Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			back, p := writeAndLoad(t, img)
			if got := repoTags(t, p); !slices.Equal(got, []string{"understory/" + c.Name + ":" + version}) {
				t.Errorf("RepoTags = %v", got)
			}
			cf, err := back.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			want := v1.Config{
				Entrypoint: []string{"/" + c.Binary}, User: c.User, WorkingDir: "/",
				Labels: map[string]string{LabelTitle: c.Name, LabelVersion: version, LabelDescription: c.Description},
			}
			if diff := cmp.Diff(want, cf.Config); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || cf.Created.Unix() != 1700000000 {
				t.Errorf("platform/created = %s/%s %v", cf.OS, cf.Architecture, cf.Created)
			}

			layers := readLayers(t, back)
			wantLayers := 2
			if c.CGO {
				wantLayers++
			}
			if len(c.Extra) > 0 {
				wantLayers++
			}
			if len(layers) != wantLayers {
				t.Fatalf("%d layers, want %d", len(layers), wantLayers)
			}
			if len(c.Extra) > 0 {
				extra := layers[len(layers)-2]
				for _, e := range c.Extra {
					got, ok := extra[strings.TrimPrefix(e.Path, "/")]
					if !ok || got.mode != int64(e.Mode) || got.uid != 0 || got.data != "\x7fELF extra "+e.Source {
						t.Errorf("extra layer = %v, want %s at %s, %v, root's", keys(extra), e.Source, e.Path, e.Mode)
					}
				}
			}
			if !strings.Contains(layers[0]["etc/passwd"].data, "nonroot:x:65532:65532:") ||
				layers[0]["tmp/"].mode != 0o1777 || layers[0]["home/nonroot/"].uid != 65532 {
				t.Errorf("base layer = %v", layers[0])
			}
			app := layers[len(layers)-1]
			if e, ok := app[c.Binary]; len(app) != 1 || !ok || e.mode != 0o755 || e.uid != 0 {
				t.Errorf("app layer = %v, want only %s, 0755, root's", keys(app), c.Binary)
			}
			if c.CGO {
				var libs []string
				for p := range layers[1] {
					libs = append(libs, p)
				}
				if !slices.ContainsFunc(libs, func(p string) bool { return strings.HasSuffix(p, "/libc.so.6") }) {
					t.Errorf("glibc layer = %v, want libc.so.6", libs)
				}
			}
			cfgDiffs := cf.RootFS.DiffIDs
			baseDiffIDs = append(baseDiffIDs, cfgDiffs[0])

			runInImage(t, back, c)
		})
	}
	for _, d := range baseDiffIDs {
		if d != baseDiffIDs[0] {
			t.Errorf("base layers differ: %v", baseDiffIDs)
		}
	}
}

// runInImage unpacks img and runs its entrypoint chrooted into it, as the image's
// user: a root holding only the image's files proves the image carries everything
// the binary needs (for a cgo binary, its loader and glibc).
func runInImage(t *testing.T, img v1.Image, c Component) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "running the image needs root (chroot, file owners)")
	}
	root := t.TempDir()
	extract(t, img, root)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := parseUser(t, cf.Config.User)
	cmd := exec.Command(cf.Config.Entrypoint[0])
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("run %s in the image: %v\n%s", cf.Config.Entrypoint[0], err, out.String())
	}
	want := fmt.Sprintf("hello /%s uid=%d", c.Binary, uid)
	if c.CGO {
		want += " nvml=0" // no libnvidia-ml.so.1 in the image: the node provides it
	}
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

func parseUser(t *testing.T, user string) (uint32, uint32) {
	t.Helper()
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("user %q is not uid:gid", user)
	}
	return uint32(uid), uint32(gid)
}

func keys(m map[string]entry) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestProjectSpecErrors(t *testing.T) {
	t.Parallel()
	bin := projectBin(t)
	agent, _ := ComponentNamed("koordlet")
	ext, _ := ComponentNamed("scheduler-extender")
	// The extender built with cgo: refused, its image would need libc.
	cgoBin := t.TempDir()
	copyFile(t, filepath.Join(bin, agent.Binary), filepath.Join(cgoBin, ext.Binary))
	// The agent without the shim its image carries (`make tsg-shim` not run).
	noShim := t.TempDir()
	copyFile(t, filepath.Join(bin, agent.Binary), filepath.Join(noShim, agent.Binary))
	tests := []struct {
		name    string
		c       Component
		o       ProjectOptions
		wantErr error // from ProjectSpec, else from Build
	}{
		{"cgo extender", ext, ProjectOptions{Version: "v1", BinDir: cgoBin, LibRoot: "/"}, ErrNotStatic},
		{"no binary", ext, ProjectOptions{Version: "v1", BinDir: t.TempDir(), LibRoot: "/"}, fs.ErrNotExist},
		{"no libraries", agent, ProjectOptions{Version: "v1", BinDir: bin, LibRoot: t.TempDir()}, fs.ErrNotExist},
		{"no time-slice shim", agent, ProjectOptions{Version: "v1", BinDir: noShim, LibRoot: "/"}, fs.ErrNotExist},
		{"latest", ext, ProjectOptions{Version: "latest", BinDir: bin, LibRoot: "/"}, ErrLatestTag},
		{"no version", ext, ProjectOptions{BinDir: bin, LibRoot: "/"}, ErrInvalidRef},
		{"bad version", ext, ProjectOptions{Version: "v1/x", BinDir: bin, LibRoot: "/"}, ErrInvalidRef},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec, err := ProjectSpec(tc.c, tc.o)
			if err == nil {
				_, err = Build(spec)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// With a package lookup the cgo agent's glibc layer carries, per package its copied
// libraries come from, the dpkg status file scanners read; files no package owns are
// left out, and without a lookup there are none.
func TestProjectSpecPackages(t *testing.T) {
	t.Parallel()
	bin := projectBin(t)
	c, _ := ComponentNamed("koordlet")
	lookup := func(p string) (string, []byte, error) {
		if strings.Contains(filepath.Base(p), "libc.so") || strings.Contains(filepath.Base(p), "ld-linux") {
			return "libc6:" + runtime.GOARCH, []byte("Package: libc6\nStatus: install ok installed\n"), nil
		}
		return "", nil, errors.New("not from a package")
	}
	for _, tc := range []struct {
		name   string
		lookup func(string) (string, []byte, error)
		want   []string
	}{
		{"lookup", lookup, []string{"/var/lib/dpkg/status.d/libc6_" + runtime.GOARCH}},
		{"none", nil, nil},
	} {
		spec, err := ProjectSpec(c, ProjectOptions{Version: "v1", BinDir: bin, LibRoot: "/", Package: tc.lookup})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range spec.Layers {
			for _, f := range l.Files {
				if strings.HasPrefix(f.Path, "/var/lib/dpkg/") {
					if l.Name != "glibc" || string(f.Data) != "Package: libc6\nStatus: install ok installed\n" {
						t.Errorf("%s: %s in layer %s with %q", tc.name, f.Path, l.Name, f.Data)
					}
					got = append(got, f.Path)
				}
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: dpkg files %v, want %v", tc.name, got, tc.want)
		}
	}
}
