package images

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Users of the images, numeric so that kubelet can check runAsNonRoot without
// reading /etc/passwd. 65532 is distroless' "nonroot".
const (
	RootUser    = "0:0"
	NonRootUser = "65532:65532"
)

// Label keys the images carry (OCI image annotations, as config labels).
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelVersion     = "org.opencontainers.image.version"
	LabelDescription = "org.opencontainers.image.description"
)

// Component is one deployed binary and its image.
type Component struct {
	// Name is the image's short name: the last element of Repo and its tarball's
	// base name.
	Name string
	// Repo is the image's name without tag; manifests use Repo:VERSION.
	Repo string
	// Binary is the file in the bin directory (`make build`), also the entrypoint
	// /<Binary> in the image.
	Binary string
	// Package is what the Dockerfile builds, and CGO whether it builds it with cgo.
	Package string
	CGO     bool
	// User the container runs as (numeric uid:gid).
	User        string
	Description string
	// Extra are further files of the bin directory the image carries, in a layer of
	// their own below the binary's.
	Extra []ExtraFile
}

// ExtraFile is one file of the bin directory in an image.
type ExtraFile struct {
	// Source is its name in the bin directory (`make build` and friends).
	Source string
	// Path is where the image has it; Mode its permissions.
	Path string
	Mode fs.FileMode
}

// Components are the project's images, in the order `make images` builds them.
//
// The agent needs root: it writes cgroup files and joins the NRI socket. bin/koordlet
// is the cgo build, for NVML; it dlopens libnvidia-ml.so.1 at run time and runs
// with GPU features off where the library is missing, so one image, carrying glibc,
// serves CPU-only and GPU nodes alike. It also carries the GPU time-slice shim
// (`make tsg-shim`), which the agent copies to the host with gpu.timeslice on.
// koordlet-nogpu is the pure-Go agent, static like the extender, the webhook and the
// Kueue quota follower, for clusters that want no libc in the image. kueue-quota is
// deployed only with manifests/components/kueue.
func Components() []Component {
	return []Component{
		{
			Name: "koordlet", Repo: "understory/koordlet", Binary: "koordlet",
			Package: "./cmd/koordlet", CGO: true, User: RootUser,
			Description: "Understory node agent (cgo: NVML when the node provides libnvidia-ml.so.1)",
			Extra: []ExtraFile{{Source: "libunderstory-tsg.so", Path: "/usr/lib/understory/libunderstory-tsg.so",
				Mode: 0o644}},
		},
		{
			Name: "koordlet-nogpu", Repo: "understory/koordlet-nogpu", Binary: "koordlet-nogpu",
			Package: "./cmd/koordlet", CGO: false, User: RootUser,
			Description: "Understory node agent, pure Go (static), GPU features off",
		},
		{
			Name: "scheduler-extender", Repo: "understory/scheduler-extender", Binary: "scheduler-extender",
			Package: "./cmd/scheduler-extender", CGO: false, User: NonRootUser,
			Description: "Understory kube-scheduler extender",
		},
		{
			Name: "admission", Repo: "understory/admission", Binary: "admission",
			Package: "./cmd/admission", CGO: false, User: NonRootUser,
			Description: "Understory admission webhook",
		},
		{
			Name: "kueue-quota", Repo: "understory/kueue-quota", Binary: "kueue-quota",
			Package: "./cmd/kueue-quota", CGO: false, User: NonRootUser,
			Description: "Understory Kueue quota follower (ClusterQueue quotas follow published batch capacity)",
		},
	}
}

// ComponentNamed returns the component of that name.
func ComponentNamed(name string) (Component, bool) {
	for _, c := range Components() {
		if c.Name == name {
			return c, true
		}
	}
	return Component{}, false
}

// ProjectOptions say where a project image's parts come from.
type ProjectOptions struct {
	// Version is the tag (the repository's VERSION file, which the manifests name).
	Version string
	// BinDir holds the built binaries (`make build`: bin/).
	BinDir string
	// LibRoot is where a dynamically linked binary's loader and libraries are
	// copied from: the build host, "/".
	LibRoot string
	// Created is the images' time (see Spec.Created).
	Created time.Time
	// Package names the Debian package a copied library file (its path on the build
	// host) comes from, and that package's dpkg status stanza; nil, or an error, leaves
	// the file without one. The image then carries /var/lib/dpkg/status.d/<package>,
	// the stanza, as distroless images do, so image scanners see the glibc it ships.
	Package func(hostPath string) (name string, stanza []byte, err error)
}

// Ref is the component's image reference at version.
func (c Component) Ref(version string) string { return c.Repo + ":" + version }

// Entrypoint is the command the image runs.
func (c Component) Entrypoint() []string { return []string{"/" + c.Binary} }

// ProjectSpec is the image of c: a base layer (/etc/passwd and /etc/group with
// root and nonroot, their homes, /tmp), for a cgo binary a layer with its loader and
// libraries, a layer with c.Extra where it has any, and the binary as /<Binary>. The base layer is the same in every image,
// so registries and containerd store it once. A component that is not CGO must be
// statically linked (ErrNotStatic otherwise); a CGO one may be either.
func ProjectSpec(c Component, o ProjectOptions) (Spec, error) {
	binPath := filepath.Join(o.BinDir, c.Binary)
	bin, err := ReadBinary(binPath)
	if err != nil {
		return Spec{}, fmt.Errorf("image %s: %w", c.Name, err)
	}
	if !c.CGO && !bin.Static() {
		return Spec{}, fmt.Errorf("image %s: %w: %s has interpreter %q and needs %v (build it with CGO_ENABLED=0)",
			c.Name, ErrNotStatic, binPath, bin.Interp, bin.Needed)
	}
	layers := []Layer{{Name: "base", Files: baseFiles()}}
	if !bin.Static() {
		libs, err := RuntimeFiles(o.LibRoot, binPath)
		if err != nil {
			return Spec{}, fmt.Errorf("image %s: %w", c.Name, err)
		}
		layers = append(layers, Layer{Name: "glibc", Files: append(libs, packageFiles(libs, o.Package)...)})
	}
	if len(c.Extra) > 0 {
		var files []File
		for _, e := range c.Extra {
			src := filepath.Join(o.BinDir, e.Source)
			if _, err := os.Stat(src); err != nil {
				return Spec{}, fmt.Errorf("image %s: %w", c.Name, err)
			}
			files = append(files, File{Path: e.Path, Mode: e.Mode, Source: src})
		}
		layers = append(layers, Layer{Name: "extra", Files: files})
	}
	layers = append(layers, Layer{Name: c.Binary, Files: []File{
		{Path: "/" + c.Binary, Mode: 0o755, Source: binPath},
	}})
	return Spec{
		Ref:          c.Ref(o.Version),
		OS:           "linux",
		Architecture: bin.Arch,
		Layers:       layers,
		Entrypoint:   c.Entrypoint(),
		User:         c.User,
		WorkingDir:   "/",
		Labels: map[string]string{
			LabelTitle:       c.Name,
			LabelVersion:     o.Version,
			LabelDescription: c.Description,
		},
		Created: o.Created,
	}, nil
}

// baseFiles are the files every project image has, as distroless has them.
func baseFiles() []File {
	return []File{
		{Path: "/etc", Mode: fs.ModeDir | 0o755},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}
}

// dpkgStatusDir is where an image without dpkg keeps the status of the packages its
// files come from, one file per package (distroless' layout, which Trivy, Grype and
// Syft read).
const dpkgStatusDir = "/var/lib/dpkg/status.d"

// packageFiles are the dpkg status files of the packages files come from, by
// lookup; none without it.
func packageFiles(files []File, lookup func(string) (string, []byte, error)) []File {
	if lookup == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []File
	for _, f := range files {
		if f.Source == "" {
			continue
		}
		name, stanza, err := lookup(f.Source)
		if err != nil || name == "" || seen[name] {
			continue
		}
		seen[name] = true
		// A multi-arch name (libc6:amd64) is a file name too, as distroless spells it.
		out = append(out, File{Path: dpkgStatusDir + "/" + strings.ReplaceAll(name, ":", "_"), Mode: 0o644, Data: stanza})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
